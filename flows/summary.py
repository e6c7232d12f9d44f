"""Rich rendering of run summaries and query results for the CLI."""

from __future__ import annotations

import polars as pl
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table


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


def print_ingest_summary(console: Console, summary: dict) -> None:
    counts = Table(title="ingest: rows in = rows out + quarantined + duplicates merged")
    for column in (
        "raw table",
        "rows in",
        "rows out",
        "quarantined",
        "duplicates",
        "flagged (kept)",
        "balanced",
    ):
        counts.add_column(column, justify="left" if column == "raw table" else "right")
    for name, c in summary["counts"].items():
        balanced = c["rows_in"] == c["rows_out"] + c["quarantined"] + c["duplicates"]
        counts.add_row(
            name,
            *(f"{c[k]:,}" for k in ("rows_in", "rows_out", "quarantined", "duplicates", "flagged")),
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
    outputs = Table(title="lake tables")
    outputs.add_column("table")
    outputs.add_column("rows", justify="right")
    outputs.add_column("path")
    for name, path in summary["paths"].items():
        rows = summary["output_rows"].get(name)
        outputs.add_row(name, "" if rows is None else f"{rows:,}", path)
    console.print(outputs)
    if summary.get("validation"):
        console.print(f"validation passed; Data Docs: {summary['validation']['docs']}", soft_wrap=True)
    note = " (bundle unchanged: nothing rewritten)" if summary.get("skipped") else ""
    console.print(f"{stage_time('ingest', summary)}{note}; lake: {summary['lake']}")


def print_frame(console: Console, frame: pl.DataFrame, limit: int) -> None:
    table = Table(show_lines=False)
    for name in frame.columns:
        table.add_column(name)
    for row in frame.head(limit).iter_rows():
        table.add_row(*("" if v is None else str(v) for v in row))
    console.print(table)
    if frame.height > limit:
        console.print(f"({frame.height:,} rows, first {limit} shown)")
