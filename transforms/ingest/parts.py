"""Pass 1: the plan of parts, and the raw rows read, typed and kept or spilled by part."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from transforms import align
from transforms.config import IngestSettings
from transforms.ingest.chunks import TableReader, read_chunk_rows, spill_part_rows, stack_frames
from transforms.ingest.duplicate_ids import IdHashes
from transforms.ingest.feeds_in_place import FeedsInPlace
from transforms.ingest.hashes import ID_SEED, id_hash, part_of
from transforms.ingest.item_index import keyed_items
from transforms.ingest.writer import Writer
from transforms.readers import (
    TableRead,
    empty_rejects,
    empty_typed,
    estimated_rows,
    file_format,
    no_event_marks,
    raw_table_files,
)
from transforms.rekey import Pseudonymizer
from transforms.schemas import RAW_TABLES

if TYPE_CHECKING:
    from transforms.ingest.run import StagedRun

SPILL_BUFFER_BYTES = 256 * 2**20  # rows buffered before spilling: few, big files
# items left to pass 2 are read in smaller chunks than the rest: an item row (title, reviews, text)
# is several times an event's, and a few chunks are in flight at once (read ahead, keyed, written)
ITEM_CHUNK_SHARE = 2
MERGE_DISTINCT = 8  # chunks' distinct user ids (and named items) kept before they are merged


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
                batch.append((stack_frames(frames, table), path))
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
            return stack_frames([f.result() if isinstance(f, Future) else f for f in frames], table).rechunk()
        files = sorted((self.folder / table / f"part={part}").glob("*.parquet"))
        return pl.read_parquet(files).rechunk() if files else empty_typed(table)

    def columns(self, table: str, part: int, columns: tuple[str, ...]) -> pl.DataFrame:
        """``columns`` of an on-disk (table, part), read from the spill's files (after ``finish``)."""
        files = sorted((self.folder / table / f"part={part}").glob("*.parquet"))
        return pl.read_parquet(files, columns=list(columns)) if files else empty_typed(table).select(columns)

    def pieces(self, table: str, part: int) -> Iterator[pl.DataFrame]:
        """Rows of an on-disk (table, part) a spill file at a time, in the order they came (after
        ``finish``)."""
        for path in sorted((self.folder / table / f"part={part}").glob("*.parquet")):
            yield pl.read_parquet(path)


def _add_distinct(kept: list[pl.Series], values: pl.Series) -> None:
    """Add a chunk's distinct ``values`` to ``kept``, merged into one distinct Series every
    ``MERGE_DISTINCT`` chunks: each day's file names most of the shoppers and items again, so the
    chunks' lists alone would grow with the files, not with the shoppers."""
    kept.append(values)
    if len(kept) >= MERGE_DISTINCT:
        kept[:] = [pl.concat(kept).unique()]


def _write_spill(batch: list[tuple[pl.DataFrame, Path]]) -> None:
    # uncompressed: the spill is read back soon, from the page cache; a codec costs more CPU than
    # the disk saves (at 10x UserArena scale this ran faster than lz4 or zstd spills)
    for frame, path in batch:
        path.parent.mkdir(parents=True, exist_ok=True)
        frame.write_parquet(path, compression="uncompressed", statistics=False)


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
    event_hashes: IdHashes = field(default_factory=IdHashes)
    item_hashes: list[pl.Series] = field(default_factory=list)
    users: list[pl.Series] = field(default_factory=list)
    event_items: list[pl.Series] = field(default_factory=list)  # hashes of the items events name
    # set when the items make several chunks: pass 1 skips them, pass 2 reads (and counts) them, and
    # the duplicate check hashes their ids from the id column alone where it can (their text columns
    # are too large to keep in memory or to spill)
    deferred_items: TableReader | None = None
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
            self.item_hashes.append(frame.select(id_hash("item_id")).to_series())
            self.spill.add("items", self.item_chunks, frame)
            self.item_chunks += 1
        elif chunk.name in ("events", "feeds"):
            if chunk.name == "events":
                self.event_hashes.add(frame.select(id_hash("event_id")).to_series())
                _add_distinct(self.users, frame["user_id"].unique())
                _add_distinct(self.event_items, frame.select(id_hash("item_id").unique()).to_series())
            self._spill_parts(chunk.name, frame)
        elif chunk.name in self.spill.on_disk:  # history of a spilled bundle: one part, in order
            self.spill.add(chunk.name, 0, frame)
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
        part = part_of(self.parts)
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
        counts items left to pass 2 (``deferred_items``)."""
        if self.deferred_items is None:
            yield from (self.spill.read("items", n, release=release) for n in range(self.item_chunks))
            return
        for chunk in self.deferred_items.chunks():
            if count:
                self.count(chunk)
            if chunk.frame.width and chunk.frame.height:
                yield chunk.frame

    def feeds(self, part: int) -> pl.DataFrame:
        """The accepted feed rows of ``part``, in source order (pass 2)."""
        if self.feeds_in_place is None:
            return self.spill.read("feeds", part)
        return self.feeds_in_place.take(part, self.count)

    def feed_item_ids(self, part: int) -> pl.Series:
        """The ``item_id`` of ``part``'s feed rows, read alone from where they lie on disk (feeds read
        in place: every row of the part's range as the files hold it, the typed rows' ids and those
        of rows the typing rejects)."""
        if self.feeds_in_place is not None:
            return self.feeds_in_place.item_ids(part)
        return self.spill.columns("feeds", part, ("item_id",))["item_id"]

    def item_id_hashes(self) -> list[pl.Series]:
        """``id_hash`` of the item ids: of every accepted row, or (items left to pass 2) of every
        row, which only adds suspects that ``settle`` clears). Handed over: ``Raw`` keeps no copy."""
        if self.deferred_items is None:
            hashes, self.item_hashes = self.item_hashes, []
            return hashes
        return _item_id_column_hashes(self.deferred_items.root) or [
            frame.select(id_hash("item_id")).to_series() for frame in self.item_frames()
        ]

    def take(self, name: str) -> pl.DataFrame:
        """A small table, whole, handed over: ``Raw`` keeps no copy."""
        return stack_frames(self.small.pop(name, []), name)

    def history(self) -> Iterator[pl.DataFrame]:
        """The history rows in reading order, handed over: whole where they stayed in memory, else a
        spill file at a time (history grows with the shoppers)."""
        if "history" not in self.spill.on_disk:
            yield self.take("history")
            return
        none = True
        for frame in self.spill.pieces("history", 0):
            none = False
            yield frame
        if none:
            yield empty_typed("history")


def _plan(root: Path, settings: IngestSettings, pseudonymize: Pseudonymizer, run: StagedRun) -> Raw:
    """Parts from the bundle's size: 1 for small bundles, more for big ones; the parts of bundles
    beyond ``memory_rows`` are spilled to disk. Items of several chunks are left to pass 2."""
    per_part = spill_part_rows(settings)
    events = estimated_rows(root, "events")
    rows = events + estimated_rows(root, "feeds")
    parts = max(1, -(-rows // per_part))
    on_disk = {"events", "feeds", "history"} if parts > 1 and rows > settings.memory_rows else set()
    unit, chunk = settings.timestamp_unit, read_chunk_rows(settings)
    feeds = TableReader(root, ("feeds",), unit, pseudonymize, chunk)
    in_place = FeedsInPlace.plan(feeds, parts) if on_disk else None
    if in_place is not None:
        on_disk.discard("feeds")
    items = TableReader(root, ("items",), unit, pseudonymize, max(1, chunk // ITEM_CHUNK_SHARE))
    event_hashes = IdHashes.on_disk(run.spill / "event_hashes", events) if on_disk else IdHashes()
    return Raw(
        Spill(run.spill, on_disk, run.writer, _preparations(settings)),
        parts,
        event_hashes=event_hashes,
        deferred_items=items if estimated_rows(root, "items") > chunk else None,
        feeds_in_place=in_place,
    )


def _item_id_column_hashes(root: Path) -> list[pl.Series] | None:
    """``id_hash`` of every item row, from the id column alone: string ids pass the typing
    untouched, so these are the typed rows' hashes (plus those of rows the typing rejects). None
    unless every items file is Parquet with string ids: the full read hashes them then."""
    hashes = []
    for path in raw_table_files(root, "items"):
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


def read_pass(root: Path, settings: IngestSettings, pseudonymize: Pseudonymizer, run: StagedRun) -> Raw:
    """Pass 1 over a raw bundle folder: one chunk in memory at a time."""
    raw = _plan(root, settings, pseudonymize, run)
    for name in RAW_TABLES:
        raw.reads[name] = TableRead(name, pl.DataFrame(), empty_rejects(), 0)
    deferred = {"items"} if raw.deferred_items else set()
    deferred |= {"feeds"} if raw.feeds_in_place else set()
    tables = [t for t in RAW_TABLES if t not in deferred]
    reader = TableReader(
        root, tuple(tables), settings.timestamp_unit, pseudonymize, read_chunk_rows(settings)
    )
    for chunk in reader.chunks():
        raw.add(chunk)
    raw.spill.finish()
    return raw


def from_tables(tables: dict[str, TableRead], settings: IngestSettings, run: StagedRun) -> Raw:
    """An already-read bundle (the UserArena release) as one in-memory part."""
    raw = Raw(Spill(run.spill, set(), run.writer, _preparations(settings)), 1)
    for name in RAW_TABLES:
        raw.reads[name] = TableRead(name, pl.DataFrame(), empty_rejects(), 0)
        raw.add(tables[name])
    return raw


def _preparations(settings: IngestSettings) -> dict[str, Callable[[pl.DataFrame], pl.DataFrame]]:
    """What ``Spill`` adds to a table's in-memory chunks in the writer thread: the items' keyed ids."""
    return {"items": partial(keyed_items, settings=settings)}
