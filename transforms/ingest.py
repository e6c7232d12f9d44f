"""Ingest: a raw log bundle becomes the lake tables steps, sessions, feed_layouts,
items, profiles, history and the ingest part of quarantine.

Two passes, so memory is bounded by a part, not by the bundle:

1. *read*: the raw part files are read and typed in two threads, in chunks (a big Parquet
   file about a row group at a time, small ones several at a time), rejects collected.
   ``events`` and ``feeds`` rows are split into parts by a hash of ``page_view_id``, kept in
   memory up to ``memory_rows`` and otherwise spilled under
   ``LAKE/.staging/spill-<token>/<table>/part=<p>/``. Beyond ``memory_rows``, feeds whose files
   are all Parquet with each view's cards together (the usual layout) are not spilled: a view
   belongs to the part its first card falls in, only ``page_view_id`` is read here, and pass 2
   reads each part's feed rows in place, in order (``FeedsInPlace``); the events are spilled by
   that map. ``items`` that make one chunk stay in memory, their ids and image refs keyed in
   the writer thread meanwhile; items that make several are left to pass 2, which reads them
   once (their text is too large to keep or spill), after a read of their id column alone for
   the duplicate check. Profiles and history stay in memory.
2. *align*: items are checked and written chunk by chunk, leaving a compact catalog (ids
   sorted by hash, pseudonyms, what the checks need); then, part by part, the checks and the
   step alignment of ``transforms.align`` run on the part's page views, and its rows are
   pseudonymized and added to the staged tables as ``part-<p>.parquet`` files.

Part size: ``IngestSettings.spill_part_rows`` feed + event rows per part (2,000,000: three
parts at UserArena scale, kept in memory; one for small bundles).

Whatever a check compares lies within one page view, hence within one part, except ids:
duplicate event and item ids are found from a hash of the id kept for every row, and the
few rows involved are settled together; missing-profile flags are kept once per user.
Two parts align at once (``ALIGN_THREADS``: Polars runs many small steps on one core, so
one part at a time leaves the other idle); their pseudonyms and Parquet writes run in one
writer thread, in part order. Tables are swapped into place at the end, one atomic rename
each; a failure leaves the previous lake and no staging or spill behind.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from transforms import align
from transforms.config import IngestSettings
from transforms.lake import STAGING, StagedTable, write_quarantine
from transforms.readers import (
    TableRead,
    check_bundle,
    chunk_plan,
    empty_rejects,
    empty_typed,
    estimated_rows,
    file_format,
    no_event_marks,
    read_tables,
    reject_rows,
    table_files,
)
from transforms.rekey import ID_COLUMNS, PREFIXES, Pseudonymizer, bucket_of, keyed_hex, split_of
from transforms.schemas import LAKE_TABLES, RAW_TABLES
from transforms.userarena import read_userarena

#: raw input table -> the lake table its accepted rows land in
OUTPUT_OF: dict[str, str] = {
    "events": "steps",
    "feeds": "feed_layouts",
    "items": "items",
    "profiles": "profiles",
    "history": "history",
}
HISTORY_KINDS = ("click", "buy")
READ_CHUNK_ROWS = 1 << 20  # rows read at a time from a big Parquet file: one default row group
SPILL_BUFFER_BYTES = 256 * 2**20  # rows buffered before spilling: few, big files
ALIGN_THREADS = 2  # parts aligned at once
WRITER_QUEUE = 2  # jobs in flight in the writer thread (each holds about a part's frames)
PART_SEED = 7  # hash seeds: any constants, the hashes never leave the run
ID_SEED = 11
CHECK_SEED = 0x9E3779B97F4A7C15
REPEAT_PROBE_ROWS = 10_000  # rows of a column that tell whether its values repeat
ITEM_KEYED = ("item_id", "image")  # item columns keyed as they are read (see _keyed_items)
WRITE_ORDER = ("steps", "feed_layouts", "items", "profiles", "history", "sessions")


@dataclass
class TableCount:
    """Accounting for one raw table: rows_in = rows_out + quarantined + duplicates + dropped."""

    rows_in: int
    rows_out: int
    quarantined: int
    duplicates: int
    flagged: int = 0
    dropped: int = 0  # events ``action_map`` declares no part of a trajectory (align.drop_declared)

    @property
    def balanced(self) -> bool:
        return self.rows_in == self.rows_out + self.quarantined + self.duplicates + self.dropped


@dataclass
class IngestResult:
    lake: str
    raw: str
    counts: dict[str, TableCount]
    quarantine_by_reason: dict[str, int]
    flagged_by_reason: dict[str, int]
    output_rows: dict[str, int]
    paths: dict[str, str]
    naive_timestamps: int
    wall_seconds: float
    settings: dict = field(default_factory=dict)
    notes: dict = field(default_factory=dict)  # source-specific counts, e.g. context rows of UserArena

    def to_json(self) -> dict:
        return asdict(self)


class AccountingError(AssertionError):
    """Rows were lost or invented: a bug in the pipeline, never a data problem."""


def _concat(frames: list[pl.DataFrame]) -> pl.DataFrame:
    frames = [f for f in frames if f.height]
    return pl.concat(frames, how="vertical_relaxed") if frames else empty_rejects()


def read_chunk_rows(settings: IngestSettings) -> int:
    """Rows read at a time from a big Parquet file: about one default row group, at most a part."""
    return min(spill_part_rows(settings), READ_CHUNK_ROWS)


def spill_part_rows(settings: IngestSettings) -> int:
    """Feed + event rows per part."""
    return settings.spill_part_rows


def _part_of(parts: int) -> pl.Expr:
    """The part of a row: all rows of one page view land in the same part."""
    return (pl.col("page_view_id").hash(PART_SEED) % parts).cast(pl.Int32)


def _id_hash(column: str) -> pl.Expr:
    return pl.col(column).hash(ID_SEED)


# --- pass 1: read, type, spill ---------------------------------------------------


class Writer:
    """One worker thread for pseudonyms and file writes, so they overlap the next computation
    (Polars and its Parquet writer release the GIL). Jobs run in submission order; at most
    ``WRITER_QUEUE`` are in flight, so memory stays bounded."""

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ingest-writer")
        self.pending: deque[Future] = deque()

    def submit(self, job: Callable[..., object], *args: object) -> Future:
        while len(self.pending) >= WRITER_QUEUE:
            self.pending.popleft().result()  # a failed job fails the run here
        future = self.pool.submit(job, *args)
        self.pending.append(future)
        return future

    def wait(self) -> None:
        while self.pending:
            self.pending.popleft().result()

    def close(self) -> None:
        """Let the queued jobs end (they must not write into staging that is being removed)."""
        self.pool.shutdown(wait=True)


@dataclass
class Spill:
    """Typed raw rows between the passes, by (table, part). Tables in ``on_disk`` are buffered up to
    ``SPILL_BUFFER_BYTES`` and written as few, big files under ``folder`` (by ``writer``); the others
    stay in memory. A table's ``prepare`` step (adding columns; in-memory tables only) runs in the
    writer thread, while pass 1 reads on."""

    folder: Path
    on_disk: set[str]
    writer: Writer
    prepare: dict[str, Callable[[pl.DataFrame], pl.DataFrame]] = field(default_factory=dict)
    frames: dict[tuple[str, int], list[pl.DataFrame | Future]] = field(default_factory=dict)
    buffered: int = 0
    files: int = 0

    def add(self, table: str, part: int, frame: pl.DataFrame) -> None:
        if table in self.prepare and table not in self.on_disk:
            self.frames.setdefault((table, part), []).append(self.writer.submit(self.prepare[table], frame))
            return
        self.frames.setdefault((table, part), []).append(frame)
        if table in self.on_disk:
            self.buffered += frame.estimated_size()
            if self.buffered > SPILL_BUFFER_BYTES:
                self.flush()

    def flush(self) -> None:
        batch = []
        for (table, part), frames in list(self.frames.items()):
            if table in self.on_disk:
                path = self.folder / table / f"part={part}" / f"{self.files:06d}.parquet"
                batch.append((_stack(frames, table), path))
                self.files += 1
                del self.frames[(table, part)]
        self.buffered = 0
        if batch:
            self.writer.submit(_write_spill, batch)

    def finish(self) -> None:
        """Write what is still buffered: pass 1 is over."""
        self.flush()
        self.writer.wait()

    def read(self, table: str, part: int, *, release: bool = True) -> pl.DataFrame:
        """Rows of (table, part) in the order they came (after ``finish``); ``release`` drops the
        in-memory copy."""
        if table not in self.on_disk:
            frames = self.frames.pop((table, part), []) if release else self.frames.get((table, part), [])
            return _stack([f.result() if isinstance(f, Future) else f for f in frames], table).rechunk()
        files = sorted((self.folder / table / f"part={part}").glob("*.parquet"))
        return pl.read_parquet(files).rechunk() if files else empty_typed(table)


def _write_spill(batch: list[tuple[pl.DataFrame, Path]]) -> None:
    # uncompressed: the spill is read back soon, from the page cache; a codec costs more CPU than
    # the disk saves (at 10x UserArena scale this ran faster than lz4 or zstd spills)
    for frame, path in batch:
        path.parent.mkdir(parents=True, exist_ok=True)
        frame.write_parquet(path, compression="uncompressed", statistics=False)


def _stack(frames: list[pl.DataFrame], table: str) -> pl.DataFrame:
    return pl.concat(frames, how="diagonal_relaxed") if frames else empty_typed(table)


@dataclass
class Raw:
    """What pass 1 keeps: per raw table the counts and rejects, the small tables, the spill,
    and the id hashes of every row that the cross-part duplicate checks need."""

    spill: Spill
    parts: int
    reads: dict[str, TableRead] = field(default_factory=dict)
    small: dict[str, list[pl.DataFrame]] = field(default_factory=dict)
    rejects: list[pl.DataFrame] = field(default_factory=list)
    item_chunks: int = 0
    id_hashes: dict[str, list[pl.Series]] = field(default_factory=lambda: {"events": [], "items": []})
    users: list[pl.Series] = field(default_factory=list)
    event_items: list[pl.Series] = field(default_factory=list)  # hashes of the items events name
    # set when the items make several chunks: pass 1 skips them, pass 2 reads (and counts) them,
    # and the duplicate check takes the hashes of their ids from ``item_ids`` (their text columns
    # are too large to keep in memory or to spill)
    read_items: Callable[[], Iterator[TableRead]] | None = None
    item_ids: Callable[[], list[pl.Series]] | None = None
    # set when the feeds are read in place in pass 2 instead of spilled (``FeedsInPlace``)
    feeds_in_place: FeedsInPlace | None = None
    cuts: pl.DataFrame = field(default_factory=align.no_cuts)  # sessions the reader cut (UserArena)
    # per part, where the events rows the reader rejected stood (``readers.rejected_event_marks``):
    # in the part of their page view, whose session they cut in pass 2
    rejected_events: dict[int, list[pl.DataFrame]] = field(default_factory=dict)

    def add(self, chunk: TableRead) -> None:
        self.count(chunk)
        if chunk.name == "events":
            self._keep_marks(chunk.rejected_events)
        frame = chunk.frame
        if frame.width == 0 or frame.height == 0:
            return
        if chunk.name == "items":
            self.id_hashes["items"].append(frame.select(_id_hash("item_id")).to_series())
            self.spill.add("items", self.item_chunks, frame)
            self.item_chunks += 1
        elif chunk.name in ("events", "feeds"):
            if chunk.name == "events":
                self.id_hashes["events"].append(frame.select(_id_hash("event_id")).to_series())
                self.users.append(frame["user_id"].unique())
                self.event_items.append(frame.select(_id_hash("item_id").unique()).to_series())
            self._spill_parts(chunk.name, frame)
        else:
            self.small.setdefault(chunk.name, []).append(frame)

    def count(self, chunk: TableRead) -> None:
        """A chunk's rows in, merged rows, naive timestamps and rejects."""
        read = self.reads.setdefault(chunk.name, TableRead(chunk.name, pl.DataFrame(), empty_rejects(), 0))
        read.rows_in += chunk.rows_in
        read.naive_timestamps += chunk.naive_timestamps
        read.merged += chunk.merged
        self.rejects.append(chunk.rejects)

    def _spill_parts(self, table: str, frame: pl.DataFrame) -> None:
        for part, rows in self._by_part(frame):
            self.spill.add(table, part, rows)

    def _keep_marks(self, marks: pl.DataFrame) -> None:
        """A mark without a readable page view belongs to no session: it has nothing to cut."""
        for part, rows in self._by_part(marks.filter(pl.col("page_view_id").is_not_null())):
            self.rejected_events.setdefault(part, []).append(rows)

    def _by_part(self, frame: pl.DataFrame) -> Iterator[tuple[int, pl.DataFrame]]:
        """``frame``'s rows by the part of their page view."""
        if frame.height == 0:
            return
        if self.parts == 1:
            yield 0, frame
            return
        part = _part_of(self.parts)
        if self.feeds_in_place is not None:  # the part of the view's feed rows; views without any: hashed
            part = pl.coalesce(self.feeds_in_place.part_of(frame["page_view_id"]), part)
        split = frame.with_columns(part.alias("_part"))
        for (part,), rows in split.partition_by("_part", as_dict=True, maintain_order=True).items():
            yield int(part), rows.drop("_part")

    def marks(self, part: int) -> pl.DataFrame:
        """The rejected events' marks of ``part`` (pass 2)."""
        return pl.concat(self.rejected_events.pop(part, [no_event_marks()]))

    def item_frames(self, *, release: bool = True, count: bool = False) -> Iterator[pl.DataFrame]:
        """The accepted item rows, chunk by chunk, in reading order; ``count``: this is the read that
        counts items left to pass 2 (``read_items``)."""
        if self.read_items is None:
            yield from (self.spill.read("items", n, release=release) for n in range(self.item_chunks))
            return
        for chunk in self.read_items():
            if count:
                self.count(chunk)
            if chunk.frame.width and chunk.frame.height:
                yield chunk.frame

    def feeds(self, part: int) -> pl.DataFrame:
        """The accepted feed rows of ``part``, in source order (pass 2)."""
        if self.feeds_in_place is None:
            return self.spill.read("feeds", part)
        return self.feeds_in_place.take(part, self.count)

    def item_id_hashes(self) -> list[pl.Series]:
        """``_id_hash`` of the item ids: of every accepted row, or (items left to pass 2) of every
        row, which only adds suspects that ``settle`` clears."""
        return self.id_hashes["items"] if self.item_ids is None else self.item_ids()

    def table(self, name: str) -> pl.DataFrame:
        """A small table, whole."""
        return _stack(self.small.get(name, []), name)


def _plan(root: Path, settings: IngestSettings, pseudonymize: Pseudonymizer, run: Run) -> Raw:
    """Parts from the bundle's size: 1 for small bundles, more for big ones; the parts of bundles
    beyond ``memory_rows`` are spilled to disk. Items of several chunks are left to pass 2."""
    per_part = spill_part_rows(settings)
    rows = estimated_rows(root, "events") + estimated_rows(root, "feeds")
    parts = max(1, -(-rows // per_part))
    on_disk = {"events", "feeds"} if parts > 1 and rows > settings.memory_rows else set()
    unit, chunk = settings.timestamp_unit, read_chunk_rows(settings)
    in_place = FeedsInPlace.plan(root, parts, chunk) if on_disk else None
    if in_place is not None:
        on_disk.discard("feeds")
        in_place.read_chunks = lambda: read_tables(root, ("feeds",), unit, pseudonymize, chunk)
    raw = Raw(Spill(run.spill, on_disk, run.writer, _preparations(settings)), parts, feeds_in_place=in_place)
    if estimated_rows(root, "items") > chunk:
        raw.read_items = lambda: read_tables(root, ("items",), unit, pseudonymize, chunk)
        raw.item_ids = lambda: _item_id_column_hashes(root) or [
            frame.select(_id_hash("item_id")).to_series() for frame in raw.item_frames()
        ]
    return raw


def _item_id_column_hashes(root: Path) -> list[pl.Series] | None:
    """``_id_hash`` of every item row, from the id column alone: string ids pass the typing
    untouched, so these are the typed rows' hashes (plus those of rows the typing rejects). None
    unless every items file is Parquet with string ids: the full read hashes them then."""
    hashes = []
    for path in table_files(root, "items"):
        if file_format(path) != "parquet":
            return None
        try:
            ids = pl.scan_parquet(path, hive_partitioning=False).select("item_id").collect().to_series()
        except Exception:  # unreadable, or no id column: the full read reports it
            return None
        if ids.dtype != pl.String:
            return None
        hashes.append(ids.hash(ID_SEED))
    return hashes


@dataclass
class FeedsInPlace:
    """Feeds read where they lie in pass 2, not spilled: when every feeds file is Parquet and each
    page view's cards come together (the usual layout), a view belongs to the part its first card
    falls in (rows numbered over the files in ``_file`` order), so a part's feeds are one run of
    whole views. One reader walks the files once, in order, and hands each part its rows; pass 1
    reads the ``page_view_id`` column alone and spills only the events, by the same map."""

    views: pl.DataFrame  # _h (a hash of page_view_id; flagged sorted, unique), _view_part
    seed: int
    cuts: pl.Series  # the global row where each part's feed rows begin
    bases: dict[str, int]  # _file -> global row of its first row
    read_chunks: Callable[[], Iterator[TableRead]] | None = None  # the typed chunks, in order
    chunks: Iterator[TableRead] | None = None
    ready: dict[int, list[pl.DataFrame]] = field(default_factory=dict)
    complete_below: int = 0  # parts below this one have all their rows in ``ready``
    lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def plan(cls, root: Path, parts: int, chunk_rows: int) -> FeedsInPlace | None:
        """None when the feeds are not all Parquet, or some view's cards are not together."""
        found = _feed_view_runs(root, chunk_rows)
        if found is None:
            return None
        runs, bases = found
        total = int(runs["_rows"].sum())
        per_part = max(1, -(-total // parts))
        part = (pl.col("_start") // per_part).clip(upper_bound=parts - 1)
        runs = runs.with_columns(part.alias("_view_part"))
        first_run = runs["_view_part"].search_sorted(pl.Series(range(parts), dtype=pl.Int64), side="left")
        starts = pl.concat([runs["_start"], pl.Series([total], dtype=pl.Int64)])
        views = runs.filter(pl.col("page_view_id").is_not_null())
        seed = ID_SEED
        while (hashes := views["page_view_id"].hash(seed)).n_unique() < views.height:
            seed += 1  # two views share a hash under this seed: another one separates them
        views = views.select(hashes.alias("_h"), pl.col("_view_part").cast(pl.Int32)).sort("_h")
        return cls(views.with_columns(pl.col("_h").set_sorted()), seed, starts.gather(first_run), bases)

    def part_of(self, ids: pl.Series) -> pl.Series:
        """The part of each page view (``_merge_lookup``); null for a view without feed rows (whose
        events are rejected in any part: should its hash equal a feed view's, odds about 2^-64, it
        lands in that view's part and finds no cards there either)."""
        return _merge_lookup(ids.hash(self.seed), self.views, pl.col("_view_part")).alias("_view_part")

    def take(self, part: int, count: Callable[[TableRead], None]) -> pl.DataFrame:
        """The feed rows of ``part``; reads on (counting each chunk once) until the part is whole."""
        with self.lock:
            if self.chunks is None:
                self.chunks = self.read_chunks()
            while part >= self.complete_below:
                chunk = next(self.chunks, None)
                if chunk is None:
                    self.complete_below = len(self.cuts)
                    break
                count(chunk)
                self._deal(chunk.frame)
            frames = self.ready.pop(part, [])
        return _stack(frames, "feeds").rechunk()

    def _deal(self, frame: pl.DataFrame) -> None:
        """Split a typed chunk (rows in global order) where parts begin."""
        if frame.width == 0 or frame.height == 0:
            return
        files = frame["_file"]
        if files[0] == files[-1]:  # files come in order: one file (the usual chunk)
            rows = frame["_row"] + self.bases[files[0]]
        else:
            rows = frame.select(pl.col("_file").replace_strict(self.bases) + pl.col("_row")).to_series()
        bounds = [*rows.search_sorted(self.cuts, side="left").to_list(), frame.height]
        first = self.cuts.search_sorted(rows[0], side="right") - 1
        last = self.cuts.search_sorted(rows[-1], side="right") - 1
        for p in range(first, last + 1):
            start = 0 if p == first else bounds[p]
            self.ready.setdefault(p, []).append(frame.slice(start, bounds[p + 1] - start))
        self.complete_below = last


def _feed_view_runs(root: Path, chunk_rows: int) -> tuple[pl.DataFrame, dict[str, int]] | None:
    """The feeds' runs of one page view (``page_view_id``, ``_start``: global row, ``_rows``), read
    from that column alone, with the global row of each file's first row (files in ``_file`` order);
    None unless every file is Parquet with a string column and every view is one run (null ids,
    rejected when typed, may recur)."""
    pieces, bases, offset = [], {}, 0
    for chunk in chunk_plan(root, "feeds", chunk_rows):
        for path in chunk.paths:
            if file_format(path) != "parquet":
                return None
            bases.setdefault(path.relative_to(root).as_posix(), offset)
            scan = pl.scan_parquet(path, hive_partitioning=False).select("page_view_id")
            try:
                column = (scan.slice(*chunk.rows) if chunk.rows else scan).collect().to_series()
            except Exception:  # unreadable, or no such column: the spilled path reports it
                return None
            if column.dtype != pl.String:
                return None
            pieces.append(column.rle().struct.unnest())
            offset += column.len()
    if not pieces:
        return None
    runs = (
        pl.concat(pieces)
        .group_by(pl.col("value").rle_id().alias("_run"), maintain_order=True)
        .agg(pl.col("value").first().alias("page_view_id"), pl.col("len").sum().cast(pl.Int64).alias("_rows"))
        .select("page_view_id", (pl.col("_rows").cum_sum() - pl.col("_rows")).alias("_start"), "_rows")
    )
    if runs["page_view_id"].drop_nulls().is_duplicated().any():
        return None
    return runs, bases


def read_pass(root: Path, settings: IngestSettings, pseudonymize: Pseudonymizer, run: Run) -> Raw:
    """Pass 1 over a raw bundle folder: one chunk in memory at a time."""
    raw = _plan(root, settings, pseudonymize, run)
    for name in RAW_TABLES:
        raw.reads[name] = TableRead(name, pl.DataFrame(), empty_rejects(), 0)
    deferred = {"items"} if raw.read_items else set()
    deferred |= {"feeds"} if raw.feeds_in_place else set()
    tables = [t for t in RAW_TABLES if t not in deferred]
    chunks = read_tables(root, tables, settings.timestamp_unit, pseudonymize, read_chunk_rows(settings))
    for chunk in chunks:
        raw.add(chunk)
    raw.spill.finish()
    return raw


def from_tables(tables: dict[str, TableRead], settings: IngestSettings, run: Run) -> Raw:
    """An already-read bundle (the UserArena release) as one in-memory part."""
    raw = Raw(Spill(run.spill, set(), run.writer, _preparations(settings)), 1)
    for name in RAW_TABLES:
        raw.reads[name] = TableRead(name, pl.DataFrame(), empty_rejects(), 0)
        raw.add(tables[name])
    return raw


# --- ids that cross parts --------------------------------------------------------


@dataclass
class Settled:
    """Duplicate ids settled over all parts at once: the rows ``align.dedupe`` merged or rejected
    (by ``_file``, ``_row``), its rejects and its merge count."""

    dropped: pl.DataFrame
    rejects: list[pl.DataFrame]
    duplicates: int

    def apply(self, frame: pl.DataFrame) -> pl.DataFrame:
        if self.dropped.height == 0:
            return frame
        return frame.join(self.dropped, on=["_file", "_row"], how="anti", maintain_order="left")


def settle(
    hashes: list[pl.Series],
    frames: Callable[[], Iterable[pl.DataFrame]],
    key: str,
    dedupe: Callable[[pl.DataFrame], align.Checked],
) -> Settled:
    """Ids whose hash occurs once are unique (the common case: nothing to read again); the rows
    of the others are gathered from every part and deduplicated together."""
    every = pl.concat(hashes) if hashes else pl.Series(dtype=pl.UInt64)
    if every.n_unique() == every.len():
        return Settled(pl.DataFrame(schema={"_file": pl.String, "_row": pl.Int64}), [], 0)
    suspects = every.filter(every.is_duplicated()).unique().implode()
    rows = pl.concat((f.filter(_id_hash(key).is_in(suspects)) for f in frames()), how="vertical_relaxed")
    checked = dedupe(rows)
    dropped = rows.select("_file", "_row").join(
        checked.rows.select("_file", "_row"), on=["_file", "_row"], how="anti"
    )
    return Settled(dropped, checked.rejects, checked.duplicates)


# --- items: checked, written and keyed chunk by chunk ------------------------------


@dataclass
class Catalog:
    """Accepted items sorted by a hash of ``item_id``: a part sorts its probes by the same hash and
    finds its items by one merge join (Polars' sorted-key join), never by building a hash table over
    the whole catalog (which grows with the bundle) or by a binary search per probe. A match
    is confirmed by a second, independently seeded 64-bit hash (``_check``) rather than by the id
    strings, whose random reads over a large catalog cost more: an id outside the catalog passes
    both hashes with odds of about 2^-128."""

    frame: pl.DataFrame  # _h (sorted, unique), item_id, title, top_category, review_count, _check
    seed: int
    arrival: pl.Series  # _h of the items as they came
    keys: pl.Series = field(default_factory=lambda: pl.Series(dtype=pl.String))  # pseudonyms, frame order
    by_hash: pl.DataFrame = field(init=False)  # _h (flagged sorted), _check, _row: what a lookup joins

    def __post_init__(self) -> None:
        rows = self.frame.select("_h", "_check").with_row_index("_row")
        self.by_hash = rows.with_columns(pl.col("_h").set_sorted())

    @classmethod
    def build(cls, items: pl.DataFrame, seed: int = ID_SEED) -> Catalog:
        hashes = items.select(pl.col("item_id").hash(seed)).to_series()
        if hashes.n_unique() < items.height:  # ids are unique here, so another seed separates them
            return cls.build(items, seed + 1)
        # a sort moves the rows (in parallel) several times faster than a gather by arg_sort does,
        # and leaves one chunk per column: gathers over many chunks cost a chunk lookup per row
        frame = items.with_columns(hashes.alias("_h"), _check_hash(pl.col("item_id")).alias("_check"))
        return cls(frame.sort("_h").rechunk(), seed, hashes.alias("_h"))

    def attach(self, keys: list[pl.Series]) -> None:
        """The pseudonyms of the items as they came (chunk by chunk), put in ``frame`` order."""
        arrived = pl.concat([pl.Series(dtype=pl.String), *keys]).alias("_key")
        self.keys = pl.DataFrame([self.arrival, arrived]).sort("_h")["_key"].rechunk()

    def index(self, ids: pl.Series) -> pl.Series:
        """Row of each id in ``frame``; null where the id is missing or not in the catalog."""
        present = ids.is_not_null()
        if self.frame.height == 0 or not present.any():
            return pl.repeat(None, ids.len(), dtype=pl.get_index_type(), eager=True).alias(ids.name)
        if not present.all():  # look up the ids only (most target/open item columns are null)
            found = self.index(ids.filter(present))
            nulls = pl.repeat(None, ids.len(), dtype=found.dtype, eager=True).alias(ids.name)
            return nulls.scatter(present.arg_true(), found)
        confirmed = pl.when(pl.col("_check") == pl.col("_probe")).then("_row")
        found = _merge_lookup(ids.hash(self.seed), self.by_hash, confirmed, {"_probe": _check_hash(ids)})
        return found.alias(ids.name)

    @property
    def context(self) -> pl.DataFrame:
        """``align.item_context`` by catalog row: row k describes the item a ``_item`` of k names."""
        return self.frame.drop("_h", "_check")


def _merge_lookup(
    hashes: pl.Series, table: pl.DataFrame, value: pl.Expr, probes: dict[str, pl.Series] | None = None
) -> pl.Series:
    """``value`` of the row of ``table`` (``_h`` unique, flagged sorted) whose ``_h`` each hash is,
    in the hashes' order; null where none (``probes``: columns beside each hash that ``value`` may
    use). Sorted probes meet the sorted table in one merge join: the cost follows the probes, not
    the table, which grows with the bundle."""
    order = hashes.arg_sort()
    beside = {name: column.gather(order) for name, column in (probes or {}).items()}
    sorted_probes = pl.DataFrame({"_h": hashes.gather(order).set_sorted(), **beside})
    found = sorted_probes.join(table, on="_h", how="left", maintain_order="left").select(value).to_series()
    return pl.repeat(None, hashes.len(), dtype=found.dtype, eager=True).scatter(order, found)


def _check_hash(ids: pl.Series | pl.Expr) -> pl.Series | pl.Expr:
    """The catalog's confirming hash of an id (a seed unrelated to the sort hash's)."""
    return ids.hash(CHECK_SEED)


def _outputs(frame: pl.DataFrame, table: str) -> pl.DataFrame:
    """Only the lake table's columns (ids are keyed after this, so nothing unused gets hashed)."""
    return frame.select([c for c in LAKE_TABLES[table].names if c in frame.columns])


def items_pass(
    raw: Raw, settings: IngestSettings, pseudonymize: Pseudonymizer, run: Run
) -> tuple[Catalog, list[pl.DataFrame], int]:
    """Settle duplicate item ids, then check, key and write the items chunk by chunk.

    Returns the catalog, the quarantine rows and the merged duplicates."""
    settled = settle(
        raw.item_id_hashes(),
        lambda: raw.item_frames(release=False),
        "item_id",
        lambda rows: align.dedupe(rows, ["item_id"], "items", "duplicate_item_id", pseudonymize),
    )
    rejects, pieces, keys = list(settled.rejects), [], []
    named = pl.concat([pl.Series(dtype=pl.UInt64), *raw.event_items]).unique().implode()
    for n, frame in enumerate(raw.item_frames(count=True)):
        chunk_keys = Pseudonymizer(settings.rekey_key, settings.keep_image_refs)  # ids do not recur
        rows, bad = align.check_prices(settled.apply(frame), chunk_keys)
        rejects.append(bad)
        items = align.build_items(rows)
        # keyed here (unless pass 1 did), written in the writer thread while the next chunk is keyed
        items = items if "_keyed_item_id" in items.columns else _keyed_items(items, settings)
        run.write("items", _with_pseudonyms(items, settings, chunk_keys), n)
        keys.append(items["_keyed_item_id"])
        pieces.append(_catalog_rows(items, named))
    catalog = Catalog.build(pl.concat([_catalog_rows(empty_typed("items"), named), *pieces]))
    catalog.attach(keys)
    return catalog, rejects, settled.duplicates


def _preparations(settings: IngestSettings) -> dict[str, Callable[[pl.DataFrame], pl.DataFrame]]:
    return {"items": lambda frame: _keyed_items(frame, settings)}


def _keyed_items(frame: pl.DataFrame, settings: IngestSettings) -> pl.DataFrame:
    """Item rows with the pseudonyms of their id and image columns beside the raw values
    (``_keyed_<column>``): one keyed hash per row, run in the writer thread while pass 1 reads on."""
    columns = [c for c in ITEM_KEYED if c in frame.columns]
    keys = Pseudonymizer(settings.rekey_key, settings.keep_image_refs)
    keyed = pseudonyms(frame.select(columns), settings, keys)
    return frame.with_columns(keyed.select(pl.all().name.prefix("_keyed_")))


def _with_pseudonyms(items: pl.DataFrame, settings: IngestSettings, keys: Pseudonymizer) -> pl.DataFrame:
    """The items' lake columns, ids keyed (by ``_keyed_items`` where it ran)."""
    ready = tuple(c for c in ITEM_KEYED if f"_keyed_{c}" in items.columns)
    items = items.with_columns(pl.col(f"_keyed_{c}").alias(c) for c in ready)
    return pseudonyms(_outputs(items, "items"), settings, keys, done=ready)


def _catalog_rows(items: pl.DataFrame, named: pl.Series) -> pl.DataFrame:
    """``align.item_context``, titles only where an event names the item (target and detail-page
    titles are their only use: most of a big catalog's text stays out of memory)."""
    return align.item_context(items).with_columns(
        pl.when(_id_hash("item_id").is_in(named)).then(pl.col("title")).alias("title")
    )


# --- pass 2: per part -------------------------------------------------------------


@dataclass
class Context:
    """Run-wide inputs of every part."""

    settings: IngestSettings
    catalog: Catalog
    profiles: pl.DataFrame  # align.profile_context
    users: pl.DataFrame  # user_id (raw) -> _user (pseudonym), split, bucket
    max_ts: pl.Expr
    events: Settled  # duplicate event ids, settled over all parts
    source_cuts: pl.DataFrame  # page_view_id, cut_reason: sessions the reader already cut (UserArena)


@dataclass
class Part:
    """One part's lake rows (ids still raw), quarantine rows and merged feed duplicates."""

    steps: pl.DataFrame
    layout: pl.DataFrame
    sessions: pl.DataFrame
    rejects: list[pl.DataFrame]
    flags: list[pl.DataFrame]
    no_profile: pl.DataFrame  # first step of each user without a profile
    feed_duplicates: int
    dropped_events: int  # align.drop_declared


def _sessionless_feeds(
    layout: pl.DataFrame, steps_views: pl.Series, pseudonymize: Pseudonymizer
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Feed rows of page views that kept no action at all leave as session_without_actions."""
    return align.split_by_reason(
        layout,
        pl.when(~pl.col("page_view_id").is_in(steps_views.implode())).then(pl.lit("session_without_actions")),
        "feeds",
        pl.lit("no action of this page view survived ingest"),
        pseudonymize,
    )


def _first_step_without_profile(steps: pl.DataFrame) -> pl.DataFrame:
    """Per user without a profile, the first step in (page view, step) order: the flag's locator."""
    return (
        steps.filter(pl.col("profile_missing"))
        .sort("page_view_id", "step")
        .group_by("user_id", maintain_order=True)
        .first()
        .select("user_id", "page_view_id", "_file", "_row")
    )


def align_part(
    events: pl.DataFrame,
    feeds: pl.DataFrame,
    ctx: Context,
    pseudonymize: Pseudonymizer,
    rejected_events: pl.DataFrame | None = None,
) -> Part:
    """Every check and the step alignment of one part's page views; ids stay raw (``key_part``).
    ``rejected_events``: the part's ``readers.rejected_event_marks`` (quarantined by the reader; here
    they only cut their sessions, in the row checks).

    A rejected event cuts its session (``align.cut_sessions``), in two places: after the row checks
    (before ordering, in session order) and after the screen checks (which run on what the row cut
    kept, so their cut lies inside the earlier one's prefix and is the one that holds). A scroll
    whose distance is not logged takes it from the next kept event, so the last step before a row
    cut may itself be rejected (``missing_scroll_distance``) and move the cut one step earlier."""
    catalog, settings = ctx.catalog, ctx.settings
    known = pl.col("_item").is_not_null()
    feeds = feeds.with_columns(catalog.index(feeds["item_id"]).alias("_item"))
    cards = align.check_feeds(feeds, known, settings.geometry, pseudonymize)
    events, dropped = align.drop_declared(ctx.events.apply(align.map_actions(events, settings.action_map)))
    marks = None if rejected_events is None else align.map_actions(rejected_events, settings.action_map)
    events = events.with_columns(catalog.index(events["item_id"]).alias("_item"))
    checked = align.row_checks(
        events,
        in_catalog=known,
        feed_views=cards.rows["page_view_id"].unique(),
        max_ts=ctx.max_ts,
        pseudonymize=pseudonymize,
        on_bad_event=settings.on_bad_event,
        reader_rejected=marks,
    )
    ordered, order_flags = align.order_events(checked.rows, pseudonymize)
    ordered, after_end = align.drop_after_end(ordered, pseudonymize)
    layout = align.layouts(cards.rows)
    items = catalog.context
    screens = align.screen_checks(
        ordered, layout, items, settings.geometry, pseudonymize, on_bad_event=settings.on_bad_event
    )
    steps = align.build_steps(screens.rows, items, ctx.profiles)
    layout, orphans = _sessionless_feeds(layout, steps["page_view_id"].unique(), pseudonymize)
    layout = layout.rename({"page_view_id": "session_id"})
    cuts = align.session_cuts([ctx.source_cuts, *checked.cuts, *screens.cuts])
    return Part(
        steps=steps,
        layout=layout,
        sessions=align.build_sessions(steps, layout, items, cuts),
        rejects=[*checked.rejects, after_end, *screens.rejects, *cards.rejects, orphans],
        flags=[order_flags, *cards.flags],
        no_profile=_first_step_without_profile(steps),
        feed_duplicates=cards.duplicates,
        dropped_events=dropped,
    )


def _id_columns(settings: IngestSettings) -> dict[str, str]:
    return ID_COLUMNS if settings.keep_image_refs else {**ID_COLUMNS, "image": "image"}


def _per_element(lists: pl.Series, fn: Callable[[pl.Series], pl.Series]) -> pl.Series:
    """``fn`` over the elements of a list column, rebuilt with the same offsets (null lists stay)."""
    arrow = lists.to_arrow()
    arrow = arrow.combine_chunks() if isinstance(arrow, pa.ChunkedArray) else arrow
    offsets = pc.subtract(arrow.offsets, arrow.offsets[0])
    flat = fn(pl.from_arrow(arrow.flatten())).to_arrow()
    rebuilt = type(arrow).from_arrays(offsets, flat, mask=arrow.is_null() if arrow.null_count else None)
    return pl.from_arrow(rebuilt).alias(lists.name)


def _item_keys(values: pl.Series, catalog: Catalog, pseudonymize: Pseudonymizer) -> pl.Series:
    """Item ids (or lists of them) -> pseudonyms from the catalog; a column holding an id the
    catalog lacks (a logged visible item) is hashed instead."""
    if isinstance(values.dtype, pl.List):
        return _per_element(values, lambda flat: _item_keys(flat, catalog, pseudonymize))
    keys = catalog.keys.gather(catalog.index(values))
    if keys.null_count() != values.null_count():
        return pseudonymize.column(values, "item")
    return keys.alias(values.name)


def _hashed(values: pl.Series, kind: str, settings: IngestSettings, pseudonymize: Pseudonymizer) -> pl.Series:
    """Ids that hardly repeat (item ids, image refs) hashed straight through: the keys of
    ``pseudonymize.column`` without its per-distinct lookups, which cost more than the hash here.
    A column whose head repeats (e.g. one placeholder image everywhere) goes per distinct value."""
    head = values.head(REPEAT_PROBE_ROWS)
    if head.n_unique() * 2 < head.len():
        return pseudonymize.column(values, kind)
    hexes = keyed_hex(values, settings.rekey_key.encode("utf-8"), kind)
    return (f"{PREFIXES[kind]}_" + hexes).alias(values.name)


def pseudonyms(
    frame: pl.DataFrame,
    settings: IngestSettings,
    pseudonymize: Pseudonymizer,
    catalog: Catalog | None = None,
    done: tuple[str, ...] = (),
) -> pl.DataFrame:
    """Every raw id column but ``done`` re-keyed: item ids from the ``catalog`` where given (hashed
    once per run), the rest hashed here (image refs and the catalog's own ids do not repeat)."""
    keyed = [
        _item_keys(frame[c], catalog, pseudonymize)
        if kind == "item" and catalog is not None
        else _hashed(frame[c], kind, settings, pseudonymize)
        for c, kind in _id_columns(settings).items()
        if c in frame.columns and c not in done
    ]
    return frame.with_columns(keyed)


def _visible_keys(steps: pl.DataFrame, catalog: Catalog, pseudonymize: Pseudonymizer) -> pl.Series:
    """Pseudonyms of ``visible_items``: lists computed from the layout map through the cards' own
    catalog rows (``_visible_item``), no lookup; logged lists are looked up."""
    if (steps["visible_source"] == "logged").any():
        return _item_keys(steps["visible_items"], catalog, pseudonymize)
    rows = steps.select(pl.when(pl.col("screen") == "feed").then(pl.col("_visible_item"))).to_series()
    return _per_element(rows, lambda flat: catalog.keys.gather(flat)).alias("visible_items")


def _views(part: Part, ctx: Context, pseudonymize: Pseudonymizer) -> pl.DataFrame:
    """Per page view of the part: its pseudonym, and its user's pseudonym, split and bucket."""
    views = part.sessions.select("session_id", "user_id").join(ctx.users, on="user_id", how="left")
    return views.with_columns(pseudonymize.column(views["session_id"], "session").alias("_session"))


def _with_view_columns(layout: pl.DataFrame, views: pl.DataFrame) -> pl.DataFrame:
    """``views``' columns on every card of the view. ``layouts`` keeps each view's cards together
    with its rank-0 card first, so the view of card k is a run number: a gather, not a join."""
    first_cards = layout.filter(pl.col("rank") == 0).select("session_id")
    per_view = first_cards.join(views, on="session_id", how="left", maintain_order="left")
    runs = layout.select(pl.col("_pv").rle_id()).to_series()
    if runs.len() and (runs[-1] + 1 != per_view.height or per_view["_session"].null_count()):
        raise AssertionError("feed layout rows are not grouped by page view, one session each")
    return pl.concat([layout.drop("session_id"), per_view.gather(runs)], how="horizontal")


def key_part(part: Part, ctx: Context, pseudonymize: Pseudonymizer) -> dict[str, pl.DataFrame]:
    """The part's lake rows: pseudonyms, split and bucket (sessions keyed once per page view, then
    joined; feed cards through their integer view number ``_pv``)."""
    views = _views(part, ctx, pseudonymize)
    layout = _with_view_columns(part.layout, views)
    layout = layout.with_columns(ctx.catalog.keys.gather(layout["_item"]).alias("item_id"))
    by_view = {"how": "left", "maintain_order": "left", "on": "session_id"}
    steps = part.steps.drop("user_id").join(views, **by_view)
    keys = ctx.catalog.keys  # target and open item: pseudonyms by their catalog rows
    targets = keys.gather(steps.select(pl.when(pl.col("action") == "click").then("_item")).to_series())
    tables = {
        "steps": steps.with_columns(
            _visible_keys(steps, ctx.catalog, pseudonymize),
            targets.alias("target_item_id"),
            keys.gather(steps["_open_item"]).alias("ipv_item_id"),
        ),
        "feed_layouts": layout,
        "sessions": part.sessions.drop("user_id").join(views, **by_view),
    }
    keyed_ids = [pl.col("_session").alias("session_id"), pl.col("_user").alias("user_id")]
    return {
        name: pseudonyms(
            _outputs(frame.with_columns(keyed_ids), name),
            ctx.settings,
            pseudonymize,
            ctx.catalog,
            ("session_id", "user_id", "item_id", "visible_items", "target_item_id", "ipv_item_id"),
        )
        for name, frame in tables.items()
    }


def _write_part(part: Part, ctx: Context, pseudonymize: Pseudonymizer, run: Run, number: int) -> None:
    for name, frame in key_part(part, ctx, pseudonymize).items():
        run.tables[name].add(frame, number)


# --- the run ----------------------------------------------------------------------


class Run:
    """The staged lake tables, the spill and the writer thread of one ingest: the tables are
    committed together, or all of it is discarded."""

    def __init__(self, lake: Path, zstd_level: int) -> None:
        self.lake, self.zstd_level = lake, zstd_level
        self.spill = lake / STAGING / f"spill-{uuid.uuid4().hex[:8]}"
        self.tables = {name: StagedTable(lake, name, zstd_level=zstd_level) for name in WRITE_ORDER}
        self.writer = Writer()

    def write(self, name: str, frame: pl.DataFrame, part: int = 0) -> None:
        """Add ``frame`` to the staged table ``name`` in the writer thread."""
        self.writer.submit(self.tables[name].add, frame, part)

    def commit(self, quarantine: pl.DataFrame) -> dict[str, str]:
        self.writer.wait()
        paths = {name: str(self.tables[name].commit()) for name in WRITE_ORDER}
        paths["quarantine"] = str(
            write_quarantine(self.lake, "ingest", quarantine, zstd_level=self.zstd_level)
        )
        return paths

    def discard(self) -> None:
        self.writer.close()
        for staged in self.tables.values():
            staged.discard()
        shutil.rmtree(self.spill, ignore_errors=True)


def _checked_history(history: pl.DataFrame, pseudonymize: Pseudonymizer) -> align.Checked:
    rows, bad = align.split_by_reason(
        history,
        pl.when(~pl.col("kind").is_in(HISTORY_KINDS)).then(pl.lit("unknown_history_kind")),
        "history",
        pl.lit("history kind must be click or buy"),
        pseudonymize,
    )
    return align.Checked(rows, [bad])


def _assignment(users: pl.Series, pseudonymize: Pseudonymizer, settings: IngestSettings) -> pl.DataFrame:
    """user_id (raw) -> _user (pseudonym), split, bucket; both derive from the pseudonym alone."""
    keys = pseudonymize.mapping(users, "user")
    return keys.select(
        pl.col("raw").alias("user_id"),
        pl.col("key").alias("_user"),
        split_of(keys["key"], settings.split_seed, settings.split_ratios),
        bucket_of(keys["key"], settings.buckets),
    )


def _profile_flags(candidates: list[pl.DataFrame], pseudonymize: Pseudonymizer) -> pl.DataFrame:
    """One kept-and-flagged row per user whose profile is missing, at the user's first step."""
    rows = pl.concat(candidates, how="vertical_relaxed") if candidates else pl.DataFrame()
    if rows.height == 0:
        return empty_rejects()
    first = rows.sort("page_view_id").group_by("user_id", maintain_order=True).first()
    return reject_rows("events", first, "missing_profile", "kept with an empty profile", pseudonymize)


def _quarantine(rejects: list[pl.DataFrame], flags: list[pl.DataFrame]) -> pl.DataFrame:
    return pl.concat(
        [
            _concat(rejects).with_columns(pl.lit(False).alias("kept")),
            _concat(flags).with_columns(pl.lit(True).alias("kept")),
        ],
        how="vertical_relaxed",
    ).sort("table", "source_file", "source_row", "reason", nulls_last=True)


def _count(
    reads: dict[str, TableRead],
    rows_out: dict[str, int],
    quarantine: pl.DataFrame,
    duplicates: dict[str, int],
    dropped: dict[str, int],
) -> dict[str, TableCount]:
    per_table = quarantine.group_by("table", "kept").len()
    lookup = {(t, k): n for t, k, n in per_table.iter_rows()}
    counts = {
        name: TableCount(
            rows_in=reads[name].rows_in,
            rows_out=rows_out[OUTPUT_OF[name]],
            quarantined=lookup.get((name, False), 0),
            duplicates=duplicates[name] + reads[name].merged,
            flagged=lookup.get((name, True), 0),
            dropped=dropped[name],
        )
        for name in OUTPUT_OF
    }
    broken = {name: c for name, c in counts.items() if not c.balanced}
    if broken:
        raise AccountingError(f"rows in != rows out + quarantined + duplicates + dropped for {broken}")
    return counts


def _silent(phase: str) -> None:
    return None


def _read(
    raw: str | Path, source_format: str, settings: IngestSettings, pseudonymize: Pseudonymizer, run: Run
) -> tuple[Raw, dict[str, int]]:
    if source_format == "userarena":
        tables, notes, cuts = read_userarena(
            raw,
            settings.timestamp_unit,
            pseudonymize,
            on_bad_event=settings.on_bad_event,
            card_height=settings.geometry.default_card_height,
            action_map=settings.action_map,
        )
        source = from_tables(tables, settings, run)
        source.cuts = cuts
        return source, notes
    if source_format == "bundle":
        return read_pass(check_bundle(raw), settings, pseudonymize, run), {}
    raise ValueError(f"unknown source format {source_format!r}: expected bundle or userarena")


@dataclass
class Totals:
    """What the run gathers beside the lake rows: quarantine rows, flags, merged duplicates."""

    rejects: list[pl.DataFrame] = field(default_factory=list)
    flags: list[pl.DataFrame] = field(default_factory=list)
    no_profile: list[pl.DataFrame] = field(default_factory=list)
    duplicates: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTPUT_OF, 0))
    dropped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTPUT_OF, 0))


def prepare(
    source: Raw, settings: IngestSettings, pseudonymize: Pseudonymizer, run: Run, totals: Totals
) -> Context:
    """Everything the parts share: users' pseudonyms and splits (profiles and history written),
    the catalog (items written), duplicate event ids settled. Small writes are queued first, so the
    writer thread's longer jobs (writing the items) never hold this thread up."""
    profiles = align.check_profiles(source.table("profiles"), pseudonymize)
    history = _checked_history(source.table("history"), pseudonymize)
    users = _assignment(pl.concat([*source.users, profiles.rows["user_id"]]).unique(), pseudonymize, settings)
    run.write("profiles", _profiles_out(profiles.rows, users, pseudonymize))
    run.write("history", _history_out(history.rows, pseudonymize, settings))
    catalog, rejects, totals.duplicates["items"] = items_pass(source, settings, pseudonymize, run)
    events = settle(
        source.id_hashes["events"],
        lambda: [
            align.map_actions(source.spill.read("events", p, release=False), settings.action_map)
            for p in range(source.parts)
        ],
        "event_id",
        lambda rows: align.dedupe_events(rows, pseudonymize),
    )
    totals.rejects += [*rejects, *profiles.rejects, *history.rejects, *events.rejects]
    totals.duplicates["profiles"], totals.duplicates["events"] = profiles.duplicates, events.duplicates
    max_ts = pl.lit(datetime.now(UTC) + timedelta(days=1)).dt.cast_time_unit("ms")
    profile_context = align.profile_context(profiles.rows)
    return Context(settings, catalog, profile_context, users, max_ts, events, source.cuts)


def _history_out(
    history: pl.DataFrame, pseudonymize: Pseudonymizer, settings: IngestSettings
) -> pl.DataFrame:
    """Pre-window history with its user's split (from the pseudonym, so also for users without events)."""
    users = _assignment(history["user_id"].unique(), pseudonymize, settings)
    splits = users.select(pl.col("_user").alias("user_id"), "split")
    keyed = pseudonymize(history.drop(_helpers(history)))
    return keyed.join(splits, on="user_id", how="left", maintain_order="left")


def _profiles_out(profiles: pl.DataFrame, users: pl.DataFrame, pseudonymize: Pseudonymizer) -> pl.DataFrame:
    splits = users.select(pl.col("_user").alias("user_id"), "split")
    keyed = pseudonymize(profiles.drop(_helpers(profiles)))
    return align.profile_columns(keyed).join(splits, on="user_id", how="left")


def align_parts(source: Raw, ctx: Context, run: Run, totals: Totals) -> None:
    """Pass 2: ``ALIGN_THREADS`` parts align at once; their outputs are keyed and written in part
    order while the next ones align."""

    def aligned(p: int) -> tuple[Part, Pseudonymizer]:
        keys = Pseudonymizer(ctx.settings.rekey_key, ctx.settings.keep_image_refs)  # the part's own ids
        events, feeds = source.spill.read("events", p), source.feeds(p)
        return align_part(events, feeds, ctx, keys, source.marks(p)), keys

    with ThreadPoolExecutor(max_workers=ALIGN_THREADS, thread_name_prefix="ingest-align") as pool:
        running = deque(pool.submit(aligned, p) for p in range(min(ALIGN_THREADS, source.parts)))
        for p in range(source.parts):
            part, keys = running.popleft().result()
            if p + ALIGN_THREADS < source.parts:
                running.append(pool.submit(aligned, p + ALIGN_THREADS))
            totals.rejects += part.rejects
            totals.flags += part.flags
            totals.no_profile.append(part.no_profile)
            totals.duplicates["feeds"] += part.feed_duplicates
            totals.dropped["events"] += part.dropped_events
            run.writer.submit(_write_part, part, ctx, keys, run, p)


def ingest_bundle(
    raw: str | Path,
    lake: str | Path,
    settings: IngestSettings | None = None,
    progress: Callable[[str], None] = _silent,
    source_format: str = "bundle",
    staging: str | Path | None = None,
) -> IngestResult:
    """Read ``raw``, align, and (re)write the lake tables atomically. Idempotent.

    ``source_format`` is ``bundle`` (a raw log bundle folder) or ``userarena``
    (release JSONL). ``progress`` is called with the name of each phase as it starts.
    ``staging``: a lake-shaped folder (``transforms.lake.Staging``) that receives the tables
    instead of the lake, so they can be validated before they replace the lake's; the
    reported paths are still the lake's.
    """
    started = time.perf_counter()
    settings = settings or IngestSettings()
    pseudonymize = Pseudonymizer(settings.rekey_key, settings.keep_image_refs)
    out = Path(staging) if staging is not None else Path(lake)
    run, totals = Run(out, settings.zstd_level), Totals()
    try:
        progress("read")
        source, notes = _read(raw, source_format, settings, pseudonymize, run)
        progress("items")
        ctx = prepare(source, settings, pseudonymize, run, totals)
        progress("align")
        align_parts(source, ctx, run, totals)
        progress("write")
        totals.flags.append(_profile_flags(totals.no_profile, pseudonymize))
        quarantine = _quarantine([*source.rejects, *totals.rejects], totals.flags)
        run.writer.wait()
        output_rows = {name: run.tables[name].rows for name in WRITE_ORDER}
        counts = _count(source.reads, output_rows, quarantine, totals.duplicates, totals.dropped)
        paths = run.commit(quarantine)
    finally:
        run.discard()
    reasons = quarantine.group_by("kept", "reason").len().sort("reason")
    return IngestResult(
        lake=str(lake),
        raw=str(raw),
        counts=counts,
        quarantine_by_reason={r: n for k, r, n in reasons.iter_rows() if not k},
        flagged_by_reason={r: n for k, r, n in reasons.iter_rows() if k},
        output_rows=output_rows,
        paths={name: str(Path(lake) / Path(path).relative_to(out)) for name, path in paths.items()},
        naive_timestamps=sum(t.naive_timestamps for t in source.reads.values()),
        notes=notes,
        wall_seconds=round(time.perf_counter() - started, 3),
        settings=json.loads(settings.model_dump_json(exclude={"rekey_key"})),
    )


def _helpers(frame: pl.DataFrame) -> list[str]:
    """Locator and helper columns, never part of an output."""
    return [c for c in frame.columns if c.startswith("_")]
