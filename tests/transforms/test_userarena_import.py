"""UserArena release records (single and cross-session) into the lake, worked out by hand.

The feed geometry is the one of tests/bundles.py (cards itm-1..itm-8, feed height 1240).
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from tests.bundles import CARDS, FEED_HEIGHT
from transforms.config import IngestSettings
from transforms.ingest import ingest_bundle
from transforms.lake import read_lake_table
from transforms.rekey import Pseudonymizer

PROFILE = {"age_band": "25-29", "gender": "f", "city_tier": "1", "purchase_power": "mid",
           "member_level": "gold", "lifecycle": "active", "hobby": "hiking"}  # fmt: skip


def catalog(*numbers: int) -> list[dict]:
    cards = {item: (x, y, h) for item, x, y, h in CARDS}
    return [
        {"item_id": f"itm-{n}", "item_title": f"Linen shirt {n}", "item_price": f"¥{100 + n}.00",
         "item_cate": "Apparel-Tops-Shirts", "item_image": f"pic-{n}.jpg",
         "bbox": {"x": cards[f"itm-{n}"][0], "y": cards[f"itm-{n}"][1], "height": cards[f"itm-{n}"][2],
                  "width": 195},
         "item_params": [{"label": "material", "value": "linen"}], "item_reviews": ["fits well", "thin"]}
        for n in numbers
    ]  # fmt: skip


SINGLE = {
    "session_id": "pv-U1", "visitor_id": "vis-1", "user_info": PROFILE,
    "user_click_list": ["Old linen shirt"], "user_buy_list": [{"title": "Canvas tote", "category": "Bags"}],
    "history_counts": {"click": 1, "buy": 1},
    "feed_long_image": {"url": "feed-U1.jpg", "height": FEED_HEIGHT}, "feed_catalog": catalog(*range(1, 9)),
    "trajectory": [
        {"step_type": "feed", "scroll_top": 0, "visible_items": ["itm-1", "itm-2", "itm-3", "itm-4"]},
        {"step_type": "feed", "action": "scroll_down", "scroll_top": 0, "scroll_delta_px": 400, "gui_image": "g0"},
        {"step_type": "transition", "action": "click", "clicked_item_id": "itm-5", "scroll_top": 400},
        {"step_type": "ipv", "action": "ipv_click_param", "item_id": "itm-5", "scroll_top": 0,
         "ipv_step_ui_state": "main", "property_values": "material:linen"},
        {"step_type": "transition", "action": "back_home", "item_id": "itm-5", "scroll_top": 0},
        {"step_type": "feed", "action": "click", "clicked_item_id": "itm-8", "scroll_top": 400},
        {"step_type": "feed", "action": "end", "scroll_top": 400},
    ],
}  # fmt: skip
CROSS = {
    "visitor_id": "vis-2", "pv_ids": ["pv-C1", "pv-C2"], "num_sessions": 2,
    "user_info": dict(PROFILE, gender="m"),
    "feed_session_screenshots": [
        {"pv_id": "pv-C1", "feed_long_image": {"height": FEED_HEIGHT}, "feed_catalog": catalog(1, 2, 3, 4)},
        {"pv_id": "pv-C2", "feed_long_image": {"height": FEED_HEIGHT}, "feed_catalog": catalog(*range(1, 9))},
    ],
    "trajectory": [
        {"pv_id": "pv-C1", "step_type": "feed", "action": "click", "clicked_item_id": "itm-2", "scroll_top": 0},
        {"pv_id": "pv-C1", "step_type": "ipv", "action": "ipv_buy", "item_id": "itm-3"},
        {"pv_id": "pv-C1", "step_type": "ipv", "action": "end", "item_id": "itm-3"},
        {"pv_id": "pv-C2", "step_type": "feed", "action": "scroll_down", "scroll_top": 0, "scroll_distance": 400},
        {"pv_id": "pv-C2", "step_type": "feed", "action": "click", "clicked_item_id": "itm-6", "scroll_top": 400},
        {"pv_id": "pv-C2", "step_type": "ipv", "action": "ipv_enter_comment", "item_id": "itm-6", "scroll_top": 0},
        {"pv_id": "pv-C2", "step_type": "ipv", "action": "ipv_click_comment", "item_id": "itm-6",
         "review_index": 0, "ipv_step_ui_state": "comments"},
        {"pv_id": "pv-C2", "step_type": "ipv", "action": "ipv_buy", "item_id": "itm-6"},
        {"pv_id": "pv-C2", "step_type": "ipv", "action": "end", "item_id": "itm-6"},
    ],
}  # fmt: skip
DEFECTS = {
    "session_id": "pv-U3", "visitor_id": "vis-3", "user_info": PROFILE, "feed_catalog": catalog(1, 2, 3, 4),
    "feed_long_image": {"height": FEED_HEIGHT},
    "trajectory": [
        {"step_type": "ipv", "action": "ipv_scroll_down", "item_id": "itm-1", "scroll_top": 0, "scroll_delta_px": 300},
        {"step_type": "feed", "action": "click", "clicked_item_id": "itm-7", "scroll_top": 0},
        {"step_type": "ipv", "action": "back_home", "item_id": "itm-7"},
        {"step_type": "feed", "action": "end", "scroll_top": 0},
    ],
}  # fmt: skip
UNPRESENTABLE = {
    "session_id": "pv-U4", "visitor_id": "vis-4", "user_info": PROFILE, "feed_catalog": catalog(1, 2, 3, 4),
    "feed_long_image": {"height": FEED_HEIGHT},
    "trajectory": [
        {"step_type": "feed", "action": "scroll_down", "scroll_top": 0, "scroll_delta_px": 100},
        {"step_type": "feed", "action": "click", "clicked_item_id": "itm-7", "scroll_top": 100},
        {"step_type": "ipv", "action": "back_home", "item_id": "itm-7"},
        {"step_type": "feed", "action": "end", "scroll_top": 100},
    ],
}  # fmt: skip


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> tuple[Path, object]:
    root = tmp_path_factory.mktemp("userarena")
    records = (SINGLE, CROSS, DEFECTS, UNPRESENTABLE)
    lines = [json.dumps(r) for r in records] + ['{"session_id": "pv-bad", "trajectory": [']
    (root / "release.jsonl").write_text("\n".join(lines) + "\n")
    result = ingest_bundle(root / "release.jsonl", root / "lake", source_format="userarena")
    return root / "lake", result


def session_key(pv: str) -> str:
    return Pseudonymizer(IngestSettings().rekey_key).column(pl.Series([pv]), "session")[0]


def item_keys(*numbers: int) -> list[str]:
    keyed = Pseudonymizer(IngestSettings().rekey_key).column(pl.Series([f"itm-{n}" for n in numbers]), "item")
    return keyed.to_list()


def steps_of(lake: Path, pv: str) -> pl.DataFrame:
    return read_lake_table(lake, "steps").filter(pl.col("session_id") == session_key(pv)).sort("step")


def test_single_session_record(imported):
    lake, _ = imported
    steps = steps_of(lake, "pv-U1")
    # the context row is not an action; the click on itm-8 is followed by `end`, never a detail page:
    # that click is rejected, so the session is cut before it (its `end` is never stitched on)
    assert steps["action"].to_list() == ["scroll_down", "click", "ipv_click_param", "back_home"]
    assert steps["screen"].to_list() == ["feed", "feed", "ipv", "ipv"]
    session = read_lake_table(lake, "sessions").filter(pl.col("session_id") == session_key("pv-U1"))
    cut = ("truncated", "click_without_detail_page", 4)
    assert session.select("terminal", "cut_reason", "length").row(0) == cut
    assert steps["visible_items"][0].to_list() == item_keys(1, 2, 3, 4)
    assert steps["target_item_id"][1] == item_keys(5)[0] and steps["target_title"][1] == "Linen shirt 5"
    assert steps["distance"][0] == 400 and steps["ui_state"][2] == "main"
    profile = steps["profile"][0]
    assert profile["member_level"] == "gold" and json.loads(steps["profile_extra"][0]) == {"hobby": "hiking"}


def test_cross_session_record(imported):
    lake, _ = imported
    assert steps_of(lake, "pv-C1").height == 0  # its only excursion was about another product
    steps = steps_of(lake, "pv-C2")
    assert steps["action"].to_list() == [
        "scroll_down", "click", "ipv_enter_comment", "ipv_click_comment", "ipv_buy", "end"]  # fmt: skip
    assert steps["review_alias"][3] == "C1" and steps["distance"][0] == 400
    sessions = read_lake_table(lake, "sessions")
    assert sessions.filter(pl.col("session_id") == session_key("pv-C2"))["terminal"][0] == "purchase"
    # pv-C2 is whole; pv-U1 and pv-U4 are cut; pv-C1 and pv-U3 are cut at their first row: no steps
    assert sessions["cut_reason"].is_null().sum() == 1 and sessions.height == 3
    assert sessions["user_id"].n_unique() == 3  # vis-1, vis-2, vis-4 (vis-3 kept no step)


def test_a_defective_excursion_cuts_its_session(imported):
    lake, _ = imported
    assert steps_of(lake, "pv-U4")["action"].to_list() == ["scroll_down"]  # not scroll_down, end
    session = read_lake_table(lake, "sessions").filter(pl.col("session_id") == session_key("pv-U4"))
    assert session.select("terminal", "cut_reason").row(0) == ("truncated", "unpresentable_click")


def test_items_prices_and_history(imported):
    lake, _ = imported
    items = read_lake_table(lake, "items")
    assert items.height == 8  # one catalog entry per item, however many records list it
    assert sorted(items["price"].to_list()) == [101.0 + n for n in range(8)]  # "¥101.00" -> 101.0
    history = read_lake_table(lake, "history").sort("kind")
    assert history.select("kind", "title").rows() == [("buy", "Canvas tote"), ("click", "Old linen shirt")]


def test_defective_excursions_are_quarantined_with_reasons(imported):
    _, result = imported
    # the first row of a defective excursion carries its reason; it cuts the session, so every
    # row after it (the rest of the excursion too) is after_rejected_event
    assert result.quarantine_by_reason == {
        "click_without_detail_page": 1,  # pv-U1: click on itm-8, then end
        "excursion_product_mismatch": 1,  # pv-C1: click itm-2, detail rows about itm-3 (buy, end)
        "detail_step_without_page": 1,  # pv-U3: detail row before any click
        "unpresentable_click": 1,  # pv-U4: itm-7 is not in that visit's catalog (click + back_home)
        "unparseable_row": 1,  # the truncated last line
        # pv-U1: end; pv-C1: ipv_buy, end; pv-U3: click, back_home, end; pv-U4: back_home, end
        "after_rejected_event": 1 + 2 + 3 + 2,
        "session_without_actions": 8,  # four feed cards each of pv-C1 and pv-U3: no action survived
    }
    events = result.counts["events"]
    # in: 6 + 9 + 4 + 4 actions + 1 bad line; out: pv-U1's 4 steps before the cut, pv-C2's 6, pv-U4's 1
    assert (events.rows_in, events.rows_out, events.quarantined) == (24, 11, 13)
    assert all(c.balanced for c in result.counts.values())
    assert result.notes["context_rows"] == 1 and result.notes["synthetic_timestamps"] == 23


# --- a step that fails typing cuts its session at its place in the trajectory ----------------------
# Every step of a record shares the record's line, so the trajectory index is the only place a
# mistyped step can be told to stand at. Each record below is one feed view of cards itm-1..itm-8.


def feed_record(pv: str, trajectory: list[dict]) -> dict:
    return {"session_id": pv, "visitor_id": f"vis-{pv}", "user_info": PROFILE,
            "feed_long_image": {"height": FEED_HEIGHT}, "feed_catalog": catalog(*range(1, 9)),
            "trajectory": trajectory}  # fmt: skip


def with_times(trajectory: list[dict], spoilt: int, bad_ts: str) -> list[dict]:
    """Each step logged one second after the one before; step ``spoilt`` logs ``bad_ts`` instead."""
    timed = [dict(step, ts=f"2026-03-01T10:00:{i:02d}Z") for i, step in enumerate(trajectory)]
    timed[spoilt]["ts"] = bad_ts
    return timed


# step 2's scroll_top is no number: scroll_down and scroll_up stay; click, ipv_buy, end follow the cut
MISTYPED_STEPS = [
    {"step_type": "feed", "action": "scroll_down", "scroll_top": 0, "scroll_delta_px": 400},
    {"step_type": "feed", "action": "scroll_up", "scroll_top": 400, "scroll_delta_px": 400},
    {"step_type": "feed", "action": "scroll_down", "scroll_top": "four hundred", "scroll_delta_px": 400},
    {"step_type": "feed", "action": "click", "clicked_item_id": "itm-5", "scroll_top": 400},
    {"step_type": "ipv", "action": "ipv_buy", "item_id": "itm-5"},
    {"step_type": "ipv", "action": "end", "item_id": "itm-5"},
]  # fmt: skip
CLEAN_STEPS = [dict(s, scroll_top=0) if i == 2 else s for i, s in enumerate(MISTYPED_STEPS)]
# the same steps, every one with a readable ts except step 2's
UNTIMED_STEPS = with_times(CLEAN_STEPS, spoilt=2, bad_ts="the day after tomorrow")
# step 1 is mistyped and so is step 3, which follows the cut: it stays under its own reason
TWICE_STEPS = [dict(s, scroll_top="x") if i in (1, 3) else s for i, s in enumerate(CLEAN_STEPS)]
MISTYPED_RECORDS = (
    feed_record("pv-M1", MISTYPED_STEPS),  # line 0
    feed_record("pv-M2", UNTIMED_STEPS),  # line 1
    feed_record("pv-M3", TWICE_STEPS),  # line 2
)


def ingest_records(root: Path, records: tuple[dict, ...], settings: IngestSettings | None = None):
    (root / "release.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    result = ingest_bundle(root / "release.jsonl", root / "lake", settings, source_format="userarena")
    assert all(c.balanced for c in result.counts.values()), result.counts
    return root / "lake", result


def event_rejects(lake: Path) -> list[tuple[str, int]]:
    rows = read_lake_table(lake, "quarantine").filter(~pl.col("kept") & (pl.col("table_name") == "events"))
    return sorted(rows.select("reason", "source_row").iter_rows())


def session_of(lake: Path, pv: str) -> tuple:
    sessions = read_lake_table(lake, "sessions").filter(pl.col("session_id") == session_key(pv))
    return sessions.select("terminal", "cut_reason", "length").row(0)


@pytest.fixture(scope="module")
def mistyped(tmp_path_factory) -> tuple[Path, object]:
    return ingest_records(tmp_path_factory.mktemp("mistyped"), MISTYPED_RECORDS)


def test_a_step_with_a_non_numeric_scroll_top_cuts_its_session(mistyped):
    lake, _ = mistyped
    # never scroll_down, scroll_up, click, ipv_buy, end: the steps around step 2 did not follow each other
    assert steps_of(lake, "pv-M1")["action"].to_list() == ["scroll_down", "scroll_up"]
    assert session_of(lake, "pv-M1") == ("truncated", "schema_mismatch", 2)


def test_a_step_with_an_unreadable_timestamp_cuts_its_session(mistyped):
    lake, _ = mistyped
    steps = steps_of(lake, "pv-M2")
    assert steps["action"].to_list() == ["scroll_down", "scroll_up"]
    assert steps["ts"].dt.second().to_list() == [0, 1]  # the logged times, not synthesised ones
    assert session_of(lake, "pv-M2") == ("truncated", "schema_mismatch", 2)


def test_a_mistyped_step_is_quarantined_once_at_its_records_line(mistyped):
    lake, result = mistyped
    assert steps_of(lake, "pv-M3")["action"].to_list() == ["scroll_down"]
    assert session_of(lake, "pv-M3") == ("truncated", "schema_mismatch", 1)
    # pv-M1 (line 0) and pv-M2 (line 1): step 2, then steps 3..5 after it; pv-M3 (line 2): steps 1
    # and 3 under their own reason, steps 2, 4, 5 after the cut
    assert event_rejects(lake) == sorted(
        [("schema_mismatch", 0), *[("after_rejected_event", 0)] * 3,
         ("schema_mismatch", 1), *[("after_rejected_event", 1)] * 3,
         ("schema_mismatch", 2), ("schema_mismatch", 2), *[("after_rejected_event", 2)] * 3]
    )  # fmt: skip
    events = result.counts["events"]
    # in: 3 records x 6 steps; out: 2 + 2 + 1 steps; quarantined: 4 + 4 + 5
    assert (events.rows_in, events.rows_out, events.quarantined) == (18, 5, 13)
    # pv-M2 logs every step's time, the bad one included: only pv-M1's and pv-M3's are synthesised
    assert result.notes["synthetic_timestamps"] == 12


def test_drop_session_drops_the_whole_session_of_a_mistyped_step(tmp_path):
    settings = IngestSettings(on_bad_event="drop_session")
    lake, result = ingest_records(tmp_path, MISTYPED_RECORDS[:1], settings)
    assert read_lake_table(lake, "steps").height == 0 and read_lake_table(lake, "sessions").height == 0
    # step 2 under its own reason; the other five steps with the session
    assert event_rejects(lake) == sorted([("schema_mismatch", 0), *[("dropped_with_session", 0)] * 5])
    events = result.counts["events"]
    assert (events.rows_in, events.rows_out, events.quarantined) == (6, 0, 6)


def test_a_mistyped_step_whose_action_is_dropped_cuts_nothing(tmp_path):
    # a favorite between the two scrolls, mapped to drop: the session goes on whole without it
    favorite = {"step_type": "feed", "action": "favorite", "scroll_top": "n/a", "item_id": "itm-1"}
    record = feed_record("pv-F1", [*CLEAN_STEPS[:2], favorite, *CLEAN_STEPS[2:]])
    lake, result = ingest_records(tmp_path, (record,), IngestSettings(action_map={"favorite": "drop"}))
    expected = ["scroll_down", "scroll_up", "scroll_down", "click", "ipv_buy", "end"]
    assert steps_of(lake, "pv-F1")["action"].to_list() == expected
    assert session_of(lake, "pv-F1") == ("purchase", None, 6)
    assert event_rejects(lake) == [("schema_mismatch", 0)]  # the reader could not type it
    events = result.counts["events"]
    assert (events.rows_in, events.rows_out, events.quarantined) == (7, 6, 1)
