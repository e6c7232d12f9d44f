"""The main job killed outright (SIGKILL) while it trains or while it evaluates, then run again: what
had finished comes from Prefect's cache, an evaluation keeps the sessions it had finished, and the
run ends as one never stopped does: the same checkpoint bytes and the same report figures.

Five small main jobs (40 shoppers, a few updates), each its own process and temporary Prefect
server: about three minutes on two cores.
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

from tests.cli.test_cli import SMALL_RUN
from tests.flows.test_killed_evaluation import environment

DATASET_STAGES = ("synthesise", "ingest", "chain", "extraction states", "extract", "records")


def command(workdir: Path, config: Path) -> list[str]:
    return [sys.executable, "-m", "cli", "run", "--users", "40", "--seed", "5",
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


def first_update(workdir: Path) -> bool:
    metrics = workdir / "train" / "sft" / "metrics.jsonl"
    return metrics.exists() and '"kind": "train"' in metrics.read_text()


def first_rollout(workdir: Path) -> bool:
    return any(p.read_text().strip() for p in (workdir / "evaluation").glob("*.rollout.jsonl"))


KILL_POINTS = {"training": first_update, "evaluation": first_rollout}


def kill_when(reached, workdir: Path, config: Path, home: Path) -> None:
    """Start the job, SIGKILL its process group once ``reached(workdir)``."""
    job = subprocess.Popen(
        command(workdir, config), env=environment(home), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 600
    try:
        while not reached(workdir):
            assert job.poll() is None, "the job ended before the point it was to be killed at"
            assert time.monotonic() < deadline, "the point was not reached in 10 minutes"
            time.sleep(0.1)
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


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> tuple[Path, Path]:
    """The config and the workdir of a run never stopped."""
    root = tmp_path_factory.mktemp("straight")
    config = root / "small.toml"
    config.write_text(SMALL_RUN)
    finish(root / "job", config, root / "home")
    return config, root / "job"


def traces(workdir: Path) -> dict[str, tuple[int, str]]:
    """Each rollout trace file: its inode (a file kept and extended keeps it) and its text."""
    files = sorted((workdir / "evaluation").glob("*.rollout.jsonl"))
    return {p.name: (p.stat().st_ino, p.read_text()) for p in files}


@pytest.mark.slow
@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_a_main_job_killed_reruns_to_the_uninterrupted_result(straight, tmp_path, point):
    config, reference = straight
    killed = tmp_path / "killed"
    kill_when(KILL_POINTS[point], killed, config, tmp_path / "home")
    assert not (killed / "evaluation" / "report.json").exists()
    written = traces(killed)
    rerun = stage_rows(finish(killed, config, tmp_path / "home"))
    assert all(rerun[stage] for stage in DATASET_STAGES), rerun  # nothing of the dataset redone
    if point == "training":  # the stage that was running, and all after it, run again
        assert not any(rerun[stage] for stage in ("train optd", "evaluate")), rerun
    else:  # the checkpoint is kept, and the sessions the evaluation had finished
        assert rerun["train sft"] and rerun["train optd"] and not rerun["evaluate"], rerun
        after = traces(killed)
        assert all(after[name][1].startswith(text) for name, (_, text) in written.items())
        assert all(after[name][0] == inode for name, (inode, _) in written.items())  # not rewritten
    for stage in ("sft", "optd"):
        (ours,) = (killed / "train" / stage / "checkpoints").glob("step-*/model.safetensors")
        (theirs,) = (reference / "train" / stage / "checkpoints").glob("step-*/model.safetensors")
        assert ours.read_bytes() == theirs.read_bytes(), stage
    assert figures(killed) == figures(reference)
