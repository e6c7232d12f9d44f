"""The ``trajforge`` command line as a user runs it: the main job, SQL, validation, clean stops."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from typer.testing import CliRunner

from flows.cli import app
from tests.bundles import tiny_bundle, write_bundle
from transforms.catalog import query

runner = CliRunner()


def test_main_job_builds_a_queryable_lake(prefect_harness, tmp_path):
    result = runner.invoke(app, ["run", "--users", "40", "--seed", "5", "--workdir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    lake = tmp_path / "lake"
    assert "main job finished" in result.output
    for table in ("steps", "sessions", "histories", "records"):
        assert query(lake, f"SELECT count(*) AS n FROM {table}")["n"][0] > 0, table
    mix = runner.invoke(app, ["sql", "--lake", str(lake), "SELECT * FROM action_mix()"])
    assert mix.exit_code == 0 and "scroll_down" in mix.output
    checked = runner.invoke(app, ["validate", "--lake", str(lake), "steps"])
    assert checked.exit_code == 0, checked.output
    assert "Data Docs" in checked.output


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
        "flows.cli",
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
