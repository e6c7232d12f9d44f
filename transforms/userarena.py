"""Reader for the public UserArena release: one JSON object per session (or per
shopper, for cross-session records), turned into the raw bundle tables so the
same alignment, checks and quarantine apply as for platform logs.

Conventions of the release, as read here:
- ``trajectory[]`` rows without an ``action`` are context (an observation), not
  actions; they are counted, and their ``scroll_top`` fills a following action
  row that lacks one.
- ``step_type`` ``transition`` rows move onto the screen their action is taken
  on: ``click`` -> feed, ``back_home`` -> detail page, others keep the screen
  of the previous row.
- On detail-page rows ``scroll_top`` is the page offset (``ipv_scroll``).
- A detail-page excursion (a click and the detail-page rows after it, up to
  ``back_home``) is rejected whole when it is defective: a click with no detail
  page after it (``click_without_detail_page``), detail-page rows with no click
  before them (``detail_step_without_page``), detail rows about another product
  than the one clicked (``excursion_product_mismatch``), or a click on an item
  that is not in the visit's feed catalog (``unpresentable_click``). Like any
  rejected event it cuts the session (``align.cut_sessions``): the steps before
  it stay, its first row carries the reason, the rows after it (the rest of the
  excursion included) leave as ``after_rejected_event``.
- A step that fails typing (``readers.coerce``: a non-numeric ``scroll_top``, an
  unreadable ``ts``, ...) is quarantined once under its own reason, at its
  record's line, and cuts its session at its place in the trajectory: every
  step of a record shares that line, so the step index orders them.
- Card boxes need only ``y``: ``x`` and ``width`` may be absent and a missing
  ``height`` is the reference's 328 px (``align.check_feeds`` flags each default).
- Rows carry no timestamps in the release; when a row has none, times are
  synthesised (one second per row, sessions one hour apart, in record order)
  and counted in the summary.
"""

from __future__ import annotations

import gzip
import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl

from transforms.align import (
    ALREADY_QUARANTINED,
    cut_sessions,
    cutting_as_quarantined,
    map_actions,
    no_cuts,
    session_cuts,
)
from transforms.config import DROP_ACTION
from transforms.readers import Pseudonymize, TableRead, coerce, empty_rejects, empty_typed
from transforms.schemas import PROFILE_FIELDS

EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
PRICE = re.compile(r"-?\d+(?:\.\d+)?")


def _text(value: object) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _price(value: object) -> str | None:
    """Numbers as they are; '¥129.00' or '129 yuan' -> '129.00'."""
    if value is None or isinstance(value, int | float):
        return None if value is None else repr(value)
    found = PRICE.search(str(value))
    return found.group(0) if found else str(value)


def _item_ids(values: object) -> str | None:
    if values is None:
        return None
    return json.dumps([v.get("item_id") if isinstance(v, dict) else v for v in values])


def _action(step: dict) -> str | None:
    action = step.get("action")
    return action.get("type") if isinstance(action, dict) else action


def _visits(record: dict) -> list[dict]:
    """Per-visit feed catalogs: one for single-session records, one per pv for cross-session ones."""
    if record.get("feed_session_screenshots"):
        return [
            {
                "pv": v.get("pv_id") or v.get("session_id"),
                "catalog": v.get("feed_catalog") or [],
                "height": (v.get("feed_long_image") or {}).get("height") or v.get("height"),
            }
            for v in record["feed_session_screenshots"]
        ]
    pv = record.get("session_id") or record.get("pv_id")
    return [
        {
            "pv": pv,
            "catalog": record.get("feed_catalog") or [],
            "height": (record.get("feed_long_image") or {}).get("height"),
        }
    ]


def _px(value: object) -> float | None:
    try:
        return float(value) if value is not None and not isinstance(value, bool) else None
    except (TypeError, ValueError):
        return None


def _feed_bottom(catalog: list[dict], card_height: float) -> float | None:
    """A feed's height when the record gives none: the lowest card bottom (boxes without ``y`` left
    out, a missing height taken as ``card_height``); None when no card can be placed."""
    bottoms = []
    for card in catalog:
        box = card.get("bbox") or {}
        y, height = _px(box.get("y")), _px(box.get("height"))
        if y is not None:
            bottoms.append(y + (card_height if height is None else height))
    return max(bottoms, default=None)


class _Tables:
    """Loose rows of every raw table, collected record by record."""

    def __init__(self, card_height: float) -> None:
        self.rows: dict[str, list[dict]] = {
            t: [] for t in ("profiles", "items", "feeds", "events", "history")
        }
        self.context_rows = 0
        self.synthetic_ts = 0
        self.card_height = card_height  # a box without height (the feed's bottom is then estimated)

    def add_record(self, record: dict, rel: str, line: int) -> None:
        user = record.get("visitor_id")
        self._profile(record.get("user_info") or {}, user, rel, line)
        visits = _visits(record)
        for visit in visits:
            self._feed(visit, rel, line)
        self._history(record, user, rel, line)
        single_pv = visits[0]["pv"] if len(visits) == 1 else None
        self._trajectory(record.get("trajectory") or [], user, single_pv, rel, line)

    def _profile(self, info: dict, user: object, rel: str, line: int) -> None:
        row = {"user_id": _text(user), "_file": rel, "_row": line}
        row.update({k: _text(v) for k, v in info.items() if k != "user_id"})
        row.update({f: _text(info.get(f)) for f in PROFILE_FIELDS})
        self.rows["profiles"].append(row)

    def _feed(self, visit: dict, rel: str, line: int) -> None:
        for card in visit["catalog"]:
            box = card.get("bbox") or {}
            self.rows["items"].append(
                {
                    "item_id": _text(card.get("item_id")),
                    "title": _text(card.get("item_title")),
                    "price": _price(card.get("item_price")),
                    "category": _text(card.get("item_cate")),
                    "params": _text(card.get("item_params") or []),
                    "reviews": _text(card.get("item_reviews") or []),
                    "image": _text(card.get("item_image") or card.get("image")),
                    "_file": rel,
                    "_row": line,
                }
            )
            height = visit["height"] or _feed_bottom(visit["catalog"], self.card_height)
            self.rows["feeds"].append(
                {
                    "page_view_id": _text(visit["pv"]),
                    "item_id": _text(card.get("item_id")),
                    "x": _text(box.get("x")),
                    "y": _text(box.get("y")),
                    "width": _text(box.get("width")),
                    "height": _text(box.get("height")),
                    "feed_height": _text(height),
                    "_file": rel,
                    "_row": line,
                }
            )

    def _history(self, record: dict, user: object, rel: str, line: int) -> None:
        for kind, key in (("click", "user_click_list"), ("buy", "user_buy_list")):
            for rank, entry in enumerate(record.get(key) or []):
                entry = entry if isinstance(entry, dict) else {"title": entry}
                ts = entry.get("ts") or (EPOCH - timedelta(days=1, seconds=rank)).isoformat()
                self.rows["history"].append(
                    {
                        "user_id": _text(user),
                        "ts": _text(ts),
                        "kind": kind,
                        "title": _text(entry.get("title") or entry.get("item_title")),
                        "category": _text(entry.get("category") or entry.get("item_cate")),
                        "_file": rel,
                        "_row": line,
                    }
                )

    def _trajectory(self, steps: list[dict], user: object, single_pv: object, rel: str, line: int) -> None:
        screen, scroll_top = "feed", None
        session_starts: dict[object, int] = {}
        for index, step in enumerate(steps):
            action = _action(step)
            pv = step.get("pv_id") or single_pv
            kind = step.get("step_type")
            if kind in ("feed", "ipv"):
                screen = kind
            elif kind == "transition":
                screen = {"click": "feed", "back_home": "ipv"}.get(action, screen)
            if action is None:  # an observation row: context for the next action
                self.context_rows += 1
                if screen == "feed" and step.get("scroll_top") is not None:
                    scroll_top = step["scroll_top"]
                continue
            session_starts.setdefault(pv, len(session_starts))
            ts = step.get("ts") or step.get("timestamp")
            if ts is None:
                self.synthetic_ts += 1
                ts = (EPOCH + timedelta(days=line, hours=session_starts[pv], seconds=index)).isoformat()
            on_feed = screen == "feed"
            top = (
                step.get("scroll_top")
                if step.get("scroll_top") is not None
                else (scroll_top if on_feed else None)
            )
            self.rows["events"].append(
                {
                    "event_id": f"{pv}#{index}",
                    "user_id": _text(user),
                    "page_view_id": _text(pv),
                    "ts": _text(ts),
                    "screen": screen,
                    "action": _text(action),
                    "item_id": _text(
                        step.get("clicked_item_id") if action == "click" else step.get("item_id")
                    ),
                    "scroll_top": _text(top if on_feed else None),
                    "scroll_delta": _text(step.get("scroll_delta_px") or step.get("scroll_distance")),
                    "ipv_scroll": _text(None if on_feed else step.get("scroll_top")),
                    "review_index": _text(step.get("review_index")),
                    "ui_state": _text(step.get("ipv_step_ui_state")),
                    "image": _text(step.get("gui_image")),
                    "visible_items": _item_ids(step.get("visible_items")),
                    "_file": rel,
                    "_row": line,
                    "_step": index,
                }
            )
            if on_feed and top is not None:
                scroll_top = top


def _frame(rows: list[dict]) -> pl.DataFrame:
    if not rows:
        return pl.DataFrame()
    columns = dict.fromkeys(k for r in rows for k in r)
    return pl.DataFrame(
        {
            c: pl.Series(c, [r.get(c) for r in rows], dtype=pl.Int64 if c in ("_row", "_step") else pl.String)
            for c in columns
        }
    )


def defective_excursions() -> pl.Expr:
    """Reason code for rows of a defective detail-page excursion (null for the rest)."""
    click = pl.col("action") == "click"
    ipv = pl.col("screen") == "ipv"
    by_view = {"partition_by": "page_view_id", "order_by": ["_row", "_step"]}
    ordinal = click.cast(pl.Int32).cum_sum().over(**by_view)
    # which excursion a row belongs to: the ordinal of the last click, reset to 0 by a feed row
    opened = pl.when(click).then(ordinal).when(pl.col("screen") == "feed").then(0)
    current = opened.forward_fill().over(**by_view).fill_null(0)
    clicked_item = pl.when(click).then(pl.col("item_id")).forward_fill().over(**by_view)
    exc = pl.when(click | (ipv & (current > 0))).then(
        pl.concat_str(pl.col("page_view_id"), pl.lit("#"), current.cast(pl.String))
    )
    next_is_ipv = pl.col("screen").shift(-1).over(**by_view) == "ipv"
    mismatch = ipv & pl.col("item_id").is_not_null() & (pl.col("item_id") != clicked_item)
    return (
        pl.when(ipv & (current == 0))
        .then(pl.lit("detail_step_without_page"))
        .when((click & ~next_is_ipv.fill_null(False)).any().over(exc))
        .then(pl.lit("click_without_detail_page"))
        .when(mismatch.any().over(exc))
        .then(pl.lit("excursion_product_mismatch"))
        .when((click & ~pl.col("_in_feed")).any().over(exc))
        .then(pl.lit("unpresentable_click"))
    )


def read_userarena(
    path: str | Path,
    unit: str = "auto",
    pseudonymize: Pseudonymize | None = None,
    *,
    on_bad_event: str = "cut",
    card_height: float = 328,
    action_map: dict[str, str] | None = None,
) -> tuple[dict[str, TableRead], dict[str, int], pl.DataFrame]:
    """Read release JSONL (file or folder of part files) into raw bundle tables, import notes, and
    the sessions cut at a step that failed typing or a defective excursion (``page_view_id``,
    ``cut_reason``). ``action_map``: the run's, so that a step whose action it drops cuts nothing."""
    path = Path(path)
    files = sorted(p for p in path.rglob("*.jsonl*") if p.is_file()) if path.is_dir() else [path]
    if not files or not all(f.exists() for f in files):
        raise FileNotFoundError(f"no UserArena JSONL at {path}")
    collected, bad = _Tables(card_height), []
    for file in files:
        rel = file.name
        data = file.read_bytes()
        data = gzip.decompress(data) if file.suffix == ".gz" else data
        for line, raw in enumerate(data.removeprefix(b"\xef\xbb\xbf").split(b"\n")):
            if not raw.strip():
                continue
            try:
                record = json.loads(raw)
                if not isinstance(record, dict):
                    raise ValueError(f"record is a {type(record).__name__}")
                collected.add_record(record, rel, line)
            except (ValueError, UnicodeDecodeError, AttributeError, TypeError) as exc:
                bad.append(
                    {
                        "table_name": "events",
                        "source_file": rel,
                        "source_row": line,
                        "reason": "unparseable_row",
                        "detail": f"record: {str(exc)[:160]}",
                        "payload": None,
                    }
                )
    tables, cuts = _tables(collected, bad, unit, pseudonymize, on_bad_event, action_map or {})
    notes = {
        "records_unparseable": len(bad),
        "context_rows": collected.context_rows,
        "synthetic_timestamps": collected.synthetic_ts,
    }
    return tables, notes, cuts


def _tables(
    collected: _Tables,
    bad: list[dict],
    unit: str,
    pseudonymize: Pseudonymize | None,
    on_bad_event: str,
    action_map: dict[str, str],
) -> tuple[dict[str, TableRead], pl.DataFrame]:
    tables: dict[str, TableRead] = {}
    cuts = no_cuts()
    for name, rows in collected.rows.items():
        loose = _frame(rows)
        merged = 0
        if name == "items" and loose.height:  # the same catalog entry appears in many records
            before = loose.height
            loose = loose.unique("item_id", keep="first", maintain_order=True)
            merged = before - loose.height
        if name == "profiles" and loose.height:
            before = loose.height
            loose = loose.unique("user_id", keep="first", maintain_order=True)
            merged = before - loose.height
        if loose.height == 0:
            tables[name] = TableRead(name, empty_typed(name), empty_rejects(), 0)
            continue
        if name == "events":
            typed, rejects, naive, mistyped = coerce(loose, name, unit, pseudonymize, carry=("_step",))
            typed, cut_rejects, cuts = _cut_at_rejections(
                loose, typed, mistyped, collected.rows["feeds"], pseudonymize, on_bad_event, action_map
            )
            rejects = pl.concat([cut_rejects, rejects])
        else:
            typed, rejects, naive, _ = coerce(loose, name, unit, pseudonymize)
        tables[name] = TableRead(name, typed, rejects, len(rows), naive_timestamps=naive, merged=merged)
    if bad:
        events = tables["events"]
        events.rejects = pl.concat([events.rejects, pl.DataFrame(bad, schema=empty_rejects().schema)])
        events.rows_in += len(bad)
    return tables, cuts


def _cut_at_rejections(
    loose: pl.DataFrame,
    typed: pl.DataFrame,
    mistyped: pl.DataFrame,
    feed_rows: list[dict],
    pseudonymize: Pseudonymize | None,
    on_bad_event: str,
    action_map: dict[str, str],
) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """The first step (before the session's ``end``) that failed typing or opens a defective
    excursion cuts the session like any rejected event (``align.cut_sessions``), in trajectory
    order: what follows it leaves as ``after_rejected_event`` (or the whole session,
    ``on_bad_event = "drop_session"``). ``typed``: the events that typed (with ``_step``);
    ``mistyped``: the ``rejected_event_marks`` of those that did not, quarantined by ``coerce``
    already under their own reason, so they cut without a second quarantine row; one whose action
    ``action_map`` drops cuts nothing, like any dropped event."""
    order = ["_file", "_row", "_step"]
    cutting = map_actions(mistyped, action_map).filter(pl.col("action").ne_missing(DROP_ACTION))
    # as the release wrote them: excursions are told by screen and item, which the marks lack;
    # a view with no typed step has no session to cut
    unread = (
        loose.join(cutting.select(*order, "reason"), on=order)
        .filter(pl.col("page_view_id").is_in(typed["page_view_id"].unique().implode()))
        .select("page_view_id", "action", "screen", "item_id", *order, *cutting_as_quarantined())
    )
    presentable = (
        pl.DataFrame(
            {
                "page_view_id": [r["page_view_id"] for r in feed_rows],
                "item_id": [r["item_id"] for r in feed_rows],
            },
            schema={"page_view_id": pl.String, "item_id": pl.String},
        )
        .unique()
        .with_columns(pl.lit(True).alias("_in_feed"))
    )
    tagged = (
        pl.concat([typed, unread], how="diagonal")
        .join(presentable, on=["page_view_id", "item_id"], how="left")
        .with_columns(pl.col("_in_feed").fill_null(False))
        .sort("page_view_id", *order)  # grouped by view, in trajectory order
        .with_columns(
            pl.coalesce(pl.col("_why"), defective_excursions()).alias("_why"),
            pl.concat_str(pl.lit("trajectory step "), pl.col("_step").cast(pl.String)).alias("_why_detail"),
        )
    )
    if tagged["_why"].null_count() == tagged.height:
        helpers = ["_why", "_why_detail", "_in_feed", "_step", ALREADY_QUARANTINED]
        return tagged.drop(helpers, strict=False), empty_rejects(), no_cuts()
    checked = cut_sessions(tagged, on_bad_event, pseudonymize)
    return checked.rows.drop("_in_feed", "_step"), pl.concat(checked.rejects), session_cuts(checked.cuts)
