"""A command says which Prefect server its flows report to when ``PREFECT_API_URL`` names one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def chain_on_a_missing_lake(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """``trajforge chain`` stops at its lake check, before any flow asks the server anything."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    command = [sys.executable, "-m", "cli", "chain", "--lake", str(tmp_path / "missing")]
    return subprocess.run(
        command, env=base | {"PYTHONPATH": str(ROOT), **env}, capture_output=True, text=True, timeout=120
    )


def test_a_configured_server_is_named(tmp_path):
    done = chain_on_a_missing_lake(tmp_path, PREFECT_API_URL="http://127.0.0.1:4299/api")
    assert done.returncode == 1
    assert "flows report to the Prefect server at http://127.0.0.1:4299/api" in done.stderr


def test_without_one_nothing_is_claimed(tmp_path):
    done = chain_on_a_missing_lake(tmp_path)
    assert done.returncode == 1 and "Prefect server at" not in done.stderr
