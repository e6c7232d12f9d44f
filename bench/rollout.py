"""Rollout throughput of the engine: ``markov``, a tiny checkpoint (batched vs one session at a time),
and the ``openai:`` simulator against a local OpenAI-compatible server with 100 ms latency.

    python bench/rollout.py                 # all three, result appended to RESULTS.md
    python bench/rollout.py --no-append --only openai

The sessions are those of a lake ingested from a generated world (not timed). A *step* is one
simulator output judged by the environment (accepted or rejected), so the figures compare across
simulators whatever they answer. The tiny checkpoint is a randomly initialised 2-layer Llama (its
answers are rejected, so each episode is given ``max_try`` tries to keep it generating). The fake
server runs in a process of its own, so it does not share the client's interpreter, and answers every
prompt with a random executable action; the concurrency bound is concurrency / latency requests per
second.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hostinfo import describe as machine

from evaluation.engine import roll_out
from evaluation.environment import EnvironmentSettings
from evaluation.loader import load_sessions
from evaluation.openai_simulator import OpenAISimulator
from evaluation.rollout import Rollout
from evaluation.session import Session
from evaluation.simulators import RandomSimulator, Sampling, Simulator, simulator_for_lake
from extractors.fakeserver import FakeOpenAIServer
from synthetic.bundle import write_bundle
from tests.evaluation.tiny_model import save_tiny_llama
from transforms.ingest import ingest_bundle

LATENCY_S = 0.1
CONCURRENCY = 64


def timed(sessions: list[Session], simulator: Simulator, folder: Path, name: str, **engine) -> dict:
    load = os.getloadavg()[0]  # the machine is shared: how busy it was when this run began
    started, cpu = time.perf_counter(), time.process_time()
    summary = roll_out(sessions, simulator, folder / f"{name}.jsonl", source=name, **engine)
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    steps = summary.outputs
    rates = {"per_s": steps / seconds, "cpu_ms": 1000 * cpu / steps, "load": load}
    return {"name": name, "sessions": len(sessions), "steps": steps, "seconds": seconds, **rates}


def markov_runs(lake: Path, sessions: list[Session], folder: Path) -> list[dict]:
    markov = simulator_for_lake("markov", lake)
    return [
        timed(sessions, markov, folder, "markov, 64 sessions at once", batch_size=64),
        timed(sessions, markov, folder, "markov, one session at a time", batch_size=1),
    ]


def checkpoint_runs(sessions: list[Session], folder: Path, tokens: int, tries: int) -> list[dict]:
    import torch

    torch.set_num_threads(min(2, os.cpu_count() or 1))
    corpus = [m["content"] for s in sessions[:4] for m in Rollout(s).messages()]
    model = save_tiny_llama(folder / "tiny-llama", corpus)
    sim = simulator_for_lake(f"checkpoint:{model}", model, Sampling(max_new_tokens=tokens))
    settings = EnvironmentSettings(max_try=tries)
    label = f"tiny checkpoint ({tokens} new tokens)"
    together = f"{label}, {len(sessions)} sessions at once"
    return [
        timed(sessions, sim, folder, together, settings=settings, batch_size=len(sessions)),
        timed(sessions, sim, folder, f"{label}, one session at a time", settings=settings, batch_size=1),
    ]


def serve_shopper_answers() -> None:
    """The fake server answering each prompt with a random executable action (valid simulator JSON),
    until stdin closes: run in a process of its own by ``openai_run``."""
    chooser = RandomSimulator(seed=1)
    responder = lambda body: chooser.answer(body["messages"][-1]["content"])  # noqa: E731
    with FakeOpenAIServer(responder=responder, latency=LATENCY_S) as server:
        print(f"PORT {server.port}", flush=True)
        sys.stdin.read()


def openai_run(sessions: list[Session], folder: Path) -> dict:
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve-fake"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        port = int(server.stdout.readline().split()[1])
        spec = f"fake-model@http://127.0.0.1:{port}/v1"
        with OpenAISimulator.from_spec(spec, Sampling(max_new_tokens=64), concurrency=CONCURRENCY) as sim:
            name = f"openai, concurrency {CONCURRENCY}, {LATENCY_S * 1000:.0f} ms latency"
            run = timed(sessions, sim, folder, name, batch_size=CONCURRENCY)
    finally:
        server.stdin.close()
        server.wait(10)
    bound = CONCURRENCY / LATENCY_S
    return {**run, "bound": bound, "share": run["per_s"] / bound}


def world(folder: Path, users: int) -> Path:
    write_bundle(folder / "raw", users=users, seed=3, fmt="parquet", parts_per_table=1)
    ingest_bundle(folder / "raw", folder / "lake")
    return folder / "lake"


def append_result(runs: list[dict], command: str) -> None:
    rows = "\n".join(
        f"| {r['name']} | {r['sessions']:,} | {r['steps']:,} | {r['seconds']:.2f} | {r['per_s']:,.1f} "
        f"| {r['cpu_ms']:.2f} | {r['load']:.1f} |"
        for r in runs
    )
    lines = [
        f"## rollout — engine throughput ({datetime.now(UTC):%Y-%m-%d})",
        "",
        f"Command: `{command}`  ",
        f"Machine: {machine()}  ",
        "A step is one simulator output judged by the environment; CPU is this process's CPU time per step.",
        "",
        "| simulator | sessions | steps | seconds | steps/s | CPU ms/step | load average at start |",
        "|---|---|---|---|---|---|---|",
        rows,
    ]
    for r in (r for r in runs if "bound" in r):
        share = f"{r['per_s']:.0f} requests/s = {100 * r['share']:.0f} % of the concurrency bound"
        lines += ["", f"openai: {share} {r['bound']:.0f}/s (target >= 80 %)."]
    results = Path(__file__).with_name("RESULTS.md")
    results.write_text(results.read_text().rstrip("\n") + "\n\n" + "\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--users", type=int, default=600, help="shoppers of the generated world")
    parser.add_argument("--only", choices=["markov", "checkpoint", "openai"], action="append")
    parser.add_argument("--checkpoint-sessions", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=16, help="new tokens per checkpoint answer")
    parser.add_argument("--tries", type=int, default=4, help="max_try for the checkpoint's episodes")
    parser.add_argument("--no-append", action="store_true", help="print only, leave RESULTS.md alone")
    parser.add_argument("--serve-fake", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_fake:
        return serve_shopper_answers()
    chosen = args.only or ["markov", "checkpoint", "openai"]
    runs: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        lake = world(folder, args.users)
        sessions = load_sessions(lake)
        print(f"{len(sessions):,} sessions", flush=True)
        if "markov" in chosen:
            runs += markov_runs(lake, sessions, folder)
        if "checkpoint" in chosen:
            runs += checkpoint_runs(sessions[: args.checkpoint_sessions], folder, args.tokens, args.tries)
        if "openai" in chosen:
            runs.append(openai_run(sessions, folder))
    for run in runs:
        print(run, flush=True)
    if not args.no_append:
        append_result(runs, "python " + " ".join(sys.argv))


if __name__ == "__main__":
    main()
