"""The main job killed outright (SIGKILL) while it trains, then run again: the dataset stages come
from Prefect's cache, training runs again, and the run ends as one never stopped does: the same
checkpoint bytes and the same report figures.

Three small main jobs (40 shoppers, a few updates), each its own process and temporary Prefect
server: about two minutes on two cores.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.flows.test_cli import SMALL_RUN
from tests.flows.test_killed_evaluation import environment

DATASET_STAGES = ("synthesise", "ingest", "chain", "extraction states", "extract", "records")


def command(workdir: Path, config: Path) -> list[str]:
    return [sys.executable, "-m", "flows.cli", "run", "--users", "40", "--seed", "5",
            "--workdir", str(workdir), "--config", str(config)]  # fmt: skip


def finish(workdir: Path, config: Path, home: Path) -> str:
    done = subprocess.run(
        command(workdir, config),
        env=environment(home) | {"COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def kill_while_training(workdir: Path, config: Path, home: Path) -> None:
    """Start the job, SIGKILL its process group once SFT has logged an update."""
    metrics = workdir / "train" / "sft" / "metrics.jsonl"
    job = subprocess.Popen(
        command(workdir, config), env=environment(home), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 600
    try:
        while '"kind": "train"' not in (metrics.read_text() if metrics.exists() else ""):
            assert job.poll() is None, "the job ended before it trained"
            assert time.monotonic() < deadline, "no update logged in 10 minutes"
            time.sleep(0.2)
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()


def stage_rows(output: str) -> dict[str, bool]:
    """The stage table: stage -> served from the cache."""
    rows = {}
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip().strip("│┃").split("│")]
        if len(cells) == 3 and cells[1].replace(".", "").isdigit():
            rows[cells[0]] = cells[2] == "✓"
    return rows


def figures(workdir: Path) -> list[dict]:
    report = json.loads((workdir / "evaluation" / "report.json").read_text())
    return list(report["simulators"].values())  # keyed by specs that hold the workdir's path


@pytest.mark.slow
def test_a_main_job_killed_while_training_reruns_to_the_uninterrupted_result(tmp_path):
    config = tmp_path / "small.toml"
    config.write_text(SMALL_RUN)
    finish(tmp_path / "straight", config, tmp_path / "home-a")
    kill_while_training(tmp_path / "killed", config, tmp_path / "home-b")
    assert not (tmp_path / "killed" / "evaluation" / "report.json").exists()
    rerun = stage_rows(finish(tmp_path / "killed", config, tmp_path / "home-b"))
    assert all(rerun[stage] for stage in DATASET_STAGES), rerun  # nothing of the dataset redone
    # killed inside SFT or OPTD: the stage that was running (and all after it) runs again
    assert not any(rerun[stage] for stage in ("train optd", "evaluate")), rerun
    for stage in ("sft", "optd"):
        (straight,) = (tmp_path / "straight" / "train" / stage / "checkpoints").glob(
            "step-*/model.safetensors"
        )
        (killed,) = (tmp_path / "killed" / "train" / stage / "checkpoints").glob("step-*/model.safetensors")
        assert killed.read_bytes() == straight.read_bytes(), stage
    assert figures(tmp_path / "killed") == figures(tmp_path / "straight")
