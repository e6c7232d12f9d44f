"""Responses judged on their records' screens, placed by the replay cursor (PROTOCOL.md §2).

The tiny environment lake (tests/evaluation/test_environment_loader.py), with two steps changed:
sA's first step logs its feed offset (0 px, the top) with its cards in view, so a scroll up would
not move; sC's last step logs neither offset nor cards, so replay cannot place it.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from evaluation.executable import (
    NO_RECORDED_STEPS,
    RECORD_NOT_IN_LAKE,
    judge_responses,
    record_screens,
)
from synthetic.bundle import write_bundle
from tests.evaluation.test_environment_loader import write_environment_lake
from tests.extractors.tinylake import ITEM, SESSION, steps_frame
from transforms.ingest import ingest_bundle
from transforms.lake import read_lake_table, write_table
from transforms.prompts import Accepted, Rejected
from transforms.records import write_records


def record(session: str, step: int) -> str:
    return f"{SESSION[session]}:{step}"


def at(session: str, step: int) -> pl.Expr:
    return (pl.col("session_id") == SESSION[session]) & (pl.col("step") == step)


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> Path:
    path = write_environment_lake(tmp_path_factory.mktemp("lake"))
    steps = steps_frame().with_columns(
        pl.when(at("sA", 0)).then(0.0).otherwise(pl.col("scroll_top")).alias("scroll_top"),
        pl.when(at("sA", 0))
        .then(pl.lit("logged"))
        .otherwise(pl.col("visible_source"))
        .alias("visible_source"),
        pl.when(at("sC", 2)).then(None).otherwise(pl.col("visible_items")).alias("visible_items"),
    )
    write_table(path, "steps", steps)
    return path


def answer(action: dict) -> str:
    return json.dumps({"rationale": "I look around.", "action": action})


FEED_TOP = record("sA", 0)  # feed at 0 px, cards i01..i04 in view; the layout continues with i05, i06
PAGE = record("sA", 2)  # i01's detail page


@pytest.fixture(scope="module")
def screens(lake):
    return record_screens(lake, [FEED_TOP, PAGE, record("sC", 2), "nowhere:0"])


def test_a_click_on_a_card_in_view_is_executable(screens):
    verdict = screens.judge(FEED_TOP, answer({"type": "click", "target_item_id": ITEM["i02"]}))
    assert isinstance(verdict, Accepted) and verdict.target_item_id == ITEM["i02"]


def test_each_rejection_has_its_reason_in_protocol_order(screens):
    cases = {
        # prose, not the JSON shape
        "I would scroll down a bit.": "parse_failure",
        # not one of the 13 actions (checked before the screen is looked at)
        answer({"type": "zoom"}): "unknown_action",
        # at 0 px a scroll up would not move: not executable here
        answer({"type": "scroll_up", "distance": 200}): "illegal_in_state",
        # i05 is in the session's feed (y = 4 * 300 = 1200 px) but not among the cards in view
        answer({"type": "click", "target_item_id": ITEM["i05"]}): "target_unresolved",
        # one px past the largest feed scroll of the reference geometry (694 px)
        answer({"type": "scroll_down", "distance": 695}): "target_unresolved",
        # 100.0 is not a plain integer
        answer({"type": "scroll_down", "distance": 100.0}): "target_unresolved",
    }
    for text, reason in cases.items():
        verdict = screens.judge(FEED_TOP, text)
        assert isinstance(verdict, Rejected) and verdict.reason == reason, text


def test_the_detail_page_takes_its_own_actions_only(screens):
    assert isinstance(screens.judge(PAGE, answer({"type": "ipv_cart"})), Accepted)
    feed_only = screens.judge(PAGE, answer({"type": "click", "target_item_id": ITEM["i01"]}))
    assert isinstance(feed_only, Rejected) and feed_only.reason == "illegal_in_state"


def test_records_without_a_screen_are_counted_apart_by_reason(lake, screens, tmp_path):
    # sC's last step has neither offset nor cards: replay does not place it
    assert screens.unplaced == {record("sC", 2): "missing_feed_offset", "nowhere:0": RECORD_NOT_IN_LAKE}
    assert screens.judge(record("sC", 2), answer({"type": "end"})) is None
    with pytest.raises(KeyError, match="was not among"):
        screens.judge(record("sB1", 0), answer({"type": "end"}))
    records_only = tmp_path / "records_only"
    write_table(records_only, "records", pl.read_parquet(next((lake / "records").rglob("*.parquet"))))
    assert record_screens(records_only, [FEED_TOP]).unplaced == {FEED_TOP: NO_RECORDED_STEPS}


def test_the_report_counts_shares_and_reasons(screens):
    ids = [FEED_TOP, FEED_TOP, FEED_TOP, FEED_TOP, PAGE, PAGE, record("sC", 2), "nowhere:0"]
    texts = [
        answer({"type": "scroll_down", "distance": 300}),  # executable: what the shopper did there
        answer({"type": "click", "target_item_id": ITEM["i01"]}),  # executable
        answer({"type": "scroll_down", "distance": 695}),  # target_unresolved
        "{not json",  # parse_failure
        answer({"type": "back_home"}),  # executable
        answer({"type": "scroll_down", "distance": 100}),  # a feed action on the page: illegal_in_state
        answer({"type": "end"}),  # parses, no screen
        "nothing",  # no screen, does not parse
    ]
    report = judge_responses(screens, ids, texts).as_json()
    # 6 of the 8 parse; 6 have a screen, 3 of them executable, 1 the recorded action (sA's step 0 was a
    # scroll down; the click there and back_home on the page, where the shopper swiped, are not)
    assert report == {
        "parse_share": 6 / 8,
        "executable_share": 3 / 6,
        "recorded_action_share": 1 / 6,
        "judged": 6,
        "rejected": {"parse_failure": 1, "illegal_in_state": 1, "target_unresolved": 1},
        "no_screen": {"missing_feed_offset": 1, RECORD_NOT_IN_LAKE: 1},
    }
    assert judge_responses(screens, ["nowhere:0"], ["{}"]).as_json()["executable_share"] is None


def test_every_gold_action_of_an_ingested_lake_is_executable_on_its_screen(tmp_path):
    # the synthetic shoppers act only as the environment allows, so each record's own gold action,
    # written as a response, must be accepted on the screen replay places for it (both modes)
    write_bundle(tmp_path / "raw", users=4, seed=3, fmt="parquet", parts_per_table=1)
    lake = tmp_path / "lake"
    ingest_bundle(tmp_path / "raw", lake)
    write_records(lake, modes=["single", "cross"])
    records = read_lake_table(lake, "records", ["record_id", "action_json"])
    ids = records["record_id"].to_list()
    texts = [json.dumps({"rationale": "r", "action": json.loads(a)}) for a in records["action_json"]]
    report = judge_responses(record_screens(lake, ids), ids, texts).as_json()
    assert report["judged"] == len(ids) > 0 and report["executable_share"] == 1.0
    assert report["rejected"] == {} and report["no_screen"] == {}
