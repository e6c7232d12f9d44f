"""Sequence steps of the alignment (ordering flags, events after an end, per-view shifts) against
plain-Python references on random page views, interleaved in the source as logs interleave them."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import polars as pl
import pytest

from transforms import align

BASE = datetime(2026, 3, 1, tzinfo=UTC)


def interleaved_events(seed: int, views: int = 40) -> pl.DataFrame:
    """Events of ``views`` page views in a shuffled source order, with repeated and backward
    timestamps and a few ``end`` actions in the middle of a view."""
    rng = random.Random(seed)
    rows = []
    for v in range(views):
        ts = 0
        for _ in range(rng.randint(1, 12)):
            ts += rng.choice([-3, 0, 0, 1, 2, 5])  # ties and steps back in time
            action = (
                rng.choice(["scroll_down", "click", "end", "scroll_up"]) if rng.random() < 0.3 else "click"
            )
            rows.append({"page_view_id": f"pv-{v:03d}", "ts": BASE + timedelta(seconds=ts), "action": action})
    rng.shuffle(rows)
    files = ["events/a.parquet", "events/b.parquet"]
    for n, row in enumerate(rows):
        row["_file"], row["_row"] = files[n * 2 // len(rows)], n
    return pl.DataFrame(rows)


def reference_order(events: pl.DataFrame) -> tuple[list[tuple[str, int]], dict[int, str]]:
    """(view, source row) in ts then source order per view, and the flag of each flagged row."""
    by_view: dict[str, list[dict]] = {}
    for row in events.sort("_file", "_row").iter_rows(named=True):
        by_view.setdefault(row["page_view_id"], []).append(row)
    order, flags = [], {}
    for view in sorted(by_view):
        latest = None
        for row in by_view[view]:  # source order: late when an earlier row has a later ts
            if latest is not None and row["ts"] < latest:
                flags[row["_row"]] = "out_of_order_timestamp"
            latest = row["ts"] if latest is None else max(latest, row["ts"])
        ordered = sorted(by_view[view], key=lambda r: r["ts"])  # stable: ties keep source order
        for before, row in zip([None, *ordered], ordered, strict=False):
            if before is not None and before["ts"] == row["ts"] and row["_row"] not in flags:
                flags[row["_row"]] = "duplicate_timestamp"
        order += [(view, row["_row"]) for row in ordered]
    return order, flags


@pytest.mark.parametrize("seed", range(6))
def test_order_events_matches_a_per_view_reference(seed):
    events = interleaved_events(seed)
    ordered, flags = align.order_events(events, None)
    expected_order, expected_flags = reference_order(events)
    assert list(ordered.select("page_view_id", "_row").iter_rows()) == expected_order
    assert dict(flags.select("source_row", "reason").iter_rows()) == expected_flags
    assert set(flags["reason"]) <= {"out_of_order_timestamp", "duplicate_timestamp"}
    assert len(expected_flags) > 0  # the fixture has both kinds of fault to find


@pytest.mark.parametrize("seed", range(6))
def test_events_after_the_first_end_of_their_view_leave(seed):
    ordered, _ = align.order_events(interleaved_events(seed), None)
    kept, rejected = align.drop_after_end(ordered, None)
    expected_out = set()
    for view in ordered.partition_by("page_view_id", maintain_order=True):
        actions = view["action"].to_list()
        if "end" in actions:
            expected_out |= set(view["_row"].to_list()[actions.index("end") + 1 :])
    assert set(rejected["source_row"]) == expected_out
    assert set(rejected["reason"]) <= {"event_after_end"}
    assert kept.height + rejected.height == ordered.height
    assert expected_out  # some view goes on after its end


@pytest.mark.parametrize("seed", range(3))
def test_per_view_shifts_equal_the_window_forms(seed):
    """On rows grouped by view, the shift forms equal Polars' windows over the view."""
    ordered, _ = align.order_events(interleaved_events(seed), None)
    ordered = ordered.with_columns(pl.col("ts").dt.epoch("s").alias("t"))
    view = "page_view_id"
    got = ordered.select(
        align._in_view(pl.col("t"), 1).alias("back"),
        align._in_view(pl.col("t"), -1).alias("ahead"),
        align._index_in_view().alias("index"),
        align._view_start().alias("start"),
    )
    want = ordered.select(
        pl.col("t").shift(1).over(view).alias("back"),
        pl.col("t").shift(-1).over(view).alias("ahead"),
        pl.int_range(pl.len(), dtype=pl.Int32).over(view).alias("index"),
        (pl.int_range(pl.len()).over(view) == 0).alias("start"),
    )
    assert got.equals(want)


ITEMS = pl.DataFrame(  # ``item_context`` by catalog row: itm-k is row k - 1
    {"item_id": ["itm-1", "itm-2", "itm-3"], "title": ["a", "b", "c"], "review_count": [0, 0, 0]}
)


def detail_page_events(seed: int, views: int = 30) -> pl.DataFrame:
    """Views grouped in order (as ``order_events`` leaves them) that open, leave and reopen detail
    pages; some start on a detail page with nothing opened in them."""
    rng = random.Random(seed)
    rows = []
    for v in range(views):
        for _ in range(rng.randint(1, 10)):
            if rng.random() < 0.5:
                action = rng.choice(["click", "scroll_down"])
                item = f"itm-{rng.randint(1, 3)}" if action == "click" else None
                rows.append(("feed", action, item, v))
            else:
                action = rng.choice(["ipv_scroll_down", "ipv_cart", "back_home"])
                rows.append(("ipv", action, rng.choice([None, None, f"itm-{rng.randint(1, 3)}"]), v))
    return pl.DataFrame(
        [
            {
                "page_view_id": f"pv-{v:03d}",
                "screen": screen,
                "action": action,
                "item_id": item,
                "_item": None if item is None else int(item[4:]) - 1,  # its row in ITEMS
                "scroll_top": 0,
                "review_index": None,
                "_file": "events/a.parquet",
                "_row": n,
            }
            for n, (screen, action, item, v) in enumerate(rows)
        ],
        schema_overrides={"review_index": pl.Int32, "_item": pl.get_index_type()},
    )


def reference_open_items(events: pl.DataFrame) -> tuple[dict[int, str], dict[int, str]]:
    """Per ipv row, the item whose detail page is open (last click, not since closed by the feed
    or back_home, in the same view) and the reject reason of the rows that fail."""
    open_items, reasons, current, view = {}, {}, None, None
    for row in events.iter_rows(named=True):
        if row["page_view_id"] != view:
            current, view = None, row["page_view_id"]
        if row["screen"] == "ipv":
            if current is None:
                reasons[row["_row"]] = "ipv_without_open_item"
            elif row["item_id"] is not None and row["item_id"] != current:
                reasons[row["_row"]] = "ipv_item_mismatch"
            else:
                open_items[row["_row"]] = current
        if row["action"] == "click":
            current = row["item_id"]
        elif row["screen"] == "feed" or row["action"] == "back_home":
            current = None
    return open_items, reasons


@pytest.mark.parametrize("seed", range(6))
def test_the_open_detail_page_stays_inside_its_view(seed):
    events = detail_page_events(seed)
    # the state and verdict of every row (the cut that follows a rejection is tested elsewhere)
    stated, reason = align._detail_page_legality(events, ITEMS)
    tagged = stated.with_columns(reason.alias("reason"))
    kept, rejected = tagged.filter(pl.col("reason").is_null()), tagged.filter(pl.col("reason").is_not_null())
    expected_open, expected_reasons = reference_open_items(events)
    assert dict(rejected.select("_row", "reason").iter_rows()) == expected_reasons
    opened = kept.filter(pl.col("screen") == "ipv").select("_row", "_open")
    assert dict(opened.iter_rows()) == expected_open
    rows = kept.filter(pl.col("screen") == "ipv").select("_open", pl.col("_open_item").cast(pl.Int64) + 1)
    assert all(item == f"itm-{row}" for item, row in rows.iter_rows())  # the row names the same item
    assert "ipv_without_open_item" in expected_reasons.values() and expected_open  # both cases occur
