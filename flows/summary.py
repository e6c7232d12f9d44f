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
