"""Fractional CSS pixels, lenient card boxes and sessions cut (never stitched) at a rejected event.

Expected steps are worked out by hand in the comments; ids are compared through their pseudonyms.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from pydantic import ValidationError

from tests.bundles import event, items, profiles, tiny_bundle, write_bundle
from transforms.config import Geometry, IngestSettings
from transforms.ingest import ingest_bundle
from transforms.lake import read_lake_table
from transforms.records import write_records
from transforms.rekey import Pseudonymizer

KEYS = Pseudonymizer(IngestSettings().rekey_key)


def keyed(kind: str, *raw: str) -> list[str]:
    return KEYS.column(pl.Series(list(raw)), kind).to_list()


def ingest(tmp_path: Path, bundle: dict, settings: IngestSettings | None = None, fmt: str = "parquet"):
    write_bundle(bundle, tmp_path / "raw", fmt)
    result = ingest_bundle(tmp_path / "raw", tmp_path / "lake", settings)
    assert all(c.balanced for c in result.counts.values()), result.counts
    return result, tmp_path / "lake"


def quarantined(lake: Path) -> dict[str, list[str]]:
    """Rejected (not kept) rows by reason: their raw source rows, as 'table:row'."""
    rows = read_lake_table(lake, "quarantine").filter(~pl.col("kept")).sort("table_name", "source_row")
    by_reason: dict[str, list[str]] = {}
    for table, row, reason in rows.select("table_name", "source_row", "reason").iter_rows():
        by_reason.setdefault(reason, []).append(f"{table}:{row}")
    return by_reason


# --- 1. fractional pixels everywhere -----------------------------------------------

# Cards 196.5 px wide in columns at x = 4.5 and 205.5; feed 1240.5 px; viewport 693.5 px, so the
# largest offset is 1240.5 - 693.5 = 547.
FRACTIONAL_CARDS = [  # item, x, y, height -> spans
    ("itm-1", 4.5, 0.0, 300.5),  # 0..300.5
    ("itm-2", 205.5, 0.0, 260.25),  # 0..260.25
    ("itm-3", 205.5, 260.25, 300.5),  # 260.25..560.75
    ("itm-4", 4.5, 300.5, 320.25),  # 300.5..620.75
    ("itm-5", 205.5, 560.75, 300.0),  # 560.75..860.75
    ("itm-6", 4.5, 620.75, 300.0),  # 620.75..920.75
    ("itm-7", 205.5, 860.75, 300.0),  # 860.75..1160.75
    ("itm-8", 4.5, 920.75, 300.0),  # 920.75..1220.75
]
FRACTIONAL_GEOMETRY = Geometry(feed_viewport=693.5)


def fractional_bundle() -> dict:
    feeds = [
        {"page_view_id": "pv-A", "item_id": item, "x": x, "y": y, "width": 196.5, "height": h,
         "feed_height": 1240.5}
        for item, x, y, h in FRACTIONAL_CARDS
    ]  # fmt: skip
    events = [
        event("ev-0", 0, "feed", "scroll_down", scroll_top=0.0, scroll_delta=400.4),
        event("ev-1", 5, "feed", "click", scroll_top=400.4, item_id="itm-5"),
        event("ev-2", 9, "ipv", "ipv_scroll_down", item_id="itm-5", ipv_scroll=0.0, scroll_delta=500.6),
        event("ev-3", 12, "ipv", "back_home", item_id="itm-5", ipv_scroll=500.6),
        # no logged delta: the move to the next offset, 400.4 - 100.2 = 300.2 -> distance 300
        event("ev-4", 15, "feed", "scroll_up", scroll_top=400.4),
        event("ev-5", 20, "feed", "end", scroll_top=100.2),
    ]
    return {"profiles": profiles(), "items": items(), "feeds": feeds, "events": events, "history": []}


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "csv"])
def test_fractional_pixels_everywhere_ingest_exactly(tmp_path, fmt):
    result, lake = ingest(tmp_path, fractional_bundle(), IngestSettings(geometry=FRACTIONAL_GEOMETRY), fmt)
    assert quarantined(lake) == {} and result.counts["feeds"].rows_out == 8
    steps = read_lake_table(lake, "steps").sort("step")
    assert steps["action"].to_list() == [
        "scroll_down", "click", "ipv_scroll_down", "back_home", "scroll_up", "end"]  # fmt: skip
    # 400.4 -> 400; 500.6 -> 501 (nearest whole px); 300.2 -> 300; the offsets stay exact
    assert steps["distance"].to_list() == [400, None, 501, None, 300, None]
    assert steps["scroll_top"].to_list() == [0.0, 400.4, 400.4, 400.4, 400.4, 100.2]
    assert steps["ipv_scroll"].to_list() == [None, None, 0.0, 500.6, None, None]
    visible = [v.to_list() if v is not None else None for v in steps["visible_items"]]
    # top 0, view [0, 693.5]: itm-5 shows 693.5 - 560.75 = 132.75 < 150 -> itm-1..4
    # top 400.4, view [400.4, 1093.9]: itm-3 shows 560.75 - 400.4 = 160.35 >= 150.25; itm-8 shows
    #   1093.9 - 920.75 = 173.15 >= 150 -> itm-3..8
    # top 100.2, view [100.2, 793.7]: itm-2 shows 160.05 >= 130.125; itm-6 shows 172.95 >= 150; itm-7
    #   starts below 793.7 -> itm-1..6
    assert visible == [
        keyed("item", "itm-1", "itm-2", "itm-3", "itm-4"),
        keyed("item", "itm-3", "itm-4", "itm-5", "itm-6", "itm-7", "itm-8"),
        None,
        None,
        keyed("item", "itm-3", "itm-4", "itm-5", "itm-6", "itm-7", "itm-8"),
        keyed("item", "itm-1", "itm-2", "itm-3", "itm-4", "itm-5", "itm-6"),
    ]
    layout = read_lake_table(lake, "feed_layouts").sort("rank")
    assert layout.select("x", "y", "width", "height").rows() == [
        (x, y, 196.5, h) for _, x, y, h in FRACTIONAL_CARDS
    ]
    session = read_lake_table(lake, "sessions").row(0, named=True)
    assert session["feed_height"] == 1240.5 and session["cut_reason"] is None
    assert session["terminal"] == "browse_only" and session["length"] == 6


def test_a_logged_distance_rounds_half_up():
    from transforms.align import scroll_distance

    moves = pl.DataFrame({"px": [331.4, 331.5, -331.5, 0.4, 0.5, 694.49]})
    # nearest whole px, halves up; the sign is the direction, the distance its size
    assert moves.select(scroll_distance(pl.col("px")))["px"].to_list() == [331, 332, 332, 0, 1, 694]


# --- 2. lenient card boxes (UserArena) ---------------------------------------------

# Boxes of only y and height; card C has no height (the reference's 328 px), card F no y.
# Feed 2000.5 px, viewport 693:
#   A 0..300, B 150.5..450.5, C 500.25..828.25, D 900..1200, E 1300..1600
#   top 0:     A, B; C shows 693 - 500.25 = 192.75 >= 164 -> A, B, C
#   top 300.5: view [300.5, 993.5]: A shows 0; B shows 450.5 - 300.5 = 150 = half of 300 (visible);
#              C whole; D shows 93.5 < 150 -> B, C
BOXES = {"A": {"y": 0, "height": 300}, "B": {"y": 150.5, "height": 300}, "C": {"y": 500.25},
         "D": {"y": 900, "height": 300}, "E": {"y": 1300, "height": 300}, "F": {"height": 300}}  # fmt: skip
PARTIAL_BOXES = {
    "session_id": "pv-P", "visitor_id": "vis-P", "user_info": {"gender": "f"},
    "feed_long_image": {"height": 2000.5},
    "feed_catalog": [
        {"item_id": name, "item_title": f"Card {name}", "item_price": 10, "item_cate": "Bags-Totes",
         "bbox": box, "item_reviews": []}
        for name, box in BOXES.items()
    ],
    "trajectory": [
        {"step_type": "feed", "action": "scroll_down", "scroll_top": 0, "scroll_delta_px": 300.5},
        {"step_type": "transition", "action": "click", "clicked_item_id": "C", "scroll_top": 300.5},
        {"step_type": "ipv", "action": "ipv_click_param", "item_id": "C", "scroll_top": 0},
        {"step_type": "transition", "action": "back_home", "item_id": "C"},
        {"step_type": "feed", "action": "end", "scroll_top": 300.5},
    ],
}  # fmt: skip


def test_userarena_boxes_of_only_y_and_height(tmp_path):
    (tmp_path / "release.jsonl").write_text(json.dumps(PARTIAL_BOXES) + "\n")
    result = ingest_bundle(tmp_path / "release.jsonl", tmp_path / "lake", source_format="userarena")
    lake = tmp_path / "lake"
    steps = read_lake_table(lake, "steps").sort("step")
    assert steps["action"].to_list() == ["scroll_down", "click", "ipv_click_param", "back_home", "end"]
    assert steps["distance"][0] == 301  # 300.5 px, halves up
    assert steps["visible_items"][0].to_list() == keyed("item", "A", "B", "C")
    assert steps["visible_items"][1].to_list() == keyed("item", "B", "C")
    flags = read_lake_table(lake, "quarantine").filter(pl.col("kept"))
    # every placed card lacked a width (A..E: 5 flags); C lacked its height too
    assert flags["reason"].to_list() == ["defaulted_geometry"] * 5
    assert sorted(flags["detail"].to_list()) == sorted(
        ["kept; defaulted width = 196.5 px"] * 4 + ["kept; defaulted width = 196.5 px, height = 328 px"]
    )
    assert result.quarantine_by_reason == {"missing_required_field": 1}  # F: no y, cannot be placed
    feeds = result.counts["feeds"]
    assert (feeds.rows_in, feeds.rows_out, feeds.quarantined, feeds.flagged) == (6, 5, 1, 5)
    layout = read_lake_table(lake, "feed_layouts").sort("rank")
    assert layout["width"].to_list() == [196.5] * 5 and layout["x"].null_count() == 5
    assert layout["height"].to_list() == [300, 300, 328, 300, 300]


def test_raw_feeds_without_width_and_height_take_the_defaults(tmp_path):
    bundle = tiny_bundle()
    for card in bundle["feeds"]:
        del card["width"]
    del bundle["feeds"][0]["height"]  # itm-1: 0..328 instead of 0..300, still visible at top 0
    result, lake = ingest(tmp_path, bundle)
    assert read_lake_table(lake, "steps").height == 9  # session_a, as with whole boxes
    assert result.flagged_by_reason == {"defaulted_geometry": 8} and result.quarantine_by_reason == {}
    heights = read_lake_table(lake, "feed_layouts").sort("rank")["height"].to_list()
    assert heights[0] == 328


# --- 3. no stitched sessions ---------------------------------------------------------


def bad_middle() -> dict:
    """scroll_down, [teleport], [click on an item the catalog lacks], end."""
    bundle = tiny_bundle()
    bundle["events"] = [
        event("ev-0", 0, "feed", "scroll_down", scroll_top=0, scroll_delta=400),
        event("ev-1", 5, "feed", "teleport", scroll_top=400),
        event("ev-2", 9, "feed", "click", scroll_top=400, item_id="itm-404"),
        event("ev-3", 12, "feed", "end", scroll_top=400),
    ]
    return bundle


def test_a_bad_event_in_the_middle_cuts_the_session(tmp_path):
    result, lake = ingest(tmp_path, bad_middle())
    steps = read_lake_table(lake, "steps")
    assert steps["action"].to_list() == ["scroll_down"]  # never scroll_down, end
    session = read_lake_table(lake, "sessions").row(0, named=True)
    assert (session["cut_reason"], session["terminal"], session["ended"]) == (
        "unknown_action",
        "truncated",
        False,
    )
    # events rows 1..3: the teleport, then the click and the end after it
    assert quarantined(lake) == {
        "unknown_action": ["events:1"],
        "after_rejected_event": ["events:2", "events:3"],
    }
    details = read_lake_table(lake, "quarantine").filter(pl.col("source_row") == 2)["detail"].to_list()
    assert details == [
        "the session was cut at an earlier rejected event: unknown_action; itself item_not_in_catalog"
    ]
    events = result.counts["events"]
    assert (events.rows_in, events.rows_out, events.quarantined) == (4, 1, 3)  # 4 = 1 + 3


def test_drop_session_quarantines_the_whole_session(tmp_path):
    result, lake = ingest(tmp_path, bad_middle(), IngestSettings(on_bad_event="drop_session"))
    assert read_lake_table(lake, "steps").height == 0 and read_lake_table(lake, "sessions").height == 0
    assert quarantined(lake) == {
        "dropped_with_session": ["events:0", "events:2", "events:3"],
        "unknown_action": ["events:1"],
        # the view kept no action: its 8 cards follow
        "session_without_actions": [f"feeds:{n}" for n in range(8)],
    }
    assert result.counts["events"].quarantined == 4 and result.counts["events"].rows_out == 0


def test_a_screen_check_rejection_cuts_after_the_last_good_step(tmp_path):
    bundle = tiny_bundle()
    # session_a with ev-4 asking for review 3 of the three (0-based): the steps before it stay
    bundle["events"][4]["review_index"] = 3
    _, lake = ingest(tmp_path, bundle)
    steps = read_lake_table(lake, "steps").sort("step")
    assert steps["action"].to_list() == ["scroll_down", "click", "ipv_scroll_down", "ipv_enter_comment"]
    session = read_lake_table(lake, "sessions").row(0, named=True)
    assert (session["cut_reason"], session["terminal"]) == ("review_not_found", "truncated")
    # ev-5 .. ev-8 (rows 5..8) after it
    assert quarantined(lake) == {
        "review_not_found": ["events:4"],
        "after_rejected_event": [f"events:{n}" for n in range(5, 9)],
    }


def test_a_bad_event_after_the_end_cuts_nothing(tmp_path):
    bundle = tiny_bundle()
    bundle["events"].append(event("ev-9", 40, "feed", "teleport", scroll_top=100))
    _, lake = ingest(tmp_path, bundle)
    assert read_lake_table(lake, "steps").height == 9
    session = read_lake_table(lake, "sessions").row(0, named=True)
    assert session["cut_reason"] is None and session["terminal"] == "cart_only"
    assert quarantined(lake) == {"unknown_action": ["events:9"]}


def test_duplicates_and_flags_never_cut(tmp_path):
    bundle = tiny_bundle()
    bundle["events"].append(dict(bundle["events"][3]))  # ev-3 again, identical: merged
    bundle["events"][6]["ts"] = bundle["events"][5]["ts"]  # ev-6 at ev-5's time: a kept flag
    result, lake = ingest(tmp_path, bundle)
    assert read_lake_table(lake, "steps").height == 9 and quarantined(lake) == {}
    assert read_lake_table(lake, "sessions")["cut_reason"].to_list() == [None]
    assert result.counts["events"].duplicates == 1 and result.flagged_by_reason == {"duplicate_timestamp": 1}


def with_favorite() -> dict:
    bundle = tiny_bundle()  # a platform 'favorite' on the detail page, between ev-2 and ev-3
    bundle["events"].insert(3, event("ev-f", 10, "ipv", "favorite", item_id="itm-5", ipv_scroll=500))
    return bundle


def test_drop_in_action_map_drops_without_cutting(tmp_path):
    result, lake = ingest(tmp_path, with_favorite(), IngestSettings(action_map={"favorite": "drop"}))
    steps = read_lake_table(lake, "steps").sort("step")
    assert steps.height == 9 and "favorite" not in steps["action"].to_list()  # session_a whole
    assert read_lake_table(lake, "sessions")["cut_reason"].to_list() == [None] and quarantined(lake) == {}
    events = result.counts["events"]
    # 10 in = 9 out + 0 quarantined + 0 duplicates + 1 dropped
    assert (events.rows_in, events.rows_out, events.quarantined, events.dropped) == (10, 9, 0, 1)


def test_an_unmapped_platform_action_cuts(tmp_path):
    _, lake = ingest(tmp_path, with_favorite())
    assert read_lake_table(lake, "steps").height == 3  # scroll_down, click, ipv_scroll_down
    assert read_lake_table(lake, "sessions")["cut_reason"].to_list() == ["unknown_action"]


def test_action_map_targets_are_checked():
    with pytest.raises(ValidationError, match="favourite_it"):
        IngestSettings(action_map={"favorite": "favourite_it"})


def test_records_keep_the_states_of_a_cut_prefix(tmp_path):
    bundle = tiny_bundle()
    bundle["events"][4]["review_index"] = 3  # cut before ev-4: four steps kept
    _, lake = ingest(tmp_path, bundle)
    write_records(lake, modes=["single"])
    records = read_lake_table(lake, "records").sort("step")
    assert records["action"].to_list() == ["scroll_down", "click", "ipv_scroll_down", "ipv_enter_comment"]


def test_a_session_cut_before_its_first_step_keeps_nothing(tmp_path):
    bundle = tiny_bundle()
    bundle["events"][0]["action"] = "teleport"
    result, lake = ingest(tmp_path, bundle)
    assert read_lake_table(lake, "steps").height == 0 and read_lake_table(lake, "sessions").height == 0
    by_reason = quarantined(lake)
    assert by_reason["unknown_action"] == ["events:0"]
    assert by_reason["after_rejected_event"] == [f"events:{n}" for n in range(1, 9)]
    assert result.counts["events"].quarantined == 9


# --- the gate reads these lakes as valid ---------------------------------------------


def _bought_then_bad() -> dict:
    """session_a up to its ipv_cart, then a buy, then an unknown action: cut with a buy kept."""
    bundle = tiny_bundle()
    buy = event(
        "ev-b", 21, "ipv", "ipv_buy", item_id="itm-5", scroll_top=400, ipv_scroll=500, ui_state="main"
    )
    bundle["events"] = [*bundle["events"][:6], buy, event("ev-t", 22, "ipv", "teleport", item_id="itm-5")]
    return bundle


@pytest.mark.parametrize(
    "case",
    ["fractional", "partial_boxes", "cut", "cut_after_buy"],
)
def test_the_gate_accepts_fractional_lenient_and_cut_lakes(tmp_path, case):
    from validation.gate import run_gate

    if case == "partial_boxes":
        (tmp_path / "release.jsonl").write_text(json.dumps(PARTIAL_BOXES) + "\n")
        ingest_bundle(tmp_path / "release.jsonl", tmp_path / "lake", source_format="userarena")
        lake, settings = tmp_path / "lake", None
    else:
        bundle, settings = {
            "fractional": (fractional_bundle(), IngestSettings(geometry=FRACTIONAL_GEOMETRY)),
            "cut": (bad_middle(), None),
            "cut_after_buy": (_bought_then_bad(), None),
        }[case]
        _, lake = ingest(tmp_path, bundle, settings)
    tables = ["steps", "sessions", "feed_layouts"]
    summary = run_gate(lake, tables, stage="ingest", replace_quarantine=True, settings=settings, docs=False)
    assert summary.ok
    if case == "cut_after_buy":  # a buy, but cut: truncated, not purchase
        session = read_lake_table(lake, "sessions").row(0, named=True)
        assert (session["buys"], session["terminal"], session["cut_reason"]) == (
            1,
            "truncated",
            "unknown_action",
        )


def test_prompts_show_fractional_offsets_as_logged():
    from transforms.prompts.render import Observation, fmt_px
    from transforms.records import fmt_px as fmt_px_expr

    values = [0.0, 400.0, 331.4, 1240.5, None]
    # whole px without a decimal point, fractions as logged; the renderer and its vectorised twin agree
    expected = ["0 px", "400 px", "331.4 px", "1240.5 px", "unknown"]
    assert [fmt_px(v) for v in values] == expected
    frame = pl.DataFrame({"px": values}, schema={"px": pl.Float64})
    assert frame.select(fmt_px_expr(pl.col("px")).alias("text"))["text"].to_list() == expected
    assert Observation(screen="feed", scroll_top=400.4, max_scroll=547.0).scroll_top == 400.4
