"""``trajforge evaluate`` killed outright (SIGKILL) while it writes traces: no process of its own
outlives it (Prefect's temporary API server included), and the same command run again writes the
traces and report.json figures of a run never stopped.

Three evaluations of a 120-shopper world's first 30 test sessions (markov and random, the A/B
effect over 10 users), each starting its own temporary Prefect server: about a minute on two cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.flows.generated_lakes import generated_lake

ROOT = Path(__file__).resolve().parents[2]
SPECS = ("markov", "random")
SESSIONS = 30


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> Path:
    return generated_lake(tmp_path_factory.mktemp("killed"), users=120, seed=9)


def command(lake: Path, out: Path) -> list[str]:
    args = [sys.executable, "-m", "cli", "evaluate", "--lake", str(lake), "--out", str(out)]
    args += ["--sessions", str(SESSIONS), "--batch-size", "1", "--effect-users", "10", "--seed", "3"]
    return args + [arg for spec in SPECS for arg in ("--simulator", spec)]


def environment(home: Path) -> dict[str, str]:
    """The test's environment for a command of its own: this checkout's code, its own Prefect home and
    temporary server (never the test session's API)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    path = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env | {"PYTHONPATH": path, "PREFECT_HOME": str(home), "PREFECT_LOGGING_TO_API_ENABLED": "false"}


def run(lake: Path, out: Path, home: Path) -> subprocess.CompletedProcess:
    done = subprocess.run(
        command(lake, out), env=environment(home), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def parents() -> dict[int, int]:
    """pid -> parent pid of every live process (zombies, already ended, left out)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                found[int(entry.name)] = int(fields[1])
    return found


def descendants(pid: int) -> set[int]:
    tree, found, frontier = parents(), set(), {pid}
    while frontier:
        frontier = {child for child, parent in tree.items() if parent in frontier} - found
        found |= frontier
    return found


def command_line(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


@pytest.fixture(scope="module")
def killed(lake: Path, tmp_path_factory) -> dict:
    """An evaluation SIGKILLed once its first simulator has written a few traces (of 30): its folder and
    the processes it had started."""
    root = tmp_path_factory.mktemp("killed-run")
    out = root / "out"
    process = subprocess.Popen(command(lake, out), env=environment(root / "prefect"),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    deadline = time.monotonic() + 300
    while process.poll() is None and time.monotonic() < deadline:
        written = [lines(p) for p in out.glob("markov-*.rollout.jsonl")]
        if written and written[0] >= 3:
            break
        time.sleep(0.02)
    assert process.poll() is None, process.stderr.read().decode()[-3000:] if process.stderr else ""
    children = descendants(process.pid)
    process.kill()
    process.wait()
    process.stderr.close()
    rollout = next(out.glob("markov-*.rollout.jsonl"))
    return {"out": out, "children": children, "written": lines(rollout), "home": root / "prefect"}


def test_a_sigkilled_command_leaves_no_process_behind(killed: dict):
    servers = [pid for pid in killed["children"] if "uvicorn" in command_line(pid)]
    assert servers, "the command had started Prefect's temporary API server"
    # the server notices within half a second that its parent is gone, and shuts down
    deadline = time.monotonic() + 20
    while (alive := killed["children"] & set(parents())) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive, {pid: command_line(pid) for pid in alive}


def test_a_sigkilled_evaluation_run_again_equals_one_never_stopped(lake: Path, killed: dict, tmp_path):
    assert 3 <= killed["written"] < SESSIONS  # killed part way through the first simulator's rollouts
    run(lake, killed["out"], killed["home"])
    whole = tmp_path / "whole"
    run(lake, whole, tmp_path / "prefect")
    resumed = json.loads((killed["out"] / "report.json").read_text())
    uninterrupted = json.loads((whole / "report.json").read_text())
    assert resumed["runs"]["markov"]["rollout"]["resumed"] == killed["written"]
    # every figure, the effect's included, and every trace line (in the order sessions finished)
    assert resumed["simulators"] == uninterrupted["simulators"]
    for spec in SPECS:
        for kind in ("rollout", "replay"):
            ours = Path(resumed["traces"][spec][kind]).read_text().splitlines()
            theirs = Path(uninterrupted["traces"][spec][kind]).read_text().splitlines()
            assert sorted(ours) == sorted(theirs), (spec, kind)
