"""The main job's first run and its unchanged rerun in the same workdir, stage by stage.

    python bench/main_job_rerun.py --workdir /tmp/main-job [--users 300]

Runs ``trajforge run`` twice (the embedded default, each a fresh process) and writes
``bench/results/main_job_rerun.json``: the wall seconds of each run, each stage's seconds and whether
Prefect's cache served it, and whether any checkpoint file changed between the two runs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hostinfo import describe as machine  # noqa: E402 - bench/ is the script's folder

STAGE_ROW = re.compile(
    r"^[│|]\s*(?P<stage>[a-z][a-z ]+?)\s*[│|]\s*(?P<seconds>[\d.]+)\s*[│|]\s*(?P<cached>✓?)\s*[│|]$"
)


def run_once(workdir: Path, users: int) -> dict:
    env = {**os.environ, "COLUMNS": "200", "HF_HUB_OFFLINE": "1"}
    command = [
        str(ROOT / ".venv" / "bin" / "trajforge"),
        "run",
        "--workdir",
        str(workdir),
        "--users",
        str(users),
    ]
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - started
    stages = {}
    for line in done.stdout.splitlines():
        row = STAGE_ROW.match(line.strip())
        if row:
            stages[row["stage"]] = {"seconds": float(row["seconds"]), "cached": bool(row["cached"])}
    return {"wall_s": round(wall, 1), "stages": stages}


def checkpoint_files(workdir: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(workdir)): (p.stat().st_mtime_ns, p.stat().st_size)
        for p in sorted((workdir / "train").rglob("*"))
        if p.is_file()
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--users", type=int, default=300)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "main_job_rerun.json")
    args = parser.parse_args()
    shutil.rmtree(args.workdir, ignore_errors=True)
    first = run_once(args.workdir, args.users)
    trained = checkpoint_files(args.workdir)
    again = run_once(args.workdir, args.users)
    result = {
        "machine": machine(),
        "command": f"trajforge run --workdir {args.workdir} --users {args.users}, twice",
        "first": first,
        "unchanged_rerun": again,
        "rerun_share": round(again["wall_s"] / first["wall_s"], 3),
        "training_files_rewritten": sorted(
            k for k, v in checkpoint_files(args.workdir).items() if trained.get(k) != v
        ),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
