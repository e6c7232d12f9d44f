"""Scoring time of ``trajforge score`` at UserArena scale (about 578k actions per side).

    python bench/score.py                      # 64,729 sessions per side, result appended to RESULTS.md
    python bench/score.py --sessions 2000 --no-append

Writes three JSONL files in a temporary folder (not timed): real traces, simulated traces and a
replay trace with one prediction per real step. Sessions are random but plausible: a walk over the
two screens (scrolls, clicks that open a detail page, detail-page looks, cart/buy, back, end) with a
per-session budget of 1 + Poisson(7.92) actions, 8.92 on average as in DATA.md; the simulated side
walks with other probabilities, rejects ~5 % of its outputs and hits the budget now and then; the
replay predicts the recorded action 60 % of the time. Then it times reading the three files and
scoring them in this process, as the command does.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hostinfo import describe as machine

from evaluation.scorecard import score
from evaluation.traces import load_replay, load_traces
from transforms.schemas import ACTIONS, FEED_ACTIONS, IPV_ACTIONS

SESSIONS = 64_729
USERS = 11_010
CATEGORIES = [f"top{t}-mid{m}-leaf{leaf}" for t in range(12) for m in range(3) for leaf in range(3)]
FEED_MOVES, IPV_MOVES = FEED_ACTIONS, IPV_ACTIONS  # the probabilities below follow their order
REAL_FEED = np.array([0.55, 0.08, 0.25, 0.12])
REAL_IPV = np.array([0.25, 0.05, 0.15, 0.06, 0.05, 0.04, 0.05, 0.03, 0.28, 0.04])
SIM_FEED = np.array([0.50, 0.10, 0.28, 0.12])
SIM_IPV = np.array([0.22, 0.06, 0.16, 0.05, 0.06, 0.03, 0.07, 0.02, 0.29, 0.04])


def walk(
    rng: np.random.Generator, budget: int, feed_p: np.ndarray, ipv_p: np.ndarray, end_on_budget: bool
) -> list[tuple]:
    """(screen, action, item) per step. A real walk ends exactly at its budget with ``end``; a simulated
    one may end earlier, or run out of budget without ending (truncated)."""
    steps, screen, item = [], "feed", None
    for position in range(budget):
        moves, probabilities = (FEED_MOVES, feed_p) if screen == "feed" else (IPV_MOVES, ipv_p)
        if end_on_budget:
            probabilities = np.where(np.array(moves) == "end", 0.0, probabilities)
            probabilities = probabilities / probabilities.sum()
        action = moves[rng.choice(len(moves), p=probabilities)]
        if end_on_budget and position == budget - 1:
            action = "end"
        if action == "click":
            item = int(rng.integers(0, 50_000))
        steps.append((screen, action, item if (action == "click" or screen == "ipv") else None))
        if action == "end":
            break
        screen = "ipv" if action == "click" else "feed" if action == "back_home" else screen
    return steps


def step_record(screen: str, action: str, item: int | None, rng: np.random.Generator) -> dict:
    return {
        "screen": screen,
        "action": action,
        "target_item_id": None if item is None else f"i{item}",
        "review_alias": "C1" if action == "ipv_click_comment" else None,
        "accepted": True,
        "reject_reason": None,
        "item_category": None if item is None else CATEGORIES[item % len(CATEGORIES)],
        "item_price": None if item is None else float(10 + item % 500),
        "raw_output": None,
    }


def session_record(
    index: int, source: str, steps: list[dict], truncated: bool, rng: np.random.Generator
) -> dict:
    user = index % USERS
    return {
        "session_id": f"s{index}",
        "user_id": f"u{user}",
        "source": source,
        "terminated": not truncated,
        "truncated": truncated,
        "termination_reason": "budget" if truncated else "end",
        "profile": {
            "prior_clicks": int(user * 7 % 60),
            "prior_buys": int(user % 5 == 0) * int(user % 4),
            "recent_click_categories": [CATEGORIES[(user + k) % len(CATEGORIES)] for k in range(user % 6)],
        },
        "steps": steps,
    }


def write_files(folder: Path, sessions: int, seed: int) -> dict[str, int]:
    rng = np.random.default_rng(seed)
    budgets = 1 + rng.poisson(7.92, size=sessions)
    counts = {"real_steps": 0, "sim_steps": 0, "replay_steps": 0}
    with (
        (folder / "real.jsonl").open("w") as real_file,
        (folder / "sim.jsonl").open("w") as sim_file,
        (folder / "replay.jsonl").open("w") as replay_file,
    ):
        for index, budget in enumerate(budgets):
            real = [step_record(*s, rng) for s in walk(rng, int(budget), REAL_FEED, REAL_IPV, True)]
            real_file.write(json.dumps(session_record(index, "real", real, False, rng)) + "\n")
            sim = [step_record(*s, rng) for s in walk(rng, 31, SIM_FEED, SIM_IPV, False)]
            for step in sim:
                if rng.random() < 0.05:
                    step.update(accepted=False, reject_reason="illegal_in_state")
            truncated = sim[-1]["action"] != "end"
            sim_file.write(json.dumps(session_record(index, "bench", sim, truncated, rng)) + "\n")
            for position, step in enumerate(real):
                hit = rng.random() < 0.6
                predicted = step["action"] if hit else ACTIONS[int(rng.integers(0, len(ACTIONS)))]
                replay_file.write(
                    json.dumps(
                        {
                            "session_id": f"s{index}",
                            "step_index": position,
                            "screen": step["screen"],
                            "gt_action": step["action"],
                            "gt_target_item_id": step["target_item_id"]
                            if step["action"] == "click"
                            else None,
                            "pred_action": predicted,
                            "pred_target_item_id": step["target_item_id"] if hit else None,
                            "accepted": rng.random() < 0.95,
                        }
                    )
                    + "\n"
                )
            counts["real_steps"] += len(real)
            counts["sim_steps"] += len(sim)
            counts["replay_steps"] += len(real)
    return counts


def timed_score(folder: Path) -> dict[str, float]:
    load = os.getloadavg()[0]  # the machine is shared: how busy it was when this run began
    started = time.perf_counter()
    real, sim = load_traces(folder / "real.jsonl"), load_traces(folder / "sim.jsonl")
    replay = load_replay(folder / "replay.jsonl")
    loaded = time.perf_counter()
    figures = score(real, sim, replay)
    done = time.perf_counter()
    return {
        "read_s": loaded - started,
        "score_s": done - loaded,
        "total_s": done - started,
        "load": load,
        "PF": figures["PF"],
    }


def append_result(counts: dict[str, int], runs: list[dict[str, float]], command: str) -> None:
    totals = sorted(run["total_s"] for run in runs)
    median = totals[len(totals) // 2]
    rows = "\n".join(
        f"| {i + 1} | {run['read_s']:.2f} | {run['score_s']:.2f} | {run['total_s']:.2f} | {run['load']:.1f} |"
        for i, run in enumerate(runs)
    )
    lines = [
        f"## score — traces at UserArena scale ({datetime.now(UTC):%Y-%m-%d})",
        "",
        f"Command: `{command}`  ",
        f"Machine: {machine()}  ",
        f"Traces: {counts['real_steps']:,} real steps, {counts['sim_steps']:,} simulated steps "
        f"(5 % rejected), {counts['replay_steps']:,} replay rows; writing them is not timed",
        "",
        "| run | read s | score s | total s | load average at start |",
        "|---|---|---|---|---|",
        rows,
        "",
        f"Median total = {median:.2f} s (target <= 30 s): reading the three JSONL files and computing every "
        "`trajforge score` figure, each run in a fresh process.",
    ]
    section = "\n" + "\n".join(lines) + "\n"
    results = Path(__file__).with_name("RESULTS.md")
    results.write_text(results.read_text().rstrip("\n") + "\n" + section)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sessions", type=int, default=SESSIONS)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--no-append", action="store_true", help="print only, leave RESULTS.md alone")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        counts = write_files(folder, args.sessions, args.seed)
        print(json.dumps(counts))
        runs = []
        for _ in range(args.repeat):
            # a fresh process per run, so no run reuses another's warm caches
            out = subprocess.run(
                [sys.executable, __file__, "--time-only", str(folder)],
                capture_output=True,
                text=True,
                check=True,
            )
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(json.dumps(runs[-1]))
    if not args.no_append:
        append_result(counts, runs, "python " + " ".join(["bench/score.py", *sys.argv[1:]]))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--time-only":
        print(json.dumps(timed_score(Path(sys.argv[2]))))
    else:
        main()
