"""The chain flow: sessions -> staged histories -> gate -> lake, a summary comparable with the paper."""

from __future__ import annotations

import polars as pl
from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows.retrying import IO_RETRIES
from flows.staged_write import Staged, StageWrite, write_staged
from flows.stages import tables
from transforms.chain import PAPER, ChainStats, chain, chain_stats, stats_markdown
from transforms.lake import scan_table, table_dir, write_table


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
        "paper": PAPER,
    }


def summary_markdown(result: dict) -> str:
    return f"# Chain\n\n{stats_markdown(ChainStats(**result['stats']))}\n"


CHAIN = StageWrite("chain", ["histories"], markdown=summary_markdown)


def staged_histories(lake: str, staged: str) -> Staged:
    result = chain_histories(lake, staged)
    return Staged(result, {"histories": {"rows_in": result["sessions"], "rows_out": result["rows"]}})


@flow(name="chain", persist_result=False)  # its tasks' results stay in memory
def chain_flow(lake: str) -> dict:
    """sessions -> histories (one row per user) + statistics summary."""
    details = write_staged(
        lake, CHAIN, tables(lake, ["sessions"]), lambda staged: staged_histories(lake, staged)
    )
    return {**details, "lake": lake}
