"""Atomic, idempotent lake writes and the DuckDB catalog over them."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

from tests.bundles import tiny_bundle, write_bundle
from transforms import lake as lake_io
from transforms.catalog import query, refresh_catalog
from transforms.ingest import ingest_bundle
from transforms.lake import read_lake_table, table_files

TABLES = ("steps", "sessions", "feed_layouts", "items", "profiles", "history", "quarantine")


@pytest.fixture()
def ingested(tmp_path) -> Path:
    write_bundle(tiny_bundle(), tmp_path / "raw")
    ingest_bundle(tmp_path / "raw", tmp_path / "lake")
    return tmp_path


def test_second_run_gives_identical_rows_and_bytes(ingested):
    lake = ingested / "lake"
    before = {t: read_lake_table(lake, t) for t in TABLES}
    files_before = {p.relative_to(lake): p.read_bytes() for t in TABLES for p in table_files(lake, t)}
    ingest_bundle(ingested / "raw", lake)
    for table in TABLES:
        assert read_lake_table(lake, table).equals(before[table]), table
    files_after = {p.relative_to(lake): p.read_bytes() for t in TABLES for p in table_files(lake, t)}
    assert files_after == files_before  # same files, same bytes: no duplicates, no leftovers


def test_failure_mid_write_leaves_previous_table_visible(ingested, monkeypatch):
    lake = ingested / "lake"
    before = read_lake_table(lake, "steps")
    calls = {"n": 0}
    real_write = lake_io._write_parquet

    def flaky(frame, schema, path, zstd_level):
        calls["n"] += 1
        if calls["n"] == 1:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"PAR1 half a file")  # a partial file lands in staging, then the disk "fails"
            raise OSError("disk full")
        real_write(frame, schema, path, zstd_level)

    monkeypatch.setattr(lake_io, "_write_parquet", flaky)
    with pytest.raises(OSError, match="disk full"):
        ingest_bundle(ingested / "raw", lake)
    assert read_lake_table(lake, "steps").equals(before)
    assert not any((lake / ".staging").iterdir())  # the staged half-file was removed
    for path in table_files(lake, "steps"):
        pq.read_metadata(path)  # every visible file is a whole Parquet file


def test_failure_on_first_write_leaves_no_table(tmp_path, monkeypatch):
    write_bundle(tiny_bundle(), tmp_path / "raw")

    def broken(frame, schema, path, zstd_level):
        raise OSError("disk full")

    monkeypatch.setattr(lake_io, "_write_parquet", broken)
    with pytest.raises(OSError):
        ingest_bundle(tmp_path / "raw", tmp_path / "lake")
    assert not (tmp_path / "lake" / "steps").exists()


def test_duckdb_views_agree_with_polars(ingested):
    lake = ingested / "lake"
    refresh_catalog(lake)
    for table in TABLES:
        rows = query(lake, f"SELECT count(*) AS n FROM {table}")["n"][0]
        assert rows == read_lake_table(lake, table).height, table
    mix = query(lake, "SELECT action, steps FROM action_mix()")
    expected = read_lake_table(lake, "steps").group_by("action").len()
    assert dict(mix.iter_rows()) == dict(expected.iter_rows())
    funnel = dict(query(lake, "SELECT * FROM funnel()").iter_rows())
    assert funnel == {"sessions": 1, "clicked": 1, "carted": 1, "bought": 0}


def test_bucket_partition_column_reads_back_as_integer(ingested):
    lake = ingested / "lake"
    refresh_catalog(lake)
    types = dict(query(lake, "SELECT column_name, column_type FROM (DESCRIBE steps)").iter_rows())
    assert types["bucket"] == "INTEGER" and types["ts"].startswith("TIMESTAMP")
    assert read_lake_table(lake, "steps").schema["bucket"] == pl.Int32


def test_catalog_follows_a_moved_lake(ingested, tmp_path_factory):
    lake = ingested / "lake"
    refresh_catalog(lake)
    moved = tmp_path_factory.mktemp("moved") / "lake"
    lake.rename(moved)
    assert query(moved, "SELECT count(*) AS n FROM steps")["n"][0] == 9


def test_no_raw_id_reaches_the_lake(tmp_path):
    bundle = tiny_bundle()
    bundle["events"][3]["item_id"] = "itm-2"  # also put one row into quarantine
    write_bundle(bundle, tmp_path / "raw")
    ingest_bundle(tmp_path / "raw", tmp_path / "lake")
    refresh_catalog(tmp_path / "lake")
    raw_ids = {r["user_id"] for r in bundle["profiles"]} | {r["item_id"] for r in bundle["items"]}
    raw_ids |= {r["event_id"] for r in bundle["events"]} | {r["page_view_id"] for r in bundle["events"]}
    for path in (tmp_path / "lake").rglob("*"):
        if path.is_file():
            content = path.read_bytes()
            leaked = [i for i in raw_ids if i.encode() in content]
            assert not leaked, (path, leaked)


def test_no_synthetic_platform_id_reaches_the_lake(tmp_path):
    # the synthetic world's ids carry distinctive prefixes, image refs embed them too
    from synthetic.bundle import write_bundle as synth_bundle

    synth_bundle(tmp_path / "raw", users=40, seed=3, fmt="parquet")
    ingest_bundle(tmp_path / "raw", tmp_path / "lake")
    refresh_catalog(tmp_path / "lake")
    for path in (tmp_path / "lake").rglob("*"):
        if path.is_file():
            content = path.read_bytes()
            assert not [p for p in (b"usr-", b"pv-", b"ev-", b"itm-") if p in content], path
