"""Every quarantine reason of the ingest, triggered by a one-fault variant of the hand-built bundle.

Each case names the raw table, the reason code and how many rows must carry it;
the accounting identity must hold in every case.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest

from tests.bundles import at, event, tiny_bundle, write_bundle
from transforms.ingest import ingest_bundle
from transforms.lake import read_lake_table

Bundle = dict[str, list[dict]]


def _with_event(bundle: Bundle, position: int, row: dict) -> Bundle:
    bundle["events"].insert(position, row)
    return bundle


def _edit(table: str, index: int, **changes) -> Callable[[Bundle], Bundle]:
    def apply(bundle: Bundle) -> Bundle:
        bundle[table][index].update(changes)
        return bundle

    return apply


def _drop_events(*ids: str) -> Callable[[Bundle], Bundle]:
    def apply(bundle: Bundle) -> Bundle:
        bundle["events"] = [e for e in bundle["events"] if e["event_id"] not in ids]
        return bundle

    return apply


def _second_view_without_events(bundle: Bundle) -> Bundle:
    bundle["feeds"] += [dict(card, page_view_id="pv-empty") for card in bundle["feeds"][:3]]
    return bundle


def _exact_duplicate_event(bundle: Bundle) -> Bundle:
    bundle["events"].append(dict(bundle["events"][3]))
    return bundle


def _conflicting_duplicate_event(bundle: Bundle) -> Bundle:
    bundle["events"].append(dict(bundle["events"][8], screen="feed", scroll_top=200, ts=at(40)))
    return bundle


def _missing_profile(bundle: Bundle) -> Bundle:
    bundle["profiles"] = [p for p in bundle["profiles"] if p["user_id"] != "usr-1"]
    return bundle


CASES: dict[str, tuple[Callable[[Bundle], Bundle], str, str, int]] = {
    "unknown action": (_edit("events", 0, action="teleport"), "events", "unknown_action", 1),
    "unknown screen": (_edit("events", 0, screen="cart_page"), "events", "unknown_screen", 1),
    "action illegal on its screen": (
        _edit("events", 7, action="ipv_cart"),
        "events",
        "illegal_action_on_screen",
        1,
    ),
    "item not in catalog (feed card)": (
        _edit("feeds", 7, item_id="itm-404"),
        "feeds",
        "item_not_in_catalog",
        1,
    ),
    "item not in catalog (event)": (
        lambda b: _with_event(b, 2, event("ev-x", 6, "ipv", "ipv_swipe_pic", item_id="itm-404")),
        "events",
        "item_not_in_catalog",
        1,
    ),
    "click target not visible": (
        # itm-8 spans 920..1220: at top 0 it is 227 px below the viewport's bottom (693)
        lambda b: _with_event(b, 1, event("ev-x", 2, "feed", "click", scroll_top=0, item_id="itm-8")),
        "events",
        "click_target_not_visible",
        1,
    ),
    "missing click target": (
        lambda b: _with_event(b, 1, event("ev-x", 2, "feed", "click", scroll_top=0)),
        "events",
        "missing_click_target",
        1,
    ),
    "detail-page step without an opened item": (
        # removing the click leaves the detail-page steps with nothing open: the first of them is
        # rejected and cuts the session, the six events after it follow as after_rejected_event
        _drop_events("ev-1"),
        "events",
        "ipv_without_open_item",
        1,
    ),
    "ipv item mismatch": (_edit("events", 3, item_id="itm-2"), "events", "ipv_item_mismatch", 1),
    "review not found": (
        _edit("events", 4, review_index=3),
        "events",
        "review_not_found",
        1,
    ),  # 3 reviews: 0..2
    "scroll up at the top": (
        lambda b: _with_event(b, 0, event("ev-x", -1, "feed", "scroll_up", scroll_top=0, scroll_delta=50)),
        "events",
        "illegal_in_state",
        1,
    ),
    "scroll distance out of range": (
        _edit("events", 0, scroll_delta=900),
        "events",
        "scroll_distance_out_of_range",
        1,
    ),
    "negative price": (_edit("items", 0, price=-3.0), "items", "invalid_price", 1),
    "NaN price": (_edit("items", 1, price=float("nan")), "items", "invalid_price", 1),
    "negative scroll offset": (_edit("events", 8, scroll_top=-20), "events", "negative_offset", 1),
    "future timestamp": (_edit("events", 8, ts=at(10 * 365 * 86400)), "events", "future_timestamp", 1),
    "event after end": (
        lambda b: _with_event(
            b, 9, event("ev-x", 40, "feed", "scroll_down", scroll_top=100, scroll_delta=50)
        ),
        "events",
        "event_after_end",
        1,
    ),
    "page view used by two users": (
        _edit("events", 8, user_id="usr-2"),
        "events",
        "page_view_user_conflict",
        1,
    ),
    "page view without feed layout": (
        lambda b: _with_event(b, 9, event("ev-x", 50, "feed", "end", scroll_top=0, page_view_id="pv-nofeed")),
        "events",
        "missing_feed_layout",
        1,
    ),
    "session without actions": (_second_view_without_events, "feeds", "session_without_actions", 3),
    "conflicting duplicate event id": (_conflicting_duplicate_event, "events", "duplicate_event_id", 1),
    "missing required field": (_edit("events", 0, user_id=None), "events", "missing_required_field", 1),
    "invalid geometry": (_edit("feeds", 0, height=0), "feeds", "invalid_geometry", 1),
    "duplicate item id": (
        lambda b: b | {"items": b["items"] + [dict(b["items"][0], price=1.0)]},
        "items",
        "duplicate_item_id",
        1,
    ),
    "unknown history kind": (_edit("history", 0, kind="wishlist"), "history", "unknown_history_kind", 1),
    "NUL byte": (_edit("items", 2, title="Linen\x00shirt"), "items", "nul_byte", 1),
    "10 MB string": (_edit("items", 2, title="x" * 10_000_000), "items", "field_too_large", 1),
}


def _ingest(tmp_path: Path, bundle: Bundle, fmt: str = "parquet"):
    write_bundle(bundle, tmp_path / "raw", fmt)
    result = ingest_bundle(tmp_path / "raw", tmp_path / "lake")
    quarantine = read_lake_table(tmp_path / "lake", "quarantine")
    return result, quarantine


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_fault_is_quarantined_with_its_reason(case, tmp_path):
    mutate, table, reason, expected = CASES[case]
    result, quarantine = _ingest(tmp_path, mutate(tiny_bundle()))
    hits = quarantine.filter((pl.col("reason") == reason) & (pl.col("table_name") == table) & ~pl.col("kept"))
    assert hits.height == expected, quarantine.select("table_name", "reason", "detail").to_dicts()
    assert result.quarantine_by_reason.get(reason) == expected
    assert all(c.balanced for c in result.counts.values()), result.counts


def test_exact_duplicate_is_merged_and_counted(tmp_path):
    result, quarantine = _ingest(tmp_path, _exact_duplicate_event(tiny_bundle()))
    events = result.counts["events"]
    assert (events.rows_in, events.rows_out, events.duplicates, events.quarantined) == (10, 9, 1, 0)
    assert quarantine.filter(pl.col("table_name") == "events").height == 0


def test_missing_profile_is_kept_and_flagged(tmp_path):
    result, quarantine = _ingest(tmp_path, _missing_profile(tiny_bundle()))
    flags = quarantine.filter(pl.col("reason") == "missing_profile")
    assert flags.height == 1 and flags["kept"].all()  # one flag per user, rows kept
    steps = read_lake_table(tmp_path / "lake", "steps")
    assert steps.height == 9 and steps["profile_missing"].all()
    assert result.flagged_by_reason == {"missing_profile": 1}


def test_out_of_order_and_tied_timestamps_are_reordered_and_flagged(tmp_path):
    bundle = tiny_bundle()
    events = bundle["events"]
    events[2], events[3] = events[3], events[2]  # ev-3 (t=12) now precedes ev-2 (t=9) in the file
    events[6]["ts"] = events[5]["ts"]  # back_home ties with the cart: source order decides
    result, quarantine = _ingest(tmp_path, bundle)
    assert result.flagged_by_reason == {"duplicate_timestamp": 1, "out_of_order_timestamp": 1}
    steps = read_lake_table(tmp_path / "lake", "steps").sort("step")
    assert steps["action"].to_list()[2:7] == [
        "ipv_scroll_down", "ipv_enter_comment", "ipv_click_comment", "ipv_cart", "back_home",
    ]  # fmt: skip
    assert quarantine.filter(pl.col("kept")).height == 2


def test_unparseable_jsonl_line(tmp_path):
    write_bundle(tiny_bundle(), tmp_path / "raw", "jsonl")
    part = tmp_path / "raw" / "events" / "part-0.jsonl"
    lines = part.read_text().splitlines()
    part.write_text("\n".join([*lines, '{"event_id": "ev-broken", "ts": ', "[1, 2]"]) + "\n")
    result = ingest_bundle(tmp_path / "raw", tmp_path / "lake")
    assert result.quarantine_by_reason == {"unparseable_row": 2}
    assert result.counts["events"].rows_in == 11 and result.counts["events"].balanced


def test_type_mismatch_in_csv(tmp_path):
    write_bundle(tiny_bundle(), tmp_path / "raw", "csv")
    part = tmp_path / "raw" / "items" / "part-0.csv"
    frame = pl.read_csv(part, infer_schema=False)
    frame = frame.with_columns(
        pl.when(pl.int_range(pl.len()) == 0).then(pl.lit("cheap")).otherwise("price").alias("price")
    )
    frame.write_csv(part)
    result = ingest_bundle(tmp_path / "raw", tmp_path / "lake")
    assert result.quarantine_by_reason.get("schema_mismatch") == 1
    detail = read_lake_table(tmp_path / "lake", "quarantine").filter(pl.col("reason") == "schema_mismatch")[
        "detail"
    ]
    assert "price" in detail[0]


def test_truncated_parquet_file_is_one_unreadable_row(tmp_path):
    write_bundle(tiny_bundle(), tmp_path / "raw", "parquet")
    part = tmp_path / "raw" / "history" / "part-0.parquet"
    part.write_bytes(part.read_bytes()[:40])
    result = ingest_bundle(tmp_path / "raw", tmp_path / "lake")
    assert result.quarantine_by_reason == {"unreadable_file": 1}
    assert result.counts["history"].rows_in == 1 and result.counts["history"].balanced


def test_quarantine_payload_is_pseudonymized(tmp_path):
    _, quarantine = _ingest(tmp_path, _edit("events", 3, item_id="itm-2")(tiny_bundle()))
    payload = json.loads(quarantine.filter(pl.col("reason") == "ipv_item_mismatch")["payload"][0])
    assert payload["item_id"].startswith("i_") and payload["user_id"].startswith("u_")
    assert payload["page_view_id"].startswith("s_") and payload["event_id"].startswith("e_")
