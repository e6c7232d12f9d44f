"""The chain flow: sessions -> staged histories -> gate -> lake, a summary comparable with the paper.

Each user bucket of ``sessions`` is chained by its own task (``flows.buckets``): a history depends on
its user's sessions alone. The reduce reads the staged histories back (one row per user) for the
statistics and the record of what was chained.
"""

from __future__ import annotations

import polars as pl
from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows.buckets import map_buckets, per_bucket
from flows.retrying import IO_RETRIES
from flows.staged_write import Staged, StageWrite, write_staged
from flows.stages import tables
from flows.unchanged_users import plan_chain, record_chain
from transforms.chain import (
    PAPER,
    Chaining,
    ChainStats,
    chain_bucket,
    chain_stats,
    chained_histories,
    stats_markdown,
)
from transforms.lake import bucket_files, table_dir
from transforms.manifest import UsersDone

chain_bucket_task = per_bucket("chain-bucket", chain_bucket)


@task(name="chain-summary", cache_policy=NO_CACHE, **IO_RETRIES)
def chain_summary(lake: str, chaining: Chaining, buckets: list[dict]) -> tuple[dict, pl.DataFrame]:
    """The reduce: the statistics of every bucket's histories; returns them and the histories with
    their helpers, recorded once they are in place."""
    histories = chained_histories(chaining, lake)
    return {
        "histories": str(table_dir(lake, "histories")),
        "rows": histories.height,
        "sessions": sum(bucket["sessions"] for bucket in buckets),
        "stats": chain_stats(histories).model_dump(),
        "paper": PAPER,
    }, histories


def summary_markdown(result: dict) -> str:
    return f"# Chain\n\n{stats_markdown(ChainStats(**result['stats']))}\n"


CHAIN = StageWrite("chain", ["histories"], markdown=summary_markdown)


@flow(name="chain", persist_result=False)  # its tasks' results stay in memory
def chain_flow(lake: str, reuse: bool = True) -> dict:
    """sessions -> histories (one row per user) + statistics summary, bucket by bucket. ``reuse``:
    users whose sessions are unchanged since the last chain keep their histories."""
    plan = plan_chain(lake, reuse)
    written: list[pl.DataFrame] = []

    def staged_histories(staged: str) -> Staged:
        chaining = Chaining.of(staged, plan.kept, plan.changed)
        chained = map_buckets(chain_bucket_task, bucket_files(lake, "sessions"), chaining=chaining)
        result, histories = chain_summary(lake, chaining, chained)
        written.append(histories)
        changed = histories.height if plan.changed is None else plan.changed.len()
        result |= {"users_chained": changed, "users_kept": plan.digests.height - changed}
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
