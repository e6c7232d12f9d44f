"""The partitioned ingest: a run forced into several parts gives the lake of a one-part run.

Parts are chosen from the bundle's size (``spill_part_rows`` feed + event rows per part) and spilled
to disk beyond ``memory_rows``; settings subclasses with tiny values force the parts and the spill on
bundles small enough to check by hand.
Rows are compared as sets (sorted): parts change which file a row lands in, never the row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from synthetic.bundle import write_bundle as write_synthetic
from tests.bundles import event, feeds, tiny_bundle, write_bundle
from transforms import lake as lake_io
from transforms.config import IngestSettings
from transforms.ingest import (
    chunks,
    duplicate_ids,
    feeds_in_place,
    hashes,
    ingest_bundle,
    item_shards,
    lookups_ahead,
)
from transforms.ingest import parts as pass_one
from transforms.ingest import run as run_module
from transforms.ingest.item_index import load_index
from transforms.ingest.landed import landed_dir
from transforms.lake import read_lake_table, table_files
from transforms.readers import read_tables

TABLES = ("steps", "sessions", "feed_layouts", "items", "profiles", "history", "quarantine")
PARTS = 3


class ThreeParts(IngestSettings):
    # cross_part_bundle: 27 events + 33 feed cards = 60 rows -> ceil(60 / 20) = 3 parts, on disk
    spill_part_rows: int = 20
    memory_rows: int = 0


class ThreePartsInMemory(ThreeParts):
    memory_rows: int = 60  # the same parts, kept in memory between the passes


def part_of(page_view: str, parts: int = PARTS) -> int:
    """The part a page view lands in (the ingest's own rule)."""
    return pl.DataFrame({"page_view_id": [page_view]}).select(hashes.part_of(parts)).item()


def views_by_part() -> dict[int, list[str]]:
    """Two page-view ids per part, so cross-part cases really cross."""
    views: dict[int, list[str]] = {p: [] for p in range(PARTS)}
    for n in range(1000):
        views[part_of(f"pv-{n}")].append(f"pv-{n}")
        if all(len(v) >= 2 for v in views.values()):
            return views
    raise AssertionError("no page views for every part")


def cross_part_bundle() -> dict[str, list[dict]]:
    """The hand-built session copied into page views of all three parts, plus faults that cross
    parts: an event id reused in another part with other values, a user without a profile whose
    sessions sit in two parts, a page view used by two users, an exact duplicate, a duplicate item id.

    Event rows (one file, in this order): a 0-8 (usr-1), b 9-17 (usr-2), c 18-20 and d 21-23 (usr-3,
    no profile), 24 the conflicting ev-0, 25 an exact copy of row 10, 26 usr-1's end in view c.
    """
    views = views_by_part()
    a, b, c, d = views[0][0], views[1][0], views[2][0], views[0][1]  # d shares a's part, not c's
    base = tiny_bundle()["events"]

    def copy(view: str, user: str, prefix: str, rows: list[dict]) -> list[dict]:
        return [dict(e, event_id=f"{prefix}{e['event_id']}", page_view_id=view, user_id=user) for e in rows]

    events = copy(a, "usr-1", "", base) + copy(b, "usr-2", "b", base)
    events += copy(c, "usr-3", "c", base[:3]) + copy(d, "usr-3", "d", base[:3])
    events.append(dict(events[9], event_id="ev-0", scroll_delta=200))  # a's ev-0 id, b's row: conflict
    events.append(dict(events[10]))  # exact repeat: merged
    events.append(event("x-end", 40, "feed", "end", scroll_top=0, page_view_id=c, user_id="usr-1"))
    bundle = tiny_bundle()
    bundle["events"] = events
    bundle["feeds"] = feeds(a) + feeds(b) + feeds(c) + feeds(d) + [dict(feeds(c)[0], item_id="itm-404")]
    bundle["items"] = [*bundle["items"], dict(bundle["items"][2], price=5.0)]  # itm-3 again, other price
    return bundle


def _lake(lake: Path) -> dict[str, pl.DataFrame]:
    """Every table's rows in a canonical order (row sets, not file layout)."""
    tables = {}
    for table in TABLES:
        frame = read_lake_table(lake, table)
        tables[table] = frame.sort(pl.struct(pl.all()).struct.json_encode())
    return tables


def _same_lakes(one: Path, many: Path) -> None:
    left, right = _lake(one), _lake(many)
    for table in TABLES:
        assert left[table].equals(right[table]), table


def _ingest_both(raw: Path, tmp_path: Path, settings: IngestSettings):
    single = ingest_bundle(raw, tmp_path / "one")
    parted = ingest_bundle(raw, tmp_path / "many", settings)
    return single, parted


@pytest.fixture
def spilled(monkeypatch) -> list[Path]:
    """The paths of the spill files a run writes."""
    paths: list[Path] = []
    real_spill = pass_one._write_spill

    def spy(batch):
        paths.extend(path for _, path in batch)
        real_spill(batch)

    monkeypatch.setattr(pass_one, "_write_spill", spy)
    return paths


@dataclass
class Lookups:
    grouped: bool
    swept: list[int] = field(default_factory=list)  # the groups of parts swept, in order


@pytest.fixture(params=["alone", "grouped"])
def lookups(request, monkeypatch) -> Lookups:
    """Each part looks its items up alone (a catalog this small), or the parts in groups of two, a
    group ahead (``lookups_ahead``, as beside a catalog many times a part's size)."""
    seen = Lookups(request.param == "grouped")
    if seen.grouped:
        monkeypatch.setattr(lookups_ahead, "GROUP_SHARE", 1e9)
        monkeypatch.setattr(lookups_ahead, "MAX_GROUP", 2)
        real_sweep = lookups_ahead.LookupsAhead._sweep

        def spy_sweep(ahead, group):
            seen.swept.append(group)
            return real_sweep(ahead, group)

        monkeypatch.setattr(lookups_ahead.LookupsAhead, "_sweep", spy_sweep)
    return seen


@pytest.mark.parametrize("settings", [ThreeParts(), ThreePartsInMemory()], ids=["on-disk", "in-memory"])
def test_cross_part_faults_give_the_one_part_lake(tmp_path, spilled, settings, monkeypatch, lookups):
    write_bundle(cross_part_bundle(), tmp_path / "raw")
    hash_files: list[Path] = []
    real_by_range = duplicate_ids.IdHashes.by_range

    def spy_by_range(kept):
        yield from real_by_range(kept)
        hash_files.extend(kept.folder.rglob("*.arrow") if kept.folder else [])

    monkeypatch.setattr(duplicate_ids.IdHashes, "by_range", spy_by_range)
    single, parted = _ingest_both(tmp_path / "raw", tmp_path, settings)
    # several part files per bucket prove the parts ran (a one-part run writes part-0 only)
    written = {p.name for p in table_files(tmp_path / "many", "feed_layouts")}
    assert written == {"part-0.parquet", "part-1.parquet", "part-2.parquet"}
    spilled_parts = {path.parent.name for path in spilled}
    assert spilled_parts == ({"part=0", "part=1", "part=2"} if settings.memory_rows == 0 else set())
    # view c's stray card comes after view d's cards: the feeds are not grouped by view, so spilled
    # history too: it grows with the shoppers; and the event ids' hashes went to disk beside them
    assert {path.parent.parent.name for path in spilled} == (
        {"events", "feeds", "history"} if spilled else set()
    )
    assert bool(hash_files) == bool(spilled)
    _same_lakes(tmp_path / "one", tmp_path / "many")
    assert parted.counts == single.counts and all(c.balanced for c in parted.counts.values())
    assert parted.quarantine_by_reason == single.quarantine_by_reason
    assert parted.flagged_by_reason == single.flagged_by_reason
    assert parted.output_rows == single.output_rows
    # the faults were seen, and seen once
    reasons = parted.quarantine_by_reason
    assert reasons["duplicate_event_id"] == 1  # the later ev-0, whose twin sits in another part
    assert reasons["page_view_user_conflict"] == 1  # usr-1's end in view c, which belongs to usr-3
    assert reasons["duplicate_item_id"] == 1 and reasons["item_not_in_catalog"] == 1
    assert parted.flagged_by_reason["missing_profile"] == 1  # usr-3, steps in two parts: one flag
    assert parted.counts["events"].duplicates == 1  # the exact repeat, merged
    # parts held in memory are never read ahead of their turn: they look their items up alone
    assert lookups.swept == ([0, 1] if lookups.grouped and settings.memory_rows == 0 else [])


def grouped_feeds_bundle() -> dict[str, list[dict]]:
    """cross_part_bundle with every view's cards together (c's stray card moved into c's run) and
    feed faults: an exact repeat of a card, a catalog item shown with no width, a card without a page
    view (between two views)."""
    bundle = cross_part_bundle()
    a, b, c, d = (bundle["feeds"][n]["page_view_id"] for n in (0, 8, 16, 24))
    spare = dict(bundle["items"][1], item_id="itm-spare")
    bundle["items"] = [*bundle["items"], spare]
    bundle["feeds"] = [
        *feeds(a)[:2], dict(feeds(a)[1]), *feeds(a)[2:],
        *feeds(b), dict(feeds(b)[0], page_view_id=None),
        *feeds(c), dict(feeds(c)[0], item_id="itm-404"),
        *feeds(d), dict(feeds(d)[0], item_id="itm-spare", width=0),
    ]  # fmt: skip
    return bundle


def split_feeds(raw: Path, rows_per_file: int, row_group: int) -> None:
    """Rewrite the one feeds file as several, with small row groups: views straddle files and chunks."""
    table = pq.read_table(raw / "feeds" / "part-0.parquet")
    (raw / "feeds" / "part-0.parquet").unlink()
    for n, start in enumerate(range(0, table.num_rows, rows_per_file)):
        piece = table.slice(start, rows_per_file)
        pq.write_table(piece, raw / "feeds" / f"part-{n}.parquet", row_group_size=row_group)


def test_grouped_feeds_are_read_in_place_and_give_the_one_part_lake(tmp_path, spilled, lookups):
    raw = tmp_path / "raw"
    write_bundle(grouped_feeds_bundle(), raw)
    # read in chunks of rows 0-20, 21-23 (file 0) and 24-35 (file 1): view c (rows 18-26) spans all three
    split_feeds(raw, rows_per_file=24, row_group=7)
    single, parted = _ingest_both(raw, tmp_path, ThreeParts())
    assert {path.parent.parent.name for path in spilled} == {"events", "history"}  # no feed row spilled
    assert len({p.name for p in table_files(tmp_path / "many", "feed_layouts")}) > 1  # parts ran
    _same_lakes(tmp_path / "one", tmp_path / "many")
    assert parted.counts == single.counts and all(c.balanced for c in parted.counts.values())
    assert parted.quarantine_by_reason == single.quarantine_by_reason
    assert parted.flagged_by_reason == single.flagged_by_reason
    reasons, feeds_count = parted.quarantine_by_reason, parted.counts["feeds"]
    assert reasons["item_not_in_catalog"] == 1 and reasons["invalid_geometry"] == 1
    assert reasons["missing_required_field"] == 1  # the card without a page view, counted once
    assert feeds_count.rows_in == 36 and feeds_count.duplicates == 1
    assert reasons["duplicate_event_id"] == 1 and reasons["page_view_user_conflict"] == 1
    assert lookups.swept == ([0, 1] if lookups.grouped else [])


def test_feed_view_runs_merge_across_files_and_refuse_split_views(tmp_path):
    raw = tmp_path / "raw"
    write_bundle(grouped_feeds_bundle(), raw)
    split_feeds(raw, rows_per_file=24, row_group=7)
    runs, bases = feeds_in_place._feed_view_runs(raw, 4)
    assert bases == {"feeds/part-0.parquet": 0, "feeds/part-1.parquet": 24}
    assert runs["_rows"].sum() == 36 and runs["_start"].to_list()[:3] == [0, 9, 17]
    assert runs["page_view_id"].null_count() == 1  # the card without a view, a run of its own
    write_bundle(cross_part_bundle(), tmp_path / "mixed")  # view c's stray card after d's cards
    assert feeds_in_place._feed_view_runs(tmp_path / "mixed", 4) is None
    # item ids that are not strings would be typed on the way: they cannot be read ahead as they lie
    second = raw / "feeds" / "part-1.parquet"
    cards = pq.read_table(second)
    at = cards.schema.get_field_index("item_id")
    numbered = cards.set_column(at, "item_id", pa.array(range(cards.num_rows), pa.int64()))
    pq.write_table(numbered, second)
    assert feeds_in_place._feed_view_runs(raw, 4) is None


class ItemChunks(IngestSettings):
    # chunks of 4 rows: the 13 item rows below make 4 chunks, left to pass 2 (one read of their text)
    spill_part_rows: int = 4
    memory_rows: int = 0


def items_over_chunks() -> dict[str, list[dict]]:
    """cross_part_bundle with item faults in other chunks than their twins: itm-3 again with another
    price (rejected), itm-1 repeated exactly (merged), a negative price, an item without an id."""
    bundle = cross_part_bundle()
    items = bundle["items"]
    bundle["items"] = [
        *items,
        dict(items[0]),
        dict(items[1], item_id="itm-cheap", price=-1.0),
        dict(items[1], item_id=None),
        dict(items[2], item_id="itm-spare"),
    ]
    return bundle


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_items_left_to_pass_two_are_read_once_and_counted_once(tmp_path, monkeypatch, fmt):
    write_bundle(items_over_chunks(), tmp_path / "raw", fmt)
    read_item_text, id_column = [], []
    real_read, real_ids = chunks.read_tables, pass_one._item_id_column_hashes

    def spy_read(root, tables, *args, **kwargs):
        read_item_text.append("items" in tables)
        return real_read(root, tables, *args, **kwargs)

    def spy_ids(root):
        id_column.append(real_ids(root))
        return id_column[-1]

    single = ingest_bundle(tmp_path / "raw", tmp_path / "one")  # one chunk: items read in pass 1
    monkeypatch.setattr(chunks, "read_tables", spy_read)
    monkeypatch.setattr(pass_one, "_item_id_column_hashes", spy_ids)
    parted = ingest_bundle(tmp_path / "raw", tmp_path / "many", ItemChunks())
    _same_lakes(tmp_path / "one", tmp_path / "many")
    assert parted.counts == single.counts and all(c.balanced for c in parted.counts.values())
    assert parted.quarantine_by_reason == single.quarantine_by_reason
    reasons = parted.quarantine_by_reason
    assert reasons["duplicate_item_id"] == 1 and reasons["invalid_price"] == 1
    assert parted.counts["items"].duplicates == 1 and parted.counts["items"].rows_in == 13
    # pass 1 reads no items; pass 2 reads them to find the duplicates' rows, then to check and write
    # them (counted then); Parquet ids come from the id column alone, JSONL ids from a full read first
    hashes_read = [] if fmt == "parquet" else [True]
    assert read_item_text == [False, *hashes_read, True, True]
    assert id_column and (id_column[0] is not None) == (fmt == "parquet")


def test_an_unreadable_items_file_left_to_pass_two_is_quarantined_once(tmp_path):
    write_bundle(items_over_chunks(), tmp_path / "raw")
    (tmp_path / "raw" / "items" / "part-1.parquet").write_bytes(b"PAR1 cut short")
    result = ingest_bundle(tmp_path / "raw", tmp_path / "lake", ItemChunks())
    assert result.quarantine_by_reason["unreadable_file"] == 1
    assert result.counts["items"].rows_in == 13 + 1 and result.counts["items"].balanced
    assert result.output_rows["items"] == 9  # the id-column read failed: the full read found the duplicates


def test_duplicate_event_id_across_parts_keeps_the_first_by_source_order(tmp_path):
    write_bundle(cross_part_bundle(), tmp_path / "raw")
    ingest_bundle(tmp_path / "raw", tmp_path / "lake", ThreeParts())
    rejected = read_lake_table(tmp_path / "lake", "quarantine").filter(
        pl.col("reason") == "duplicate_event_id"
    )
    assert rejected["source_row"].to_list() == [24]  # the later of the two rows with id ev-0


def test_synthetic_bundle_in_many_parts_gives_the_one_part_lake(tmp_path, monkeypatch, lookups):
    monkeypatch.setattr(item_shards, "SHARD_ITEMS", 256)  # ~3,000 items: the index in 16 shards
    built = []
    real_build = item_shards.ShardPieces.build

    def spy_build(pieces):
        built.append(real_build(pieces))
        return built[-1]

    monkeypatch.setattr(item_shards.ShardPieces, "build", spy_build)
    raw = tmp_path / "raw"
    write_synthetic(raw, users=60, seed=3, fmt="parquet")
    first = sorted((raw / "events").glob("*.parquet"))[0]
    events = pl.read_parquet(first)
    conflicting = events.slice(0, 1).with_columns(pl.lit(events["page_view_id"][-1]).alias("page_view_id"))
    pl.concat([events, conflicting, events.slice(5, 1)]).write_parquet(first)

    class ManyParts(IngestSettings):
        spill_part_rows: int = (
            2_000  # ~29,000 feed + event rows -> 15 parts; ~3,000 items -> 2 chunks, left to pass 2
        )
        memory_rows: int = 0

    single, parted = _ingest_both(raw, tmp_path, ManyParts())
    assert [shards.bits for shards in built] == [4]  # the one-part run keeps its index whole
    _same_lakes(tmp_path / "one", tmp_path / "many")
    # the landed index (the next day's lookups) streamed from the shards is the whole index
    one, many = (load_index(landed_dir(tmp_path / name)) for name in ("one", "many"))
    assert many.frame.equals(one.frame) and many.keys.equals(one.keys)
    assert parted.counts == single.counts
    assert parted.quarantine_by_reason == single.quarantine_by_reason
    assert lookups.swept == (list(range(8)) if lookups.grouped else [])  # 15 parts, 2 a group
    assert (
        single.quarantine_by_reason.get("duplicate_event_id") == 1 and single.counts["events"].duplicates == 1
    )


@pytest.mark.parametrize("bundle", [cross_part_bundle, grouped_feeds_bundle], ids=["spilled", "in-place"])
def test_partitioned_rerun_gives_identical_files(tmp_path, bundle):
    write_bundle(bundle(), tmp_path / "raw")
    lake = tmp_path / "lake"
    ingest_bundle(tmp_path / "raw", lake, ThreeParts())
    before = {p.relative_to(lake): p.read_bytes() for t in TABLES for p in table_files(lake, t)}
    ingest_bundle(tmp_path / "raw", lake, ThreeParts())
    after = {p.relative_to(lake): p.read_bytes() for t in TABLES for p in table_files(lake, t)}
    assert after == before


def test_failure_in_a_later_part_leaves_the_previous_lake_and_no_spill(tmp_path, monkeypatch):
    write_bundle(cross_part_bundle(), tmp_path / "raw")
    lake = tmp_path / "lake"
    ingest_bundle(tmp_path / "raw", lake, ThreeParts())
    before = _lake(lake)
    calls = {"n": 0}
    real_write = lake_io._write_parquet

    def flaky(frame, schema, path, zstd_level):
        calls["n"] += 1
        if calls["n"] == 6:  # items and the first part are staged by now
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"PAR1 half a file")
            raise OSError("disk full")
        real_write(frame, schema, path, zstd_level)

    monkeypatch.setattr(lake_io, "_write_parquet", flaky)
    with pytest.raises(OSError, match="disk full"):
        ingest_bundle(tmp_path / "raw", lake, ThreeParts())
    assert calls["n"] >= 6
    assert not any((lake / ".staging").iterdir())  # staged tables and the spill are gone
    after = _lake(lake)
    for table in TABLES:
        assert after[table].equals(before[table]), table


def test_big_parquet_files_are_read_in_row_group_chunks(tmp_path):
    # 10 rows in row groups of 3: chunks of >= 4 rows are whole groups, rows numbered from the file start
    rows = feeds("pv-A") + feeds("pv-B")[:2]
    table = pa.Table.from_pylist(rows)
    (tmp_path / "feeds").mkdir()
    pq.write_table(table, tmp_path / "feeds" / "part-0.parquet", row_group_size=3)
    chunks = list(read_tables(tmp_path, ("feeds",), "auto", None, 4))
    assert [c.frame.height for c in chunks] == [6, 4]  # 3+3, then 3+1
    assert pl.concat([c.frame for c in chunks])["_row"].to_list() == list(range(10))
    assert sum(c.rows_in for c in chunks) == 10


def test_a_row_group_larger_than_a_chunk_is_read_in_slices(tmp_path):
    # one group of 2, one of 10, one of 1, in chunks of 4: the 2 alone, the 10 in even slices, the 1
    rows = feeds("pv-A") + feeds("pv-B") + feeds("pv-C")
    table = pa.Table.from_pylist(rows[:13])
    (tmp_path / "feeds").mkdir()
    with pq.ParquetWriter(tmp_path / "feeds" / "part-0.parquet", table.schema) as writer:
        for start, size in ((0, 2), (2, 10), (12, 1)):
            writer.write_table(table.slice(start, size), row_group_size=size)
    chunks = list(read_tables(tmp_path, ("feeds",), "auto", None, 4))
    assert [c.frame.height for c in chunks] == [2, 3, 3, 4, 1]
    assert pl.concat([c.frame for c in chunks])["_row"].to_list() == list(range(13))
    assert pl.concat([c.frame for c in chunks])["item_id"].to_list() == [r["item_id"] for r in rows[:13]]


def bundle_with_history(raw: Path, kept: int) -> dict[str, list[dict]]:
    """The tiny bundle with ``kept`` good history rows and one of unknown kind last, written to ``raw``."""
    bundle = tiny_bundle()
    first = bundle["history"][0]
    bundle["history"] = [
        *(dict(first, user_id=f"usr-{n % 3}", title=f"thing {n}") for n in range(kept)),
        dict(first, kind="view"),  # unknown kind: quarantined from the last slice or file
    ]
    write_bundle(bundle, raw)
    return bundle


def test_history_written_in_slices_gives_the_whole_history(tmp_path, monkeypatch):
    bundle_with_history(tmp_path / "raw", 7)
    whole = ingest_bundle(tmp_path / "raw", tmp_path / "one")
    monkeypatch.setattr(run_module, "HISTORY_ROWS", 3)  # 8 rows -> slices of 3, 3 and 2
    sliced = ingest_bundle(tmp_path / "raw", tmp_path / "many")
    assert len(table_files(tmp_path / "many", "history")) > len(table_files(tmp_path / "one", "history"))
    _same_lakes(tmp_path / "one", tmp_path / "many")
    assert sliced.counts["history"] == whole.counts["history"] and sliced.counts["history"].balanced
    assert sliced.output_rows["history"] == 7 and sliced.quarantine_by_reason["unknown_history_kind"] == 1
    landed = [
        pl.read_parquet(p).height for p in (landed_dir(tmp_path / "many") / "history").glob("*.parquet")
    ]
    assert sorted(landed) == [2, 3, 3]  # the raw rows, landed a slice at a time


class SpilledInChunksOfFour(IngestSettings):
    spill_part_rows: int = 4  # parts of 4 rows, read 4 rows at a time
    memory_rows: int = 0  # spilled


def test_spilled_history_is_read_back_a_file_at_a_time_and_gives_the_whole_history(tmp_path, monkeypatch):
    bundle = bundle_with_history(tmp_path / "raw", 9)
    history_file = tmp_path / "raw" / "history" / "part-0.parquet"
    pq.write_table(pq.read_table(history_file), history_file, row_group_size=3)  # read in chunks: 6, 4
    whole = ingest_bundle(tmp_path / "raw", tmp_path / "one")
    monkeypatch.setattr(pass_one, "SPILL_BUFFER_BYTES", 0)  # every chunk read is a spill file
    pieces: list[int] = []
    real_pieces = pass_one.Spill.pieces

    def spy_pieces(spill, table, part):
        for frame in real_pieces(spill, table, part):
            pieces.append(frame.height)
            yield frame

    monkeypatch.setattr(pass_one.Spill, "pieces", spy_pieces)
    spilled = ingest_bundle(tmp_path / "raw", tmp_path / "many", SpilledInChunksOfFour())
    assert len(pieces) >= 2 and sum(pieces) == 10  # read back in several files, every row once
    _same_lakes(tmp_path / "one", tmp_path / "many")
    assert spilled.counts["history"] == whole.counts["history"] and spilled.counts["history"].balanced
    assert spilled.output_rows["history"] == 9 and spilled.quarantine_by_reason["unknown_history_kind"] == 1
    landed = [pl.read_parquet(p) for p in (landed_dir(tmp_path / "many") / "history").glob("*.parquet")]
    assert sorted(frame.height for frame in landed) == sorted(pieces)  # landed a file at a time
    assert sorted(pl.concat(landed)["title"].to_list()) == sorted(row["title"] for row in bundle["history"])
