"""The ``trajforge`` command line as a user runs it: the main job, SQL, validation, clean stops."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.app import app
from tests.bundles import tiny_bundle, write_bundle
from transforms.catalog import query
from transforms.ingest import ingest_bundle
from transforms.lake import read_lake_table

runner = CliRunner()


#: the main job's stages at a test's size (the demo's own size is measured in bench/RESULTS.md)
SMALL_RUN = """
[train]
steps = 6
eval_every = 3
held_out_states = 8
held_out_sampled = 4
held_out_sampling = {temperature = 1.0, top_p = 0.95, max_new_tokens = 24}
tiny = {vocab_size = 600, hidden_size = 32, intermediate_size = 64, num_layers = 1, num_heads = 2, num_kv_heads = 1}

[optd]
steps = 2
rollout_sampling = {temperature = 0.8, top_p = 1.0, max_new_tokens = 16}

[main_job]
sessions = 4
effect_users = 4
max_new_tokens = 24
"""


def test_main_job_builds_a_queryable_lake_a_checkpoint_and_a_report(prefect_harness, tmp_path):
    config = tmp_path / "small.toml"
    config.write_text(SMALL_RUN)
    result = runner.invoke(
        app, ["run", "--users", "40", "--seed", "5", "--workdir", str(tmp_path), "--config", str(config)]
    )
    assert result.exit_code == 0, result.output
    lake = tmp_path / "lake"
    assert "main job finished" in result.output
    # the OPTD checkpoint is a Hugging Face folder distilled from the SFT teacher
    checkpoints = sorted((tmp_path / "train" / "optd" / "checkpoints").glob("step-*"))
    assert checkpoints and (checkpoints[-1] / "config.json").is_file()
    assert (checkpoints[-1] / "model.safetensors").is_file()
    report = json.loads((tmp_path / "evaluation" / "report.json").read_text())
    assert [spec.split(":")[0] for spec in report["simulators"]] == [
        "checkpoint",
        "world",
        "markov",
        "random",
    ]
    assert str(checkpoints[-1]) in next(iter(report["simulators"]))
    assert "<img" in (tmp_path / "evaluation" / "report.html").read_text()
    for table in ("steps", "sessions", "histories", "records"):
        assert query(lake, f"SELECT count(*) AS n FROM {table}")["n"][0] > 0, table
    mix = runner.invoke(app, ["sql", "--lake", str(lake), "SELECT * FROM action_mix()"])
    assert mix.exit_code == 0 and "scroll_down" in mix.output
    checked = runner.invoke(app, ["validate", "--lake", str(lake), "steps"])
    assert checked.exit_code == 0, checked.output
    assert "Data Docs" in checked.output
    # run again into the same folder, on other shoppers: every stage replaces what the first run wrote
    first_real = (tmp_path / "evaluation" / "real.jsonl").read_text()
    again = runner.invoke(
        app, ["run", "--users", "40", "--seed", "6", "--workdir", str(tmp_path), "--config", str(config)]
    )
    assert again.exit_code == 0, again.output
    assert json.loads((tmp_path / "raw" / "manifest.json").read_text())["seed"] == 6
    second_real = (tmp_path / "evaluation" / "real.jsonl").read_text()
    assert second_real != first_real  # the new lake's sessions, none of the old traces resumed
    rolled = [json.loads(line)["session_id"] for line in rollout_lines(tmp_path / "evaluation")]
    assert set(rolled) == {json.loads(line)["session_id"] for line in second_real.splitlines()}
    # and once more, unchanged: every stage is served from Prefect's cache, no file rewritten
    written = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in outputs(tmp_path)}
    unchanged = runner.invoke(
        app, ["run", "--users", "40", "--seed", "6", "--workdir", str(tmp_path), "--config", str(config)]
    )
    assert unchanged.exit_code == 0, unchanged.output
    reused = " ".join(unchanged.output.split("served from Prefect's cache:")[1].split("main job")[0].split())
    stages = "synthesise, ingest, chain, extraction states, extract, records, train sft, train optd, evaluate"
    assert reused == stages
    assert {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in outputs(tmp_path)} == written


def outputs(workdir: Path) -> list[Path]:
    """The files a run leaves: raw logs, lake tables, checkpoints, the evaluation."""
    folders = ("raw", "lake/steps", "lake/records", "lake/rationales", "train", "evaluation")
    return sorted(p for folder in folders for p in (workdir / folder).rglob("*") if p.is_file())


def rollout_lines(evaluation: Path) -> list[str]:
    (checkpoint_rollout,) = evaluation.glob("checkpoint*.rollout.jsonl")
    return checkpoint_rollout.read_text().splitlines()


def test_version_is_the_installed_packages():
    from importlib.metadata import version

    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output == f"trajforge {version('trajforge')}\n"


def test_sql_refuses_writes(prefect_harness, tmp_path):
    write_bundle(tiny_bundle(), tmp_path / "raw")
    assert (
        runner.invoke(app, ["ingest", str(tmp_path / "raw"), "--lake", str(tmp_path / "lake")]).exit_code == 0
    )
    result = runner.invoke(app, ["sql", "--lake", str(tmp_path / "lake"), "DROP VIEW steps"])
    assert result.exit_code == 1 and "read-only" in result.output


def test_bundle_without_events_stops_with_one_paragraph(tmp_path):
    # a real process, as a user runs it: what reaches the terminal is the paragraph, not a traceback
    write_bundle(tiny_bundle(), tmp_path / "raw")
    shutil.rmtree(tmp_path / "raw" / "events")
    command = [
        sys.executable,
        "-m",
        "cli",
        "ingest",
        str(tmp_path / "raw"),
        "--lake",
        str(tmp_path / "lake"),
    ]
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=300, env=os.environ | {"COLUMNS": "200"}
    )
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "no 'events' table" in output and "Traceback" not in output
    assert not (tmp_path / "lake" / "steps").exists()


@pytest.fixture()
def lake(tmp_path):
    write_bundle(tiny_bundle(), tmp_path / "raw")
    ingest_bundle(tmp_path / "raw", tmp_path / "lake")
    return tmp_path / "lake"


STEPS_SQL = "SELECT step, action, visible_items FROM steps ORDER BY step"


def test_sql_csv_holds_every_row_and_lists_as_json(lake):
    result = runner.invoke(app, ["sql", "--lake", str(lake), STEPS_SQL, "--format", "csv", "--limit", "2"])
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(io.StringIO(result.output)))
    steps = read_lake_table(lake, "steps").sort("step")
    # every row (the table limit does not apply); a list cell is a JSON array of the same ids, and
    # the detail-page steps, which show no feed, have an empty cell
    assert [int(r["step"]) for r in rows] == steps["step"].to_list() and len(rows) == 9
    assert [r["action"] for r in rows] == steps["action"].to_list()
    cells = [json.loads(r["visible_items"]) if r["visible_items"] else None for r in rows]
    assert cells == steps["visible_items"].to_list()


def test_sql_json_is_an_array_of_row_objects(lake):
    result = runner.invoke(app, ["sql", "--lake", str(lake), STEPS_SQL, "--format", "json"])
    assert result.exit_code == 0, result.output
    steps = read_lake_table(lake, "steps").sort("step").select("step", "action", "visible_items")
    assert json.loads(result.output) == steps.to_dicts()


def test_sql_table_shows_values_wider_than_the_terminal(lake):
    # the test terminal is 80 columns; a 150-character value and the column after it print in full
    wide = "x" * 150
    result = runner.invoke(app, ["sql", "--lake", str(lake), f"SELECT '{wide}' AS wide, 'tail' AS after"])
    assert result.exit_code == 0, result.output
    assert wide in result.output and "tail" in result.output


def test_sql_rejects_an_unknown_format(lake):
    result = runner.invoke(app, ["sql", "--lake", str(lake), "SELECT 1", "--format", "xml"])
    assert result.exit_code == 2 and "xml" in result.output


def test_config_help_names_its_section():
    named = (
        ("ingest", "[ingest]"),
        ("chain", "[scale]"),
        ("records", "[records] [scale]"),
        ("extract", "[extract]"),
    )
    for command, section in named:
        result = runner.invoke(app, [command, "--help"], env={"COLUMNS": "200"})
        assert result.exit_code == 0 and f"TOML file with {section} settings" in result.output, command
