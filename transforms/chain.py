"""Chaining: a user's sessions in time order become one history (DATA.md ``histories``).

Per user: session ids ordered by start time (ties by session id), the idle gap
before each later session (its start minus the previous session's end, in
seconds; overlapping page views count as 0 and are counted in the summary),
whether each later session *continues* the previous one's category (the same
``sessions.top_category``: the top-level category clicked most, else the one
most shown in its feed), and counts. Users with two or more sessions form the
cross-session setting. The summary reports the continuation rate over all
pairs and, as ``synthetic.calibration`` measures the paper's 57.8 %, over pairs
where both sessions clicked, plus the looser "a clicked top category in
common" rate.

Splits are not decided here: ingest assigns ``split`` per user with
``rekey.split_of``, a hash of (pseudonym, seed) mapped to [0, 1) and cut 8:1:1.
Because the hash is independent of everything a user does, *every* activity
stratum (any subset of users chosen without looking at the hash) is split 8:1:1
in expectation, with binomial noise of sd sqrt(p(1-p)/n) per stratum; and a
user's split depends on nothing that new users or new days can change. Explicit
stratification (sort by activity, deal users round-robin) would make a user's
split depend on everyone else's activity, so it would move when data arrives;
we keep the provably stable hash and *report* per-activity-tertile split shares
in the chain summary instead (``ChainStats.split_share_by_activity``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import polars as pl
from pydantic import BaseModel

from transforms.lake import STAGING, read_lake_table, scan_files, write_table, write_table_part
from transforms.schemas import SPLITS

FIVE_MINUTES_S = 300.0
TWELVE_HOURS_S = 43_200.0

#: UserArena paper figures (DATA.md, ERRATA.md) to compare a summary with
PAPER: dict[str, float] = {
    "users": 11_010,
    "sessions": 64_729,
    "actions": 577_670,
    "actions_per_session": 8.92,
    "single_session_length_median": 14,
    "single_session_length_mean": 15,
    "cross_users": 5_768,
    "cross_user_share": 0.524,
    "cross_sessions": 59_378,
    "cross_sessions_per_user": 10.29,
    "cross_actions_per_user": 86.36,
    "cross_session_length_median": 8,
    "cross_session_length_mean": 8.4,
    "adjacent_pairs": 53_610,
    "gap_under_5min_share": 0.346,
    "gap_over_12h_share": 0.133,
    "continuation_rate": 0.578,
    "continuation_rate_clicked": 0.578,  # the same paper figure, as synthetic.calibration measures it
}


def session_order(sessions: pl.LazyFrame) -> pl.LazyFrame:
    """Sessions in chain order: ``ordinal`` (1-based per user), ``gap_s`` (null first), ``overlaps``."""
    user = "user_id"
    previous_end = pl.col("end_ts").shift(1).over(user)
    gap_ms = (pl.col("start_ts") - previous_end).dt.total_milliseconds()
    return sessions.sort(user, "start_ts", "session_id").with_columns(
        (pl.int_range(pl.len(), dtype=pl.Int32).over(user) + 1).alias("ordinal"),
        (gap_ms.clip(lower_bound=0).cast(pl.Float64) / 1000).alias("gap_s"),
        (gap_ms < 0).alias("overlaps"),
    )


def continuation(ordered: pl.LazyFrame) -> pl.LazyFrame:
    """Per later session: ``continues`` (same ``top_category`` as the previous session; null when
    either has none), ``both_clicked`` and ``overlap`` (their clicked top categories intersect)."""
    user, later = "user_id", pl.col("ordinal") > 1
    top, previous_top = pl.col("top_category"), pl.col("top_category").shift(1).over(user)
    categories, previous = pl.col("categories"), pl.col("categories").shift(1).over(user)
    both_clicked = (pl.col("clicks") > 0) & (pl.col("clicks").shift(1).over(user) > 0)
    return ordered.with_columns(
        pl.when(later).then(top == previous_top).alias("continues"),
        pl.when(later).then(both_clicked).alias("both_clicked"),
        pl.when(later).then(categories.list.set_intersection(previous).list.len() > 0).alias("overlap"),
    )


def chain(sessions: pl.LazyFrame) -> pl.LazyFrame:
    """One row per user with the ``HISTORIES`` columns (plus ``_``-prefixed helpers for the summary)."""
    later = pl.col("ordinal") > 1
    pair = later & pl.col("both_clicked")
    return (
        continuation(session_order(sessions))
        .group_by("user_id", maintain_order=True)
        .agg(
            pl.col("session_id").alias("session_ids"),
            pl.col("start_ts"),
            pl.col("gap_s").filter(later).alias("gaps_s"),
            pl.col("continues").filter(later),
            pl.col("top_category").alias("top_categories"),
            pl.col("length").alias("lengths"),
            pl.len().cast(pl.Int32).alias("n_sessions"),
            pl.col("length").sum().cast(pl.Int32).alias("n_actions"),
            pl.col("clicks").sum().cast(pl.Int32).alias("n_clicks"),
            pl.col("carts").sum().cast(pl.Int32).alias("n_carts"),
            pl.col("buys").sum().cast(pl.Int32).alias("n_buys"),
            pl.col("continues").sum().cast(pl.Int32).alias("n_continuations"),
            pl.col("overlaps").sum().cast(pl.Int32).alias("n_overlaps"),
            pl.col("start_ts").min().alias("first_ts"),
            pl.col("end_ts").max().alias("last_ts"),
            pl.col("split").first(),
            pl.col("bucket").first(),
            # summary helpers (not stored)
            pl.col("continues").filter(later).is_not_null().sum().alias("_decidable"),
            pair.sum().alias("_clicked_pairs"),
            pl.col("continues").filter(pair).sum().alias("_clicked_continued"),
            pl.col("overlap").filter(pair).sum().alias("_clicked_overlap"),
            pl.col("split").n_unique().alias("_splits"),
        )
        .with_columns((pl.col("n_sessions") >= 2).alias("cross_session"))
        .sort("user_id")
    )


#: the per-user figures ``chain_stats`` needs beyond the histories' own columns
SUMMARY_HELPERS = ("_decidable", "_clicked_pairs", "_clicked_continued", "_clicked_overlap", "_splits")


def chain_some(sessions: pl.LazyFrame, kept: pl.DataFrame, changed: pl.Series) -> pl.DataFrame:
    """The histories ``chain(sessions)`` gives, from the ``kept`` rows (histories with their
    ``SUMMARY_HELPERS``) of users not in ``changed`` and the chains of those who are: a user's
    history depends on their own sessions alone."""
    fresh = chain(sessions.filter(pl.col("user_id").is_in(changed.implode()))).collect()
    others = kept.filter(~pl.col("user_id").is_in(changed.implode())).select(fresh.columns)
    return pl.concat([others, fresh], how="vertical_relaxed").sort("user_id")


# --- bucket by bucket --------------------------------------------------------------------------


@dataclass(frozen=True)
class Chaining:
    """What every bucket of one chain shares, as paths: the staging folder its histories go to, and
    for a chain that redoes changed users only, the kept histories (with their ``SUMMARY_HELPERS``)
    and the changed ids."""

    staged: str
    kept: str | None = None
    changed: str | None = None

    @classmethod
    def of(cls, staged: str, kept: pl.DataFrame | None, changed: pl.Series | None) -> Chaining:
        """The kept histories and changed users, when there are any, written beside the staged tables."""
        if kept is None or changed is None:
            return cls(staged)
        folder = Path(staged) / STAGING
        folder.mkdir(parents=True, exist_ok=True)
        kept.write_parquet(folder / "chain-kept.parquet")
        changed.to_frame("user_id").write_parquet(folder / "chain-changed.parquet")
        return cls(staged, str(folder / "chain-kept.parquet"), str(folder / "chain-changed.parquet"))

    def helpers(self) -> Path:
        return Path(self.staged) / STAGING / "chain-helpers"


def chain_bucket(bucket: Sequence[str | Path], chaining: Chaining) -> dict[str, int]:
    """Chain one bucket's sessions (its files under ``bucket=K/``): its histories, and their summary
    helpers beside them, written as ``part-K``; its rows and sessions counted."""
    sessions = scan_files("sessions", bucket)
    number = int(Path(bucket[0]).parent.name.removeprefix("bucket="))
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


def chained_histories(chaining: Chaining, lake: str | Path) -> pl.DataFrame:
    """The reduce: every bucket's staged histories with their summary helpers (``chain_stats``'s
    input); with no sessions at all, an empty histories table is staged for its schema."""
    helpers = sorted(chaining.helpers().glob("*.parquet"))
    if not helpers:
        histories = chain(read_lake_table(lake, "sessions").clear().lazy()).collect()
        write_table(chaining.staged, "histories", histories)
        return histories
    return read_lake_table(chaining.staged, "histories").join(
        pl.read_parquet(helpers), on="user_id", how="left"
    )


class ChainStats(BaseModel):
    """Chain summary, named like ``PAPER`` where the paper reports the same figure."""

    users: int
    sessions: int
    actions: int
    actions_per_session: float
    sessions_per_user: float
    actions_per_user: float
    single_users: int
    single_session_length_mean: float | None
    single_session_length_median: float | None
    cross_users: int
    cross_user_share: float
    cross_sessions: int
    cross_sessions_per_user: float | None
    cross_actions_per_user: float | None
    cross_session_length_mean: float | None
    cross_session_length_median: float | None
    adjacent_pairs: int
    gap_under_5min_share: float | None
    gap_over_12h_share: float | None
    gap_median_s: float | None
    overlapping_pairs: int
    continuation_rate: float | None  # same top category, over pairs where both have one
    clicked_pairs: int  # adjacent pairs where both sessions clicked something
    continuation_rate_clicked: float | None  # same (clicked) top category, over clicked pairs
    category_overlap_rate_clicked: float | None  # any clicked top category in common, over clicked pairs
    split_users: dict[str, int]
    split_share_by_activity: dict[str, dict[str, float]]
    split_conflicts: int


def _share(numerator: int, denominator: int) -> float | None:
    return round(numerator / denominator, 6) if denominator else None


def _mean(series: pl.Series) -> float | None:
    return None if series.is_empty() else round(float(series.mean()), 4)


def _median(series: pl.Series) -> float | None:
    return None if series.is_empty() else float(series.median())


def split_by_activity(histories: pl.DataFrame) -> dict[str, dict[str, float]]:
    """Split shares within activity tertiles (users ranked by actions, ties by id)."""
    ranked = histories.sort("n_actions", "user_id").with_columns(
        (pl.int_range(pl.len()) * 3 // pl.len()).alias("tertile")
    )
    shares = (
        ranked.group_by("tertile", "split")
        .len()
        .with_columns((pl.col("len") / pl.col("len").sum().over("tertile")).alias("share"))
    )
    names = {0: "low", 1: "mid", 2: "high"}
    out: dict[str, dict[str, float]] = {}
    for tertile, split, _, share in shares.sort("tertile", "split").iter_rows():
        out.setdefault(names[tertile], {})[split] = round(share, 4)
    return out


def chain_stats(histories: pl.DataFrame) -> ChainStats:
    """Summary of a ``chain`` result (before writing: it uses the ``_`` helper columns)."""
    cross = histories.filter(pl.col("cross_session"))
    single = histories.filter(~pl.col("cross_session"))
    gaps = cross["gaps_s"].explode().drop_nulls()
    pairs = gaps.len()
    users = histories.height
    n_sessions, n_actions = int(histories["n_sessions"].sum()), int(histories["n_actions"].sum())
    splits = dict(histories.group_by("split").len().sort("split").iter_rows())
    clicked = int(histories["_clicked_pairs"].sum())
    return ChainStats(
        users=users,
        sessions=n_sessions,
        actions=n_actions,
        actions_per_session=round(n_actions / n_sessions, 4) if n_sessions else 0.0,
        sessions_per_user=round(n_sessions / users, 4) if users else 0.0,
        actions_per_user=round(n_actions / users, 4) if users else 0.0,
        single_users=single.height,
        single_session_length_mean=_mean(single["lengths"].explode()),
        single_session_length_median=_median(single["lengths"].explode()),
        cross_users=cross.height,
        cross_user_share=round(cross.height / users, 4) if users else 0.0,
        cross_sessions=int(cross["n_sessions"].sum()),
        cross_sessions_per_user=_mean(cross["n_sessions"]),
        cross_actions_per_user=_mean(cross["n_actions"]),
        cross_session_length_mean=_mean(cross["lengths"].explode()),
        cross_session_length_median=_median(cross["lengths"].explode()),
        adjacent_pairs=pairs,
        gap_under_5min_share=_share(int((gaps < FIVE_MINUTES_S).sum()), pairs),
        gap_over_12h_share=_share(int((gaps > TWELVE_HOURS_S).sum()), pairs),
        gap_median_s=_median(gaps),
        overlapping_pairs=int(histories["n_overlaps"].sum()),
        continuation_rate=_share(int(histories["n_continuations"].sum()), int(histories["_decidable"].sum())),
        clicked_pairs=clicked,
        continuation_rate_clicked=_share(int(histories["_clicked_continued"].sum()), clicked),
        category_overlap_rate_clicked=_share(int(histories["_clicked_overlap"].sum()), clicked),
        split_users={s: int(splits.get(s, 0)) for s in SPLITS},
        split_share_by_activity=split_by_activity(histories),
        split_conflicts=int((histories["_splits"] > 1).sum()),
    )


def stats_markdown(stats: ChainStats) -> str:
    """A two-column comparison with the paper's figures (for the CLI and the Prefect artifact)."""
    values = stats.model_dump()
    lines = ["| figure | this lake | UserArena paper |", "|---|---:|---:|"]
    for name, value in values.items():
        if isinstance(value, dict):
            continue
        paper = PAPER.get(name)
        shown = "–" if value is None else f"{value:,}" if isinstance(value, int) else f"{value:,.4f}"
        ref = "" if paper is None else f"{paper:,}" if float(paper).is_integer() else f"{paper:,.4f}"
        lines.append(f"| {name} | {shown} | {ref} |")
    lines.append("")
    lines.append("Split users: " + ", ".join(f"{k} {v:,}" for k, v in stats.split_users.items()))
    for tertile, shares in stats.split_share_by_activity.items():
        lines.append(f"- activity {tertile}: " + ", ".join(f"{k} {v:.3f}" for k, v in shares.items()))
    return "\n".join(lines)
