"""Chunk planning: small Parquet files are read several at a time, and give the rows, types and
locators that reading them one by one gives."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import transforms.readers as readers
from tests.bundles import tiny_bundle, write_bundle
from transforms.ingest import ingest_bundle
from transforms.lake import read_lake_table
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
    by_three = chunk_plan(root, "events", chunk_rows=3)  # the 4-row file (one row group) in two slices
    assert [chunk.paths for chunk in by_three] == [[paths[0]], [paths[1]], [paths[1]], [paths[2]]]
    assert [chunk.rows for chunk in by_three] == [None, (0, 2), (2, 2), None]
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


# --- a file that cannot be read counts every row it held ------------------------------


def _history_rows(n: int) -> list[dict]:
    row = tiny_bundle()["history"][0]
    return [{**row, "ts": row["ts"].isoformat(), "title": f"Canvas tote {k}"} for k in range(n)]


def test_an_unreadable_1000_line_jsonl_file_counts_1000_rows_quarantined(tmp_path, monkeypatch):
    root = write_bundle(tiny_bundle(), tmp_path / "raw")
    (root / "history" / "part-0.parquet").unlink()
    lines = "".join(json.dumps(r) + "\n" for r in _history_rows(1000))
    (root / "history" / "part-0.jsonl").write_text(lines + "\n")  # a trailing blank line is no row

    def failing_disk(path: Path, *args: object, **kwargs: object) -> object:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(readers, "_loose_jsonl", failing_disk)
    result = ingest_bundle(root, tmp_path / "lake")
    history = result.counts["history"]
    assert (history.rows_in, history.rows_out, history.quarantined) == (1000, 0, 1000)
    assert result.quarantine_by_reason["unreadable_file"] == 1000
    quarantined = read_lake_table(tmp_path / "lake", "quarantine").filter(
        pl.col("reason") == "unreadable_file"
    )
    assert quarantined["source_row"].to_list() == list(range(1000))
    assert (
        "OSError" in quarantined["detail"][0]
        and "1,000 rows counted from its lines" in quarantined["detail"][0]
    )


def test_a_parquet_file_with_a_readable_footer_counts_the_footers_rows(tmp_path):
    root = write_bundle(tiny_bundle(), tmp_path / "raw")
    part = root / "history" / "part-0.parquet"
    history = pl.read_parquet(part)
    pl.concat([history] * 500).write_parquet(part, compression="zstd")  # 500 rows in one row group
    data = bytearray(part.read_bytes())
    footer = pq.read_metadata(part).row_group(0).column(0)
    start = footer.data_page_offset
    data[start + 4 : start + 64] = b"\xff" * 60  # garble the first data page, leave the footer
    part.write_bytes(bytes(data))
    result = ingest_bundle(root, tmp_path / "lake")
    assert result.counts["history"].rows_in == 500
    assert result.quarantine_by_reason["unreadable_file"] == 500 and result.counts["history"].balanced


def test_a_file_without_a_footer_counts_as_one_row_and_says_so(tmp_path):
    root = write_bundle(tiny_bundle(), tmp_path / "raw")
    part = root / "history" / "part-0.parquet"
    part.write_bytes(part.read_bytes()[:40])  # cut before the footer: its row count is gone with it
    result = ingest_bundle(root, tmp_path / "lake")
    assert result.counts["history"].rows_in == 1 and result.quarantine_by_reason["unreadable_file"] == 1
    detail = read_lake_table(tmp_path / "lake", "quarantine")["detail"][0]
    assert "its rows could not be counted" in detail


def test_a_bug_in_the_reader_is_a_traceback_not_a_quarantine_row(tmp_path, monkeypatch):
    root = write_bundle(tiny_bundle(), tmp_path / "raw")

    def buggy(*args: object, **kwargs: object) -> object:
        raise KeyError("a column our own code forgot")

    monkeypatch.setattr(readers, "_loose_parquet", buggy)
    with pytest.raises(KeyError, match="forgot"):
        ingest_bundle(root, tmp_path / "lake")
