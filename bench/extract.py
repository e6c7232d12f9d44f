"""Extraction client benchmark against the local OpenAI-compatible server with simulated latency.

    python bench/extract.py                        # latency 100 ms, concurrency 1, 8, 64
    python bench/extract.py --latency 0.05 --concurrency 1,16,128 --no-record

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
from pathlib import Path

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.1, help="simulated server latency, seconds")
    parser.add_argument("--concurrency", default="1,8,64", help="comma-separated levels")
    parser.add_argument("--seconds", type=float, default=3.0, help="target duration of one run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-record", action="store_true", help="do not append to bench/RESULTS.md")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    print("| path | concurrency | requests | bound | best req/s | median req/s | CPU ms/req |")
    before = os.getloadavg()[0]  # the machine may be shared: say how busy it was
    rows = bench(args.latency, levels, args.seconds, args.repeats)
    load = (before, os.getloadavg()[0])
    print(f"load average before / after: {load[0]:.1f} / {load[1]:.1f}")
    if not args.no_record:
        record(rows, args, "python " + " ".join(["bench/extract.py", *sys.argv[1:]]), load)


if __name__ == "__main__":
    main()
