"""The DuckDB catalog: rebuilt under a reader's feet, and never reading another lake's files."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa
import pytest

from tests.bundles import tiny_bundle, write_bundle
from transforms.catalog import query, refresh_catalog
from transforms.ingest import ingest_bundle
from transforms.lake import read_lake_table, write_table

# --- the DuckDB catalog over the lake: shared with readers, copied and moved ------------------------

HOLD_OPEN = """
import sys, duckdb
con = duckdb.connect(sys.argv[1], read_only=True)
print(con.execute("SELECT count(*) FROM steps").fetchone()[0], flush=True)
sys.stdin.readline()  # hold the catalog open until told to query it again
print(con.execute("SELECT count(*) FROM steps").fetchone()[0], flush=True)
"""

COUNT_STEPS = """
import sys, duckdb
with duckdb.connect(sys.argv[1], read_only=True) as con:
    print(con.execute("SELECT count(*) FROM steps").fetchone()[0])
"""


@pytest.fixture()
def lake(tmp_path) -> Path:
    # the tiny bundle: one page view of 9 recorded actions
    write_bundle(tiny_bundle(), tmp_path / "raw")
    ingest_bundle(tmp_path / "raw", tmp_path / "lake")
    refresh_catalog(tmp_path / "lake")
    return tmp_path / "lake"


def _plain_count(warehouse: Path, cwd: Path) -> int:
    """Steps counted by a fresh Python process with nothing but duckdb, run from ``cwd``."""
    result = subprocess.run(
        [sys.executable, "-c", COUNT_STEPS, str(warehouse)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return int(result.stdout)


def test_written_in_a_storage_format_duckdb_1_reads(lake):
    # DuckDB's file header: 8 bytes of checksum, the magic, then the storage version number; 64 is
    # the format of DuckDB 0.10 to 1.x, which their readers accept (2.0 writes a newer one by default)
    header = (lake / "warehouse.duckdb").read_bytes()[:20]
    assert header[8:12] == b"DUCK"
    assert int.from_bytes(header[12:20], "little") == 64


def test_rebuilt_while_another_process_holds_the_catalog_open(lake):
    reader = subprocess.Popen(
        [sys.executable, "-c", HOLD_OPEN, str(lake / "warehouse.duckdb")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert reader.stdout.readline().strip() == "9"
        # a later stage adds a table while the reader still has the catalog open
        _write_notes(lake, ["u_1"], [1])
        refresh_catalog(lake)
        assert query(lake, "SELECT count(*) AS n FROM notes")["n"][0] == 1
        out, err = reader.communicate("\n", timeout=120)
    finally:
        reader.kill()
    assert reader.returncode == 0, err
    assert out.strip() == "9"  # the reader's own connection kept working through the rebuild
    assert sorted(p.name for p in lake.iterdir() if "duckdb" in p.name) == ["warehouse.duckdb"]


def test_a_copied_lake_never_reads_the_original(lake, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(lake, copy)
    # the original loses 3 of its 9 steps; the copy must still count its own 9
    steps = read_lake_table(lake, "steps")
    write_table(lake, "steps", steps.head(6))
    assert query(lake, "SELECT count(*) AS n FROM steps")["n"][0] == 6
    # run from inside the original lake: a path resolved against the working directory would read it
    assert _plain_count(copy / "warehouse.duckdb", cwd=lake) == 9
    shutil.rmtree(lake)
    assert _plain_count(copy / "warehouse.duckdb", cwd=tmp_path) == 9


def test_a_moved_lake_reads_its_files_from_plain_duckdb(lake, tmp_path):
    moved = tmp_path / "elsewhere" / "lake"
    moved.parent.mkdir()
    lake.rename(moved)
    assert _plain_count(moved / "warehouse.duckdb", cwd=tmp_path) == 9


def test_attached_to_another_database_the_views_stop_with_the_remedy(lake):
    with duckdb.connect() as con:
        con.execute(f"ATTACH '{lake / 'warehouse.duckdb'}' AS lake (READ_ONLY)")
        with pytest.raises(
            duckdb.Error, match=r"duckdb\.connect\('LAKE/warehouse\.duckdb', read_only=True\)"
        ):
            con.execute("SELECT count(*) FROM lake.steps").fetchall()


def test_opening_rebuilds_a_catalog_that_misses_a_table_on_disk(lake):
    # written behind the catalog's back, as by a stage that could not rebuild it
    _write_notes(lake, ["u_1", "u_2"], [1, 3])
    assert "notes" not in _view_names(lake)
    assert query(lake, "SELECT sum(n_sessions) AS n FROM notes")["n"][0] == 4  # 1 + 3
    assert "notes" in _view_names(lake)


def test_opening_rebuilds_a_catalog_of_absolute_paths(lake, tmp_path):
    # the older layout: views naming the files by absolute path, no record of how they were built
    (lake / "warehouse.duckdb").unlink()
    with duckdb.connect(str(lake / "warehouse.duckdb")) as con:
        con.execute(f"CREATE VIEW steps AS SELECT * FROM read_parquet('{lake}/steps/**/*.parquet')")
    copy = tmp_path / "copy"
    shutil.copytree(lake, copy)
    write_table(lake, "steps", read_lake_table(lake, "steps").head(2))
    # the copy's old catalog would count the original's 2 steps; opened through query it is rebuilt
    assert query(copy, "SELECT count(*) AS n FROM steps")["n"][0] == 9


def _write_notes(lake: Path, users: list[str], sessions: list[int]) -> None:
    """A table no stage declares, as a later stage may add one."""
    schema = pa.schema([("user_id", pa.string()), ("n_sessions", pa.int64())])
    write_table(lake, "notes", pl.DataFrame({"user_id": users, "n_sessions": sessions}), schema=schema)


def _view_names(lake: Path) -> set[str]:
    with duckdb.connect(str(lake / "warehouse.duckdb"), read_only=True) as con:
        return {
            name
            for (name,) in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()
        }
