"""A tiny, hand-built, valid lake: two users, two sessions, four items.

Session s1 (user u1, train): scroll, click i3, detail scroll, cart, back, end -> cart_only.
Session s2 (user u2, val): click i1, buy, end -> purchase.
Tests break one thing at a time through ``frames()`` and ``write_lake(..., frames)``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl

from transforms.lake import write_table
from transforms.schemas import ACTION_GROUPS, LAKE_TABLES, PROFILE_FIELDS

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
PROFILE = dict.fromkeys(PROFILE_FIELDS, "x")


def _ts(seconds: int) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _step(session: str, user: str, step: int, screen: str, action: str, **kw: object) -> dict:
    row = dict.fromkeys(LAKE_TABLES["steps"].names)
    row.update(
        session_id=session,
        user_id=user,
        step=step,
        ts=_ts(10 * step),
        screen=screen,
        action=action,
        action_group=ACTION_GROUPS[action],
        profile=PROFILE,
        profile_missing=False,
        split="train" if user == "u1" else "val",
        bucket=0 if user == "u1" else 1,
        visible_source="layout" if screen == "feed" else None,
    )
    row.update(kw)
    return row


def steps() -> pl.DataFrame:
    rows = [
        _step("s1", "u1", 0, "feed", "scroll_down", distance=300, scroll_top=0, visible_items=["i1", "i2"]),
        _step(
            "s1",
            "u1",
            1,
            "feed",
            "click",
            target_item_id="i3",
            target_title="Tee",
            scroll_top=300,
            visible_items=["i3", "i4"],
        ),
        _step("s1", "u1", 2, "ipv", "ipv_scroll_down", distance=400, ipv_item_id="i3", ipv_scroll=0),
        _step("s1", "u1", 3, "ipv", "ipv_cart", ipv_item_id="i3", ipv_scroll=400),
        _step("s1", "u1", 4, "ipv", "back_home", ipv_item_id="i3", ipv_scroll=400),
        _step("s1", "u1", 5, "feed", "end", scroll_top=300, visible_items=["i3", "i4"]),
        _step("s2", "u2", 0, "feed", "click", target_item_id="i1", scroll_top=0, visible_items=["i1", "i2"]),
        _step("s2", "u2", 1, "ipv", "ipv_buy", ipv_item_id="i1", ipv_scroll=0),
        _step("s2", "u2", 2, "ipv", "end", ipv_item_id="i1", ipv_scroll=0),
    ]
    return pl.from_dicts(rows, schema=pl.Schema(pl.from_arrow(LAKE_TABLES["steps"].empty_table()).schema))


def _frame(table: str, rows: list[dict]) -> pl.DataFrame:
    schema = pl.Schema(pl.from_arrow(LAKE_TABLES[table].empty_table()).schema)
    return pl.from_dicts([{**dict.fromkeys(schema.names()), **r} for r in rows], schema=schema)


def sessions() -> pl.DataFrame:
    common = {"feed_items": 4, "feed_height": 1600, "profile_missing": False, "ended": True}
    return _frame(
        "sessions",
        [
            {
                **common,
                "session_id": "s1",
                "user_id": "u1",
                "start_ts": _ts(0),
                "end_ts": _ts(50),
                "length": 6,
                "clicks": 1,
                "carts": 1,
                "buys": 0,
                "feed_steps": 3,
                "terminal": "cart_only",
                "categories": ["apparel"],
                "split": "train",
                "bucket": 0,
            },
            {
                **common,
                "session_id": "s2",
                "user_id": "u2",
                "start_ts": _ts(0),
                "end_ts": _ts(20),
                "length": 3,
                "clicks": 1,
                "carts": 0,
                "buys": 1,
                "feed_steps": 1,
                "terminal": "purchase",
                "categories": ["bags"],
                "split": "val",
                "bucket": 1,
            },
        ],
    )


def feed_layouts() -> pl.DataFrame:
    cards = [("s1", 0, ["i1", "i2", "i3", "i4"]), ("s2", 1, ["i1", "i2"])]
    rows = [
        {
            "session_id": s,
            "item_id": item,
            "rank": k,
            "x": 201 * (k % 2),
            "y": 400 * (k // 2),
            "width": 200,
            "height": 390,
            "feed_height": 1600,
            "bucket": bucket,
        }
        for s, bucket, items in cards
        for k, item in enumerate(items)
    ]
    return _frame("feed_layouts", rows)


def items() -> pl.DataFrame:
    rows = [
        {
            "item_id": f"i{k}",
            "title": f"Item {k}",
            "price": 10.0 * k,
            "category": "apparel-tops-tees",
            "category_l1": "apparel",
            "category_l2": "tops",
            "category_l3": "tees",
            "params": [],
            "reviews": [],
        }
        for k in range(1, 5)
    ]
    return _frame("items", rows)


def profiles() -> pl.DataFrame:
    rows = [{"user_id": u, "profile": PROFILE, "split": s} for u, s in (("u1", "train"), ("u2", "val"))]
    return _frame("profiles", rows)


def history() -> pl.DataFrame:
    rows = [
        {"user_id": "u1", "ts": _ts(-86_400), "kind": "click", "title": "Old tee", "category": "apparel"},
        {"user_id": "u1", "ts": _ts(-80_000), "kind": "buy", "title": "Old tee", "category": "apparel"},
        {"user_id": "u2", "ts": _ts(-3_600), "kind": "click", "title": "Bag", "category": "bags"},
    ]
    splits = {"u1": "train", "u2": "val"}  # as in profiles()
    rows = [row | {"split": splits[row["user_id"]]} for row in rows]
    return _frame("history", rows)


def frames() -> dict[str, pl.DataFrame]:
    return {
        "steps": steps(),
        "sessions": sessions(),
        "feed_layouts": feed_layouts(),
        "items": items(),
        "profiles": profiles(),
        "history": history(),
    }


def write_lake(lake: Path, tables: dict[str, pl.DataFrame] | None = None) -> Path:
    for name, frame in (tables or frames()).items():
        write_table(lake, name, frame)
    return lake
