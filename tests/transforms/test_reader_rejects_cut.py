"""An events row the reader rejects (before alignment) cuts its session like any rejected event.

Session A of ``tests.bundles`` is nine events, rows 0..8 of its file: scroll_down, click,
ipv_scroll_down, ipv_enter_comment, ipv_click_comment, ipv_cart, back_home, scroll_up, end. Its
middle row (4, ``ev-4``) is spoiled here in the file itself; expected steps are worked out by hand.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import polars as pl
import pytest

from tests.bundles import at, feeds, profiles, session_a, tiny_bundle, write_bundle
from transforms import align
from transforms.config import IngestSettings
from transforms.ingest import ingest_bundle
from transforms.lake import read_lake_table

FIRST_FOUR = ["scroll_down", "click", "ipv_scroll_down", "ipv_enter_comment"]  # rows 0..3, before ev-4


def spoil(path: Path, row: int, column: str, value: object) -> None:
    """Set ``column`` of data row ``row`` in one part file to ``value`` (None: absent or null),
    whatever type the table declares for it."""
    if path.suffix == ".jsonl":
        lines = path.read_text().splitlines()
        record = json.loads(lines[row])
        if value is None:
            del record[column]
        else:
            record[column] = value
        lines[row] = json.dumps(record)
        path.write_text("\n".join(lines) + "\n")
        return
    frame = pl.read_csv(path, infer_schema=False) if path.suffix == ".csv" else pl.read_parquet(path)
    if value is not None:
        frame = frame.with_columns(pl.col(column).cast(pl.String))
    at_row = pl.int_range(pl.len()) == row
    frame = frame.with_columns(pl.when(at_row).then(pl.lit(value)).otherwise(pl.col(column)).alias(column))
    frame.write_csv(path) if path.suffix == ".csv" else frame.write_parquet(path)


def ingest(tmp_path: Path, bundle: dict, fmt: str, settings: IngestSettings | None = None, **spoilt):
    """Write ``bundle`` in ``fmt``, spoil the events rows in ``spoilt`` (``row=(column, value)``)."""
    root = write_bundle(bundle, tmp_path / "raw", fmt)
    for row, (column, value) in spoilt.items():
        spoil(root / "events" / f"part-0.{fmt}", int(row.removeprefix("row")), column, value)
    result = ingest_bundle(root, tmp_path / "lake", settings)
    assert all(c.balanced for c in result.counts.values()), result.counts
    return result, tmp_path / "lake"


def quarantined(lake: Path) -> dict[str, list[int]]:
    """Rejected events rows by reason: their source rows."""
    rows = read_lake_table(lake, "quarantine").filter(~pl.col("kept") & (pl.col("table_name") == "events"))
    by_reason: dict[str, list[int]] = {}
    for row, reason in rows.sort("source_row").select("source_row", "reason").iter_rows():
        by_reason.setdefault(reason, []).append(row)
    return by_reason


def actions(lake: Path) -> list[str]:
    return read_lake_table(lake, "steps").sort("session_id", "step")["action"].to_list()


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_a_mistyped_event_in_the_middle_cuts_its_session(tmp_path, fmt):
    result, lake = ingest(tmp_path, tiny_bundle(), fmt, row4=("scroll_top", "abc"))
    assert actions(lake) == FIRST_FOUR  # never ..., ipv_enter_comment, ipv_cart, ...
    session = read_lake_table(lake, "sessions").row(0, named=True)
    assert (session["cut_reason"], session["terminal"], session["length"]) == (
        "schema_mismatch",
        "truncated",
        4,
    )
    # row 4 once, under the reader's reason; rows 5..8 after it
    assert quarantined(lake) == {"schema_mismatch": [4], "after_rejected_event": [5, 6, 7, 8]}
    details = read_lake_table(lake, "quarantine").filter(pl.col("source_row") == 5)["detail"].to_list()
    assert details == ["the session was cut at an earlier rejected event: schema_mismatch"]
    events = result.counts["events"]
    assert (events.rows_in, events.rows_out, events.quarantined) == (9, 4, 5)  # 9 = 4 + 1 + 4


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_an_event_without_ts_cuts_at_its_place_in_the_source(tmp_path, fmt):
    _, lake = ingest(tmp_path, tiny_bundle(), fmt, row4=("ts", None))
    assert actions(lake) == FIRST_FOUR  # rows 0..3 come before row 4 in the source and in time
    assert read_lake_table(lake, "sessions")["cut_reason"].to_list() == ["missing_required_field"]
    assert quarantined(lake) == {"missing_required_field": [4], "after_rejected_event": [5, 6, 7, 8]}


def test_an_event_without_ts_keeps_nothing_that_followed_it_in_the_source(tmp_path):
    # the file holds ev-0 (0 s), ev-1 (5 s), ev-3 (12 s), [ev-4, no ts], ev-2 (9 s), ev-5 .. ev-8:
    # the events after row 3 in the source start at 9 s (ev-2), so row 3 stands at 9 s, before
    # ev-2 (a tie, broken by source order); ev-3 (12 s) comes after it in time: cut as well
    bundle = tiny_bundle()
    events = bundle["events"]
    bundle["events"] = [events[0], events[1], events[3], events[4], events[2], *events[5:]]
    _, lake = ingest(tmp_path, bundle, "jsonl", row3=("ts", None))
    assert actions(lake) == ["scroll_down", "click"]
    assert quarantined(lake) == {"missing_required_field": [3], "after_rejected_event": [2, 4, 5, 6, 7, 8]}


def test_drop_session_drops_the_whole_session_of_a_reader_rejected_event(tmp_path):
    settings = IngestSettings(on_bad_event="drop_session")
    result, lake = ingest(tmp_path, tiny_bundle(), "jsonl", settings, row4=("scroll_top", "abc"))
    assert read_lake_table(lake, "steps").height == 0 and read_lake_table(lake, "sessions").height == 0
    assert quarantined(lake) == {"dropped_with_session": [0, 1, 2, 3, 5, 6, 7, 8], "schema_mismatch": [4]}
    assert result.counts["events"].quarantined == 9 and result.counts["feeds"].quarantined == 8


def test_an_unparseable_line_cannot_cut_its_session(tmp_path):
    # a line that is not JSON names no page view: it is quarantined, and the eight events around it
    # stay one session, as nothing says it belonged to this one
    root = write_bundle(tiny_bundle(), tmp_path / "raw", "jsonl")
    path = root / "events" / "part-0.jsonl"
    lines = path.read_text().splitlines()
    lines[4] = "{not json"
    path.write_text("\n".join(lines) + "\n")
    result = ingest_bundle(root, tmp_path / "lake")
    lake = tmp_path / "lake"
    assert all(c.balanced for c in result.counts.values())
    assert quarantined(lake) == {"unparseable_row": [4]}
    assert actions(lake) == [*FIRST_FOUR, "ipv_cart", "back_home", "scroll_up", "end"]
    assert read_lake_table(lake, "sessions")["cut_reason"].to_list() == [None]


def test_an_event_without_page_view_cannot_cut_a_session(tmp_path):
    _, lake = ingest(tmp_path, tiny_bundle(), "jsonl", row4=("page_view_id", None))
    assert quarantined(lake) == {"missing_required_field": [4]}
    assert read_lake_table(lake, "steps").height == 8


def test_a_rejected_event_declared_irrelevant_cuts_nothing(tmp_path):
    # row 4 is a 'favorite' (declared drop) without ts: rejected by the reader, but such an event is
    # no part of a trajectory, so it cuts nothing
    settings = IngestSettings(action_map={"favorite": "drop"})
    _, lake = ingest(tmp_path, tiny_bundle(), "jsonl", settings, row4=("ts", None))
    _, lake_favorite = ingest(
        tmp_path / "favorite",
        _with_action(tiny_bundle(), 4, "favorite"),
        "jsonl",
        settings,
        row4=("ts", None),
    )
    assert actions(lake) == FIRST_FOUR  # an ipv_click_comment without ts still cuts
    assert quarantined(lake_favorite) == {"missing_required_field": [4]}
    assert read_lake_table(lake_favorite, "steps").height == 8


def _with_action(bundle: dict, row: int, action: str) -> dict:
    bundle["events"][row]["action"] = action
    return bundle


def test_the_mark_reaches_the_part_of_its_page_view(tmp_path):
    # three page views, 8 cards + 9 events each (51 rows), 4 rows per part: 13 parts, spilled, the
    # feeds read in place; pv-B's row 4 (file row 9 + 4 = 13) is mistyped
    views = ["pv-A", "pv-B", "pv-C"]
    bundle = {"profiles": profiles(), "items": tiny_bundle()["items"], "history": []}
    bundle["feeds"] = [card for view in views for card in feeds(view)]
    bundle["events"] = [
        {
            **row,
            "event_id": f"{view}/{row['event_id']}",
            "page_view_id": view,
            "ts": row["ts"] + timedelta(hours=n),
        }
        for n, view in enumerate(views)
        for row in session_a()
    ]
    settings = IngestSettings(spill_part_rows=4, memory_rows=0)
    _, lake = ingest(tmp_path, bundle, "parquet", settings, row13=("scroll_top", "abc"))
    sessions = read_lake_table(lake, "sessions").sort("start_ts")
    assert sessions["length"].to_list() == [9, 4, 9]
    assert sessions["cut_reason"].to_list() == [None, "schema_mismatch", None]
    assert quarantined(lake) == {"schema_mismatch": [13], "after_rejected_event": [14, 15, 16, 17]}


def test_place_reader_rejects_orders_an_undated_row_before_the_events_after_it():
    events = pl.DataFrame(
        {
            "page_view_id": ["v", "v", "v", "w"],
            "ts": [at(0), at(20), at(10), at(5)],
            "_file": ["a", "a", "b", "a"],
            "_row": [0, 2, 0, 3],
        }
    ).with_columns(pl.col("ts").dt.cast_time_unit("ms"))
    rejected = pl.DataFrame(
        {
            "page_view_id": ["v", "v", "w", "x"],
            "ts": [None, at(15), None, at(1)],
            "action": ["click", "favorite", "click", "click"],
            "_file": ["a", "a", "a", "a"],
            "_row": [1, 5, 4, 0],
            "reason": ["schema_mismatch", "nul_byte", "missing_required_field", "nul_byte"],
        },
        schema_overrides={"ts": pl.Datetime("ms", "UTC")},
    ).with_columns(pl.col("action").replace({"favorite": "drop"}))
    placed = align.place_reader_rejects(rejected, events).sort("_row")
    # v a:1 (undated): after it in the source come a:2 (20 s) and b:0 (10 s) -> 10 s
    # v a:5 is declared drop: no cut; w a:4 (undated): nothing after it in w -> null (sorts last)
    # x has no event here: no session to cut
    assert placed.select("page_view_id", "_row", "_why").rows() == [
        ("v", 1, "schema_mismatch"),
        ("w", 4, "missing_required_field"),
    ]
    assert placed["ts"].to_list() == [at(10), None]


def test_a_mistyped_event_in_one_of_several_small_files_cuts_its_session(tmp_path):
    # session A over two Parquet files of one schema (scroll_top as text in both), read as one
    # chunk: part-0 holds rows 0..3, part-1 rows 4..8, and part-1's row 0 (ev-4) is 'abc'
    root = write_bundle(tiny_bundle(), tmp_path / "raw", "parquet")
    events = pl.read_parquet(root / "events" / "part-0.parquet").with_columns(
        pl.col("scroll_top").cast(pl.String)
    )
    (root / "events" / "part-0.parquet").unlink()
    events.head(4).write_parquet(root / "events" / "part-0.parquet")
    events.slice(4).write_parquet(root / "events" / "part-1.parquet")
    spoil(root / "events" / "part-1.parquet", 0, "scroll_top", "abc")
    result = ingest_bundle(root, tmp_path / "lake")
    lake = tmp_path / "lake"
    assert all(c.balanced for c in result.counts.values())
    assert actions(lake) == FIRST_FOUR
    rows = read_lake_table(lake, "quarantine").filter(~pl.col("kept")).sort("source_file", "source_row")
    assert rows.select("source_file", "source_row", "reason").rows() == [
        ("events/part-1.parquet", 0, "schema_mismatch"),
        *[("events/part-1.parquet", n, "after_rejected_event") for n in range(1, 5)],
    ]
