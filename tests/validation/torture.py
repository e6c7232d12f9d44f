"""Torture corpus: faulty raw bundles derived from one tiny clean bundle.

The clean bundle (raw ids, DATA.md input contract) has three shoppers, six
items and one page view each; every card sits in a 2 x 3 grid (200 x 390 px
cards at x 0/201, y 0/400/800, feed 1200 px high), so with the 693 px viewport
the cards visible at offset 0 are i1..i4, at 200 or 300 only i3, i4.

    pv1 (u1): scroll_down(300) click i3 | ipv_scroll_down(400) ipv_cart back_home | end
    pv2 (u2): click i1 | ipv_buy end
    pv3 (u3): scroll_down(200) scroll_up(200) end

Each :class:`Fault` writes one bundle and states what ingest must do with it:
the quarantine rows per (table, reason) it must produce (``rejected``), the
kept-and-flagged rows (``flagged``), exact duplicates merged, the steps that
survive, or that ingest must stop with a clean error (``stops``). Expected
numbers are worked out by hand in each fault's ``why``.
"""

from __future__ import annotations

import copy
import gzip
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from transforms.schemas import PROFILE_FIELDS, RAW_TABLES

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
Rows = list[dict]
Bundle = dict[str, Rows]


def _ts(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _event(eid: str, user: str, pv: str, t: float, screen: str, action: str, **kw: object) -> dict:
    row = dict.fromkeys(RAW_TABLES["events"].names)
    row.update(event_id=eid, user_id=user, page_view_id=pv, ts=_ts(t), screen=screen, action=action)
    row.update(kw)
    return row


def clean_bundle() -> Bundle:
    """The clean tables as rows (Python values in the raw schemas' types)."""
    items = [
        {
            "item_id": f"i{k}",
            "title": f"Cotton tee {k}",
            "price": 9.5 * k,
            "category": "apparel-tops-tees",
            "params": [{"label": "material", "value": "cotton"}],
            "reviews": ["fits well", "soft"],
            "image": f"img/{k}.jpg",
        }
        for k in range(1, 7)
    ]
    feeds = [
        {
            "page_view_id": pv,
            "item_id": f"i{k + 1}",
            "x": 201 * (k % 2),
            "y": 400 * (k // 2),
            "width": 200,
            "height": 390,
            "feed_height": 1200,
        }
        for pv in ("pv1", "pv2", "pv3")
        for k in range(6)
    ]
    h1, h2 = 3600, 7200  # page views start an hour apart
    events = [
        _event("e01", "u1", "pv1", 0, "feed", "scroll_down", scroll_top=0, scroll_delta=300),
        _event("e02", "u1", "pv1", 10, "feed", "click", item_id="i3", scroll_top=300),
        _event(
            "e03", "u1", "pv1", 20, "ipv", "ipv_scroll_down", item_id="i3", ipv_scroll=0, scroll_delta=400
        ),
        _event("e04", "u1", "pv1", 30, "ipv", "ipv_cart", item_id="i3", ipv_scroll=400),
        _event("e05", "u1", "pv1", 40, "ipv", "back_home", item_id="i3", ipv_scroll=400),
        _event("e06", "u1", "pv1", 50, "feed", "end", scroll_top=300),
        _event("e07", "u2", "pv2", h1, "feed", "click", item_id="i1", scroll_top=0),
        _event("e08", "u2", "pv2", h1 + 10, "ipv", "ipv_buy", item_id="i1", ipv_scroll=0),
        _event("e09", "u2", "pv2", h1 + 20, "ipv", "end", item_id="i1", ipv_scroll=0),
        _event("e10", "u3", "pv3", h2, "feed", "scroll_down", scroll_top=0, scroll_delta=200),
        _event("e11", "u3", "pv3", h2 + 10, "feed", "scroll_up", scroll_top=200, scroll_delta=200),
        _event("e12", "u3", "pv3", h2 + 20, "feed", "end", scroll_top=0),
    ]
    profiles = [{"user_id": u, **{f: f"{f}-{u}" for f in PROFILE_FIELDS}} for u in ("u1", "u2", "u3")]
    history = [
        {"user_id": "u1", "ts": _ts(-30 * 86400), "kind": "click", "title": "Old tee", "category": "apparel"},
        {"user_id": "u1", "ts": _ts(-29 * 86400), "kind": "buy", "title": "Old tee", "category": "apparel"},
        {"user_id": "u2", "ts": _ts(-86400), "kind": "click", "title": "Canvas bag", "category": "bags"},
    ]
    return {"profiles": profiles, "items": items, "feeds": feeds, "events": events, "history": history}


CLEAN_STEPS = 12  # every clean event becomes a step


# --- writers --------------------------------------------------------------------


def _json_value(value: object) -> object:
    if isinstance(value, datetime):
        return value.isoformat().replace("+00:00", "Z")
    return value


def jsonl_bytes(rows: Rows, newline: bytes = b"\n") -> bytes:
    lines = [json.dumps({k: _json_value(v) for k, v in r.items()}, ensure_ascii=False) for r in rows]
    return b"".join(line.encode("utf-8") + newline for line in lines)


def write_parquet(path: Path, table: str, rows: Rows, schema: pa.Schema | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema or RAW_TABLES[table]), path)


def write_jsonl(path: Path, rows: Rows, newline: bytes = b"\n", prefix: bytes = b"") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(prefix + jsonl_bytes(rows, newline))


def write_csv(path: Path, table: str, rows: Rows, columns: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    schema = pa.schema([pa.field(c, pa.string()) for c in columns])
    text_rows = [{c: None if r.get(c) is None else str(_json_value(r[c])) for c in columns} for r in rows]
    pacsv.write_csv(pa.Table.from_pylist(text_rows, schema=schema), path)


def write_bundle(root: Path, bundle: Bundle, skip: tuple[str, ...] = ()) -> Path:
    """Every table as ``root/<table>/part-0.parquet`` (tables in ``skip`` are left to the fault)."""
    for table, rows in bundle.items():
        if table not in skip:
            write_parquet(root / table / "part-0.parquet", table, rows)
    return root


# --- faults ---------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    name: str
    why: str
    build: Callable[[Path], None]
    rejected: dict[tuple[str, str], int] = field(default_factory=dict)  # (raw table, reason) -> rows
    flagged: dict[tuple[str, str], int] = field(default_factory=dict)  # kept rows flagged
    duplicates: dict[str, int] = field(default_factory=dict)
    steps: int | None = None  # steps expected in the lake
    stops: str | None = None  # an ingest stop: the exception class name
    check: Callable[[Path], None] | None = None  # extra assertion on the lake
    # the loss gate stops the run: a raw table keeps nothing, or loses more than half its rows
    lost: tuple[str, ...] = ()


def _events(update: Callable[[Rows], Rows]) -> Callable[[Path], None]:
    """A fault that edits only the events rows (written as Parquet)."""

    def build(root: Path) -> None:
        bundle = clean_bundle()
        bundle["events"] = update(copy.deepcopy(bundle["events"]))
        write_bundle(root, bundle)

    return build


def _table(table: str, update: Callable[[Rows], Rows]) -> Callable[[Path], None]:
    def build(root: Path) -> None:
        bundle = clean_bundle()
        bundle[table] = update(copy.deepcopy(bundle[table]))
        write_bundle(root, bundle)

    return build


def _set(eid: str, **values: object) -> Callable[[Rows], Rows]:
    def update(rows: Rows) -> Rows:
        for r in rows:
            if r["event_id"] == eid:
                r.update(values)
        return rows

    return update


def _item(item: str, **values: object) -> Callable[[Rows], Rows]:
    def update(rows: Rows) -> Rows:
        for r in rows:
            if r["item_id"] == item:
                r.update(values)
        return rows

    return update


def _insert(*new: dict) -> Callable[[Rows], Rows]:
    """Add rows; events stay in time order in the file (else they are also out of order)."""
    return lambda rows: sorted(rows + list(new), key=lambda r: r.get("ts") or T0)


def _raw_events(root: Path, writer: Callable[[Path, Rows], None]) -> None:
    """Clean bundle with the events table written by ``writer`` (a format fault)."""
    bundle = clean_bundle()
    write_bundle(root, bundle, skip=("events",))
    writer(root / "events", bundle["events"])


def _epoch(rows: Rows, unit: float) -> Rows:
    return [{**r, "ts": int(r["ts"].timestamp() * unit)} for r in rows]


def _truncated_parquet(root: Path) -> None:
    bundle = clean_bundle()
    write_bundle(root, bundle, skip=("events",))
    events = bundle["events"]
    write_parquet(root / "events" / "part-0.parquet", "events", events[:9])
    part = root / "events" / "part-1.parquet"
    write_parquet(part, "events", events[9:])
    part.write_bytes(part.read_bytes()[: part.stat().st_size // 2])


def _items_jsonl_with(extra_line: bytes) -> Callable[[Path], None]:
    def build(root: Path) -> None:
        bundle = clean_bundle()
        write_bundle(root, bundle, skip=("items",))
        write_jsonl(root / "items" / "part-0.jsonl", bundle["items"])
        with (root / "items" / "part-0.jsonl").open("ab") as f:
            f.write(extra_line)

    return build


def _events_jsonl_with(extra_line: bytes) -> Callable[[Path], None]:
    def build(root: Path) -> None:
        _raw_events(root, lambda d, rows: write_jsonl(d / "part-0.jsonl", rows))
        with (root / "events" / "part-0.jsonl").open("ab") as f:
            f.write(extra_line)

    return build


def _drop_columns(*names: str) -> Callable[[Path], None]:
    def build(root: Path) -> None:
        schema = pa.schema([f for f in RAW_TABLES["events"] if f.name not in names])
        rows = [{k: v for k, v in r.items() if k not in names} for r in clean_bundle()["events"]]
        _raw_events(root, lambda d, _: write_parquet(d / "part-0.parquet", "events", rows, schema))

    return build


def _extra_column(root: Path) -> None:
    schema = RAW_TABLES["events"].append(pa.field("campaign", pa.string()))
    rows = [{**r, "campaign": "spring"} for r in clean_bundle()["events"]]
    _raw_events(root, lambda d, _: write_parquet(d / "part-0.parquet", "events", rows, schema))


def _scroll_top_as_text(root: Path) -> None:
    schema = pa.schema(
        [pa.field("scroll_top", pa.string()) if f.name == "scroll_top" else f for f in RAW_TABLES["events"]]
    )
    rows = [
        {**r, "scroll_top": None if r["scroll_top"] is None else str(r["scroll_top"])}
        for r in clean_bundle()["events"]
    ]
    rows[10]["scroll_top"] = "abc"  # e11
    _raw_events(root, lambda d, _: write_parquet(d / "part-0.parquet", "events", rows, schema))


def _items_csv_price(root: Path) -> None:
    bundle = clean_bundle()
    write_bundle(root, bundle, skip=("items",))
    rows = [{**r, "price": "cheap" if r["item_id"] == "i6" else r["price"]} for r in bundle["items"]]
    write_csv(
        root / "items" / "part-0.csv", "items", rows, ["item_id", "title", "price", "category", "image"]
    )


def _events_csv(root: Path) -> None:
    columns = [c for c in RAW_TABLES["events"].names if c != "visible_items"]
    _raw_events(root, lambda d, rows: write_csv(d / "part-0.csv", "events", rows, columns))


def _interleaved(rows: Rows) -> Rows:
    pv1, pv2 = rows[:6], rows[6:9]
    mixed = [r for pair in zip(pv1, pv2, strict=False) for r in pair] + pv1[3:]
    return mixed + rows[9:]


def _swap_e10_e11(rows: Rows) -> Rows:
    rows[9], rows[10] = rows[10], rows[9]
    return rows


def _no_events(root: Path) -> None:
    write_bundle(root, clean_bundle(), skip=("events",))


def _corrupt_gzip(root: Path) -> None:
    _raw_events(
        root,
        lambda d, rows: (
            d.mkdir(parents=True),
            (d / "part-0.jsonl.gz").write_bytes(gzip.compress(jsonl_bytes(rows))[:40] + b"garbage"),
        ),
    )


def _titles(title: str) -> Callable[[Path], None]:
    return _table("items", _item("i6", title=title))


EMOJI_TITLE = "😀 Tee Футболка 中文 تي شيرت 🧵"
NUL_TITLE = "Cotton\x00tee"
TEN_MB = "x" * (10 * 1024 * 1024)
FEED_I6 = {("feeds", "item_not_in_catalog"): 3}  # i6 sits in each of the three feeds
ALL_FEEDS_ORPHANED = {("feeds", "session_without_actions"): 18}  # 3 page views x 6 cards


def _u3_extra_click(root: Path) -> None:
    # at offset 200 only i3, i4 are >= half in view; i6 (y 800) shows 93 of 390 px
    _events(_insert(_event("e10b", "u3", "pv3", 7205, "feed", "click", item_id="i6", scroll_top=200)))(root)


def _title_is(title: str) -> Callable[[Path], None]:
    def check(lake: Path) -> None:
        from transforms.lake import read_lake_table

        titles = read_lake_table(lake, "items", ["title"])["title"].to_list()
        assert title in titles, "the title must reach the lake unchanged"

    return check


def _ts_as_clean(lake: Path) -> None:
    from transforms.lake import read_lake_table

    ts = sorted(read_lake_table(lake, "steps", ["ts"])["ts"].to_list())
    assert ts == sorted(e["ts"] for e in clean_bundle()["events"]), "timestamps must equal the clean ones"


FAULTS: tuple[Fault, ...] = (
    Fault(
        "clean",
        "the clean bundle: nothing rejected",
        lambda r: write_bundle(r, clean_bundle()),
        steps=CLEAN_STEPS,
    ),
    # --- file and format faults
    Fault(
        "truncated_parquet",
        "events part-1 (pv3: 3 events) cut in half: one unreadable file; pv3's "
        "6 feed cards then have no session",
        _truncated_parquet,
        {("events", "unreadable_file"): 1, ("feeds", "session_without_actions"): 6},
        steps=9,
    ),
    Fault(
        "corrupt_gzip",
        "the only events file is a broken gzip: unreadable; all 18 cards orphaned",
        _corrupt_gzip,
        {("events", "unreadable_file"): 1, **ALL_FEEDS_ORPHANED},
        steps=0,
        lost=("events", "feeds"),
    ),
    Fault(
        "non_utf8_line",
        "an extra items line with a Latin-1 byte",
        _items_jsonl_with(b'{"item_id": "i7", "title": "Caf\xe9", "price": 3.0, "category": "food-a-b"}\n'),
        {("items", "unparseable_row"): 1},
        steps=CLEAN_STEPS,
    ),
    Fault(
        "unparseable_row",
        "an extra events line that is not JSON",
        _events_jsonl_with(b"{not json\n"),
        {("events", "unparseable_row"): 1},
        steps=CLEAN_STEPS,
    ),
    Fault(
        "json_not_object",
        "an extra events line that is a JSON array",
        _events_jsonl_with(b"[1, 2]\n"),
        {("events", "unparseable_row"): 1},
        steps=CLEAN_STEPS,
    ),
    Fault(
        "utf8_bom",
        "events JSONL starting with a BOM: read as usual",
        lambda r: _raw_events(
            r, lambda d, rows: write_jsonl(d / "part-0.jsonl", rows, prefix=b"\xef\xbb\xbf")
        ),
        steps=CLEAN_STEPS,
    ),
    Fault(
        "crlf_jsonl",
        "events JSONL with CRLF line ends: read as usual",
        lambda r: _raw_events(r, lambda d, rows: write_jsonl(d / "part-0.jsonl", rows, b"\r\n")),
        steps=CLEAN_STEPS,
    ),
    Fault(
        "csv_events", "events as CSV (visible_items absent): read as usual", _events_csv, steps=CLEAN_STEPS
    ),
    Fault(
        "extra_column",
        "schema drift: an undeclared events column is dropped",
        _extra_column,
        steps=CLEAN_STEPS,
    ),
    Fault(
        "missing_optional_columns",
        "schema drift: image, ui_state, review_index, visible_items absent",
        _drop_columns("image", "ui_state", "review_index", "visible_items"),
        steps=CLEAN_STEPS,
    ),
    Fault(
        "missing_required_column",
        "no screen column: every one of the 12 events lacks a required field; all 18 cards orphaned",
        _drop_columns("screen"),
        {("events", "missing_required_field"): 12, **ALL_FEEDS_ORPHANED},
        steps=0,
        lost=("events", "feeds"),
    ),
    Fault(
        "wrong_type_parquet",
        "scroll_top stored as text, e11's is 'abc': the reader rejects e11, which still cuts pv3 after "
        "e10, so e12 (its end) follows as after_rejected_event",
        _scroll_top_as_text,
        {("events", "schema_mismatch"): 1, ("events", "after_rejected_event"): 1},
        steps=10,
    ),
    Fault(
        "wrong_type_csv",
        "items CSV with price 'cheap' for i6; its 3 feed cards lose their item",
        _items_csv_price,
        {("items", "schema_mismatch"): 1, **FEED_I6},
        steps=CLEAN_STEPS,
    ),
    Fault(
        "ten_mb_string",
        "a 10 MB title for i6",
        _titles(TEN_MB),
        {("items", "field_too_large"): 1, **FEED_I6},
        steps=CLEAN_STEPS,
    ),
    Fault(
        "nul_bytes",
        "a NUL byte in i6's title",
        _titles(NUL_TITLE),
        {("items", "nul_byte"): 1, **FEED_I6},
        steps=CLEAN_STEPS,
    ),
    Fault(
        "emoji_mixed_script",
        "emoji and four scripts in a title: kept byte for byte",
        _titles(EMOJI_TITLE),
        steps=CLEAN_STEPS,
        check=_title_is(EMOJI_TITLE),
    ),
    Fault(
        "missing_events_table",
        "no events table at all: the bundle cannot be ingested",
        _no_events,
        stops="BundleError",
    ),
    # --- timestamps
    Fault(
        "epoch_seconds",
        "ts as integer epoch seconds (JSONL): unit inferred, same instants",
        lambda r: _raw_events(r, lambda d, rows: write_jsonl(d / "part-0.jsonl", _epoch(rows, 1))),
        steps=CLEAN_STEPS,
        check=_ts_as_clean,
    ),
    Fault(
        "unreadable_timestamp",
        "e11's ts is 'yesterday' (JSONL): rejected by the reader, it cuts pv3 at its place in the "
        "source, after e10, so e12 (its end) follows as after_rejected_event",
        lambda r: _raw_events(
            r, lambda d, rows: write_jsonl(d / "part-0.jsonl", _set("e11", ts="yesterday")(rows))
        ),
        {("events", "schema_mismatch"): 1, ("events", "after_rejected_event"): 1},
        steps=10,
    ),
    Fault(
        "epoch_milliseconds",
        "ts as integer epoch ms (JSONL)",
        lambda r: _raw_events(r, lambda d, rows: write_jsonl(d / "part-0.jsonl", _epoch(rows, 1000))),
        steps=CLEAN_STEPS,
        check=_ts_as_clean,
    ),
    Fault(
        "timezone_naive",
        "ISO times without offset: read as UTC, same instants",
        lambda r: _raw_events(
            r,
            lambda d, rows: write_jsonl(
                d / "part-0.jsonl", [{**e, "ts": e["ts"].replace(tzinfo=None).isoformat()} for e in rows]
            ),
        ),
        steps=CLEAN_STEPS,
        check=_ts_as_clean,
    ),
    Fault(
        "future_timestamp",
        "e12 (pv3's end) dated 2100",
        _events(_set("e12", ts=datetime(2100, 1, 1, tzinfo=UTC))),
        {("events", "future_timestamp"): 1},
        steps=11,
    ),
    Fault(
        "duplicate_timestamp",
        "e11 at e10's instant: kept, tie broken by source order",
        _events(_set("e11", ts=_ts(7200))),
        flagged={("events", "duplicate_timestamp"): 1},
        steps=CLEAN_STEPS,
    ),
    Fault(
        "out_of_order_timestamp",
        "e11 written before e10: kept, re-ordered by time",
        _events(_swap_e10_e11),
        flagged={("events", "out_of_order_timestamp"): 1},
        steps=CLEAN_STEPS,
    ),
    Fault(
        "interleaved_sessions",
        "pv1 and pv2 events interleaved in the file: each still in time order",
        _events(_interleaved),
        steps=CLEAN_STEPS,
    ),
    # --- events
    Fault(
        "unknown_action",
        "e11 action 'dance'; pv3 is cut after e10, so e12 (its end) follows as after_rejected_event",
        _events(_set("e11", action="dance")),
        {("events", "unknown_action"): 1, ("events", "after_rejected_event"): 1},
        steps=10,
    ),
    Fault(
        "illegal_action_on_screen",
        "e11 is ipv_cart on the feed; pv3 is cut after e10, so e12 (its end) follows as after_rejected_event",
        _events(_set("e11", action="ipv_cart")),
        {("events", "illegal_action_on_screen"): 1, ("events", "after_rejected_event"): 1},
        steps=10,
    ),
    Fault(
        "missing_required_field",
        "e11 has no action: the reader rejects it, which still cuts pv3 after e10, so e12 (its end) "
        "follows as after_rejected_event",
        _events(_set("e11", action=None)),
        {("events", "missing_required_field"): 1, ("events", "after_rejected_event"): 1},
        steps=10,
    ),
    Fault(
        "duplicate_event_exact",
        "e11 appears twice, identical: merged and counted",
        _events(lambda rows: [*rows, dict(rows[10])]),
        duplicates={"events": 1},
        steps=CLEAN_STEPS,
    ),
    Fault(
        "duplicate_event_id",
        "a second e11 with other values (scroll_delta 150)",
        _events(lambda rows: [*rows, {**rows[10], "scroll_delta": 150}]),
        {("events", "duplicate_event_id"): 1},
        steps=CLEAN_STEPS,
    ),
    Fault(
        "page_view_two_users",
        "e11 claims user u1 although pv3 belongs to u3; pv3 is cut after e10, so e12 (its end) follows as after_rejected_event",
        _events(_set("e11", user_id="u1")),
        {("events", "page_view_user_conflict"): 1, ("events", "after_rejected_event"): 1},
        steps=10,
    ),
    Fault(
        "negative_scroll_offset",
        "e11 at scroll_top -50; pv3 is cut after e10, so e12 (its end) follows as after_rejected_event",
        _events(_set("e11", scroll_top=-50)),
        {("events", "negative_offset"): 1, ("events", "after_rejected_event"): 1},
        steps=10,
    ),
    Fault(
        "scroll_distance_out_of_range",
        "e10 scrolls 5000 px (max 694): pv3 is cut at its first event, so e11 and e12 follow as "
        "after_rejected_event and its six feed cards as session_without_actions",
        _events(_set("e10", scroll_delta=5000)),
        {
            ("events", "scroll_distance_out_of_range"): 1,
            ("events", "after_rejected_event"): 2,
            ("feeds", "session_without_actions"): 6,
        },
        steps=9,
    ),
    Fault(
        "event_after_end",
        "e13 scrolls after pv3's end",
        _events(
            _insert(_event("e13", "u3", "pv3", 7230, "feed", "scroll_down", scroll_top=0, scroll_delta=100))
        ),
        {("events", "event_after_end"): 1},
        steps=CLEAN_STEPS,
    ),
    Fault(
        "back_home_loop_no_detail",
        "two ipv back_home in pv3 with no detail page ever opened: the first cuts pv3 after e10; the "
        "second, e11 and e12 follow as after_rejected_event",
        _events(
            _insert(
                _event("e10a", "u3", "pv3", 7203, "ipv", "back_home"),
                _event("e10b", "u3", "pv3", 7206, "ipv", "back_home"),
            )
        ),
        {("events", "ipv_without_open_item"): 1, ("events", "after_rejected_event"): 3},
        steps=10,
    ),
    Fault(
        "ipv_without_open_item",
        "a detail-page scroll in pv3 with no click before it: pv3 is cut after e10, e11 and e12 follow "
        "as after_rejected_event",
        _events(
            _insert(
                _event("e10a", "u3", "pv3", 7203, "ipv", "ipv_scroll_down", ipv_scroll=0, scroll_delta=100)
            )
        ),
        {("events", "ipv_without_open_item"): 1, ("events", "after_rejected_event"): 2},
        steps=10,
    ),
    Fault(
        "click_target_not_visible",
        "pv3 clicks i6 at offset 200, where only i3, i4 are visible: pv3 is cut after e10, e11 and e12 "
        "follow as after_rejected_event",
        _u3_extra_click,
        {("events", "click_target_not_visible"): 1, ("events", "after_rejected_event"): 2},
        steps=10,
    ),
    # --- catalog, feeds, profiles
    Fault(
        "item_not_in_catalog",
        "pv3's feed has a 7th card i999 that the catalog lacks",
        _table(
            "feeds",
            _insert(
                {
                    "page_view_id": "pv3",
                    "item_id": "i999",
                    "x": 0,
                    "y": 0,
                    "width": 10,
                    "height": 10,
                    "feed_height": 1200,
                }
            ),
        ),
        {("feeds", "item_not_in_catalog"): 1},
        steps=CLEAN_STEPS,
    ),
    Fault(
        "invalid_price_negative",
        "i6 costs -5",
        _table("items", _item("i6", price=-5.0)),
        {("items", "invalid_price"): 1, **FEED_I6},
        steps=CLEAN_STEPS,
    ),
    Fault(
        "invalid_price_nan",
        "i6 costs NaN",
        _table("items", _item("i6", price=float("nan"))),
        {("items", "invalid_price"): 1, **FEED_I6},
        steps=CLEAN_STEPS,
    ),
    Fault(
        "missing_profile",
        "u3 has no profile: kept with an empty profile, flagged once",
        _table("profiles", lambda rows: rows[:2]),
        flagged={("events", "missing_profile"): 1},
        steps=CLEAN_STEPS,
    ),
    Fault(
        "session_without_actions",
        "pv4 has a feed of 6 cards and no events",
        _table("feeds", lambda rows: rows + [{**r, "page_view_id": "pv4"} for r in rows[:6]]),
        {("feeds", "session_without_actions"): 6},
        steps=CLEAN_STEPS,
    ),
)


def fault(name: str) -> Fault:
    return next(f for f in FAULTS if f.name == name)
