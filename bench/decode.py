"""Decoding cost of a trained ``checkpoint:`` simulator on a lake's held-out sessions: what the
fidelity study spends most of its evaluation on.

    python bench/decode.py --lake LAKE --checkpoint FOLDER [--sessions 24] [--rounds 2]

``LAKE`` is a lake the checkpoint was trained on (the fidelity study's ``WORK/lake``) and ``FOLDER``
its checkpoint (e.g. ``WORK/seed-0/sft/checkpoints/step-001000``). Each variant rolls out and replays
the same test sessions with the study's sampling (temperature 1.0, top-p 0.95, 96 new tokens, the
engine's 64 episodes at a time); the variants differ in how a row's top-p nucleus is found (among
``NUCLEUS_CANDIDATES`` likeliest tokens first, or by sorting the whole vocabulary) and in how many
prompts the checkpoint decodes together (``max_batch``). Rounds are interleaved, so each variant
sees the machine as busy as the others. Sampling is keyed by session and step, not by batch, so the
variants should write the same traces: the table counts those unlike the first variant's.
``--threads 1`` with one variant, run in two processes at once, measures what running the study's
seeds side by side would gain.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from hostinfo import describe as machine

import evaluation.checkpoint_simulator as checkpoint_module
from evaluation.checkpoint_simulator import CheckpointSettings, CheckpointSimulator
from evaluation.engine import replay, roll_out
from evaluation.environment import EnvironmentSettings
from evaluation.loader import load_sessions
from flows.evaluate import evaluated_ids
from transforms.records import recorded_prompt_settings

SAMPLING = {"temperature": 1.0, "top_p": 0.95, "max_new_tokens": 96, "seed": 42}
ENGINE_BATCH = 64
COLUMNS = ("variant", "outputs", "wall s (median)", "wall s (rounds)", "CPU s (median)", "load at start",
           "traces unlike the first variant's: rollouts, replayed steps")  # fmt: skip
HEADER = f"| {' | '.join(COLUMNS)} |\n|---|---:|---:|---|---:|---|---|"
#: name -> (candidates for the nucleus, max_batch); a candidate count past the vocabulary sorts it whole
VARIANTS = {
    "whole vocabulary sorted, 32 at once": (10**9, 32),
    "nucleus among 64 candidates, 32 at once": (64, 32),
    "nucleus among 64 candidates, 64 at once": (64, 64),
}


def answers(path: Path) -> list[str]:
    """Every simulator output written to a trace file, in order."""
    return [line for line in path.read_text().splitlines() if line.strip()]


def timed_variant(name: str, lake: Path, checkpoint: Path, session_ids: list[str], folder: Path) -> dict:
    candidates, max_batch = VARIANTS[name]
    checkpoint_module.NUCLEUS_CANDIDATES = candidates
    settings = EnvironmentSettings(prompt=recorded_prompt_settings(str(lake)))
    sessions = load_sessions(str(lake), session_ids, settings=settings)
    simulator = CheckpointSimulator(CheckpointSettings(path=str(checkpoint), max_batch=max_batch, **SAMPLING))
    load = os.getloadavg()[0]
    started, cpu = time.perf_counter(), time.process_time()
    outputs = 0
    for kind, phase in (("rollout", roll_out), ("replay", replay)):
        summary = phase(sessions, simulator, folder / f"{kind}.jsonl", source="checkpoint",
                        settings=settings, batch_size=ENGINE_BATCH)  # fmt: skip
        outputs += summary.outputs
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    return {"variant": name, "seconds": seconds, "cpu_s": cpu, "outputs": outputs, "load": load,
            "traces": [answers(folder / f"{kind}.jsonl") for kind in ("rollout", "replay")]}  # fmt: skip


def without_times(lines: list[str]) -> list[dict]:
    """Trace lines without what differs between two equal runs (wall-clock fields)."""
    rows = [json.loads(line) for line in lines]
    return [{k: v for k, v in row.items() if "time" not in k and "seconds" not in k} for row in rows]


def main(argv: list[str] | None = None) -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--lake", type=Path, required=True)
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--sessions", type=int, default=24, help="held-out test sessions")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--threads", type=int, default=None, help="torch's CPU threads (default: torch's)")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.threads:
        torch.set_num_threads(args.threads)
    session_ids = evaluated_ids(str(args.lake), "test", args.sessions)
    runs: dict[str, list[dict]] = {name: [] for name in args.variants}
    for _ in range(args.rounds):
        for name in args.variants:
            with tempfile.TemporaryDirectory(prefix="decode-") as folder:
                runs[name].append(timed_variant(name, args.lake, args.checkpoint, session_ids, Path(folder)))
    reference = [without_times(t) for t in runs[args.variants[0]][0]["traces"]]
    sizes = f"{len(session_ids)} test sessions, {args.rounds} rounds interleaved"
    print(f"Machine: {machine()}; {sizes}, {torch.get_num_threads()} torch threads\n")
    print(HEADER)
    for name, done in runs.items():
        print(table_row(name, done, reference))


def differing(reference: list[list[dict]], traces: list[list[dict]]) -> tuple[int, int]:
    """Rollout lines (one a session) and replay lines (one a step) unlike the reference's same line."""

    def keyed(lines: list[dict]) -> dict[tuple, dict]:
        return {(line["session_id"], line.get("step_index")): line for line in lines}

    def unlike(ref: list[dict], got: list[dict]) -> int:
        theirs = keyed(got)
        return sum(line != theirs.get(key) for key, line in keyed(ref).items())

    rollouts, replayed = (unlike(ref, got) for ref, got in zip(reference, traces, strict=True))
    return rollouts, replayed


def table_row(name: str, done: list[dict], reference: list[list[dict]]) -> str:
    unlike = [differing(reference, [without_times(t) for t in run["traces"]]) for run in done]
    walls = ", ".join(f"{run['seconds']:.1f}" for run in done)
    loads = ", ".join(f"{run['load']:.1f}" for run in done)
    wall = statistics.median(run["seconds"] for run in done)
    cpu = statistics.median(run["cpu_s"] for run in done)
    verdict = "; ".join(f"{rollouts}, {replayed}" for rollouts, replayed in unlike)
    return f"| {name} | {done[0]['outputs']} | {wall:.1f} | {walls} | {cpu:.1f} | {loads} | {verdict} |"


if __name__ == "__main__":
    main()
