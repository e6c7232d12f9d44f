"""What the commands print: Rich tables of the stages' summaries, query results, the main job's figures.

The stages' own modules are imported inside the functions that need them: ``--help`` and a command
that prints none of them start without loading Prefect or the data stack.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

console = Console()
#: stops and usage errors, one line each on stderr (no emoji: a spec like "a:x:" is text)
errors = Console(stderr=True, soft_wrap=True, highlight=False, emoji=False)


def progress_bar(console: Console) -> Progress:
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )


def stage_time(stage: str, result: dict) -> str:
    """The line closing a stage's summary: the stage's own elapsed time (``result["seconds"]``)."""
    return f"{stage} finished in {result['seconds']:.1f}s"


def print_bundle(console: Console, out: Path, summary: dict) -> None:
    table = Table(title=f"raw bundle {out}")
    table.add_column("table")
    table.add_column("rows", justify="right")
    for name, rows in summary.get("counts", {}).items():
        table.add_row(name, f"{rows:,}")
    console.print(table)


def print_ingest_summary(console: Console, summary: dict) -> None:
    counts = Table(title="ingest: rows in = rows out + quarantined + duplicates merged + dropped")
    for column in (
        "raw table",
        "rows in",
        "rows out",
        "quarantined",
        "duplicates",
        "dropped",
        "flagged (kept)",
        "balanced",
    ):
        counts.add_column(column, justify="left" if column == "raw table" else "right")
    for name, c in summary["counts"].items():
        dropped = c.get("dropped", 0)  # events action_map declares irrelevant
        balanced = c["rows_in"] == c["rows_out"] + c["quarantined"] + c["duplicates"] + dropped
        counts.add_row(
            name,
            *(f"{c[k]:,}" for k in ("rows_in", "rows_out", "quarantined", "duplicates")),
            f"{dropped:,}",
            f"{c['flagged']:,}",
            "yes" if balanced else "[red]NO[/red]",
        )
    console.print(counts)
    reasons = Table(title="quarantine by reason")
    reasons.add_column("reason")
    reasons.add_column("rows", justify="right")
    reasons.add_column("kept", justify="center")
    for reason, n in summary["quarantine_by_reason"].items():
        reasons.add_row(reason, f"{n:,}", "no")
    for reason, n in summary["flagged_by_reason"].items():
        reasons.add_row(reason, f"{n:,}", "yes")
    if reasons.row_count:
        console.print(reasons)
    print_manifest(console, summary)
    if summary.get("validation"):
        console.print(f"validation passed; Data Docs: {summary['validation']['docs']}", soft_wrap=True)
    note = " (bundle unchanged: nothing rewritten)" if summary.get("skipped") else ""
    console.print(f"{stage_time('ingest', summary)}{note}; lake: {summary['lake']}")


def print_manifest(console: Console, result: dict) -> None:
    """The stage's manifest (``result["manifest"]``) as one table: the same rows as its Prefect table
    artifact. Nothing for a result served from the cache without one."""
    from transforms.manifest import StageManifest

    if not result.get("manifest") or not Path(result["manifest"]).is_file():
        return
    manifest = StageManifest.model_validate_json(Path(result["manifest"]).read_text())
    table = Table(title=f"{manifest.stage}: what it read and wrote ({result['manifest']})")
    for column in ("kind", "name", "status", "rows", "hash"):
        table.add_column(column, justify="right" if column == "rows" else "left")
    for row in manifest.rows():
        rows = "" if row["rows"] is None else f"{row['rows']:,}"
        table.add_row(row["kind"], row["name"], row["status"], rows, row["hash"] or "")
    console.print(table)


def print_chain_summary(console: Console, result: dict) -> None:
    from transforms.chain import PAPER, ChainStats

    stats = ChainStats(**result["stats"])
    table = Table(title="chain: this lake vs the UserArena paper")
    for column in ("figure", "this lake", "paper"):
        table.add_column(column, justify="left" if column == "figure" else "right")
    for name, value in stats.model_dump().items():
        if isinstance(value, dict):
            continue
        paper = PAPER.get(name)
        shown = "–" if value is None else f"{value:,}" if isinstance(value, int) else f"{value:,.4f}"
        table.add_row(name, shown, "" if paper is None else f"{paper:,}")
    console.print(table)
    console.print("split users: " + ", ".join(f"{k} {v:,}" for k, v in stats.split_users.items()))
    for tertile, shares in stats.split_share_by_activity.items():
        console.print(f"  activity {tertile}: " + ", ".join(f"{k} {v:.3f}" for k, v in shares.items()))
    console.print(f"histories: {result['histories']} ({result['rows']:,} users)")
    print_manifest(console, result)
    console.print(stage_time("chain", result))


def print_records_summary(console: Console, result: dict) -> None:
    from flows.records import export_line
    from transforms.records import RecordsSummary

    s = RecordsSummary(**result["records"])
    table = Table(title=f"records (prompt {s.prompt_version}): {s.records:,} states")
    table.add_column("mode/split")
    table.add_column("states", justify="right")
    for key, n in s.by_mode_split.items():
        table.add_row(key, f"{n:,}")
    console.print(table)
    console.print(f"token estimate: mean {s.token_estimate_mean:,}, max {s.token_estimate_max:,}")
    if s.gold_not_executable:
        console.print(f"[yellow]recorded actions not executable as shown:[/yellow] {s.gold_not_executable}")
    if s.gold_missing:
        console.print(f"states without a gold response (response null), by reason: {s.gold_missing}")
    if "export" in result and "nothing_to_train_on" not in result["export"]:
        colour = "yellow" if result["export"].get("left_out") else "default"
        console.print(f"[{colour}]{export_line(result['export'])}[/{colour}]", soft_wrap=True)
    print_manifest(console, result)
    console.print(stage_time("records", result))


def print_extract_summary(console: Console, summary: dict[str, Any]) -> None:
    from flows.extract import spend_line

    table = Table(
        title=f"extract ({summary['backend']}, {summary['model']}): jobs = ok + quarantined + pending"
    )
    for column in ("output", "jobs", "ok", "quarantined", "pending"):
        table.add_column(column, justify="left" if column == "output" else "right")
    for name, c in summary["counts"].items():
        table.add_row(name, *(f"{c[k]:,}" for k in ("jobs", "ok", "quarantined", "pending")))
    console.print(table)
    kinds = f" {summary['retries']}" if summary["retries"] else ""
    console.print(
        f"requests {summary['requests']:,}, cache hits {summary['cache_hits']:,}, "
        f"retries {summary['retries_total']:,}{kinds}, "
        f"re-asks {summary['reasks']:,}, "
        f"tokens {summary['tokens_in']:,} in / {summary['tokens_out']:,} out"
    )
    console.print(spend_line(summary))
    if summary["rejects"]:
        console.print(f"rejected answers by code: {summary['rejects']}")
    if summary["quarantine_by_reason"]:
        console.print(f"quarantined: {summary['quarantine_by_reason']}")
    if summary["stopped"]:
        console.print(f"[yellow]stopped sending requests: {summary['stopped']} (re-run to resume)[/yellow]")
    print_manifest(console, summary)
    console.print(f"{stage_time('extract', summary)}; lake: {summary['lake']}")


def print_validation_summary(console: Console, summary: dict) -> None:
    table = Table(title=f"validation {summary['run_id']} (rows in = out + quarantined)")
    for column in ("table", "rows in", "rows out", "quarantined", "warnings", "errors"):
        table.add_column(column, justify="left" if column in ("table", "warnings", "errors") else "right")
    for name, t in summary["tables"].items():
        table.add_row(
            name,
            f"{t['rows_in']:,}",
            f"{t['rows_out']:,}",
            f"{t['quarantined']:,}",
            ", ".join(t["warnings"]) or "-",
            ", ".join(t["errors"]) or "-",
        )
    console.print(table)
    console.print(f"Data Docs: {Path(summary['docs_index']).as_uri()}", soft_wrap=True)
    console.print(f"results: {summary['results_path']}", soft_wrap=True)


UNBOUNDED = 1_000_000  # columns a table may take before Rich starts to shrink them


def print_frame(console: Console, frame: pl.DataFrame, limit: int) -> None:
    """The first ``limit`` rows as a table with every value in full: the table is as wide as its
    widest row, whatever the terminal's width (a long line wraps there rather than cutting a column)."""
    table = Table(show_lines=False)
    for name in frame.columns:
        table.add_column(name, no_wrap=True)
    for row in frame.head(limit).iter_rows():
        table.add_row(*("" if v is None else str(v) for v in row))
    natural = console.measure(table, options=console.options.update_width(UNBOUNDED)).maximum
    Console(file=console.file, width=max(console.width, natural)).print(table)
    if frame.height > limit:
        console.print(f"({frame.height:,} rows, first {limit} shown)")


def frame_as_csv(frame: pl.DataFrame) -> str:
    """Every row as CSV; lists and structs (which CSV cannot hold) as JSON text."""
    nested = [name for name, dtype in frame.schema.items() if dtype.is_nested()]
    return frame.with_columns(_json_text(name) for name in nested).write_csv()


def _json_text(column: str) -> pl.Expr:
    # Polars encodes structs only as JSON: wrap the value in a one-field struct, then unwrap its text
    encoded = pl.struct(pl.col(column).alias("v")).struct.json_encode()
    text = encoded.str.strip_prefix('{"v":').str.strip_suffix("}")
    return pl.when(pl.col(column).is_not_null()).then(text).alias(column)


def frame_as_json(frame: pl.DataFrame) -> str:
    """Every row as one JSON array of objects, nested values as JSON arrays and objects."""
    return frame.write_json() + "\n"


def print_stage_times(console: Console, stages: dict[str, dict]) -> None:
    """Each stage's seconds, and those Prefect's cache served because nothing they read changed."""
    table = Table(title="the main job's stages")
    for column in ("stage", "seconds", "from the cache"):
        table.add_column(column, justify="left" if column == "stage" else "right")
    for name, timing in stages.items():
        table.add_row(name, f"{timing['seconds']:.1f}", "✓" if timing["reused"] else "")
    console.print(table)
    reused = [name for name, timing in stages.items() if timing["reused"]]
    if reused:
        console.print(f"unchanged since the last run, served from Prefect's cache: {', '.join(reused)}")


def print_checkpoint_figures(console: Console, workdir: Path, report: dict, checkpoint: str) -> None:
    """The trained checkpoint beside ``random``: its held-out responses, its rollouts' OVA, and the
    paper's eight figures, each marked where the checkpoint does better."""
    from evaluation.report import PAPER_METRICS, better_than

    summary = json.loads((workdir / "train" / "optd" / "summary.json").read_text())
    end = summary.get("held_out_end") or {}
    shares = (end.get("parse_share"), end.get("executable_share"), end.get("recorded_action_share"))
    console.print(
        f"[bold]checkpoint's held-out responses[/bold] ({end.get('sampled', 0)} sampled, "
        f"{summary['held_out_users']} held-out users): parse {fmt(shares[0])}, executable {fmt(shares[1])}, "
        f"the shopper's own action {fmt(shares[2])}"
    )
    ours = report["simulators"][f"checkpoint:{checkpoint}"]
    chance = report["simulators"].get("random") or {}
    verdicts = better_than(ours, chance) if chance else {}
    table = Table(title="the checkpoint beside random (Table 2)")
    for column in ("figure", "checkpoint", "random", "better"):
        table.add_column(column, justify="left" if column == "figure" else "right")
    table.add_row("OVA ↑", fmt(ours.get("OVA")), fmt(chance.get("OVA")), "")
    for metric, direction in PAPER_METRICS:
        mark = {True: "✓", False: "", None: "n/a"}[verdicts.get(metric)]
        table.add_row(f"{metric} {direction}", fmt(ours.get(metric)), fmt(chance.get(metric)), mark)
    console.print(table)
    if chance:
        wins = sum(bool(v) for v in verdicts.values())
        console.print(f"the checkpoint beats random on {wins} of {len(PAPER_METRICS)} figures")


def fmt(value: float | None) -> str:
    """A figure with four decimals, or ``n/a`` where it could not be computed."""
    return "n/a" if value is None else f"{value:.4f}"
