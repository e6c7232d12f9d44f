"""The chain flow: sessions -> staged histories -> gate -> lake, a summary comparable with the paper.

Each user bucket of ``sessions`` is chained by its own task (``flows.buckets``): a history depends on
its user's sessions alone. The reduce reads the staged histories back (one row per user) for the
statistics and the record of what was chained.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl
from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows.buckets import map_buckets, per_bucket
from flows.retrying import IO_RETRIES
from flows.staged_write import Staged, StageWrite, write_staged
from flows.stages import tables
from flows.unchanged_users import ChainPlan, plan_chain, record_chain
from transforms.chain import (
    PAPER,
    SUMMARY_HELPERS,
    ChainStats,
    chain,
    chain_some,
    chain_stats,
    stats_markdown,
)
from transforms.lake import (
    STAGING,
    bucket_files,
    read_lake_table,
    scan_files,
    table_dir,
    write_table,
    write_table_part,
)
from transforms.manifest import UsersDone


@dataclass(frozen=True)
class Chaining:
    """What every bucket of one chain shares, as paths: the staging folder, and for a chain that
    redoes changed users only, the kept histories (with their summary helpers) and the changed ids."""

    staged: str
    kept: str | None = None
    changed: str | None = None

    def helpers(self) -> Path:
        return Path(self.staged) / STAGING / "chain-helpers"


def bucket_number(files: list[str]) -> int:
    """K of the ``bucket=K`` folder the files lie in."""
    return int(Path(files[0]).parent.name.removeprefix("bucket="))


def _chain_bucket(bucket: list[str], chaining: Chaining) -> dict:
    """Chain one bucket's sessions (its files); write its histories and their summary helpers."""
    sessions = scan_files("sessions", bucket)
    number = bucket_number(bucket)
    if chaining.changed is None:
        histories = chain(sessions).collect()
    else:
        kept = pl.scan_parquet(chaining.kept).filter(pl.col("bucket") == number).collect()
        histories = chain_some(sessions, kept, pl.read_parquet(chaining.changed)["user_id"])
    file_name = f"part-{number}.parquet"
    write_table_part(chaining.staged, "histories", histories, file_name)
    if histories.height:
        chaining.helpers().mkdir(parents=True, exist_ok=True)
        histories.select("user_id", *SUMMARY_HELPERS).write_parquet(chaining.helpers() / file_name)
    return {"rows": histories.height, "sessions": sessions.select(pl.len()).collect().item()}


chain_bucket = per_bucket("chain-bucket", _chain_bucket)


def chaining_for(staged: str, plan: ChainPlan) -> Chaining:
    """The plan's kept histories and changed users written beside the staged tables (tasks exchange
    paths)."""
    if plan.changed is None or plan.kept is None:
        return Chaining(staged)
    folder = Path(staged) / STAGING
    folder.mkdir(parents=True, exist_ok=True)
    plan.kept.write_parquet(folder / "chain-kept.parquet")
    plan.changed.to_frame("user_id").write_parquet(folder / "chain-changed.parquet")
    return Chaining(staged, str(folder / "chain-kept.parquet"), str(folder / "chain-changed.parquet"))


@task(name="chain-summary", cache_policy=NO_CACHE, **IO_RETRIES)
def chain_summary(lake: str, chaining: Chaining, buckets: list[dict]) -> tuple[dict, pl.DataFrame]:
    """The reduce: the staged histories with their helpers read back for the statistics (an empty
    table gets its schema file); returns the statistics and that frame, recorded once it is in place."""
    helpers = sorted(chaining.helpers().glob("*.parquet"))
    if not helpers:  # no sessions: the table's schema alone
        histories = chain(read_lake_table(lake, "sessions").clear().lazy()).collect()
        write_table(chaining.staged, "histories", histories)
    else:
        histories = read_lake_table(chaining.staged, "histories").join(
            pl.read_parquet(helpers), on="user_id", how="left"
        )
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
        chaining = chaining_for(staged, plan)
        buckets = [[str(path) for path in files] for files in bucket_files(lake, "sessions")]
        result, histories = chain_summary(
            lake, chaining, map_buckets(chain_bucket, buckets, chaining=chaining)
        )
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
