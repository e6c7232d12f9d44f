"""A hand-built lake for the extraction tests: 3 users, 4 sessions, 19 recorded actions, 2 buckets.

user A (bucket 0, train): one session sA, 8 steps; items i05/i06 first appear at step 6.
user B (bucket 1, train): sessions sB1 (4 steps) and sB2 (4 steps), in single *and* cross mode.
user C (bucket 1, val):   one session sC, 3 steps.

So there are 4 intent jobs (single sA, sB1, sB2 + cross uB; C is not train) and
19 rationale jobs (8 + 4 + 4 + 3 distinct record ids; B's cross rows share ids).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl

from transforms.lake import write_table
from transforms.schemas import ITEMS, RECORDS, STEPS


def hexid(prefix: str, name: str) -> str:
    return f"{prefix}_{hashlib.sha256(name.encode()).hexdigest()[:16]}"


ITEM_ROWS = [
    ("i01", "Lumora Slim Fit Linen Midi Dress", 129.00, "Apparel-Women-Dresses"),
    ("i02", "Veria Relaxed Cotton Blouse", 45.50, "Apparel-Women-Blouses"),
    ("i03", "Kanex Classic Denim Skirt", 59.90, "Apparel-Women-Skirts"),
    ("i04", "Solvia Vintage Leather Ankle Boot", 89.00, "Shoes-Women-Ankle boots"),
    ("i05", "Brimora Cosy Wool Knitwear Cardigan", 75.00, "Apparel-Women-Knitwear"),
    ("i06", "Zenlia Everyday Satin Midi Dress", 99.00, "Apparel-Women-Dresses"),
]
ITEM = {short: hexid("i", short) for short, *_ in ITEM_ROWS}
TITLE = {short: title for short, title, *_ in ITEM_ROWS}
USER = {u: hexid("u", u) for u in ("A", "B", "C")}
SESSION = {s: hexid("s", s) for s in ("sA", "sB1", "sB2", "sC")}

# (session, screen, action, target/ipv item, visible items, distance)
SCRIPT: dict[str, list[tuple[str, str, str | None, list[str], int | None]]] = {
    "sA": [
        ("feed", "scroll_down", None, ["i01", "i02", "i03", "i04"], 300),
        ("feed", "click", "i01", ["i01", "i02", "i03", "i04"], None),
        ("ipv", "ipv_swipe_pic", "i01", [], None),
        ("ipv", "ipv_enter_comment", "i01", [], None),
        ("ipv", "ipv_cart", "i01", [], None),
        ("ipv", "back_home", "i01", [], None),
        ("feed", "scroll_down", None, ["i03", "i04", "i05", "i06"], 420),
        ("feed", "end", None, ["i05", "i06"], None),
    ],
    "sB1": [
        ("feed", "click", "i04", ["i04", "i02"], None),
        ("ipv", "ipv_click_param", "i04", [], None),
        ("ipv", "back_home", "i04", [], None),
        ("feed", "end", None, ["i04", "i02"], None),
    ],
    "sB2": [
        ("feed", "scroll_down", None, ["i05", "i06"], 250),
        ("feed", "click", "i06", ["i05", "i06"], None),
        ("ipv", "ipv_buy", "i06", [], None),
        ("ipv", "end", "i06", [], None),
    ],
    "sC": [
        ("feed", "click", "i02", ["i02", "i03"], None),
        ("ipv", "back_home", "i02", [], None),
        ("feed", "end", None, ["i02", "i03"], None),
    ],
}
OWNER = {"sA": ("A", 0, "train"), "sB1": ("B", 1, "train"), "sB2": ("B", 1, "train"), "sC": ("C", 1, "val")}
START = {"sA": 0, "sB1": 1, "sB2": 2, "sC": 3}  # hours after T0
T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


@dataclass(frozen=True)
class TinyLake:
    path: Path
    intent_jobs: int = 4
    rationale_jobs: int = 19
    record_rows: int = 27  # 19 single-mode rows + 8 cross-mode rows of user B


def _null(dtype: pl.DataType) -> pl.Expr:
    return pl.lit(None, dtype=dtype)


def steps_frame() -> pl.DataFrame:
    rows = []
    for session, script in SCRIPT.items():
        user, bucket, split = OWNER[session]
        for k, (screen, action, item, visible, distance) in enumerate(script):
            rows.append(
                {
                    "session_id": SESSION[session],
                    "user_id": USER[user],
                    "step": k,
                    "ts": T0 + timedelta(hours=START[session], seconds=10 * k),
                    "screen": screen,
                    "action": action,
                    "target_item_id": ITEM[item] if action == "click" else None,
                    "target_title": TITLE[item] if action == "click" else None,
                    "distance": distance,
                    "visible_items": [ITEM[v] for v in visible],
                    "ipv_item_id": ITEM[item] if screen == "ipv" else None,
                    "profile": {"age_band": "25-34", "gender": "female", "city_tier": "1"},
                    "split": split,
                    "bucket": bucket,
                }
            )
    frame = pl.DataFrame(rows)
    empty = pl.from_arrow(STEPS.empty_table())
    missing = [pl.lit(None, dtype=empty.schema[c]).alias(c) for c in empty.columns if c not in frame.columns]
    return frame.with_columns(missing).select(empty.columns).cast(dict(empty.schema))


def items_frame() -> pl.DataFrame:
    rows = []
    for short, title, price, category in ITEM_ROWS:
        l1, l2, l3 = category.split("-")
        rows.append(
            {
                "item_id": ITEM[short],
                "title": title,
                "price": price,
                "category": category,
                "category_l1": l1,
                "category_l2": l2,
                "category_l3": l3,
                "params": [{"label": "Material", "value": "Cotton"}, {"label": "Colour", "value": "Navy"}],
                "reviews": ["Love it, fits perfectly."],
                "image": None,
            }
        )
    return pl.DataFrame(rows, schema=pl.from_arrow(ITEMS.empty_table()).schema)


def action_json(action: str, item: str | None, distance: int | None) -> str:
    obj: dict[str, object] = {"type": action}
    if action == "click":
        obj |= {"target": TITLE[item or ""], "target_item_id": ITEM[item or ""]}
    if distance is not None:
        obj["distance"] = distance
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def prompt_text(visible: list[str], screen: str, item: str | None) -> str:
    """A stand-in for the records stage's prompt: the current observation with titles and prices."""
    if screen == "ipv":
        return f"## Current observation\nDetail page: {TITLE[item or '']}"
    cards = "\n".join(f"[{n}] {TITLE[v]}" for n, v in enumerate(visible, start=1))
    return f"## Current observation\nFeed, cards in view:\n{cards}"


def records_frame() -> pl.DataFrame:
    rows = []
    for session, script in SCRIPT.items():
        user, bucket, split = OWNER[session]
        modes = [("single", SESSION[session])] + ([("cross", USER[user])] if user == "B" else [])
        for mode, trajectory in modes:
            for k, (screen, action, item, visible, distance) in enumerate(script):
                aj = action_json(action, item, distance)
                rows.append(
                    {
                        "record_id": f"{SESSION[session]}:{k}",
                        "session_id": SESSION[session],
                        "user_id": USER[user],
                        "step": k,
                        "trajectory_id": trajectory,
                        "mode": mode,
                        "system": "You are a shopper.",
                        "prompt": prompt_text(visible, screen, item),
                        "action": action,
                        "action_json": aj,
                        "rationale": None,
                        "response": None,  # no gold response before extraction
                        "gold_missing": "rationale_missing",
                        "intent": None,
                        "split": split,
                        "token_estimate": 0,
                        "bucket": bucket,
                    }
                )
    return pl.DataFrame(rows, schema=pl.from_arrow(RECORDS.empty_table()).schema)


def write_sessions_lake(path: Path, sessions: list[str]) -> Path:
    """The tiny lake cut down to some of its sessions (short names, e.g. ``["sB1"]``), single mode only.

    Each train session gives 1 intent job, each action 1 rationale job: ``["sB1"]``
    is 1 + 4 jobs, ``["sB1", "sC"]`` 1 + 7 (sC is in the val split: no intent).
    """
    kept = pl.col("session_id").is_in([SESSION[s] for s in sessions])
    write_table(path, "steps", steps_frame().filter(kept))
    write_table(path, "items", items_frame())
    write_table(path, "records", records_frame().filter(kept & (pl.col("mode") == "single")))
    return path


def write_tiny_lake(path: Path) -> TinyLake:
    write_table(path, "steps", steps_frame())
    write_table(path, "items", items_frame())
    write_table(path, "records", records_frame())
    return TinyLake(path)
