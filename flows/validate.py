"""Validation in flows: every stage writes into a staging folder (``staging``), ``gate_task``
validates the staged tables, and only then ``swap_staged`` moves them into the lake;
``validate_flow`` runs the gate on demand (``trajforge validate``).

A failed gate raises :class:`validation.report.GateError`, whose message is one
paragraph; Prefect's run loggers are told not to print its traceback (the
paragraph says everything, and a stop is not a crash).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect import flow, task
from prefect.artifacts import create_link_artifact, create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from flows.buckets import map_buckets, per_bucket, scale_settings, side_by_side
from transforms.config import IngestSettings
from transforms.lake import Staging, recorded_settings
from validation.report import GateError, GateSummary

if TYPE_CHECKING:
    from validation.gate import PartsMap


class QuietTracebacks(logging.Filter):
    """Drop the traceback (not the message) of log records raised by the given exception types."""

    def __init__(self, *types: type[BaseException]) -> None:
        super().__init__()
        self.types = types

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], self.types):
            record.exc_info, record.exc_text = None, None
        return True


def quiet_tracebacks(*types: type[BaseException]) -> None:
    """Install :class:`QuietTracebacks` on Prefect's task and flow run loggers."""
    for name in ("prefect.task_runs", "prefect.flow_runs"):
        logging.getLogger(name).addFilter(QuietTracebacks(*types))


quiet_tracebacks(GateError)


def summary_markdown(summary: GateSummary) -> str:
    head = "| table | rows in | rows out | quarantined | warnings | errors |\n|---|---|---|---|---|---|\n"
    rows = "".join(
        f"| {t.table} | {t.rows_in:,} | {t.rows_out:,} | {t.quarantined:,} | "
        f"{', '.join(t.warnings) or '-'} | {', '.join(t.errors) or '-'} |\n"
        for t in summary.tables.values()
    )
    status = "passed" if summary.ok else "**stopped the run**"
    return (
        f"# Validation gate after `{summary.stage}`: {status}\n\n"
        f"Run `{summary.run_id}` over `{summary.lake}` in {summary.seconds:.1f}s.\n\n{head}{rows}\n"
        f"Data Docs: [{summary.docs_index}](file://{summary.docs_index})  \n"
        f"Results JSON: `{summary.results_path}`\n"
    )


def publish(summary: GateSummary) -> None:
    """Prefect artifacts: the summary table and a link to the run's Data Docs."""
    key = re.sub(r"[^a-z0-9-]+", "-", f"validation-{summary.stage}".lower())
    create_markdown_artifact(key=key, markdown=summary_markdown(summary), description="validation gate")
    create_link_artifact(
        key=f"{key}-docs",
        link=Path(summary.docs_index).as_uri(),
        link_text=f"Data Docs of {summary.run_id}",
        description="Great Expectations Data Docs of this gate run",
    )


@contextmanager
def staging(lake: str) -> Iterator[str]:
    """A fresh staging folder for one stage's tables, removed when the stage ends (swapped or not)."""
    staged = Staging(lake)
    staged.open()
    try:
        yield str(staged.root)
    finally:
        staged.discard()


def spread_parts() -> PartsMap | None:
    """How the gate checks a partitioned table's buckets: side by side, as the stage's own buckets run,
    when the task runner runs more than one at a time (Ray, or several local workers); None (the
    whole table in the gate's process) otherwise."""
    if not side_by_side(scale_settings()):
        return None
    from validation.gate import check_part

    checks = per_bucket("validation-gate-bucket", check_part)

    def spread(parts: list[Any], repeated: Any, settings: IngestSettings | None) -> list[Any]:
        return map_buckets(checks, parts, repeated=repeated, settings=settings)

    return spread


@task(name="validation-gate", cache_policy=NO_CACHE)
def gate_task(
    lake: str,
    tables: list[str] | None,
    stage: str,
    raw: str | None = None,
    staged: str | None = None,
    settings: IngestSettings | None = None,
    accounting: dict[str, dict[str, int]] | None = None,
    raw_files: list[str] | None = None,
) -> dict:
    """Validate ``tables`` as ``stage`` wrote them (in ``staged`` when given); stops the flow on an
    error. ``settings``: those of the run that produced the tables (default: the lake's last ingest).
    ``raw_files``: the files of ``raw`` the stage read, when not all of them.

    Stage gates replace their earlier quarantine rows (the tables are new); the
    on-demand ``validate`` stage appends.
    """
    from validation.gate import run_gate

    try:
        summary = run_gate(
            lake,
            tables,
            stage=stage,
            replace_quarantine=stage != "validate",
            raw=raw,
            staged=staged,
            settings=settings or recorded_settings(lake),
            accounting=accounting,
            raw_files=raw_files,
            map_parts=spread_parts(),
        )
    except GateError as err:
        publish(err.summary)
        raise
    publish(summary)
    return summary.to_dict()


@task(name="swap-staged-tables", cache_policy=NO_CACHE)
def swap_staged(lake: str, staged: str) -> list[str]:
    """Move the gated tables of ``staged`` into the lake, one rename each."""
    return [str(path) for path in Staging(lake, staged).commit()]


@flow(name="validate")
def validate_flow(lake: str, tables: list[str] | None = None) -> dict:
    """Run the gate on demand over ``tables`` (default: every lake table with a suite)."""
    return gate_task(lake, tables, stage="validate")
