"""Every stage that writes lake tables records one manifest and publishes it as a Prefect table
artifact with the same rows."""

from __future__ import annotations

import json

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

from flows.chain import chain_flow
from flows.ingest import ingest_flow
from flows.records import records_flow
from tests.bundles import tiny_bundle, write_bundle
from transforms.manifest import read_manifest

STAGES = ("ingest", "chain", "records")


def latest_artifact(key: str) -> dict:
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
    newest = max(found, key=lambda a: a.created)
    return {
        "type": newest.type,
        "rows": json.loads(newest.data) if isinstance(newest.data, str) else newest.data,
    }


def test_each_stage_records_its_manifest_and_publishes_the_same_rows(prefect_harness, tmp_path):
    write_bundle(tiny_bundle(), tmp_path / "raw")
    lake = str(tmp_path / "lake")
    results = {
        "ingest": ingest_flow(str(tmp_path / "raw"), lake, force=True),
        "chain": chain_flow(lake),
        "records": records_flow(lake),
    }
    for stage in STAGES:
        manifest = read_manifest(lake, stage)
        assert manifest is not None and manifest.stage == stage and results[stage]["manifest"]
        assert manifest.validation["run_id"] == results[stage]["validation"]["run_id"]
        published = latest_artifact(f"{stage}-manifest")
        assert published["type"] == "table" and published["rows"] == manifest.rows()
    # what each stage read is what the stage before it wrote, hash for hash
    ingested, chained, rendered = (read_manifest(lake, s) for s in STAGES)
    assert chained.inputs["sessions"] == ingested.outputs["sessions"].hash
    assert rendered.inputs["histories"] == chained.outputs["histories"].hash
    assert rendered.inputs["steps"] == ingested.outputs["steps"].hash
    assert rendered.outputs["records"].rows == rendered.details["records"]["records"]
