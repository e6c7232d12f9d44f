"""Extraction writes into a staging folder and swaps its tables in only after its gate: a stopped gate
or a killed run leaves the previous lake byte for byte (the response cache keeps what was paid for)."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

import extractors.pipeline
from cli.app import app
from extractors.cache import CACHE_DIR, ResponseCache
from extractors.config import ExtractSettings
from extractors.fakeserver import FakeOpenAIServer, default_responder
from extractors.pipeline import extract_lake
from flows.extract import extract_flow
from tests.extractors.tinylake import write_tiny_lake
from tests.flows.test_gate_then_swap import lake_files
from transforms.lake import STAGING, read_lake_table
from transforms.manifest import read_manifest

runner = CliRunner()
RATIONALES, INTENTS = 19, 4  # the tiny lake's jobs (tests/extractors/tinylake.py)
# a model that rambles: every rationale over the 40-word limit, a check_failed answer each time
RAMBLING = json.dumps({"rationale": " ".join(["this", "might", "suit", "me"] * 15)})


def rambling_rationales(body: dict) -> str:
    """Clean intents, rationales of 60 words: every rationale job is quarantined."""
    if body["response_format"]["json_schema"]["name"] == "rationale":
        return RAMBLING
    return default_responder(body)


@pytest.fixture
def extracted_lake(prefect_harness, tmp_path) -> Path:
    """The tiny lake after a good offline extraction: tables, catalog, run summary."""
    lake = write_tiny_lake(tmp_path / "lake").path
    extract_flow(str(lake), settings=ExtractSettings(progress=False))
    return lake


@pytest.fixture
def fast_client(monkeypatch) -> None:
    for name, value in {"REQUEST_TIMEOUT_S": "10", "BACKOFF_BASE_S": "0.01", "PROGRESS": "false"}.items():
        monkeypatch.setenv(f"TRAJFORGE_EXTRACT_{name}", value)
    monkeypatch.setenv("EXTRACT_GATE_TEST_KEY", "sk-test")


def openai_extract(lake: Path, server: FakeOpenAIServer, model: str = "rambler") -> list[str]:
    return [
        "extract", "--lake", str(lake), "--backend", "openai", "--base-url", server.base_url,
        "--model", model, "--api-key-env", "EXTRACT_GATE_TEST_KEY",
    ]  # fmt: skip


def without_cache(files: dict[str, str]) -> dict[str, str]:
    return {rel: digest for rel, digest in files.items() if not rel.startswith(f"{CACHE_DIR.as_posix()}/")}


def catalog_count(lake: Path, sql: str) -> int:
    with duckdb.connect(str(lake / "warehouse.duckdb"), read_only=True) as con:
        return con.execute(sql).fetchone()[0]


def test_an_extraction_keeping_no_rationale_stops_and_leaves_the_previous_lake(extracted_lake, fast_client):
    lake = extracted_lake
    before = lake_files(lake)
    with FakeOpenAIServer() as server:
        server.responder = rambling_rationales
        result = runner.invoke(app, openai_extract(lake, server), env={"COLUMNS": "400"})
        asked = len(server.chat_requests())
    assert result.exit_code == 1, result.output
    text = " ".join(result.output.split())
    # 19 rationale jobs decided, none accepted: each asked 3 times (max_reasks 2), all check_failed
    assert "table 'rationales' failed expectation 'rows_kept'" in text and "on 19 of 19 rows" in text
    assert "reason=check_failed, rows=19" in text and "the lake keeps its previous tables" in text
    assert "Traceback" not in result.output
    assert asked == INTENTS + 3 * RATIONALES
    # every table, the catalog and the last run's summary as they were; only the cache has grown
    assert without_cache(lake_files(lake)) == before
    assert len(ResponseCache.in_lake(lake)) == asked
    assert not any((lake / STAGING).iterdir()), "the staged tables are gone"
    assert set(read_lake_table(lake, "rationales")["backend"]) == {"heuristic"}


def test_after_a_stopped_gate_a_good_extraction_is_in_place_and_in_the_catalog(extracted_lake, fast_client):
    lake = extracted_lake
    with FakeOpenAIServer() as server:
        server.responder = rambling_rationales
        assert runner.invoke(app, openai_extract(lake, server)).exit_code == 1
        server.reset()
        server.responder = default_responder
        # the rambling answers are cached under the first model's name: another model is asked afresh
        result = runner.invoke(app, openai_extract(lake, server, model="concise"))
        asked = len(server.chat_requests())
    assert result.exit_code == 0, result.output
    assert asked == INTENTS + RATIONALES  # one clean answer per job
    assert catalog_count(lake, "SELECT count(*) FROM rationales WHERE backend = 'openai'") == RATIONALES
    assert catalog_count(lake, "SELECT count(*) FROM intents WHERE backend = 'openai'") == INTENTS
    missing = "SELECT count(*) FROM records WHERE record_id NOT IN (SELECT record_id FROM rationales)"
    assert catalog_count(lake, missing) == 0
    manifest = read_manifest(lake, "extract")
    latest = manifest.details
    gate = json.loads(
        (lake / "_runs" / "validation" / manifest.validation["run_id"] / "summary.json").read_text()
    )
    assert latest["backend"] == "openai" and gate["stage"] == "extract" and gate["ok"]
    assert latest["counts"]["rationales"] == {
        "jobs": RATIONALES,
        "ok": RATIONALES,
        "quarantined": 0,
        "pending": 0,
    }


class Killed(BaseException):
    """What a kill looks like from inside the run: it never reaches the swap."""


def test_a_run_killed_after_its_first_bucket_leaves_the_lake_and_a_rerun_finishes(
    extracted_lake, monkeypatch
):
    lake = extracted_lake
    before = lake_files(lake)
    run_backend = extractors.pipeline.run_backend
    calls: list[str] = []

    def killed_at_the_second_bucket(*args, **kwargs):
        calls.append(args[-1])
        if len(calls) == 2:
            raise Killed
        return run_backend(*args, **kwargs)

    monkeypatch.setattr(extractors.pipeline, "run_backend", killed_at_the_second_bucket)
    with pytest.raises(Killed):
        extract_lake(lake, ExtractSettings(progress=False))
    # bucket 0 was extracted, in staging only: the lake is as it was
    assert lake_files(lake) == before
    assert not any((lake / STAGING).iterdir())

    monkeypatch.setattr(extractors.pipeline, "run_backend", run_backend)
    summary = extract_lake(lake, ExtractSettings(progress=False))
    assert summary["counts"]["rationales"]["ok"] == RATIONALES
    assert read_lake_table(lake, "rationales").height == RATIONALES
    assert read_lake_table(lake, "intents").height == INTENTS
