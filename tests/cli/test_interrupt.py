"""Ctrl-C as a terminal sends it, to the whole process group: a command ends in seconds, says what it
kept, exits 130, and a re-run resumes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from typer.testing import CliRunner

from cli.app import app
from cli.interrupt import guarded, interrupted_line, keep_api_server_through_interrupts
from extractors.fakeserver import FakeOpenAIServer
from tests.extractors.tinylake import write_tiny_lake
from transforms.lake import read_lake_table

JOBS = 23  # the tiny lake: 4 intent jobs + 19 rationale jobs, one request each when answered well


def _extract_args(lake: str, server: FakeOpenAIServer) -> list[str]:
    return ["extract", "--lake", lake, "--backend", "openai", "--base-url", server.base_url]


def test_ctrl_c_ends_extract_in_seconds_and_a_rerun_resumes(prefect_harness, tmp_path):
    lake = str(write_tiny_lake(tmp_path / "lake").path)
    env = os.environ | {
        "COLUMNS": "200",
        "INTERRUPT_TEST_KEY": "sk-test",
        "TRAJFORGE_EXTRACT_PROGRESS": "false",
    }
    options = ["--model", "m", "--api-key-env", "INTERRUPT_TEST_KEY", "--concurrency", "1"]
    # one request at a time, half a second each: the run is mid-way for ~10 s
    with FakeOpenAIServer(latency=0.5) as server:
        command = [sys.executable, "-m", "cli", *_extract_args(lake, server), *options]
        run = subprocess.Popen(
            command,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        deadline = time.monotonic() + 240
        while len(server.chat_requests()) < 3 and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        asked = len(server.chat_requests())
        assert run.poll() is None and 3 <= asked < JOBS, asked
        os.killpg(run.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        interrupted = time.monotonic()
        try:
            output, _ = run.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(run.pid, signal.SIGKILL)
            output, _ = run.communicate()
        ended_after = time.monotonic() - interrupted
        assert run.returncode == 130, output
        assert ended_after < 10 and interrupted_line("extract") in output
        assert "Traceback" not in output and "ConnectError" not in output

        server.reset()
        rerun = CliRunner().invoke(app, [*_extract_args(lake, server), *options], env=env)
        resent = len(server.chat_requests())
    assert rerun.exit_code == 0, rerun.output
    # the answers received before the interrupt are cached: at most the one in flight is asked again
    assert JOBS - asked <= resent <= JOBS - asked + 1
    assert read_lake_table(lake, "rationales").height == 19 and read_lake_table(lake, "intents").height == 4


def test_the_line_names_the_command_to_rerun():
    assert "run `trajforge chain` again" in interrupted_line("chain")
    assert interrupted_line(None).startswith("interrupted: the lake keeps its previous tables")


def test_an_interrupted_train_is_continued_with_resume():
    # train run again as it was refuses the --out its interrupted run left: --resume continues that run
    line = interrupted_line("train")
    assert "checkpoints stay in --out" in line
    assert "the same `trajforge train` command with --resume added" in line
    assert "again with the same options" not in line


def test_prefect_starts_its_server_outside_the_terminals_process_group():
    from prefect.server.api import server

    keep_api_server_through_interrupts()
    keep_api_server_through_interrupts()  # a second call changes nothing
    # the same call Prefect makes for its server: the child leads a session of its own
    child = server.subprocess.Popen(
        [sys.executable, "-c", "import os; print(os.getsid(0))"], stdout=subprocess.PIPE, text=True
    )
    out, _ = child.communicate(timeout=60)
    assert int(out) == child.pid != os.getsid(0)
    assert server.subprocess.TimeoutExpired is subprocess.TimeoutExpired  # the rest of the module as is


def test_an_interrupted_evaluate_is_resumed_by_the_same_command():
    line = interrupted_line("evaluate")
    assert "every session's finished trace stays in --out" in line
    assert "run the same `trajforge evaluate` command again to resume" in line
    assert "the lake keeps its previous tables" not in line


def test_a_guarded_server_ends_when_its_parent_is_killed(tmp_path):
    (tmp_path / "sleeper.py").write_text("import time\ntime.sleep(120)\n")
    assert guarded([sys.executable, "-m", "sleeper", "--port", "1"])[3:] == [
        str(os.getpid()),
        "sleeper",
        "--port",
        "1",
    ]
    # a parent starts the sleeper as Prefect starts its server, prints its pid and dies without cleaning up
    parent = (
        "import os, subprocess, sys\n"
        "from cli.interrupt import guarded\n"
        f"child = subprocess.Popen(guarded([sys.executable, '-m', 'sleeper']), cwd={str(tmp_path)!r}, "
        "start_new_session=True)\n"
        "print(child.pid, flush=True)\n"
        "os.kill(os.getpid(), 9)\n"
    )
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(tmp_path), str(Path(__file__).parents[2])])}
    done = subprocess.run([sys.executable, "-c", parent], env=env, capture_output=True, text=True, timeout=60)
    child = int(done.stdout)
    # the guard checks its parent twice a second; SIGTERM ends the sleeper at once
    deadline = time.monotonic() + 10
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(child)


def alive(pid: int) -> bool:
    """Running (a zombie, ended but not yet reaped by its new parent, is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
