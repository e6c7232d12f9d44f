"""The one manifest format: what a stage read or reused, what it wrote, as one table."""

from __future__ import annotations

import json

import polars as pl
import pytest

from transforms.fingerprints import fingerprint
from transforms.manifest import (
    ManifestError,
    StageManifest,
    UsersDone,
    manifest_path,
    new_manifest,
    parquet_rows,
    read_manifest,
    write_manifest,
)


def two_file_table(folder):
    (folder / "bucket=0").mkdir(parents=True)
    (folder / "bucket=1").mkdir()
    pl.DataFrame({"x": [1, 2, 3]}).write_parquet(folder / "bucket=0" / "part-0.parquet")
    pl.DataFrame({"x": [4, 5]}).write_parquet(folder / "bucket=1" / "part-0.parquet")


def test_outputs_carry_their_rows_and_hashes_and_inputs_their_read_or_reused(tmp_path):
    two_file_table(tmp_path / "lake" / "records")
    inputs = {"steps": "a" * 32, "items": "b" * 32}
    manifest = new_manifest(
        tmp_path / "lake", "records", 1.5, inputs, {"records": tmp_path / "lake" / "records"},
        reused=["items"], users=UsersDone(read=2, reused=7), settings={"window_single": 3},
    )  # fmt: skip
    assert manifest.read == ["steps"] and manifest.reused == ["items"]
    written = manifest.outputs["records"]
    assert written.rows == 5 and written.hash == fingerprint(tmp_path / "lake" / "records")
    rows = manifest.rows()
    assert [(r["kind"], r["name"], r["status"]) for r in rows] == [
        ("input", "steps", "read"),
        ("input", "items", "reused"),
        ("users", "users", "7 reused"),
        ("output", "records", "written"),
    ]
    assert rows[2]["rows"] == 2 and rows[3]["rows"] == 5 and rows[3]["hash"] == written.hash[:12]


def test_files_of_one_folder_are_one_row_counted_read_and_reused():
    manifest = StageManifest(
        stage="ingest", lake="L", finished_at="t", seconds=1.0, code_version="c", outputs={},
        inputs={"raw": "r", "bundle/events/part-1": "1", "bundle/events/part-2": "2", "bundle/items.parquet": "3"},
        read=["raw", "bundle/events/part-2", "bundle/items.parquet"], reused=["bundle/events/part-1"],
    )  # fmt: skip
    assert {r["name"]: r["status"] for r in manifest.rows()} == {
        "raw": "read",
        "bundle/events": "1 files read, 1 reused",
        "bundle": "1 files read, 0 reused",
    }


def test_a_manifest_is_the_last_run_and_a_copy_in_the_history(tmp_path):
    assert read_manifest(tmp_path, "chain") is None
    first = new_manifest(tmp_path, "chain", 1.0, {"sessions": "s1"}, {}, details={"rows": 1})
    second = new_manifest(tmp_path, "chain", 2.0, {"sessions": "s2"}, {}, details={"rows": 2})
    first = first.model_copy(update={"finished_at": "2026-12-02T10:00:00+00:00"})
    second = second.model_copy(update={"finished_at": "2026-12-02T11:00:00+00:00"})
    write_manifest(first)
    path = write_manifest(second)
    assert path == manifest_path(tmp_path, "chain") == tmp_path / "_runs" / "chain" / "manifest.json"
    assert read_manifest(tmp_path, "chain") == second
    history = sorted((path.parent / "history").iterdir())
    assert [json.loads(p.read_text())["inputs"]["sessions"] for p in history] == ["s1", "s2"]


def test_parquet_rows_counts_every_file_from_its_footer(tmp_path):
    two_file_table(tmp_path / "t")
    expected = pl.scan_parquet(tmp_path / "t" / "**" / "*.parquet").select(pl.len()).collect().item()
    assert parquet_rows(tmp_path / "t") == expected == 5


def test_a_lake_recorded_by_an_earlier_layout_or_a_broken_manifest_is_one_clear_error(tmp_path):
    earlier = tmp_path / "old" / "_runs" / "ingest" / "latest.json"
    earlier.parent.mkdir(parents=True)
    earlier.write_text(json.dumps({"settings": {"buckets": 8}}))  # settings the defaults would misread
    with pytest.raises(ManifestError, match=r"earlier trajforge.*run the ingest stage again"):
        read_manifest(tmp_path / "old", "ingest")
    broken = manifest_path(tmp_path / "new", "chain")
    broken.parent.mkdir(parents=True)
    broken.write_text('{"stage": "chain"')
    with pytest.raises(ManifestError, match="is not a stage manifest"):
        read_manifest(tmp_path / "new", "chain")
