"""The ingest flow under Prefect's test harness."""

from __future__ import annotations

from flows.ingest import ingest_flow
from tests.bundles import tiny_bundle, write_bundle
from transforms.catalog import query
from transforms.fingerprints import fingerprint
from transforms.lake import read_lake_table
from transforms.manifest import manifest_path, read_manifest


def test_ingest_flow_writes_lake_catalog_and_summary(prefect_harness, tmp_path):
    write_bundle(tiny_bundle(), tmp_path / "raw")
    lake = tmp_path / "lake"
    summary = ingest_flow(str(tmp_path / "raw"), str(lake))
    assert summary["skipped"] is False
    assert summary["counts"]["events"] == {
        "rows_in": 9,
        "rows_out": 9,
        "quarantined": 0,
        "duplicates": 0,
        "flagged": 0,
        "dropped": 0,
    }
    assert read_lake_table(lake, "steps").height == 9
    assert query(lake, "SELECT count(*) AS n FROM sessions")["n"][0] == 1
    recorded = read_manifest(lake, "ingest")
    assert recorded.inputs["raw"] == fingerprint(tmp_path / "raw") and "rekey_key" not in recorded.settings
    files = {name for name in recorded.inputs if name.startswith("bundle/")}
    assert files == {
        f"bundle/{p.relative_to(tmp_path / 'raw').as_posix()}"
        for p in (tmp_path / "raw").rglob("*")
        if p.is_file()
    }
    assert recorded.read == list(recorded.inputs) and recorded.reused == []
    assert recorded.outputs["steps"].rows == 9 and recorded.outputs["sessions"].rows == 1
    assert recorded.outputs["steps"].hash == fingerprint(lake / "steps")
    assert recorded.validation["run_id"] == summary["validation"]["run_id"]
    assert summary["manifest"] == str(manifest_path(lake, "ingest"))


def test_ingest_flow_is_a_no_op_on_an_unchanged_bundle(prefect_harness, tmp_path):
    write_bundle(tiny_bundle(), tmp_path / "raw")
    lake = tmp_path / "lake"
    ingest_flow(str(tmp_path / "raw"), str(lake))
    stamp = (lake / "steps").stat().st_mtime_ns
    again = ingest_flow(str(tmp_path / "raw"), str(lake))
    assert again["skipped"] is True and (lake / "steps").stat().st_mtime_ns == stamp
    bundle = tiny_bundle()
    bundle["events"] = bundle["events"][:-1]  # the bundle changed: the flow runs again
    write_bundle(bundle, tmp_path / "raw")
    changed = ingest_flow(str(tmp_path / "raw"), str(lake))
    assert changed["skipped"] is False and changed["counts"]["events"]["rows_in"] == 8
