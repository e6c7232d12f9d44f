"""A new day of logs: the pipeline on a lake that has every day before it, against a full recompute.

    python bench/incremental_day.py --workdir /tmp/incremental-day [--users 11010] [--seed 42]

Generates a bundle (``synthetic.bundle``), cuts it by day (``synthetic.days``): the bundle through
the day before ``D`` (the last day with at least the median day's events) and through ``D``. The
pipeline (ingest -> chain -> extraction states -> extract -> records, each gated) runs on the first
into a lake; the new day's files are copied into its raw folder and the pipeline runs again on that
lake (the incremental day); then the pipeline runs on the bundle through ``D`` into a fresh lake (the
full recompute). Both runs happen in this one process, side by side. Every table of the two lakes
is compared, sorted. Writes ``bench/results/incremental_day.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PREFECT_HOME", str(ROOT / ".prefect"))
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")

import polars as pl  # noqa: E402
from hostinfo import describe as machine  # noqa: E402 - bench/ is the script's folder

from flows.pipeline import pipeline_flow  # noqa: E402
from flows.stages import states_folder  # noqa: E402
from synthetic.bundle import write_bundle  # noqa: E402
from synthetic.days import add_new_files, bundle_through, event_days  # noqa: E402
from transforms.lake import differing_tables  # noqa: E402
from transforms.schemas import LAKE_TABLES  # noqa: E402

COMPARED = (*LAKE_TABLES, "quarantine")


def new_day(source: Path) -> tuple[str, str, int]:
    """(the day before, the new day, its events): the last day with at least the median day's events."""
    counts = (
        pl.scan_parquet(source / "events" / "*.parquet")
        .group_by(pl.col("ts").dt.strftime("%Y%m%d").alias("day"))
        .len()
        .sort("day")
        .collect()
    )
    typical = counts.filter(pl.col("len") >= counts["len"].median())
    day, events = typical.row(-1)
    days = event_days(source)
    return days[days.index(day) - 1], day, events


def timed(raw: Path, lake: Path) -> dict:
    started = time.perf_counter()
    result = pipeline_flow(str(raw), str(lake))
    return {
        "wall_s": round(time.perf_counter() - started, 1),
        "stages": result["stages"],
        "steps": result["ingest"]["output_rows"]["steps"],
        "ingest_increment": {
            k: len(v) if k == "files_read" else v for k, v in result["ingest"].get("increment", {}).items()
        },
        "records_users_rendered": result["records"]["records"].get("users_rendered"),
        "records_users_kept": result["records"]["records"].get("users_kept"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--users", type=int, default=11_010)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "incremental_day.json")
    args = parser.parse_args()
    work = args.workdir
    shutil.rmtree(work, ignore_errors=True)
    write_bundle(work / "generated", users=args.users, seed=args.seed)
    before_day, day, events = new_day(work / "generated")
    bundle_through(work / "generated", work / "raw", before_day)
    bundle_through(work / "generated", work / "through-day", day)

    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        first = timed(work / "raw", work / "lake")
        added = add_new_files(work / "raw", work / "through-day")
        incremental = timed(work / "raw", work / "lake")
        full = timed(work / "through-day", work / "fresh-lake")
    differences = differing_tables(work / "lake", work / "fresh-lake", COMPARED)
    states = differing_tables(states_folder(work / "lake"), states_folder(work / "fresh-lake"), ["records"])
    result = {
        "machine": machine(),
        "command": " ".join(["python", "bench/incremental_day.py", *sys.argv[1:]]),
        "users": args.users,
        "seed": args.seed,
        "new_day": day,
        "new_day_events": events,
        "files_added": added,
        "days_before": before_day,
        "first_run": first,
        "incremental_day": incremental,
        "full_recompute": full,
        "incremental_share": round(incremental["wall_s"] / full["wall_s"], 3),
        "tables_differing": {**differences, **{f"extraction states {k}": v for k, v in states.items()}},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
