"""The extract flow: records -> staged intents + rationales (+ records filled), one task per user
bucket -> gate -> lake -> catalog.

Buckets run one after another on purpose: each bucket's requests are already
concurrent, and the budget and a stop (budget spent, endpoint refusing the
key) carry from one bucket to the next. Every table is written into the stage's
staging folder and swapped into the lake only when the gate has passed it; a stopped
gate or a killed run leaves the lake's previous tables (and the response cache, so a
re-run asks nothing twice).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from extractors.config import ExtractSettings
from extractors.pipeline import (
    TABLES,
    BucketReport,
    Carry,
    extract_bucket,
    finalize,
    kept_rows,
    record_buckets,
)
from flows.caching import run_stage
from flows.staged_write import Staged, StageWrite, write_staged
from flows.stages import INGESTED, extract_stage, extraction_states_stage, tables
from flows.unchanged_users import kept_extraction, plan_extraction, record_extraction
from transforms.fingerprints import fingerprint
from transforms.lake import table_dir
from transforms.manifest import UsersDone
from transforms.records import recorded_prompt_settings


@task(name="list-record-buckets", cache_policy=NO_CACHE)
def list_buckets(states: str) -> list[int]:
    buckets = record_buckets(states)
    if not buckets:
        raise FileNotFoundError(f"no records under {states}: run the records stage first")
    return buckets


@task(name="extract-bucket", cache_policy=NO_CACHE)
def extract_partition(
    lake: str,
    staged: str,
    bucket: int,
    settings: ExtractSettings,
    carry: dict[str, Any],
    states: str | None,
    replaced_users: str | None = None,
) -> dict[str, Any]:
    """One bucket of ``lake`` extracted into ``staged``; its report (small). ``replaced_users``: a
    file naming the users to extract, the others keeping the lake's earlier rows (None: every user)."""
    kept = kept_extraction(lake, replaced_users)
    report = extract_bucket(lake, bucket, settings, Carry(**carry), staged=staged, states=states, kept=kept)
    get_run_logger().info("bucket %d: %s", bucket, report.counts)
    return report.to_json()


@task(name="assemble-extract-outputs", cache_policy=NO_CACHE)
def assemble(
    lake: str, staged: str, settings: ExtractSettings, reports: list[dict[str, Any]], started: str
) -> dict[str, Any]:
    return finalize(lake, settings, [BucketReport.from_json(r) for r in reports], started, staged=staged)


@flow(name="extract", persist_result=False)  # its tasks' results stay in memory
def extract_flow(
    lake: str, settings: ExtractSettings | None = None, states: str | None = None, reuse: bool = True
) -> dict[str, Any]:
    """Intents (train trajectories) and rationales (every recorded action), staged, gated, then
    swapped into the lake; the states are the lake's records, or those of the lake-shaped folder
    ``states`` (rendered before any extraction). With ``states`` and ``reuse``, only the users whose
    inputs changed since the last extraction are extracted, the others keep their rows."""
    settings = settings or ExtractSettings()
    started = datetime.now(UTC).isoformat()
    plan = plan_extraction(lake, states, settings, reuse) if states else None
    read_from = {
        **tables(lake, INGESTED),
        "states": fingerprint(states or table_dir(lake, "records")),
    }
    reports: list[dict[str, Any]] = []

    def staged_answers(staged: str) -> Staged:
        carry: dict[str, Any] = {}
        replaced = plan.write_replaced(staged) if plan else None
        for bucket in list_buckets(states or lake):
            reports.append(extract_partition(lake, staged, bucket, settings, carry, states, replaced))
            carry = reports[-1]["carry"]
        summary = assemble(lake, staged, settings, reports, started)
        users = UsersDone(**summary["users"])
        return Staged(summary, kept_rows(summary), settings=summary["settings"], users=users)

    def record_users() -> None:
        if plan is not None:
            record_extraction(lake, plan, [user for report in reports for user in report["pending_users"]])

    summary = write_staged(lake, EXTRACT, read_from, staged_answers, record_users)
    return summary


@flow(name="extract-stages")
def extract_stages_flow(lake: str, settings: ExtractSettings | None = None) -> dict[str, Any]:
    """Extraction as the pipeline runs it, for a lake that has been extracted before: its records'
    history windows carry the earlier rationales, so the states are rendered again as before any
    extraction (with the prompt settings the records were rendered with) and extracted from; the
    requests are those of the first extraction, answered from its cache. A lake never extracted, or
    one without the tables the states are rendered from, is extracted from its records as they are.
    Both stages are served from Prefect's cache when nothing they read changed (``skipped``)."""
    renderable = all(table_dir(lake, name).exists() for name in [*INGESTED, "histories"])
    if not (renderable and table_dir(lake, "rationales").exists()):
        return {**extract_flow(lake, settings=settings), "skipped": False}
    prompts = recorded_prompt_settings(lake)
    run_stage(extraction_states_stage, lake, lake=lake, settings=prompts, reuse=True)
    outcome = run_stage(extract_stage, lake, lake=lake, settings=settings, reuse=True)
    return {**outcome.summary, "skipped": outcome.reused}


def summary_markdown(summary: dict[str, Any]) -> str:
    kinds = "\n".join(
        f"| {k} | {c['jobs']} | {c['ok']} | {c['quarantined']} | {c['pending']} |"
        for k, c in summary["counts"].items()
    )
    rejects = "\n".join(f"| {code} | {n} |" for code, n in summary["rejects"].items()) or "| – | 0 |"
    held = "\n".join(f"| {r} | {n} |" for r, n in summary["quarantine_by_reason"].items()) or "| – | 0 |"
    retries = ", ".join(f"{k} {n}" for k, n in summary["retries"].items()) or "none"
    stopped = f", stopped: {summary['stopped']}" if summary["stopped"] else ""
    return (
        f"# Extract of `{summary['lake']}`\n\n"
        f"backend `{summary['backend']}`, model `{summary['model']}`{stopped}\n\n"
        "| output | jobs | ok | quarantined | pending |\n|---|---|---|---|---|\n"
        f"{kinds}\n\n"
        f"requests {summary['requests']}, cache hits {summary['cache_hits']}, retries {retries}, "
        f"re-asks {summary['reasks']}, tokens {summary['tokens_in']} in / {summary['tokens_out']} out\n\n"
        f"{spend_line(summary)}\n\n| answers rejected for | answers |\n|---|---|\n{rejects}\n\n"
        f"| quarantined (output:reason) | jobs |\n|---|---|\n{held}\n"
    )


def spend_line(summary: dict[str, Any]) -> str:
    """This run's spend against its budget, and what the lake's extraction has cost in all."""
    budget = summary.get("budget_usd")
    line = f"cost ${summary['cost_usd']:.4f} this run"
    line += f" (budget ${budget:.2f})" if budget is not None else " (no budget cap)"
    lake_total = summary.get("lake_cost_usd")
    if lake_total is None:
        return line + "; lake total unknown (response cache off)"
    return line + f"; ${lake_total:.4f} for this lake in all (every answer in its response cache)"


EXTRACT = StageWrite("extract", list(TABLES), markdown=summary_markdown)
