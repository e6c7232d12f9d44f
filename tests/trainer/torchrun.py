"""Two ``torchrun`` ranks on CPU (gloo) for the distributed tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def two_ranks(*arguments: str, timeout: float = 300) -> str:
    """``torchrun --nproc_per_node 2`` with ``arguments`` (a script and its own); returns what it printed.

    On a timeout (ranks waiting on each other) torchrun is told to stop: it ends its workers, which run
    in sessions of their own and would outlive a killed torchrun.
    """
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    env.pop("WORLD_SIZE", None)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    with subprocess.Popen(
        [*command, *arguments], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as workers:
        try:
            stdout, stderr = workers.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            workers.terminate()
            workers.communicate(timeout=60)
            raise
    assert workers.returncode == 0, stderr[-4000:]
    return stdout
