"""The chain flow: sessions -> staged histories -> gate -> lake, a summary comparable with the paper."""

from __future__ import annotations

import polars as pl
from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows.retrying import IO_RETRIES
from flows.staged_write import Staged, StageWrite, write_staged
from flows.stages import tables
from flows.unchanged_users import ChainPlan, plan_chain, record_chain
from transforms.chain import PAPER, ChainStats, chain, chain_some, chain_stats, stats_markdown
from transforms.lake import scan_table, table_dir, write_table
from transforms.manifest import UsersDone


@task(name="chain-histories", cache_policy=NO_CACHE, **IO_RETRIES)
def chain_histories(lake: str, staged: str, plan: ChainPlan) -> tuple[dict, pl.DataFrame]:
    """Read the lake's sessions, write histories into ``staged``; returns the statistics (small) and
    the histories with their summary helpers, recorded once they are in place."""
    sessions = scan_table(lake, "sessions")
    if plan.changed is None:
        histories = chain(sessions).collect()
    else:
        histories = chain_some(sessions, plan.kept, plan.changed)
    stats = chain_stats(histories)
    write_table(staged, "histories", histories)
    changed = histories.height if plan.changed is None else plan.changed.len()
    return {
        "histories": str(table_dir(lake, "histories")),
        "rows": histories.height,
        "sessions": sessions.select(pl.len()).collect().item(),
        "users_chained": changed,
        "users_kept": plan.digests.height - changed,
        "stats": stats.model_dump(),
        "paper": PAPER,
    }, histories


def summary_markdown(result: dict) -> str:
    return f"# Chain\n\n{stats_markdown(ChainStats(**result['stats']))}\n"


CHAIN = StageWrite("chain", ["histories"], markdown=summary_markdown)


@flow(name="chain", persist_result=False)  # its tasks' results stay in memory
def chain_flow(lake: str, reuse: bool = True) -> dict:
    """sessions -> histories (one row per user) + statistics summary. ``reuse``: users whose sessions
    are unchanged since the last chain keep their histories."""
    plan = plan_chain(lake, reuse)
    written: list[pl.DataFrame] = []

    def staged_histories(staged: str) -> Staged:
        result, histories = chain_histories(lake, staged, plan)
        written.append(histories)
        users = UsersDone(read=result["users_chained"], reused=result["users_kept"])
        accounting = {"histories": {"rows_in": result["sessions"], "rows_out": result["rows"]}}
        return Staged(result, accounting, users=users)

    details = write_staged(
        lake,
        CHAIN,
        tables(lake, ["sessions"]),
        staged_histories,
        lambda: record_chain(lake, plan, written[0]),
    )
    return {**details, "lake": lake}
