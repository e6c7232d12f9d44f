"""The chain flow: sessions -> staged histories -> gate -> lake, a summary comparable with the paper,
the catalog."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path

import polars as pl
from prefect import flow, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from flows.catalog import refresh_catalog_task
from flows.retrying import IO_RETRIES
from flows.validate import gate_task, staging, swap_staged
from transforms.chain import PAPER, ChainStats, chain, chain_stats, stats_markdown
from transforms.lake import RUNS, atomic_file, scan_table, table_dir, write_table


def summary_path(lake: str | Path) -> Path:
    return Path(lake) / RUNS / "chain" / "summary.json"


def write_json(path: Path, payload: dict) -> None:
    """Atomic JSON write: readers see the old file or the new one."""
    with atomic_file(path) as temporary:
        temporary.write_text(json.dumps(payload, indent=2, default=str))


@task(name="chain-histories", cache_policy=NO_CACHE, **IO_RETRIES)
def chain_histories(lake: str, staged: str) -> dict:
    """Read the lake's sessions, write histories into ``staged``; returns the statistics (small)."""
    sessions = scan_table(lake, "sessions")
    histories = chain(sessions).collect()
    stats = chain_stats(histories)
    write_table(staged, "histories", histories)
    return {
        "histories": str(table_dir(lake, "histories")),
        "rows": histories.height,
        "sessions": sessions.select(pl.len()).collect().item(),
        "stats": stats.model_dump(),
    }


@task(name="record-chain-run", cache_policy=NO_CACHE, **IO_RETRIES)
def record_run(lake: str, result: dict) -> str:
    """Store the summary as LAKE/_runs/chain/summary.json and as a Prefect markdown artifact."""
    payload = {**result, "lake": lake, "paper": PAPER, "finished_at": datetime.now(UTC).isoformat()}
    write_json(summary_path(lake), payload)
    markdown = f"# Chain of `{lake}`\n\n{stats_markdown(ChainStats(**result['stats']))}\n"
    create_markdown_artifact(key="chain-summary", markdown=markdown, description="chain statistics")
    return str(summary_path(lake))


@flow(name="chain", persist_result=False)  # its tasks' results stay in memory
def chain_flow(lake: str) -> dict:
    """sessions -> histories (one row per user) + statistics summary."""
    started = time.perf_counter()
    with staging(lake) as staged:
        result = chain_histories(lake, staged)
        kept = {"histories": {"rows_in": result["sessions"], "rows_out": result["rows"]}}
        gate = gate_task(lake, ["histories"], stage="chain", staged=staged, accounting=kept)
        result["validation"] = gate["run_id"]
        swap_staged(lake, staged)
    refresh_catalog_task(lake)
    result["seconds"] = round(time.perf_counter() - started, 3)
    summary = record_run(lake, result)
    return {**result, "summary": summary}
