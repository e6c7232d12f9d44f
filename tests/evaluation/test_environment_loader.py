"""The lake loader: one session's layout, the items it may open, its record, profile and recent history.

Built on the extraction tests' hand-built lake (tests/extractors/tinylake.py: users A, B, C;
sessions sA, sB1, sB2, sC), with the tables the environment needs added here.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import polars as pl
import pytest

from evaluation.environment import EnvironmentSettings
from evaluation.loader import load_sessions
from evaluation.replay import ReplayCursor
from tests.evaluation.test_environment import training_messages
from tests.extractors.tinylake import ITEM, OWNER, SCRIPT, SESSION, START, T0, TITLE, USER, write_tiny_lake
from transforms.lake import write_table
from transforms.prompts import PromptSettings
from transforms.schemas import FEED_LAYOUTS, HISTORY, PROFILES, SESSIONS, polars_schema

CARD_HEIGHT, FEED_HEIGHT = 300, 1500


def conformed(rows: list[dict], schema) -> pl.DataFrame:
    declared = polars_schema(schema)
    frame = pl.DataFrame(rows)
    missing = [pl.lit(None, dtype=t).alias(c) for c, t in declared.items() if c not in frame.columns]
    return frame.with_columns(missing).select(list(declared)).cast(dict(declared))


def feed_order(session: str) -> list[str]:
    """The session's cards: every item its record shows, first-seen order."""
    seen: dict[str, None] = {}
    for _screen, _action, item, visible, _distance in SCRIPT[session]:
        seen.update(dict.fromkeys(visible))
        if item:
            seen[item] = None
    return list(seen)


def write_environment_lake(path: Path) -> Path:
    """The tiny lake with the tables the environment needs: sessions, feed layouts, profiles, history."""
    write_tiny_lake(path)
    sessions, layouts = [], []
    for name, script in SCRIPT.items():
        user, bucket, split = OWNER[name]
        start = T0 + timedelta(hours=START[name])
        sessions.append(
            {
                "session_id": SESSION[name],
                "user_id": USER[user],
                "start_ts": start,
                "end_ts": start + timedelta(seconds=10 * (len(script) - 1)),
                "length": len(script),
                "feed_height": FEED_HEIGHT,
                "split": split,
                "bucket": bucket,
            }
        )
        for rank, item in enumerate(feed_order(name)):
            layouts.append(
                {
                    "session_id": SESSION[name],
                    "item_id": ITEM[item],
                    "rank": rank,
                    "x": 4,
                    "y": rank * CARD_HEIGHT,
                    "width": 196,
                    "height": CARD_HEIGHT,
                    "feed_height": FEED_HEIGHT,
                    "bucket": bucket,
                }
            )
    write_table(path, "sessions", conformed(sessions, SESSIONS))
    write_table(path, "feed_layouts", conformed(layouts, FEED_LAYOUTS))
    profiles = [{"user_id": USER[u], "profile": {"age_band": f"band {u}"}, "split": "train"} for u in "ABC"]
    write_table(path, "profiles", conformed(profiles, PROFILES))
    history = [
        {
            "user_id": USER["A"],
            "ts": T0 - timedelta(hours=3),
            "kind": "click",
            "title": "old click 1",
            "category": "Shoes-Women-Boots",
        },
        {
            "user_id": USER["A"],
            "ts": T0 - timedelta(hours=2),
            "kind": "click",
            "title": "old click 2",
            "category": "Bags-Totes-Canvas",
        },
        {
            "user_id": USER["A"],
            "ts": T0 - timedelta(hours=1),
            "kind": "buy",
            "title": "bought",
            "category": "Bags-Totes-Canvas",
        },
        {
            "user_id": USER["A"],
            "ts": T0,
            "kind": "click",
            "title": "at the start",
            "category": "Home",
        },  # not strictly before
        {
            "user_id": USER["B"],
            "ts": T0 + timedelta(hours=1.5),
            "kind": "click",
            "title": "between",
            "category": "Home",
        },
    ]
    write_table(path, "history", conformed(history, HISTORY))
    return path


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> Path:
    return write_environment_lake(tmp_path_factory.mktemp("lake"))


def by_name(sessions) -> dict:
    names = {v: k for k, v in SESSION.items()}
    return {names[s.session_id]: s for s in sessions}


def test_the_profile_is_the_first_steps_snapshot(lake: Path):
    # the steps carry a snapshot (age band 25-34); the profiles table's row is older
    assert load_sessions(lake)[0].profile["age_band"] == "25-34"


def test_each_session_gets_its_own_layout_items_and_record(lake: Path):
    loaded = by_name(load_sessions(lake))
    assert sorted(loaded) == ["sA", "sB1", "sB2", "sC"]
    for name, session in loaded.items():
        expected = [ITEM[i] for i in feed_order(name)]
        assert [c.item_id for c in session.cards] == expected
        assert [c.y for c in session.cards] == [float(CARD_HEIGHT * r) for r in range(len(expected))]
        # every card is in the session's catalog, also those the shopper never opened
        assert set(session.items) == set(expected)
        assert [s.action for s in session.steps] == [row[1] for row in SCRIPT[name]]
        assert session.feed_height == FEED_HEIGHT
    assert loaded["sB1"].items[ITEM["i04"]].title == TITLE["i04"]


def test_recent_history_is_strictly_before_the_session_newest_first(lake: Path):
    loaded = by_name(load_sessions(lake))
    assert loaded["sA"].recent_clicks == ("old click 2", "old click 1")
    assert loaded["sA"].recent_buys == ("bought",)
    # B's click at +1.5 h falls between sB1 (+1 h) and sB2 (+2 h)
    assert (loaded["sB1"].recent_clicks, loaded["sB2"].recent_clicks) == ((), ("between",))
    assert (loaded["sA"].prior_clicks, loaded["sA"].prior_buys) == (2, 1)
    assert loaded["sA"].recent_click_categories == ("Bags-Totes-Canvas", "Shoes-Women-Boots")
    assert (loaded["sB2"].prior_clicks, loaded["sB2"].prior_buys, loaded["sC"].prior_clicks) == (1, 0, 0)
    limited = by_name(
        load_sessions(lake, settings=EnvironmentSettings(prompt=PromptSettings(recent_clicks=1)))
    )
    assert limited["sA"].recent_clicks == ("old click 2",)
    assert limited["sA"].prior_clicks == 2  # the counts are not limited


def test_sessions_chosen_by_id_or_split(lake: Path):
    assert list(by_name(load_sessions(lake, split="val"))) == ["sC"]
    assert list(by_name(load_sessions(lake, [SESSION["sB2"]]))) == ["sB2"]


def test_replay_over_the_lake_renders_the_training_records_prompts(lake: Path):
    expected = training_messages(lake)
    cursors = [ReplayCursor(session) for session in load_sessions(lake)]
    # the hand-built record has no feed offsets, but logs the cards in view: every step is
    # rebuilt as the records show it ("Scroll position: unknown"), 8 + 4 + 4 + 3 = 19 steps
    assert sum(len(c) for c in cursors) == 19
    assert all(not c.skipped for c in cursors)
    for cursor in cursors:
        for step in cursor:
            assert step.messages() == expected[(cursor.session.session_id, step.recorded.step)]
