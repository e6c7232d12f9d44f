"""Validation time of the ``steps`` gate at UserArena scale (about 578k actions).

    python bench/validate.py                                  # synthetic world, 11,010 users, ingested
    python bench/validate.py --source numpy                   # numpy-built steps, no ingest needed
    python bench/validate.py --reuse --lake LAKE [--all]      # a lake you already have

``synthetic`` writes a bundle with ``synthetic.bundle.write_bundle`` and ingests
it (neither timed). ``numpy`` builds a valid ``steps`` table directly: 64,729
sessions of 1 + Poisson(7.92) actions (8.92 on average as in DATA.md), legal
actions on each screen, clicks on visible cards. The gate then runs on
``steps`` (``--all``: every lake table) in a fresh process; wall time, CPU time
and peak RSS are of that process, GE import included. Target: <= 60 s on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hostinfo import describe as machine

from transforms.lake import write_table
from transforms.schemas import ACTION_GROUPS, PROFILE_FIELDS

ITEMS = 566_102
USERS = 11_010
# a 4-step cycle that is legal on its screens: scroll, click (opens visible[0]), detail scroll, back
CYCLE = (("feed", "scroll_down"), ("feed", "click"), ("ipv", "ipv_scroll_down"), ("ipv", "back_home"))


def steps_frame(sessions: int, seed: int = 42) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    lengths = 1 + rng.poisson(7.92, sessions)
    session = np.repeat(np.arange(sessions), lengths)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    step = np.arange(session.size) - np.repeat(starts, lengths)
    last = step == np.repeat(lengths - 1, lengths)
    user = rng.integers(0, USERS, sessions)[session]
    phase = step % 4
    screen = np.array([s for s, _ in CYCLE])[phase]
    action = np.where(last, "end", np.array([a for _, a in CYCLE])[phase])
    block_item = (session * 131 + (step // 4) * 7) % ITEMS
    frame = pl.DataFrame(
        {
            "session_id": pl.Series(session).cast(pl.String).str.pad_start(8, "0"),
            "user_id": pl.Series(user).cast(pl.String),
            "step": step.astype(np.int32),
            "ts": (1_740_000_000_000 + session * 60_000 + step * 9_000).astype("datetime64[ms]"),
            "screen": screen,
            "action": action,
            "distance": np.where(
                phase == 0, rng.integers(1, 695, step.size), rng.integers(1, 838, step.size)
            ),
            "scroll_top": (step // 4 * 300).astype(np.int32),
            "block_item": block_item,
            "user": user,
        }
    )
    return _finish(frame)


def _finish(frame: pl.DataFrame) -> pl.DataFrame:
    item = lambda k: pl.concat_str(pl.lit("i"), ((pl.col("block_item") + k) % ITEMS).cast(pl.String))  # noqa: E731
    feed, ipv = pl.col("screen") == "feed", pl.col("screen") == "ipv"
    scroll = pl.col("action").is_in(["scroll_down", "ipv_scroll_down"])
    profile = pl.struct([pl.lit("v").alias(f) for f in PROFILE_FIELDS])
    return frame.select(
        pl.concat_str(pl.lit("s"), "session_id").alias("session_id"),
        pl.concat_str(pl.lit("u"), "user_id").alias("user_id"),
        pl.col("step").cast(pl.Int32),
        pl.col("ts").dt.replace_time_zone("UTC"),
        "screen",
        "action",
        pl.col("action").replace_strict(ACTION_GROUPS).alias("action_group"),
        pl.when(pl.col("action") == "click").then(item(0)).alias("target_item_id"),
        pl.when(pl.col("action") == "click").then(pl.lit("a title")).alias("target_title"),
        pl.lit(None, dtype=pl.String).alias("review_alias"),
        pl.when(scroll).then(pl.col("distance")).cast(pl.Int32).alias("distance"),
        pl.when(feed).then(pl.col("scroll_top")).cast(pl.Int32).alias("scroll_top"),
        pl.when(feed).then(pl.concat_list([item(k) for k in range(4)])).alias("visible_items"),
        pl.when(feed).then(pl.lit("layout")).alias("visible_source"),
        pl.when(ipv).then(item(0)).alias("ipv_item_id"),
        pl.when(ipv).then(pl.lit("a title")).alias("ipv_item_title"),
        pl.when(ipv).then(pl.lit(0)).cast(pl.Int32).alias("ipv_scroll"),
        pl.when(ipv).then(pl.lit("main")).alias("ui_state"),
        profile.alias("profile"),
        pl.lit(None, dtype=pl.String).alias("profile_extra"),
        pl.lit(False).alias("profile_missing"),
        pl.lit(None, dtype=pl.String).alias("image"),
        pl.when(pl.col("user") % 10 == 0)
        .then(pl.lit("val"))
        .when(pl.col("user") % 10 == 1)
        .then(pl.lit("test"))
        .otherwise(pl.lit("train"))
        .alias("split"),
        (pl.col("user") % 4).cast(pl.Int32).alias("bucket"),
    )


def time_gate(lake: str, batch_rows: int, tables: list[str] | None) -> None:
    """Child process: one gate run; prints a JSON line."""
    load = os.getloadavg()[0]
    started = time.perf_counter()
    from validation.gate import run_gate

    summary = run_gate(lake, tables, stage="bench", batch_rows=batch_rows)
    wall = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(
        json.dumps(
            {
                "rows": {t: r.rows_in for t, r in summary.tables.items()},
                "ok": summary.ok,
                "wall_s": round(wall, 2),
                "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
                "peak_rss_mb": round(usage.ru_maxrss / 1024),
                "load_at_start": round(load, 1),
                "checks": len(summary.outcomes),
            }
        )
    )


def synthetic_lake(lake: str, users: int) -> None:
    from synthetic.bundle import write_bundle
    from transforms.ingest import ingest_bundle

    raw = f"{lake}-raw"
    write_bundle(raw, users=users, seed=7, overwrite=True)
    ingest_bundle(raw, lake)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", choices=("synthetic", "numpy"), default="synthetic")
    parser.add_argument("--users", type=int, default=11_010, help="synthetic shoppers")
    parser.add_argument("--sessions", type=int, default=64_729, help="numpy sessions")
    parser.add_argument("--lake", default="/tmp/trajforge-bench-validate")
    parser.add_argument("--batch-rows", type=int, default=200_000)
    parser.add_argument("--reuse", action="store_true", help="time the gate on the existing lake")
    parser.add_argument("--all", action="store_true", help="every lake table, not only steps")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--build", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    tables = None if args.all else ["steps"]
    if args.child:
        time_gate(args.lake, args.batch_rows, tables)
        return
    if args.build:
        build_lake(args)
        return
    if not args.reuse:
        # its own process too: Linux keeps ru_maxrss across fork+exec, so a big parent
        # would inflate the gate's peak RSS
        started = time.perf_counter()
        subprocess.run([*_me(args), "--build", "--source", args.source], check=True)
        print(f"built the {args.source} lake {args.lake} in {time.perf_counter() - started:.1f}s (not timed)")
    child = [*_me(args), "--child", *(["--all"] if args.all else [])]
    out = subprocess.run(child, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
    print(f"machine: {machine()}")
    print(out)


def _me(args: argparse.Namespace) -> list[str]:
    sizes = ["--users", str(args.users), "--sessions", str(args.sessions)]
    return [sys.executable, __file__, "--lake", args.lake, "--batch-rows", str(args.batch_rows), *sizes]


def build_lake(args: argparse.Namespace) -> None:
    if args.source == "numpy":
        write_table(args.lake, "steps", steps_frame(args.sessions))
    else:
        synthetic_lake(args.lake, args.users)


if __name__ == "__main__":
    main()
