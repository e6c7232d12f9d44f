"""Extraction client benchmark against the local OpenAI-compatible server with simulated latency.

    python bench/extract.py                        # latency 100 ms, concurrency 1, 8, 64
    python bench/extract.py --latency 0.05 --concurrency 1,16,128 --no-record
    python bench/extract.py --served --sessions sB1,sC   # a real model behind `transformers serve`

The fake server runs in its own process (``python -m extractors.fakeserver``), so
the CPU measured here is the client's alone. With latency L and concurrency C no
client can exceed C / L requests per second: that is the bound each row is
compared with. Two paths are measured:

- ``client``: ``LLMClient.complete`` on distinct prompts, response cache off (HTTP,
  our retry wrapper, JSON decoding, token/cost accounting);
- ``rationale``: the whole per-request work of the openai backend: the same call
  with the response cache on (one file written per answer), pydantic validation of
  the answer and the leakage checker against a 60-item trajectory.

Writes (or replaces) the "## extract" section of bench/RESULTS.md unless ``--no-record``.

``--served [FOLDER]`` measures a real model instead: ``transformers serve`` on
CPU serving FOLDER (default: SmolLM2-135M-Instruct, converted on first use by
``trainer.pretrained``), and the whole openai backend (``extract_lake``) on the
hand-built lake of the tests, cut to ``--sessions``. It reports the share of
jobs accepted at the first answer, after a re-ask, and quarantined by reason,
how many answers had their JSON dug out of fences or prose, and requests/s;
the result is appended to bench/RESULTS.md as a new section.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hostinfo import describe as machine  # noqa: E402 - bench/ is the script's folder

from extractors.answer import ask_until_clean  # noqa: E402
from extractors.cache import ResponseCache  # noqa: E402
from extractors.client import LLMClient, Stats  # noqa: E402
from extractors.config import ExtractSettings  # noqa: E402
from extractors.leakage import IndexEntry, LeakIndex, check_rationale  # noqa: E402
from extractors.prompts import RATIONALE_V1  # noqa: E402
from extractors.schemas import RationaleAnswer  # noqa: E402

CONTEXT = "## Current observation\nFeed, cards in view:\n" + "\n".join(
    f"[{n}] Brand{n} Relaxed Cotton Shirt {n}, {20 + n}.90" for n in range(1, 9)
)


def start_server(latency: float) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "extractors.fakeserver", "--latency", str(latency)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert proc.stdout is not None
    port = int(proc.stdout.readline().split()[1])
    return proc, f"http://127.0.0.1:{port}/v1"


def leak_index() -> LeakIndex:
    entries = [
        IndexEntry(f"i{n}", f"i_{n:016x}", f"Brand{n} Relaxed Cotton Shirt {n}", 20.9 + n) for n in range(60)
    ]
    return LeakIndex.build(entries, identifiers=["u_00000000000000aa"])


async def measure(settings: ExtractSettings, path: str, n: int, cache_dir: Path) -> dict[str, float]:
    """Send ``n`` requests (after a warm-up of one per slot); wall time and client CPU of the n."""
    index = leak_index()
    cache = ResponseCache(cache_dir) if path == "rationale" else None
    async with LLMClient(settings, cache=cache, stats=Stats()) as client:

        def messages(i: int) -> list[dict[str, str]]:
            return RATIONALE_V1.messages(context=f"{CONTEXT}\n(request {i})", action='{"type":"scroll_down"}')

        async def one(i: int) -> None:
            if path == "client":
                await client.complete(RATIONALE_V1, messages(i))
                return

            def check(a: RationaleAnswer):
                return check_rationale(
                    a.rationale, action="click", index=index, is_future=lambda o: False, max_words=40
                )

            outcome = await ask_until_clean(
                client, RATIONALE_V1, messages(i), RationaleAnswer, check, max_reasks=0
            )
            assert outcome.status == "ok", outcome.rejected

        await run_all([one(-1 - k) for k in range(settings.concurrency)], settings.concurrency)
        wall, cpu = time.perf_counter(), time.process_time()
        await run_all([one(i) for i in range(n)], settings.concurrency)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        assert client.stats.requests == n + settings.concurrency and not client.stats.retries
    return {"rps": n / wall, "cpu_ms": 1000 * cpu / n}


async def run_all(coros: list[Awaitable[None]], limit: int) -> None:
    queue = iter(coros)

    async def worker() -> None:
        for coro in queue:
            await coro

    await asyncio.gather(*(worker() for _ in range(limit)))


def bench(latency: float, levels: list[int], seconds: float, repeats: int) -> list[dict[str, object]]:
    os.environ.setdefault("TRAJFORGE_BENCH_KEY", "bench-key")
    proc, base_url = start_server(latency)
    rows = []
    try:
        for path in ("client", "rationale"):
            for c in levels:
                bound = c / latency
                n = max(20, int(bound * seconds))
                settings = ExtractSettings(
                    api_key_env="TRAJFORGE_BENCH_KEY",  # any key will do for the local server
                    backend="openai",
                    base_url=base_url,
                    model="bench",
                    concurrency=c,
                    request_timeout_s=30,
                    progress=False,
                )
                runs = []
                for _ in range(repeats):
                    with tempfile.TemporaryDirectory() as tmp:
                        runs.append(asyncio.run(measure(settings, path, n, Path(tmp))))
                best = max(runs, key=lambda r: r["rps"])
                rows.append(
                    {
                        "path": path,
                        "concurrency": c,
                        "requests": n,
                        "bound": bound,
                        "rps_best": best["rps"],
                        "rps_median": statistics.median(r["rps"] for r in runs),
                        "cpu_ms": statistics.median(r["cpu_ms"] for r in runs),
                    }
                )
                print(format_row(rows[-1]), flush=True)
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(10)
    return rows


def format_row(r: dict[str, object]) -> str:
    share = 100 * float(r["rps_best"]) / float(r["bound"])  # type: ignore[arg-type]
    return (
        f"| {r['path']} | {r['concurrency']} | {r['requests']} | {r['bound']:.0f} | {r['rps_best']:.1f} "
        f"({share:.0f} %) | {r['rps_median']:.1f} | {r['cpu_ms']:.2f} |"
    )


def record(
    rows: list[dict[str, object]], args: argparse.Namespace, command: str, load: tuple[float, float]
) -> None:
    table = "\n".join(format_row(r) for r in rows)
    section = f"""
## extract

Command: `{command}`
Machine: {machine()}
Server: `extractors.fakeserver` in its own process, {args.latency * 1000:.0f} ms added to every request;
best and median of {args.repeats} runs of about {args.seconds:g} s each, after a warm-up of one
request per slot. Bound = concurrency / latency (no client can do better). CPU = client process CPU
time per request (median). Load average (1 min) before / after: {load[0]:.1f} / {load[1]:.1f}.

| path | concurrency | requests | bound req/s | best req/s (of bound) | median req/s | client CPU ms/req |
|---|---|---|---|---|---|---|
{table}
"""
    results = ROOT / "bench" / "RESULTS.md"
    text = results.read_text() if results.exists() else "# Benchmarks\n"
    # replace this script's previous section (up to the next "## "), keep everybody else's
    kept = re.sub(r"\n## extract\n.*?(?=\n## |\Z)", "", text, flags=re.DOTALL)
    results.write_text(kept.rstrip("\n") + "\n" + section)


@dataclass
class ServedRun:
    folder: Path
    sessions: list[str]
    settings: ExtractSettings
    summary: dict[str, Any]
    first: int  # jobs accepted at their first answer
    reasked: int  # jobs accepted after one or more re-asks
    wall: float

    @property
    def jobs(self) -> int:
        return sum(c["jobs"] for c in self.summary["counts"].values())


def bench_served(folder: Path | None, sessions: list[str], args: argparse.Namespace) -> ServedRun:
    """``extract_lake`` against ``transformers serve FOLDER``: outcome shares, recovered answers, req/s."""
    import polars as pl

    from extractors.pipeline import extract_lake
    from tests.extractors.tinylake import write_sessions_lake
    from trainer.pretrained import convert_smollm2, served
    from transforms.lake import read_lake_table

    folder = folder or convert_smollm2()
    with tempfile.TemporaryDirectory() as tmp, served(folder, log=Path(tmp) / "serve.log") as base_url:
        lake = write_sessions_lake(Path(tmp) / "lake", sessions)
        settings = ExtractSettings(
            backend="openai",
            base_url=base_url,
            model=str(folder),
            temperature=args.temperature,
            max_tokens=args.max_tokens,
            max_reasks=args.max_reasks,
            concurrency=int(args.concurrency.split(",")[0]),
            request_timeout_s=600,
            progress=False,
        )
        wall = time.perf_counter()
        summary = extract_lake(lake, settings)
        wall = time.perf_counter() - wall
        attempts = pl.concat([read_lake_table(lake, t).select("attempts") for t in ("intents", "rationales")])
    first, reasked = int((attempts["attempts"] == 1).sum()), int((attempts["attempts"] > 1).sum())
    return ServedRun(folder, sessions, settings, summary, first, reasked, wall)


def served_section(run: ServedRun, command: str, load: tuple[float, float]) -> str:
    summary, s = run.summary, run.settings
    rows = [("ok at the first answer", run.first), ("ok after a re-ask", run.reasked)]
    rows += [(f"quarantined: {reason}", n) for reason, n in sorted(summary["quarantine_by_reason"].items())]
    table = "\n".join(f"| {what} | {n} | {100 * n / run.jobs:.0f} % |" for what, n in rows)
    counts = ", ".join(f"{kind} {c['jobs']}" for kind, c in summary["counts"].items())
    rps, tps = summary["requests"] / run.wall, summary["tokens_out"] / run.wall
    return f"""
## extract against `transformers serve`: SmolLM2-135M-Instruct, untrained ({time.strftime("%Y-%m-%d")})

Command: `{command}`
Machine: {machine()}; load average (1 min) before / after: {load[0]:.1f} / {load[1]:.1f}
(the machine is shared: other processes compete for its 2 cores).
Server: `transformers serve FOLDER --device cpu`, FOLDER the float32 conversion of `trainer.pretrained`.
It ignores `response_format`: the answers are the model's own text. Lake: the tests' hand-built lake
cut to sessions {", ".join(run.sessions)} (single mode); jobs: {counts}.
Settings: temperature {s.temperature:g}, seed {s.seed}, max_tokens {s.max_tokens}, \
max_reasks {s.max_reasks}, concurrency {s.concurrency}; a fresh response cache (0 hits).

| jobs | count | share |
|---|---|---|
{table}

{summary["answers"]} answers for {run.jobs} jobs ({summary["reasks"]} re-asks). Rejected answers by code:
{summary["rejects"]}. Answers whose JSON object was dug out of fences or prose: {summary["recovered_json"]}.
{summary["requests"]} requests in {run.wall:.0f} s: **{rps:.3f} requests/s**, {tps:.1f} completion tokens/s
({summary["tokens_in"]} prompt / {summary["tokens_out"]} completion tokens).
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.1, help="simulated server latency, seconds")
    parser.add_argument("--concurrency", default="1,8,64", help="comma-separated levels")
    parser.add_argument("--seconds", type=float, default=3.0, help="target duration of one run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-record", action="store_true", help="do not append to bench/RESULTS.md")
    parser.add_argument(
        "--served",
        nargs="?",
        const="",
        default=None,
        metavar="FOLDER",
        help="a real model behind `transformers serve` (default: the converted SmolLM2)",
    )
    parser.add_argument("--sessions", default="sA,sB1,sB2,sC", help="--served: sessions of the tiny lake")
    parser.add_argument("--max-tokens", type=int, default=48, help="--served: completion token cap")
    parser.add_argument("--max-reasks", type=int, default=1, help="--served: re-asks before quarantine")
    parser.add_argument("--temperature", type=float, default=0.2, help="--served: sampling temperature")
    args = parser.parse_args()
    command = "python " + " ".join(["bench/extract.py", *sys.argv[1:]])
    if args.served is not None:
        before = os.getloadavg()[0]
        run = bench_served(Path(args.served) if args.served else None, args.sessions.split(","), args)
        section = served_section(run, command, (before, os.getloadavg()[0]))
        print(section)
        if not args.no_record:
            results = ROOT / "bench" / "RESULTS.md"
            results.write_text(results.read_text().rstrip("\n") + "\n" + section)
        return
    levels = [int(c) for c in args.concurrency.split(",")]
    print("| path | concurrency | requests | bound | best req/s | median req/s | CPU ms/req |")
    before = os.getloadavg()[0]  # the machine may be shared: say how busy it was
    rows = bench(args.latency, levels, args.seconds, args.repeats)
    load = (before, os.getloadavg()[0])
    print(f"load average before / after: {load[0]:.1f} / {load[1]:.1f}")
    if not args.no_record:
        record(rows, args, command, load)


if __name__ == "__main__":
    main()
