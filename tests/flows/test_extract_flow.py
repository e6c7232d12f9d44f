"""The extract flow under Prefect: offline default, the openai backend through the CLI command."""

from __future__ import annotations

import json
import os

import polars as pl
import typer
from typer.testing import CliRunner

from cli.dataset import extract
from extractors.config import ExtractSettings
from extractors.fakeserver import FakeOpenAIServer, status
from flows.extract import extract_flow
from flows.pipeline import pipeline_flow
from tests.bundles import tiny_bundle, write_bundle
from tests.extractors.tinylake import write_tiny_lake
from transforms.lake import read_lake_table
from transforms.manifest import read_manifest


def test_flow_offline_default(prefect_harness, tmp_path):
    lake = write_tiny_lake(tmp_path / "lake")
    summary = extract_flow(str(lake.path), settings=ExtractSettings(progress=False))
    # 4 train trajectories and 19 actions, all extracted by the rules, nothing sent anywhere
    assert summary["counts"]["intents"]["ok"] == 4 and summary["counts"]["rationales"]["ok"] == 19
    assert summary["backend"] == "heuristic" and summary["requests"] == 0 and summary["balanced"]
    manifest = read_manifest(lake.path, "extract")
    records, rationales = (read_lake_table(lake.path, t) for t in ("records", "rationales"))
    assert manifest.details["counts"] == summary["counts"] and manifest.users.reused == 0
    assert manifest.users.read == records["user_id"].n_unique()  # no earlier run: every user read
    assert manifest.outputs["rationales"].rows == 19 and manifest.outputs["intents"].rows == 4
    assert set(rationales["record_id"]) == set(records["record_id"])  # one per recorded action


def extract_command(monkeypatch, key: str) -> typer.Typer:
    """``trajforge extract`` registered as cli/app.py registers it, with the key in ``FLOW_TEST_KEY`` and
    short timeouts."""
    monkeypatch.setenv("FLOW_TEST_KEY", key)
    for name, value in {"REQUEST_TIMEOUT_S": "10", "BACKOFF_BASE_S": "0.01", "PROGRESS": "false"}.items():
        monkeypatch.setenv(f"TRAJFORGE_EXTRACT_{name}", value)
    app = typer.Typer()
    app.command()(extract)
    app.callback()(lambda: None)
    return app


def test_cli_command_runs_the_openai_backend(prefect_harness, tmp_path, monkeypatch):
    lake = write_tiny_lake(tmp_path / "lake")
    secret = "sk-flow-" + os.urandom(8).hex()
    app = extract_command(monkeypatch, secret)
    with FakeOpenAIServer() as server:
        server.enqueue(status(500))  # one transient failure, retried
        args = ["extract", "--lake", str(lake.path), "--backend", "openai", "--base-url", server.base_url]
        result = CliRunner().invoke(app, [*args, "--model", "served-model", "--api-key-env", "FLOW_TEST_KEY"])
        sent = server.chat_requests()
    assert result.exit_code == 0, result.output
    # 23 jobs -> 23 answers; the 500 costs one extra request
    assert len(sent) == 24 and {r.body["model"] for r in sent} == {"served-model"}
    assert "retries 1" in result.output and secret not in result.output
    assert sent[0].headers["authorization"] == f"Bearer {secret}"
    rationales = read_lake_table(lake.path, "rationales")
    assert rationales.height == 19 and set(rationales["backend"]) == {"openai"}
    assert not [p for p in lake.path.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    assert read_lake_table(lake.path, "intents").filter(pl.col("mode") == "cross").height == 1


def test_a_lake_extracted_before_is_extracted_again_from_states_without_its_rationales(
    prefect_harness, tmp_path, monkeypatch
):
    write_bundle(tiny_bundle(), tmp_path / "raw")
    lake = tmp_path / "lake"
    pipeline_flow(str(tmp_path / "raw"), str(lake))  # the offline rules extract; the records show them
    earlier = [r for r in read_lake_table(lake, "rationales")["rationale"].to_list() if r]
    prompts = "\n".join(read_lake_table(lake, "records", ["prompt"])["prompt"].to_list())
    assert any(r in prompts for r in earlier), "the records' history windows carry the earlier rationales"
    app = extract_command(monkeypatch, "sk-test")
    with FakeOpenAIServer() as server:
        args = ["extract", "--lake", str(lake), "--backend", "openai", "--base-url", server.base_url]
        result = CliRunner().invoke(app, [*args, "--model", "served-model", "--api-key-env", "FLOW_TEST_KEY"])
        sent = [json.dumps(r.body) for r in server.chat_requests()]
    assert result.exit_code == 0, result.output
    assert (
        sent
        and len(sent) == read_lake_table(lake, "rationales").height + read_lake_table(lake, "intents").height
    )
    # what the extractor is shown is the states as before any extraction: no earlier rationale in it
    assert not [r for r in earlier if any(json.dumps(r)[1:-1] in body for body in sent)]
    assert set(read_lake_table(lake, "rationales")["backend"]) == {"openai"}
