"""Pass 2 as one task per part, for a task runner that runs parts side by side in other processes
(the flows' Ray or local workers, ``AlignMap``).

The run's process writes what every part shares (``save_context``: the item index, or where its
shards lie, the users' pseudonyms, the profiles, the settled duplicate events, the sessions a reader
cut) and each part's typed rows (``PartJob``: Parquet files, the spill's own where it already lies
on disk) under the run's spill folder; a task reads them (``align_part_job``), aligns and keys the
part exactly as the one-process pass 2 does, writes its rows into the staged tables as
``part-<p>.parquet`` and lands its raw rows, and hands back only what the run counts
(``PartOutcome``). The lake is the one-process run's, file for file, and a task run again (a retry)
writes the same files again; the tasks need the spill folder at the same path (a shared filesystem).
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from transforms.config import IngestSettings
from transforms.ingest.alignment import Context, align_part, for_part
from transforms.ingest.duplicate_ids import Settled
from transforms.ingest.item_index import ItemIndex, load_index, save_index
from transforms.ingest.item_shards import ItemShards
from transforms.ingest.keying import key_part
from transforms.ingest.landed import LandedWriter, view_buckets
from transforms.ingest.parts import _write_spill
from transforms.lake import StagedTable
from transforms.readers import empty_typed, no_event_marks
from transforms.rekey import Pseudonymizer

if TYPE_CHECKING:
    from transforms.ingest.parts import Raw

#: a part's lake tables (the others are written once by the run)
PART_TABLES = ("steps", "feed_layouts", "sessions")
CONTEXT_FRAMES = ("profiles", "users", "source_cuts", "settled_events")


@dataclass(frozen=True)
class PartJob:
    """One part's pass 2: where its typed rows and the shared context lie, where its rows go."""

    part: int
    events: tuple[str, ...]  # Parquet files of the part's typed events rows
    feeds: tuple[str, ...]
    marks: tuple[str, ...]  # where the events rows the reader rejected stood
    context: str  # the folder ``save_context`` wrote
    settings: IngestSettings
    tables: dict[str, StagedTable]  # PART_TABLES, staged by the run
    landed: LandedWriter | None  # the run's (None: the part's raw rows are not landed)


@dataclass
class PartOutcome:
    """What the run gathers from a part: ``alignment.Part`` less its lake rows, and the rows written."""

    rejects: list[pl.DataFrame]
    flags: list[pl.DataFrame]
    no_profile: pl.DataFrame
    feed_duplicates: int
    dropped_events: int
    rows: dict[str, int]


#: runs ``align_part_job`` for every job, wherever it runs parts, and returns the outcomes in the jobs' order
AlignMap = Callable[[list[PartJob]], list[PartOutcome]]


def save_context(ctx: Context, folder: Path) -> None:
    """Everything ``Context`` holds but the settings (which travel with each job), as files; an item
    index in shards stays where it lies (under the run's spill), named in ``context.json``."""
    folder.mkdir(parents=True, exist_ok=True)
    shards = ctx.item_index if isinstance(ctx.item_index, ItemShards) else None
    if shards is None:
        save_index(ctx.item_index, folder)
    frames = {
        "profiles": ctx.profiles,
        "users": ctx.users,
        "source_cuts": ctx.source_cuts,
        "settled_events": ctx.events.dropped,
    }
    for name, frame in frames.items():
        frame.write_parquet(folder / f"{name}.parquet", compression="uncompressed")
    max_ts = pl.select(ctx.max_ts).item()
    meta = {"max_ts": max_ts.isoformat(), "item_shards": None if shards is None else str(shards.folder)}
    (folder / "context.json").write_text(json.dumps(meta) + "\n")


_loaded: dict[str, tuple[ItemIndex | ItemShards, dict[str, pl.DataFrame], datetime]] = {}
_loading = threading.Lock()


def load_context(folder: str, settings: IngestSettings) -> Context:
    """The context ``save_context`` wrote. A process keeps the last one it read: the parts of a run it
    aligns share it, and the next run's replaces it."""
    with _loading:
        if folder not in _loaded:
            _loaded.clear()
            root = Path(folder)
            frames = {name: pl.read_parquet(root / f"{name}.parquet") for name in CONTEXT_FRAMES}
            meta = json.loads((root / "context.json").read_text())
            shards = meta.get("item_shards")
            index = load_index(root) if shards is None else ItemShards.open(shards)
            _loaded[folder] = (index, frames, datetime.fromisoformat(meta["max_ts"]))
        index, frames, max_ts = _loaded[folder]
    return Context(
        settings=settings,
        item_index=index,
        profiles=frames["profiles"],
        users=frames["users"],
        max_ts=pl.lit(max_ts).dt.cast_time_unit("ms"),
        events=Settled(frames["settled_events"], [], 0),
        source_cuts=frames["source_cuts"],
    )


def forget_context(folder: str) -> None:
    """Drop the context of ``folder`` from this process (the run's, once its parts are done)."""
    with _loading:
        _loaded.pop(folder, None)


def _read(files: tuple[str, ...], empty: pl.DataFrame) -> pl.DataFrame:
    return pl.read_parquet(list(files), hive_partitioning=False).rechunk() if files else empty


def align_part_job(job: PartJob) -> PartOutcome:
    """One part aligned, keyed and written, its raw rows landed: the map step of a spread pass 2."""
    events, feeds = _read(job.events, empty_typed("events")), _read(job.feeds, empty_typed("feeds"))
    ctx = for_part(load_context(job.context, job.settings), events, feeds)
    marks = _read(job.marks, no_event_marks())
    if job.landed is not None:  # files named for the part: a retried task writes the same ones again
        job.landed.for_part(job.part).add_views(events, feeds, marks, view_buckets(events, ctx.users))
    keys = Pseudonymizer(job.settings.rekey_key, job.settings.keep_image_refs)  # the part's own ids
    part = align_part(events, feeds, ctx, keys, marks)
    rows = {}
    for name, frame in key_part(part, ctx, keys).items():
        job.tables[name].add(frame, job.part)
        rows[name] = frame.height
    return PartOutcome(
        part.rejects, part.flags, part.no_profile, part.feed_duplicates, part.dropped_events, rows
    )


def _spilled_files(source: Raw, table: str, part: int) -> tuple[str, ...] | None:
    """The spill's own files of (table, part), where the spill keeps that table on disk."""
    if table not in source.spill.on_disk:
        return None
    return tuple(str(p) for p in sorted((source.spill.folder / table / f"part={part}").glob("*.parquet")))


def _written(frame: pl.DataFrame, path: Path) -> tuple[str, ...]:
    """``frame`` written as the spill writes its files (none when it is empty)."""
    if frame.height == 0:
        return ()
    _write_spill([(frame, path)])
    return (str(path),)


def part_rows(source: Raw, part: int, folder: Path) -> tuple[tuple[str, ...], ...]:
    """(events, feeds, marks) files of ``part``: the spill's where it lies on disk, else written under
    ``folder`` (rows in memory, or feeds read in place: taken here, in part order, and counted)."""
    here = folder / f"part={part}"
    events = _spilled_files(source, "events", part)
    if events is None:
        events = _written(source.spill.read("events", part), here / "events.parquet")
    feeds = _spilled_files(source, "feeds", part)
    if feeds is None:
        feeds = _written(source.feeds(part), here / "feeds.parquet")
    return events, feeds, _written(source.marks(part), here / "marks.parquet")


def part_jobs(
    source: Raw, ctx: Context, tables: dict[str, StagedTable], landed: LandedWriter | None, folder: Path
) -> list[PartJob]:
    """Every part's job, the context and the parts' rows written under ``folder``."""
    context = folder / "context"
    save_context(ctx, context)
    jobs = []
    for part in range(source.parts):
        events, feeds, marks = part_rows(source, part, folder / "rows")
        jobs.append(
            PartJob(
                part, events, feeds, marks, str(context), ctx.settings,
                {name: copy.copy(tables[name]) for name in PART_TABLES},  # counts of their own
                landed,
            )
        )  # fmt: skip
    return jobs
