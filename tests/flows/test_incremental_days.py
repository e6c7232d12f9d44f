"""A bundle that grows by a day: the pipeline run again on its lake renders and extracts only the
users the day changed, and the lake equals a fresh full run's, table by table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flows.pipeline import pipeline_flow
from synthetic.bundle import write_bundle
from synthetic.days import add_new_files, bundle_through, event_days
from transforms.lake import differing_tables, read_lake_table
from transforms.schemas import LAKE_TABLES

pytestmark = pytest.mark.slow


def test_a_new_day_equals_a_full_run(prefect_harness, tmp_path: Path):
    write_bundle(tmp_path / "generated", users=60, seed=8)
    days = event_days(tmp_path / "generated")
    middle = len(days) // 2
    bundle_through(tmp_path / "generated", tmp_path / "raw", days[middle - 1])
    bundle_through(tmp_path / "generated", tmp_path / "grown", days[middle])
    lake, fresh = tmp_path / "lake", tmp_path / "fresh"

    first = pipeline_flow(str(tmp_path / "raw"), str(lake))
    assert first["records"]["records"]["users_kept"] == 0
    added = add_new_files(tmp_path / "raw", tmp_path / "grown")
    assert f"events/part-{days[middle]}.parquet" in added and any(a.startswith("feeds/") for a in added)
    again = pipeline_flow(str(tmp_path / "raw"), str(lake))
    full = pipeline_flow(str(tmp_path / "grown"), str(fresh))

    assert again["ingest"]["output_rows"]["steps"] > first["ingest"]["output_rows"]["steps"]
    assert again["ingest"]["increment"]["files_read"] == sorted(added)  # ingest read the new files only
    manifest = json.loads(Path(again["ingest"]["manifest"]).read_text())
    assert sorted(n for n in manifest["read"] if n.startswith("bundle/")) == [
        f"bundle/{a}" for a in sorted(added)
    ]
    bundle = {n for n in manifest["inputs"] if n.startswith("bundle/")}
    assert set(manifest["reused"]) == bundle - {f"bundle/{a}" for a in added}
    assert manifest["users"]["read"] == again["ingest"]["increment"]["users_read"] > 0
    users = read_lake_table(lake, "sessions")["user_id"].n_unique()
    chained = again["chain"]  # only the users whose sessions changed get a new history
    assert 0 < chained["users_chained"] < users and chained["users_kept"] == users - chained["users_chained"]
    assert full["chain"]["users_kept"] == 0 and again["chain"]["stats"] == full["chain"]["stats"]
    rendered = again["records"]["records"]["users_rendered"]
    assert 0 < rendered < users and again["records"]["records"]["users_kept"] == users - rendered
    assert full["records"]["records"]["users_rendered"] == users
    assert differing_tables(lake, fresh, [*LAKE_TABLES, "quarantine"]) == {}
    assert differing_tables(lake / "_extraction_states", fresh / "_extraction_states", ["records"]) == {}
    extracted = again["extract"]["users"]
    assert extracted["read"] == rendered and extracted["reused"] == users - rendered
    assert again["extract"]["counts"] == full["extract"]["counts"]  # the kept rows counted too
    assert full["extract"]["users"] == {"read": users, "reused": 0}
    assert again["records"]["records"]["records"] == full["records"]["records"]["records"]
    assert again["records"]["records"]["by_mode_split"] == full["records"]["records"]["by_mode_split"]
