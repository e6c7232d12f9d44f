"""Every stage that writes a table rebuilds the catalog, and nothing about the catalog fails a stage."""

from __future__ import annotations

import subprocess
import sys

import duckdb
import pytest

import flows.catalog
from extractors.config import ExtractSettings
from flows.chain import chain_flow
from flows.extract import extract_flow
from tests.bundles import tiny_bundle, write_bundle
from tests.extractors.tinylake import write_tiny_lake
from transforms.catalog import refresh_catalog
from transforms.ingest import ingest_bundle
from transforms.manifest import read_manifest

HOLD_OPEN = """
import sys, duckdb
con = duckdb.connect(sys.argv[1], read_only=True)
print(con.execute("SELECT count(*) FROM sessions").fetchone()[0], flush=True)
sys.stdin.readline()
"""


@pytest.fixture()
def lake(tmp_path) -> str:
    # the tiny bundle: one user, one page view
    write_bundle(tiny_bundle(), tmp_path / "raw")
    ingest_bundle(tmp_path / "raw", tmp_path / "lake")
    refresh_catalog(tmp_path / "lake")
    return str(tmp_path / "lake")


def _plain(lake: str, sql: str) -> list[tuple]:
    """What a reader sees opening the catalog file with nothing but duckdb."""
    with duckdb.connect(f"{lake}/warehouse.duckdb", read_only=True) as con:
        return con.execute(sql).fetchall()


def test_chain_succeeds_while_another_process_reads_the_catalog(prefect_harness, lake):
    reader = subprocess.Popen(
        [sys.executable, "-c", HOLD_OPEN, f"{lake}/warehouse.duckdb"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert reader.stdout.readline().strip() == "1"  # the reader holds the catalog open
        result = chain_flow(lake)
        assert reader.poll() is None  # still holding it when the stage has finished
    finally:
        reader.communicate("\n", timeout=60)
    assert read_manifest(lake, "chain").outputs["histories"].rows == result["rows"] == 1
    assert _plain(lake, "SELECT count(*) FROM histories") == [(1,)]


def test_extract_makes_its_tables_queryable_at_once(prefect_harness, tmp_path):
    lake = write_tiny_lake(tmp_path / "lake").path
    refresh_catalog(lake)
    extract_flow(str(lake), settings=ExtractSettings(progress=False))
    # 4 intent jobs and 19 rationale jobs, all answered by the offline rules (tinylake's docstring)
    assert _plain(str(lake), "SELECT count(*) FROM intents") == [(4,)]
    assert _plain(str(lake), "SELECT count(*) FROM rationales") == [(19,)]


def test_a_catalog_that_cannot_be_rebuilt_does_not_fail_the_stage(prefect_harness, lake, monkeypatch):
    def disk_full(lake):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(flows.catalog, "refresh_catalog", disk_full)
    result = chain_flow(lake)
    assert read_manifest(lake, "chain").outputs["histories"].rows == result["rows"] == 1
    # the previous catalog is left whole: its views still answer, the new table is not in it yet
    assert _plain(lake, "SELECT count(*) FROM sessions") == [(1,)]
    with pytest.raises(duckdb.CatalogException):
        _plain(lake, "SELECT count(*) FROM histories")
