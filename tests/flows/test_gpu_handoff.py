"""The GPU hand-off against a real Prefect server: a local ``prefect server``, the ``trajforge`` and
``gpu`` process pools, the deployments registered by Prefect's own loader (``prefect deploy --all``
on prefect.yaml), a process worker per pool, and the main job handing its training and evaluation to
the gpu pool's deployments through ``run_deployment``, to a checkpoint and a report.

One server, two workers and a small main job (40 shoppers, a few updates): about two minutes.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.cli.test_cli import SMALL_RUN

ROOT = Path(__file__).resolve().parents[2]
PREFECT = str(Path(sys.executable).parent / "prefect")
HANDED_OFF = {"train-sft", "train-optd", "evaluate"}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def environment(home: Path, api: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    return env | {
        "PREFECT_HOME": str(home), "PREFECT_API_URL": api, "PYTHONPATH": str(ROOT), "TRAJFORGE_CODE": str(ROOT),
        "PREFECT_WORKER_QUERY_SECONDS": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1", "COLUMNS": "200",
    }  # fmt: skip


def start(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with log.open("w") as out:
        return subprocess.Popen(command, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip


def wait_healthy(api: str, server: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert server.poll() is None, log.read_text()[-2000:]
        try:
            if httpx.get(f"{api}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError("the Prefect server did not answer within 2 minutes")


def prefect(args: list[str], env: dict[str, str]) -> str:
    done = subprocess.run([PREFECT, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout


def flow_runs(api: str) -> list[dict]:
    return httpx.post(f"{api}/flow_runs/filter", json={"limit": 200}, timeout=10).json()


def deployment_names(api: str) -> dict[str, tuple[str, str]]:
    """deployment id -> (name, work pool)."""
    listed = httpx.post(f"{api}/deployments/filter", json={}, timeout=10).json()
    return {d["id"]: (d["name"], d["work_pool_name"]) for d in listed}


@pytest.mark.slow
def test_the_main_job_hands_training_and_evaluation_to_the_gpu_pool(tmp_path):
    api = f"http://127.0.0.1:{free_port()}/api"
    env = environment(tmp_path / "home", api)
    port = api.rsplit(":", 1)[1].split("/")[0]
    processes = [start([PREFECT, "server", "start", "--host", "127.0.0.1", "--port", port], env,
                       tmp_path / "server.log")]  # fmt: skip
    try:
        wait_healthy(api, processes[0], tmp_path / "server.log")
        for pool in ("trajforge", "gpu"):
            prefect(["work-pool", "create", pool, "--type", "process"], env)
        prefect(["--no-prompt", "deploy", "--all"], env)
        declared = deployment_names(api)
        assert {name for name, pool in declared.values() if pool == "gpu"} == HANDED_OFF
        assert ("nightly", "trajforge") in declared.values()
        for pool in ("trajforge", "gpu"):
            processes.append(
                start([PREFECT, "worker", "start", "--pool", pool], env, tmp_path / f"{pool}.log")
            )
        config = tmp_path / "handoff.toml"
        config.write_text(SMALL_RUN + "hand_off = true\n")  # SMALL_RUN ends in its [main_job] table
        workdir = tmp_path / "job"
        command = [sys.executable, "-m", "cli", "run", "--users", "40", "--seed", "5",
                   "--workdir", str(workdir), "--config", str(config)]  # fmt: skip
        done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert f"flows report to the Prefect server at {api}" in done.stderr

        # the gpu pool's worker ran the three stages, each a completed run of its deployment
        runs = [r for r in flow_runs(api) if r["state_type"] != "SCHEDULED"]  # the nightly's are ahead
        handed = {declared[r["deployment_id"]][0]: r for r in runs if r["deployment_id"] in declared}
        assert set(handed) == HANDED_OFF
        assert all(r["state_type"] == "COMPLETED" and r["work_pool_name"] == "gpu" for r in handed.values())
        main_job = next(r for r in runs if r["deployment_id"] is None and r["parent_task_run_id"] is None)
        assert main_job["state_type"] == "COMPLETED"
        # and what they wrote is where the main job reads it: a checkpoint and its report
        (checkpoint,) = (workdir / "train" / "optd" / "checkpoints").glob("step-*")
        assert (checkpoint / "model.safetensors").is_file()
        report = json.loads((workdir / "evaluation" / "report.json").read_text())
        assert next(iter(report["simulators"])) == f"checkpoint:{checkpoint}"
        assert "gpu" in (tmp_path / "gpu.log").read_text() and "train" in (tmp_path / "gpu.log").read_text()
    finally:
        for process in processes:
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
