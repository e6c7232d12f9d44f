"""Real traces exported from lake tables: steps with their items, profiles from earlier activity, cut
sessions left out and counted."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import polars as pl

from evaluation.traces import load_traces, read_traces, real_trace_frame
from flows.score import export_real_traces
from tests.extractors.tinylake import ITEM, SESSION, USER, write_tiny_lake

T0 = datetime(2026, 3, 1, 8, 0, tzinfo=UTC)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def step_rows(session: str, user: str, start: float, walk: list[tuple[str, str, str | None]]) -> list[dict]:
    return [
        {
            "session_id": session,
            "user_id": user,
            "step": k,
            "ts": at(start + k),
            "screen": screen,
            "action": action,
            "target_item_id": item if action == "click" else None,
            "review_alias": "C2" if action == "ipv_click_comment" else None,
            "ipv_item_id": item if screen == "ipv" else None,
        }
        for k, (screen, action, item) in enumerate(walk)
    ]


ITEMS = pl.DataFrame(
    {"item_id": ["a", "b", "c"], "category": ["A-x-y", "B-z-w", None], "price": [10.0, 20.0, 30.0]}
)
HISTORY = pl.DataFrame(
    {
        "user_id": ["u", "u", "u", "u"],
        "ts": [at(-90), at(-60), at(-30), at(5)],  # the last is after s1 started: not prior to s1
        "kind": ["click", "buy", "click", "click"],
        "title": ["t1", "t2", "t3", "t4"],
        "category": ["H-1-1", "H-2-2", "K-1-1", "L-1-1"],
    }
)
STEPS = pl.DataFrame(
    step_rows("s1", "u", 0, [("feed", "click", "a"), ("ipv", "ipv_buy", "a"), ("ipv", "end", "a")])
    + step_rows(
        "s2", "u", 60, [("feed", "click", "c"), ("ipv", "ipv_click_comment", "c"), ("ipv", "back_home", "c")]
    )
    + step_rows("s3", "v", 30, [("feed", "scroll_down", None), ("feed", "end", None)])
    + step_rows("cut", "v", 90, [("feed", "scroll_down", None)])
)
SESSIONS = pl.DataFrame(
    {"session_id": ["s1", "s2", "s3", "cut"], "cut_reason": [None, None, None, "unknown_item"]}
)


def test_real_traces_from_lake_frames():
    traces, left_out = real_trace_frame(STEPS, ITEMS, HISTORY, SESSIONS)
    assert left_out == {"unknown_item": 1}
    rows = {row["session_id"]: row for row in traces.iter_rows(named=True)}
    assert traces["session_id"].to_list() == ["s1", "s3", "s2"]  # by start time; the cut session left out
    # s1 at minute 0: history click (-90), buy (-60), click (-30) before it; newest first
    assert rows["s1"]["profile"] == {
        "prior_clicks": 2,
        "prior_buys": 1,
        "recent_click_categories": ["K-1-1", "H-1-1"],
    }
    # s2 at minute 60: also the history click at minute 5 and s1's click (a) and buy at minutes 0 and 1
    assert rows["s2"]["profile"] == {
        "prior_clicks": 4,
        "prior_buys": 2,
        "recent_click_categories": ["L-1-1", "A-x-y", "K-1-1", "H-1-1"],
    }
    assert rows["s3"]["profile"] == {"prior_clicks": 0, "prior_buys": 0, "recent_click_categories": []}
    s2 = rows["s2"]["steps"]
    assert [(s["action"], s["target_item_id"], s["item_category"], s["item_price"]) for s in s2] == [
        ("click", "c", None, 30.0),  # an item without a category keeps its price
        ("ipv_click_comment", "c", None, 30.0),
        ("back_home", "c", None, 30.0),
    ]
    assert s2[1]["review_alias"] == "C2"
    assert (rows["s1"]["termination_reason"], rows["s2"]["termination_reason"]) == ("end", None)
    assert all(
        row["terminated"] and not row["truncated"] and row["source"] == "real" for row in rows.values()
    )


def test_real_traces_keep_only_the_20_latest_click_categories():
    many = pl.DataFrame(
        {
            "user_id": ["u"] * 25,
            "ts": [at(-100 + k) for k in range(25)],
            "kind": ["click"] * 25,
            "title": ["t"] * 25,
            "category": [f"C{k}-x-y" for k in range(25)],
        }
    )
    traces, _ = real_trace_frame(STEPS.filter(pl.col("session_id") == "s1"), ITEMS, many)
    profile = traces.row(0, named=True)["profile"]
    # 25 clicks before s1 plus none of its own: newest first, C24 down to C5
    assert profile["prior_clicks"] == 25
    assert profile["recent_click_categories"] == [f"C{k}-x-y" for k in range(24, 4, -1)]


def test_export_from_a_lake_reads_back_in_both_readers(tmp_path):
    lake = write_tiny_lake(tmp_path / "lake").path
    summary = export_real_traces(lake, tmp_path / "real.jsonl", splits=["train"])
    assert summary == {"sessions": 3, "cut_sessions_left_out": {}}  # sA, sB1, sB2 (sC is val)
    records = {trace.session_id: trace for trace in read_traces(tmp_path / "real.jsonl")}
    # user B's second session follows sB1, whose one click (i04, a shoe) came before it
    assert records[SESSION["sB2"]].profile.prior_clicks == 1
    assert records[SESSION["sB2"]].profile.recent_click_categories == ["Shoes-Women-Ankle boots"]
    assert records[SESSION["sA"]].user_id == USER["A"]
    assert [s.target_item_id for s in records[SESSION["sB1"]].steps] == [ITEM["i04"]] * 3 + [None]
    frames = load_traces(tmp_path / "real.jsonl")
    assert frames.steps.height == 8 + 4 + 4
