"""Ingest benchmark at UserArena scale, side by side with two references.

    python bench/ingest.py                   # 11,010 users (UserArena scale)
    python bench/ingest.py --scale 10        # 110,100 users
    python bench/ingest.py --variants ingest,floor --repeat 5
    python bench/ingest.py --growth 10       # ingest at 1x and 10x, interleaved: how time grows
    python bench/ingest.py --scale 100 --variants ingest --repeat 1   # 10 copies of the 10x bundle

Variants, each run in its own process so peak RSS is its own:
- ``ingest``: ``transforms.ingest.ingest_bundle`` (readers, checks, alignment, lake writes);
- ``ingest-gated``: what ``trajforge ingest`` runs, without Prefect: the ingest into a staging
  folder, its validation gate (lake and raw suites, the loss checks, Data Docs), then the swap;
- ``pandas``: a straightforward pandas implementation of the same step alignment,
  one ``groupby(...).apply`` per session (the baseline a first version would write);
- ``floor``: read the same raw bundle and write as many bytes of zstd Parquet as the ingest
  wrote, with no transformation (the raw tables, then leading feed rows again up to the size),
  with Arrow's reader and writer (``pyarrow.parquet``);
- ``floor-polars``: the same copy with Polars' reader and writer, for comparison.

Each variant imports its libraries before its clock starts (``IMPORTS``). The report gives the
median run's phases too, wall and CPU seconds and the highest sampled RSS each (ingest: read,
items, align, write; the copies: read, write), so what the ingest spends beyond a copy, and where
its memory peaks, can be read off. Every variant runs in
the environment the ``trajforge`` CLI sets (``flows``), Polars' allocator settings included.

Appends a section to bench/RESULTS.md unless ``--no-record``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hostinfo import describe as machine  # noqa: E402 - bench/ is the script's folder
from hostinfo import peak_rss_kib, rss_kib  # noqa: E402

import flows  # noqa: E402,F401 - every variant runs in the environment the CLI sets (allocator included)

VIEWPORT = 693
USERARENA_USERS = 11_010


RAW_TABLES = ("profiles", "items", "feeds", "events", "history")


#: (phase, wall clock, process CPU seconds) as each phase of the measured run starts
PHASES: list[tuple[str, float, float]] = []
#: the highest RSS sampled in each phase (MiB), every ``RSS_SAMPLE_S``: where the peak falls
PHASE_RSS: dict[str, int] = {}
RSS_SAMPLE_S = 0.25


def _sample_rss() -> None:
    while True:
        phase = PHASES[-1][0] if PHASES else "start"
        PHASE_RSS[phase] = max(PHASE_RSS.get(phase, 0), rss_kib() // 1024)
        time.sleep(RSS_SAMPLE_S)


def _phase(name: str) -> None:
    PHASES.append((name, time.perf_counter(), _cpu_seconds()))


def run_ingest(raw: Path, out: Path, target_bytes: int) -> int:
    from transforms.ingest import ingest_bundle

    result = ingest_bundle(raw, out, progress=_phase)
    return result.counts["events"].rows_in


def run_ingest_unlanded(raw: Path, out: Path, target_bytes: int) -> int:
    """The ingest keeping no landed rows (``keep_landed`` off): what landing them costs."""
    from transforms.config import IngestSettings
    from transforms.ingest import ingest_bundle

    result = ingest_bundle(raw, out, IngestSettings(keep_landed=False), progress=_phase)
    return result.counts["events"].rows_in


def run_ingest_gated(raw: Path, out: Path, target_bytes: int) -> int:
    from flows.ingest import INGESTED_TABLES
    from transforms.config import IngestSettings
    from transforms.ingest import ingest_bundle
    from transforms.lake import Staging
    from validation.gate import run_gate

    settings, staged = IngestSettings(), Staging(out)
    try:
        result = ingest_bundle(raw, out, settings, progress=_phase, staging=staged.open())
        _phase("gate")
        accounting = result.to_json()["counts"]
        tables = list(INGESTED_TABLES)
        run_gate(
            out,
            tables,
            stage="ingest",
            replace_quarantine=True,
            raw=raw,
            settings=settings,
            staged=staged.root,
            accounting=accounting,
        )
        _phase("swap")
        staged.commit()
    finally:
        staged.discard()
    return result.counts["events"].rows_in


def run_floor(raw: Path, out: Path, target_bytes: int) -> int:
    """Arrow's reader and writer: every raw table read and written back as zstd Parquet, no checks,
    no alignment, then feed rows again until the output has ``target_bytes`` (the ingest's size)."""
    import pyarrow.parquet as pq

    def write(table, path: Path) -> None:
        pq.write_table(table, path, compression="zstd")

    _phase("read")
    tables = {name: pq.read_table(raw / name) for name in RAW_TABLES}
    return _copy(tables, out, target_bytes, write, lambda table, rows: table.slice(0, rows))


def run_floor_polars(raw: Path, out: Path, target_bytes: int) -> int:
    """The same copy with Polars' reader and writer."""
    import polars as pl

    def write(frame, path: Path) -> None:
        frame.write_parquet(path, compression="zstd", compression_level=1)

    _phase("read")
    tables = {name: pl.read_parquet(raw / name) for name in RAW_TABLES}
    return _copy(tables, out, target_bytes, write, lambda frame, rows: frame.slice(0, rows))


def _copy(tables: dict, out: Path, target_bytes: int, write, head) -> int:
    """Write ``tables``, then pad with leading feed rows up to ``target_bytes`` of output."""
    _phase("write")
    out.mkdir(parents=True, exist_ok=True)
    for name, table in tables.items():
        write(table, out / f"{name}.parquet")
    feeds, written = tables["feeds"], sum(p.stat().st_size for p in out.glob("*.parquet"))
    bytes_per_row = (out / "feeds.parquet").stat().st_size / max(len(feeds), 1)
    pad = 0
    while target_bytes - written > 1 << 20:  # within a MiB is the same size
        rows = int((target_bytes - written) / bytes_per_row)
        path = out / f"pad-{pad}.parquet"
        write(head(feeds, rows), path)
        written, pad = written + path.stat().st_size, pad + 1
    return len(tables["events"])


def run_pandas(raw: Path, out: Path, target_bytes: int) -> int:
    """The same alignment written the direct way: a Python function applied per session."""
    import pandas as pd

    events = pd.read_parquet(raw / "events")
    feeds = pd.read_parquet(raw / "feeds")
    items = pd.read_parquet(raw / "items", columns=["item_id", "title", "category"])
    titles = dict(zip(items["item_id"], items["title"], strict=True))
    layouts = {pv: g.sort_values(["y", "x"]) for pv, g in feeds.groupby("page_view_id")}

    def align_session(group: pd.DataFrame) -> pd.DataFrame:
        view = group.name  # pandas >= 3 hands apply the group without its key column
        group = group.sort_values("ts").copy()
        group["page_view_id"] = view
        group["step"] = range(len(group))
        layout = layouts[view]
        visible, open_items, open_item = [], [], None
        for screen, action, top, item in zip(
            group["screen"], group["action"], group["scroll_top"], group["item_id"], strict=True
        ):
            if screen == "feed":
                shown = [
                    card
                    for card, y, h in zip(layout["item_id"], layout["y"], layout["height"], strict=True)
                    if min(y + h, top + VIEWPORT) - max(y, top) >= h / 2
                ]
                visible.append(shown)
                open_item = item if action == "click" else None
            else:
                visible.append(None)
                if action == "back_home":
                    open_items.append(open_item)
                    open_item = None
                    continue
            open_items.append(open_item if screen == "ipv" else None)
        group["visible_items"] = visible
        group["ipv_item_id"] = open_items
        group["target_title"] = [
            titles.get(i) if a == "click" else None
            for a, i in zip(group["action"], group["item_id"], strict=True)
        ]
        return group

    steps = events.groupby("page_view_id", group_keys=False).apply(align_session)
    sessions = steps.groupby("page_view_id").agg(
        user_id=("user_id", "first"),
        start=("ts", "min"),
        end=("ts", "max"),
        length=("step", "size"),
        clicks=("action", lambda a: (a == "click").sum()),
        buys=("action", lambda a: (a == "ipv_buy").sum()),
    )
    out.mkdir(parents=True, exist_ok=True)
    steps.to_parquet(out / "steps.parquet", compression="zstd")
    sessions.to_parquet(out / "sessions.parquet", compression="zstd")
    return len(events)


VARIANTS = {
    "ingest": run_ingest,
    "ingest-unlanded": run_ingest_unlanded,
    "ingest-gated": run_ingest_gated,
    "pandas": run_pandas,
    "floor": run_floor,
    "floor-polars": run_floor_polars,
}
#: modules each variant imports before its clock starts: interpreter and library start-up is the
#: same for any bundle size, so the timings compare the work on the data alone
IMPORTS = {
    "ingest": ("transforms.ingest",),
    "ingest-unlanded": ("transforms.ingest",),
    "ingest-gated": ("transforms.ingest", "validation.gate", "validation.ge", "flows.ingest"),
    "pandas": ("pandas",),
    "floor": ("pyarrow.parquet",),
    "floor-polars": ("polars",),
}


def child(variant: str, raw: Path, out: Path, target_bytes: int) -> None:
    for module in IMPORTS[variant]:
        importlib.import_module(module)
    load = os.getloadavg()[0]
    if Path("/proc/self/status").exists():
        threading.Thread(target=_sample_rss, daemon=True).start()
    cpu_before = _cpu_seconds()
    started = time.perf_counter()
    rows = VARIANTS[variant](raw, out, target_bytes)
    wall, cpu = time.perf_counter() - started, _cpu_seconds() - cpu_before
    peak = peak_rss_kib() / 1024
    result = {"variant": variant, "wall_s": wall, "rows": rows, "peak_rss_mib": peak}
    print(json.dumps(result | {"cpu_s": cpu, "load": load, "phases": _phase_times()}))


def _phase_times() -> list[tuple[str, float, float, int | None]]:
    """Wall and CPU seconds of each phase of the run (from its start to the next one's, or the end),
    and the highest RSS sampled in it (MiB; None where no sample fell in it)."""
    if not PHASES:
        return []
    ends = [*PHASES[1:], ("end", time.perf_counter(), _cpu_seconds())]
    return [
        (name, end[1] - wall, end[2] - cpu, PHASE_RSS.get(name))
        for (name, wall, cpu), end in zip(PHASES, ends, strict=True)
    ]


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def summarize(runs: list[dict]) -> dict:
    """The median run by wall time, with the spread of all runs and the highest peak RSS."""
    ordered = sorted(runs, key=lambda r: r["wall_s"])
    median = dict(ordered[len(ordered) // 2])
    median.update(
        runs=len(runs),
        wall_min=ordered[0]["wall_s"],
        wall_max=ordered[-1]["wall_s"],
        peak_rss_mib=max(r["peak_rss_mib"] for r in runs),
        load=runs[0]["load"],
    )
    return median


def measure(variant: str, raw: Path, work: Path, target_bytes: int = 0) -> dict:
    out = work / f"out-{variant}"
    subprocess.run(["rm", "-rf", str(out)], check=True)
    command = [sys.executable, __file__, "--child", variant, "--raw", str(raw), "--out", str(out)]
    proc = subprocess.run([*command, "--target-bytes", str(target_bytes)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"the {variant} run failed (exit {proc.returncode}):\n{proc.stderr.strip()}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["output_bytes"] = sum(p.stat().st_size for p in out.rglob("*.parquet"))
    result["output_mib"] = result["output_bytes"] / 2**20
    return result


def ensure_bundle(users: int, seed: int, work: Path) -> tuple[Path, float]:
    """The generated bundle of ``users`` shoppers; beyond ``GENERATED_USERS``, copies of the bundle of
    that size (the generator holds a whole world in memory)."""
    raw = work / f"raw-{users}-{seed}"
    if (raw / "manifest.json").exists():
        return raw, float("nan")
    if users > GENERATED_USERS:
        base, _ = ensure_bundle(GENERATED_USERS, seed, work)
        started = time.perf_counter()
        replicated_bundle(base, -(-users // GENERATED_USERS), raw)
        return raw, time.perf_counter() - started
    from synthetic.bundle import write_bundle

    started = time.perf_counter()
    write_bundle(raw, users=users, seed=seed, fmt="parquet")
    return raw, time.perf_counter() - started


GENERATED_USERS = 10 * USERARENA_USERS  # the largest bundle generated whole
ID_COLUMNS = ("event_id", "user_id", "page_view_id", "item_id")


def replicated_bundle(base: Path, copies: int, out: Path) -> None:
    """``copies`` copies of the bundle ``base`` side by side in ``out``, every id of copy k prefixed
    ``c<k>-`` (so the copies share no shopper, page view, event or item), each file streamed from
    Parquet to Parquet, never whole in memory."""
    import polars as pl

    partial = out.with_name(out.name + ".partial")
    for path in sorted(base.glob("*/*.parquet")):
        for copy in range(copies):
            scan = pl.scan_parquet(path)
            prefixed = [(f"c{copy}-" + pl.col(c)).alias(c) for c in ID_COLUMNS if c in scan.collect_schema()]
            target = partial / path.parent.name / f"c{copy:03d}-{path.name}"
            target.parent.mkdir(parents=True, exist_ok=True)
            scan.with_columns(prefixed).sink_parquet(target, compression="zstd", row_group_size=256_000)
    manifest = {"replicated_from": str(base), "copies": copies}  # no world: not a generator's manifest
    (partial / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    partial.rename(out)


def _generated(seconds: float) -> str:
    return "bundle already on disk" if seconds != seconds else f"{seconds:.1f} s"  # NaN: not generated now


def report(results: list[dict], users: int, generate_s: float, command: str) -> str:
    by = {r["variant"]: r for r in results}
    lines = [
        f"\n## ingest — {users:,} users ({time.strftime('%Y-%m-%d')})\n",
        f"Command: `{command}`  ",
        f"Machine: {machine()}  ",
        f"Bundle generation: {_generated(generate_s)} (not included below)\n",
        "| variant | runs | wall s (median) | wall s (min–max) | CPU s | load at start | events | events/s "
        "| peak RSS MiB | output MiB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['variant']} | {r['runs']} | {r['wall_s']:.2f} | {r['wall_min']:.2f}–{r['wall_max']:.2f} | "
            f"{r['cpu_s']:.1f} | {r['load']:.1f} | {r['rows']:,} | {r['rows'] / r['wall_s']:,.0f} | "
            f"{r['peak_rss_mib']:.0f} | {r['output_mib']:.1f} |"
        )
    lines.append("")
    for floor in ("floor", "floor-polars"):
        if "ingest" in by and floor in by:
            ratio = by["ingest"]["wall_s"] / by[floor]["wall_s"]
            lines.append(f"ingest / {floor} = {ratio:.2f}x (target <= 2x)  ")
    if "ingest" in by and "pandas" in by:
        lines.append(
            f"pandas / ingest = {by['pandas']['wall_s'] / by['ingest']['wall_s']:.1f}x (target >= 10x)  "
        )
    phases = [_phase_line(r) for r in results if r.get("phases")]
    if phases:
        heading = (
            "Where the median run's time went, per phase: wall s / CPU s (CPU counts every thread), and "
            "in brackets the highest RSS sampled in it every 0.25 s (a peak between samples is missed).  "
        )
        lines += ["", heading, *phases]
    return "\n".join(lines) + "\n"


def _phase_line(result: dict) -> str:
    parts = [
        f"{name} {wall:.2f} / {cpu:.1f}" + (f" ({rss:,} MiB)" if rss else "")
        for name, wall, cpu, rss in result["phases"]
    ]
    return f"- {result['variant']}: " + " · ".join(parts) + "  "


def growth(factor: float, seed: int, repeat: int, work: Path) -> str:
    """The ingest at 1x and at ``factor`` x UserArena scale, one of each per round, so slow spells
    of a shared machine fall on both sizes; the ratio is taken per round."""
    sizes = {1.0: USERARENA_USERS, factor: round(USERARENA_USERS * factor)}
    bundles = {scale: ensure_bundle(users, seed, work)[0] for scale, users in sizes.items()}
    rounds = [{scale: measure("ingest", bundles[scale], work) for scale in sizes} for _ in range(repeat)]
    lines = [
        f"\n## ingest growth — {sizes[1.0]:,} vs {sizes[factor]:,} users ({time.strftime('%Y-%m-%d')})\n",
        f"Command: `python bench/ingest.py --growth {factor:g} --repeat {repeat}`  ",
        f"Machine: {machine()}  ",
        "Bundles already on disk or generated first (not included below)\n",
        f"| round | 1x wall s | {factor:g}x wall s | time ratio | CPU ratio | 1x peak RSS MiB "
        f"| {factor:g}x peak RSS MiB |",
        "|---|---|---|---|---|---|---|",
    ]
    for n, pair in enumerate(rounds, start=1):
        small, big = pair[1.0], pair[factor]
        times, cpus = big["wall_s"] / small["wall_s"], big["cpu_s"] / small["cpu_s"]
        lines.append(
            f"| {n} | {small['wall_s']:.2f} | {big['wall_s']:.2f} | {times:.2f}x | {cpus:.2f}x "
            f"| {small['peak_rss_mib']:.0f} | {big['peak_rss_mib']:.0f} |"
        )
    ratios = sorted(pair[factor]["wall_s"] / pair[1.0]["wall_s"] for pair in rounds)
    lines.append(
        f"\n{factor:g}x / 1x time, median of rounds = {ratios[len(ratios) // 2]:.2f}x "
        f"({ratios[0]:.2f}–{ratios[-1]:.2f}; target <= {factor * 1.1:g}x)"
    )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scale", type=float, default=1.0, help="multiple of UserArena's 11,010 users")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--variants", default="ingest,floor,floor-polars,pandas")
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs of floor and ingest, interleaved (pandas runs once)"
    )
    parser.add_argument(
        "--growth", type=float, help="ingest only, at 1x and at this scale in turn: how time grows"
    )
    parser.add_argument("--work", type=Path, default=ROOT / "bench" / ".work")
    parser.add_argument("--no-record", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--raw", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--target-bytes", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.raw, args.out, args.target_bytes)
        return
    args.work.mkdir(parents=True, exist_ok=True)
    if args.growth:
        _record(growth(args.growth, args.seed, args.repeat, args.work), args.no_record)
        return
    users = round(USERARENA_USERS * args.scale)
    raw, generate_s = ensure_bundle(users, args.seed, args.work)
    # ingest first in each round: the floors then write as many bytes as it just did
    variants = sorted(args.variants.split(","), key=lambda v: v != "ingest")
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    for round_ in range(args.repeat):
        target = 0
        for variant in variants:
            if variant != "pandas" or round_ == 0:
                runs[variant].append(measure(variant, raw, args.work, target))
                target = runs["ingest"][-1]["output_bytes"] if "ingest" in runs else 0
    results = [summarize(runs[v]) for v in variants]
    command = "python bench/ingest.py " + " ".join(sys.argv[1:])
    _record(report(results, users, generate_s, command), args.no_record)


def _record(text: str, dry: bool) -> None:
    """Print a results section and, unless ``dry``, append it to bench/RESULTS.md."""
    print(text)
    if not dry:
        with (ROOT / "bench" / "RESULTS.md").open("a") as handle:
            handle.write(text)


if __name__ == "__main__":
    main()
