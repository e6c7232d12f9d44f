"""Benchmark: chain + records at UserArena scale (about 11k users, 65k sessions, 578k states).

Builds a raw bundle from the synthetic world, ingests it once, then times each
phase in its own child process (so peak RSS is per phase), pinned to
``--threads`` cores with ``POLARS_MAX_THREADS`` set to match. Appends the result
to bench/RESULTS.md under "## chain + records".

    python bench/chain_records.py                      # 11,010 users, seed 42, 2 threads
    python bench/chain_records.py --users 2000 --no-append
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from hostinfo import describe, peak_rss_kib  # bench/ is the script's folder

HEADING = "## chain + records"
RESULTS = Path(__file__).with_name("RESULTS.md")
PHASES = ("chain", "records_single", "records_both", "export_train_single")


# --- child: one phase ---------------------------------------------------------------------


def run_phase(phase: str, lake: str) -> dict:
    started = time.perf_counter()
    if phase == "chain":
        from transforms.chain import chain, chain_stats
        from transforms.lake import scan_table, write_table

        histories = chain(scan_table(lake, "sessions")).collect()
        stats = chain_stats(histories)
        write_table(lake, "histories", histories)
        out = {"rows": histories.height, "unit": "histories", "stats": stats.model_dump()}
    elif phase.startswith("records"):
        from transforms.records import write_records

        modes = ["single"] if phase == "records_single" else ["single", "cross"]
        summary = write_records(lake, modes=modes)
        out = {"rows": summary.records, "unit": "states", "summary": summary.model_dump(exclude={"settings"})}
    else:
        from transforms.records import NothingToTrainOn, export_chat_jsonl

        path = Path(lake).parent / "sft-train.jsonl"
        try:
            exported = export_chat_jsonl(lake, path, splits=["train"], modes=["single"])
        except NothingToTrainOn as stop:  # the bench lake is not extracted: every state is left out
            exported = stop.summary
        size = path.stat().st_size if path.exists() else 0
        out = {"rows": exported.lines, "unit": "lines", "bytes": size, "left_out": exported.left_out}
    out["wall_s"] = round(time.perf_counter() - started, 2)
    out["peak_rss_gib"] = round(peak_rss_kib() / 2**20, 2)
    return out


# --- parent: lake, phases, report ------------------------------------------------------------


def build_lake(workdir: Path, users: int, seed: int) -> dict:
    """Raw bundle from the synthetic world, ingested once (not part of the timed phases)."""
    from transforms.ingest import ingest_bundle

    raw, lake = workdir / "raw", workdir / "lake"
    shutil.rmtree(workdir, ignore_errors=True)
    started = time.perf_counter()
    try:
        from synthetic.bundle import write_bundle  # the teammate's writer, once it exists

        write_bundle(raw, users=users, seed=seed, fmt="parquet")
        source = "synthetic.bundle.write_bundle"
    except ImportError:
        from synthetic.world import World

        for name, frame in World.build(users, seed).simulate().tables().items():
            (raw / name).mkdir(parents=True, exist_ok=True)
            frame.write_parquet(raw / name / "part-0.parquet")
        source = "synthetic.world.World.simulate"
    generated = time.perf_counter() - started
    result = ingest_bundle(raw, lake)
    return {
        "lake": str(lake),
        "source": source,
        "generate_s": round(generated, 1),
        "ingest_s": result.wall_seconds,
        "rows": result.output_rows,
    }


def existing_lake(workdir: Path) -> dict | None:
    """The lake a previous run ingested under ``workdir`` (its generation is not re-timed)."""
    from transforms.lake import scan_table, table_files

    lake = workdir / "lake"
    if not table_files(lake, "steps"):
        return None
    rows = {
        n: scan_table(lake, n).select(pl_len()).collect().item()
        for n in ("steps", "sessions", "items", "history")
    }
    return {"lake": str(lake), "source": "reused lake", "generate_s": "–", "ingest_s": "–", "rows": rows}


def pl_len():
    import polars as pl

    return pl.len()


def child(phase: str, lake: str, threads: int) -> dict:
    env = {**os.environ, "POLARS_MAX_THREADS": str(threads)}
    command = [sys.executable, __file__, "--phase", phase, "--lake", lake]
    if shutil.which("taskset"):
        command = ["taskset", "-c", f"0-{threads - 1}", *command]
    before, load = resource.getrusage(resource.RUSAGE_CHILDREN), os.getloadavg()[0]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    # CPU seconds do not depend on what else runs on the machine; wall time does (load = 1-min average)
    return {
        **json.loads(done.stdout.strip().splitlines()[-1]),
        "cpu_s": round(cpu, 1),
        "load": round(load, 1),
    }


def machine(threads: int) -> str:
    import polars as pl

    return f"{describe()}; pinned to {threads} cores (POLARS_MAX_THREADS={threads}), polars {pl.__version__}"


def report(args: argparse.Namespace, lake: dict, results: dict[str, dict]) -> str:
    rows = lake["rows"]
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"### {stamp}: `python bench/chain_records.py --users {args.users} --seed {args.seed} "
        f"--threads {args.threads}`",
        "",
        f"- machine: {machine(args.threads)}",
        f"- lake: {rows['steps']:,} steps, {rows['sessions']:,} sessions, {rows['items']:,} items, "
        f"{rows['history']:,} history rows ({lake['source']}, generated in {lake['generate_s']} s, "
        f"ingested in {lake['ingest_s']} s, not timed below)",
        "",
        "| phase | wall s | CPU s | load at start | peak RSS GiB | rows | rows/s (wall) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for phase, r in results.items():
        rate = r["rows"] / r["wall_s"] if r["wall_s"] else 0.0
        lines.append(
            f"| {phase} | {r['wall_s']} | {r['cpu_s']} | {r['load']} | {r['peak_rss_gib']} "
            f"| {r['rows']:,} {r['unit']} | {rate:,.0f} |"
        )
    single = results.get("records_single")
    if single:
        target = "meets" if single["wall_s"] <= 30 else "MISSES"
        lines += [
            "",
            f"Target <= 30 s for ~578k single-session states on 2 cores: {target} ({single['wall_s']} s).",
        ]
        built = single["summary"]
        lines.append(
            f"Token estimate per state: mean {built['token_estimate_mean']}, "
            f"max {built['token_estimate_max']}; "
            f"recorded actions not executable as shown: {built['gold_not_executable'] or 'none'}."
        )
    return "\n".join(lines) + "\n"


def append_result(entry: str) -> None:
    """Insert ``entry`` at the end of the "## chain + records" section (created if missing)."""
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    if HEADING not in text:
        RESULTS.write_text(text.rstrip("\n") + f"\n\n{HEADING}\n\n{entry}")
        return
    start = text.index(HEADING) + len(HEADING)
    following = text.find("\n## ", start)
    end = len(text) if following < 0 else following + 1
    section = text[:end].rstrip("\n") + f"\n\n{entry}"
    RESULTS.write_text(section + ("\n" + text[end:] if following >= 0 else ""))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--users", type=int, default=11_010)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/trajforge-bench-chain-records"))
    parser.add_argument("--no-append", action="store_true", help="print the result, do not touch RESULTS.md")
    parser.add_argument("--reuse-lake", action="store_true", help="keep an already ingested WORKDIR/lake")
    parser.add_argument("--phase", choices=PHASES, help=argparse.SUPPRESS)
    parser.add_argument("--lake", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase:
        print(json.dumps(run_phase(args.phase, args.lake)))
        return
    lake = existing_lake(args.workdir) if args.reuse_lake else None
    lake = lake or build_lake(args.workdir, args.users, args.seed)
    results = {phase: child(phase, lake["lake"], args.threads) for phase in PHASES}
    entry = report(args, lake, results)
    print(entry)
    print(json.dumps(results["chain"]["stats"], indent=1))
    if not args.no_append:
        append_result(entry)


if __name__ == "__main__":
    main()
