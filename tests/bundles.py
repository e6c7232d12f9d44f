"""A tiny hand-built raw bundle whose expected steps are worked out by hand.

Feed of page view ``pv-A`` (viewport 693 px, feed height 1240 -> max offset 547)::

    card     x    y   h   spans       reading rank
    itm-1    4    0  300  0..300      0
    itm-2  203    0  260  0..260      1
    itm-3  203  260  300  260..560    2
    itm-4    4  300  320  300..620    3
    itm-5  203  560  300  560..860    4
    itm-6    4  620  300  620..920    5
    itm-7  203  860  300  860..1160   6
    itm-8    4  920  300  920..1220   7

A card is visible when at least half its height is inside [top, top + 693]:
top 0   -> itm-1..itm-4 (itm-5 shows 133 < 150 px)
top 400 -> itm-3..itm-8 (itm-3 shows 400..560 = 160 >= 150; itm-8 shows 920..1093 = 173 >= 150)
top 100 -> itm-1..itm-6 (itm-6 shows 620..793 = 173 >= 150; itm-7 shows 0)
"""

from __future__ import annotations

import gzip
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from transforms.schemas import RAW_TABLES

T0 = datetime(2025, 3, 1, 9, 0, 0, tzinfo=UTC)
CARDS = [  # item, x, y, height
    ("itm-1", 4, 0, 300),
    ("itm-2", 203, 0, 260),
    ("itm-3", 203, 260, 300),
    ("itm-4", 4, 300, 320),
    ("itm-5", 203, 560, 300),
    ("itm-6", 4, 620, 300),
    ("itm-7", 203, 860, 300),
    ("itm-8", 4, 920, 300),
]
FEED_HEIGHT = 1240


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def event(eid: str, second: float, screen: str, action: str, **fields) -> dict:
    row = {
        "event_id": eid,
        "user_id": fields.pop("user_id", "usr-1"),
        "page_view_id": fields.pop("page_view_id", "pv-A"),
        "ts": at(second),
        "screen": screen,
        "action": action,
    }
    row.update(fields)
    return row


def items() -> list[dict]:
    return [
        {
            "item_id": item,
            "title": f"Linen shirt {n}",
            "price": 100.0 + n,
            "category": "Apparel-Tops-Shirts" if n % 2 else "Bags-Totes-Canvas",
            "params": [{"label": "material", "value": "linen"}],
            "reviews": ["fits well", "nice colour", "thin fabric"],
            "image": f"img/{item}.jpg",
        }
        for n, (item, *_rest) in enumerate(CARDS, start=1)
    ]


def feeds(page_view: str = "pv-A") -> list[dict]:
    return [
        {
            "page_view_id": page_view,
            "item_id": item,
            "x": x,
            "y": y,
            "width": 195,
            "height": h,
            "feed_height": FEED_HEIGHT,
        }
        for item, x, y, h in CARDS
    ]


def session_a() -> list[dict]:
    """Nine valid events; the expected steps are in tests/transforms/test_align.py."""
    return [
        event("ev-0", 0, "feed", "scroll_down", scroll_top=0, scroll_delta=400),
        event("ev-1", 5, "feed", "click", scroll_top=400, item_id="itm-5"),
        event(
            "ev-2",
            9,
            "ipv",
            "ipv_scroll_down",
            item_id="itm-5",
            scroll_top=400,
            ipv_scroll=0,
            scroll_delta=500,
            ui_state="main",
        ),
        event(
            "ev-3",
            12,
            "ipv",
            "ipv_enter_comment",
            item_id="itm-5",
            scroll_top=400,
            ipv_scroll=500,
            ui_state="main",
        ),
        event(
            "ev-4",
            15,
            "ipv",
            "ipv_click_comment",
            item_id="itm-5",
            scroll_top=400,
            ipv_scroll=500,
            review_index=1,
            ui_state="comments",
        ),
        event(
            "ev-5", 20, "ipv", "ipv_cart", item_id="itm-5", scroll_top=400, ipv_scroll=500, ui_state="main"
        ),
        event(
            "ev-6", 24, "ipv", "back_home", item_id="itm-5", scroll_top=400, ipv_scroll=500, ui_state="main"
        ),
        event("ev-7", 28, "feed", "scroll_up", scroll_top=400, scroll_delta=300),
        event("ev-8", 31, "feed", "end", scroll_top=100),
    ]


def profiles() -> list[dict]:
    return [
        {
            "user_id": "usr-1",
            "age_band": "25-29",
            "gender": "f",
            "city_tier": "1",
            "purchase_power": "mid",
            "member_level": "gold",
            "lifecycle": "active",
            "ab_arm": "baseline",
        },
        {
            "user_id": "usr-2",
            "age_band": "35-39",
            "gender": "m",
            "city_tier": "2",
            "purchase_power": "high",
            "member_level": "silver",
            "lifecycle": "new",
            "ab_arm": "treatment",
        },
    ]


def history() -> list[dict]:
    return [{"user_id": "usr-1", "ts": at(-86400), "kind": "buy", "title": "Canvas tote", "category": "Bags"}]


def tiny_bundle() -> dict[str, list[dict]]:
    return {
        "profiles": profiles(),
        "items": items(),
        "feeds": feeds(),
        "events": session_a(),
        "history": history(),
    }


def _frame(table: str, rows: list[dict]) -> pl.DataFrame:
    schema = RAW_TABLES[table]
    extra = {k for r in rows for k in r} - set(schema.names)
    frame = (
        pl.from_arrow(pa.Table.from_pylist(rows, schema=schema))
        if rows
        else pl.from_arrow(schema.empty_table())
    )
    for column in sorted(extra):
        frame = frame.with_columns(pl.Series(column, [r.get(column) for r in rows], dtype=pl.String))
    return frame


def _jsonable(row: dict) -> dict:
    return {
        k: (v.isoformat().replace("+00:00", "Z") if isinstance(v, datetime) else v) for k, v in row.items()
    }


def write_bundle(bundle: dict[str, list[dict]], root: Path, fmt: str = "parquet") -> Path:
    """Write one part file per table in ``fmt`` (parquet | jsonl | jsonl.gz | csv)."""
    for table, rows in bundle.items():
        folder = root / table
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"part-0.{fmt}"
        if fmt == "parquet":
            pq.write_table(_frame(table, rows).to_arrow(), path)
        elif fmt in ("jsonl", "jsonl.gz"):
            text = "".join(json.dumps(_jsonable(r)) + "\n" for r in rows).encode()
            path.write_bytes(gzip.compress(text) if fmt.endswith(".gz") else text)
        elif fmt == "csv":
            frame = _frame(table, rows)
            nested = [c for c, t in frame.schema.items() if isinstance(t, pl.List)]
            frame = frame.with_columns(
                [
                    pl.col(c).map_elements(
                        lambda v: json.dumps(v.to_list() if hasattr(v, "to_list") else v),
                        return_dtype=pl.String,
                    )
                    for c in nested
                ]
            )
            frame.write_csv(path)
        else:
            raise ValueError(fmt)
    return root
