"""Chunk planning: small Parquet files are read several at a time, and give the rows, types and
locators that reading them one by one gives."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from tests.bundles import tiny_bundle, write_bundle
from transforms.ingest import ingest_bundle
from transforms.readers import _read_rows, chunk_plan, read_chunk, read_tables


def _split_events(root: Path, sizes: list[int]) -> list[Path]:
    """The tiny bundle's events as several part files of ``sizes`` rows (in order)."""
    events = pl.read_parquet(root / "events" / "part-0.parquet")
    (root / "events" / "part-0.parquet").unlink()
    paths, start = [], 0
    for n, size in enumerate(sizes):
        path = root / "events" / f"part-{n}.parquet"
        events.slice(start, size).write_parquet(path)
        paths.append(path)
        start += size
    assert start == events.height
    return paths


def _one_by_one(root: Path, paths: list[Path]) -> pl.DataFrame:
    return pl.concat([_read_rows(p, root, "events", "auto", None)[0] for p in paths])


def test_small_files_are_read_together_with_their_own_file_and_row(tmp_path):
    root = write_bundle(tiny_bundle(), tmp_path / "raw")
    paths = _split_events(root, [3, 4, 2])
    plan = chunk_plan(root, "events", chunk_rows=100)
    assert [chunk.paths for chunk in plan] == [paths]
    read = read_chunk(root, plan[0], "auto", None)
    assert read.rows_in == 9 and read.files == [f"events/part-{n}.parquet" for n in range(3)]
    assert read.frame.equals(_one_by_one(root, paths))
    assert read.frame["_row"].to_list() == [0, 1, 2, 0, 1, 2, 3, 0, 1]


def test_small_files_are_grouped_up_to_the_chunk_size(tmp_path):
    root = write_bundle(tiny_bundle(), tmp_path / "raw")
    paths = _split_events(root, [3, 4, 2])
    assert [chunk.paths for chunk in chunk_plan(root, "events", chunk_rows=7)] == [paths[:2], paths[2:]]
    assert [chunk.paths for chunk in chunk_plan(root, "events", chunk_rows=3)] == [[p] for p in paths]
    streamed = pl.concat([r.frame for r in read_tables(root, ("events",), "auto", None, 7)])
    assert streamed.equals(_one_by_one(root, paths))


def test_files_whose_schemas_differ_are_read_one_by_one(tmp_path):
    root = write_bundle(tiny_bundle(), tmp_path / "raw")
    paths = _split_events(root, [5, 4])
    # the second file logs scroll_top as text: the two cannot be scanned as one
    second = pq.read_table(paths[1])
    position = second.schema.get_field_index("scroll_top")
    as_text = pa.array([None if v is None else str(v) for v in second["scroll_top"].to_pylist()], pa.string())
    pq.write_table(second.set_column(position, "scroll_top", as_text), paths[1])
    plan = chunk_plan(root, "events", chunk_rows=100)
    assert [chunk.paths for chunk in plan] == [paths]
    read = read_chunk(root, plan[0], "auto", None)
    assert read.frame.equals(_one_by_one(root, paths))
    assert read.frame.schema["scroll_top"] == pl.Float64 and read.rows_in == 9  # the declared type


def test_a_truncated_file_among_small_ones_is_quarantined_alone(tmp_path):
    root = write_bundle(tiny_bundle(), tmp_path / "raw")
    paths = _split_events(root, [3, 4, 2])
    paths[1].write_bytes(paths[1].read_bytes()[:40])
    plan = chunk_plan(root, "events", chunk_rows=100)
    assert [chunk.paths for chunk in plan] == [[paths[0]], [paths[1]], [paths[2]]]
    result = ingest_bundle(root, tmp_path / "lake")
    assert result.quarantine_by_reason.get("unreadable_file") == 1
    assert result.counts["events"].rows_in == 3 + 1 + 2 and result.counts["events"].balanced
