"""The extract flow under Prefect: offline default, the openai backend through the CLI command."""

from __future__ import annotations

import os

import polars as pl
import typer
from typer.testing import CliRunner

from cli.dataset import extract
from extractors.config import ExtractSettings
from extractors.fakeserver import FakeOpenAIServer, status
from flows.extract import extract_flow
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


def test_cli_command_runs_the_openai_backend(prefect_harness, tmp_path, monkeypatch):
    lake = write_tiny_lake(tmp_path / "lake")
    secret = "sk-flow-" + os.urandom(8).hex()
    monkeypatch.setenv("FLOW_TEST_KEY", secret)
    for name, value in {"REQUEST_TIMEOUT_S": "10", "BACKOFF_BASE_S": "0.01", "PROGRESS": "false"}.items():
        monkeypatch.setenv(f"TRAJFORGE_EXTRACT_{name}", value)
    # registered as cli/app.py registers it
    app = typer.Typer()
    app.command()(extract)
    app.callback()(lambda: None)
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
