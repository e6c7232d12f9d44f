"""Chaining: session order, gaps, category continuation, counts and the summary."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import polars as pl
import pytest

from transforms.chain import PAPER, chain, chain_some, chain_stats, stats_markdown
from transforms.lake import read_lake_table, write_table
from transforms.schemas import SESSIONS

T0 = datetime(2025, 3, 1, 10, 0, tzinfo=UTC)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def sessions() -> pl.DataFrame:
    """User a: four sessions given out of order (a0 and a1 start together); b: one; c: two.

    session  time           clicked top categories  top_category
    a0       10:00-10:02    [Home]                  Home
    a1       10:00-10:06    [Bags]                  Bags     (starts before a0 ends: overlap)
    a2       10:10-10:20    [Apparel, Bags]         Bags     (two Bags clicks, one Apparel)
    a3       22:40-22:45    []                      Shoes    (no click: most shown in its feed)
    b1       09:00-09:05    [Bags]                  Bags
    c1       10:00-10:01    [Apparel]               Apparel
    c2       10:01:30-10:03 [Apparel]               Apparel
    """
    rows = [
        ("a2", "a", at(10), at(20), 5, ["Apparel", "Bags"], "Bags", "train"),
        ("a3", "a", at(760), at(765), 2, [], "Shoes", "train"),
        ("a1", "a", at(0), at(6), 7, ["Bags"], "Bags", "train"),
        ("a0", "a", at(0), at(2), 3, ["Home"], "Home", "train"),
        ("b1", "b", at(-60), at(-55), 14, ["Bags"], "Bags", "val"),
        ("c1", "c", at(0), at(1), 8, ["Apparel"], "Apparel", "test"),
        ("c2", "c", at(1.5), at(3), 9, ["Apparel"], "Apparel", "test"),
    ]
    names = ("session_id", "user_id", "start_ts", "end_ts", "length", "categories", "top_category", "split")
    frame = [dict(zip(names, r, strict=True)) | {"carts": 0, "buys": 0, "bucket": 0} for r in rows]
    frame = [r | {"clicks": len(r["categories"])} for r in frame]
    return pl.DataFrame(frame, schema=pl.Schema(pl.from_arrow(SESSIONS.empty_table()).schema))


@pytest.fixture(scope="module")
def histories() -> pl.DataFrame:
    return chain(sessions().lazy()).collect()


def row(histories: pl.DataFrame, user: str) -> dict:
    return histories.filter(pl.col("user_id") == user).to_dicts()[0]


def test_sessions_ordered_by_start_ties_by_id(histories):
    # a0 and a1 both start 10:00 -> id order; then a2 (10:10), a3 (22:40)
    assert row(histories, "a")["session_ids"] == ["a0", "a1", "a2", "a3"]
    assert row(histories, "c")["session_ids"] == ["c1", "c2"]


def test_gaps_are_start_minus_previous_end_overlaps_zero(histories):
    # a1 starts 2 min before a0 ends -> 0 (one overlap); a2 10:10 - a1 10:06 = 240 s;
    # a3 22:40 - a2 10:20 = 12 h 20 min = 44,400 s
    a = row(histories, "a")
    assert a["gaps_s"] == [0.0, 240.0, 44_400.0] and a["n_overlaps"] == 1
    assert row(histories, "c")["gaps_s"] == [30.0]
    assert row(histories, "b")["gaps_s"] == []


def test_continuation_is_the_same_top_category(histories):
    # Home->Bags no; Bags->Bags yes; Bags->Shoes no
    a = row(histories, "a")
    assert a["continues"] == [False, True, False] and a["n_continuations"] == 1
    assert a["top_categories"] == ["Home", "Bags", "Bags", "Shoes"]
    assert row(histories, "c")["continues"] == [True]


def test_counts_and_cross_session_flag(histories):
    a = row(histories, "a")
    assert (a["n_sessions"], a["n_actions"], a["lengths"]) == (4, 17, [3, 7, 5, 2])
    assert a["first_ts"] == at(0) and a["last_ts"] == at(765)
    flags = dict(histories.select("user_id", "cross_session").iter_rows())
    assert flags == {"a": True, "b": False, "c": True}
    assert dict(histories.select("user_id", "split").iter_rows()) == {"a": "train", "b": "val", "c": "test"}


def test_summary_figures(histories):
    stats = chain_stats(histories)
    # users 3, sessions 7, actions 17 + 14 + 17 = 48
    assert (stats.users, stats.sessions, stats.actions) == (3, 7, 48)
    # cross users a, c: 6 sessions, 34 actions -> 3 sessions and 17 actions per user
    assert (stats.cross_users, stats.cross_sessions) == (2, 6)
    assert (stats.cross_sessions_per_user, stats.cross_actions_per_user) == (3.0, 17.0)
    # single user b: one session of 14
    assert (stats.single_users, stats.single_session_length_median) == (1, 14.0)
    # pairs: gaps 0, 240, 44400, 30 -> 3 of 4 under 5 min, 1 of 4 over 12 h
    assert (stats.adjacent_pairs, stats.gap_under_5min_share, stats.gap_over_12h_share) == (4, 0.75, 0.25)
    # same top category: a1-a2 and c1-c2 of the 4 pairs
    assert stats.continuation_rate == 0.5
    # pairs where both clicked: a0-a1, a1-a2, c1-c2 (a3 clicked nothing); 2 of 3 keep the top
    # category, and 2 of 3 share a clicked category (a1-a2 Bags, c1-c2 Apparel)
    assert (stats.clicked_pairs, stats.continuation_rate_clicked) == (3, round(2 / 3, 6))
    assert stats.category_overlap_rate_clicked == round(2 / 3, 6)
    assert stats.split_users == {"train": 1, "val": 1, "test": 1} and stats.overlapping_pairs == 1
    table = stats_markdown(stats)
    assert "| continuation_rate | 0.5000 | 0.5780 |" in table and PAPER["cross_users"] == 5768


def test_histories_round_trip_through_the_lake(tmp_path, histories):
    write_table(tmp_path, "histories", histories)
    back = read_lake_table(tmp_path, "histories").sort("user_id")
    assert back.equals(histories.select(back.columns))


def test_chaining_some_users_again_gives_what_chaining_everyone_gives():
    before = sessions()
    grown = pl.concat(  # user a gains a session, c loses one, d appears; b is untouched
        [before.filter(pl.col("session_id") != "c2"),
         before.filter(pl.col("session_id") == "a3").with_columns(
             pl.lit("a4").alias("session_id"), pl.col("start_ts", "end_ts") + timedelta(minutes=140)),
         before.filter(pl.col("session_id") == "b1").with_columns(
             pl.lit("d1").alias("session_id"), pl.lit("d").alias("user_id"))]
    )  # fmt: skip
    kept = chain(before.lazy()).collect()
    kept = kept.with_columns(pl.col("session_ids").list.eval(pl.element() + "-stale"))  # not to be reused
    everyone = chain(grown.lazy()).collect()
    some = chain_some(grown.lazy(), kept, pl.Series(["a", "c", "d"]))  # kept: every earlier history
    assert some.equals(everyone.select(some.columns).with_columns(
        pl.when(pl.col("user_id") == "b").then(pl.col("session_ids").list.eval(pl.element() + "-stale"))
        .otherwise(pl.col("session_ids")).alias("session_ids")))  # fmt: skip
    assert chain_stats(some.with_columns(everyone["session_ids"])) == chain_stats(everyone)
