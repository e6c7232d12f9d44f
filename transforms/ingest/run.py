"""The I/O runner: the staged tables, the context the parts share, the parts aligned two at a time and
written in order, the accounting, and the commit (or nothing left behind)."""

from __future__ import annotations

import json
import shutil
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl

from transforms import align
from transforms.config import IngestSettings
from transforms.ingest.accounting import (
    IngestResult,
    Totals,
    count_rows,
    ingest_quarantine,
    ingest_result,
    profile_flags,
)
from transforms.ingest.alignment import (
    NAMING_COLUMNS,
    Context,
    Part,
    align_part,
    by_user_hash,
    checked_history,
    for_part,
    part_names,
)
from transforms.ingest.chunks import spill_part_rows
from transforms.ingest.duplicate_ids import settle
from transforms.ingest.item_index import ItemIndex, items_pass
from transforms.ingest.item_shards import ItemShards, PartNames, ShardPieces
from transforms.ingest.keying import history_rows, key_part, profile_rows, user_assignment
from transforms.ingest.landed import LandedWriter, bundle_files, commit_landed, landed_dir, view_buckets
from transforms.ingest.lookups_ahead import LookupsAhead, group_size
from transforms.ingest.new_files import NewFiles, ingest_new_files, plan_new_files
from transforms.ingest.part_tasks import AlignMap, PartOutcome, forget_context, part_jobs
from transforms.ingest.parts import Raw, from_tables, read_pass
from transforms.ingest.writer import Writer
from transforms.lake import STAGING, StagedTable, write_quarantine
from transforms.readers import check_bundle
from transforms.rekey import Pseudonymizer
from transforms.userarena import read_userarena

ALIGN_THREADS = 2  # parts aligned at once
HISTORY_ROWS = 1 << 20  # history rows checked, keyed and written at a time


WRITE_ORDER = ("steps", "feed_layouts", "items", "profiles", "history", "sessions")


def write_keyed_part(
    part: Part, ctx: Context, pseudonymize: Pseudonymizer, run: StagedRun, number: int
) -> None:
    for name, frame in key_part(part, ctx, pseudonymize).items():
        run.tables[name].add(frame, number)


class StagedRun:
    """The staged lake tables, the spill and the writer thread of one ingest: the tables are
    committed together, or all of it is discarded."""

    def __init__(self, lake: Path, zstd_level: int, landed: LandedWriter | None = None) -> None:
        self.lake, self.zstd_level, self.landed = lake, zstd_level, landed
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
        if self.landed is not None:
            self.landed.discard()


def _silent(phase: str) -> None:
    return None


def read_source(
    raw: str | Path, source_format: str, settings: IngestSettings, pseudonymize: Pseudonymizer, run: StagedRun
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


def shared_context(
    source: Raw,
    settings: IngestSettings,
    pseudonymize: Pseudonymizer,
    run: StagedRun,
    totals: Totals,
    item_index: ItemIndex | None = None,
) -> Context:
    """Everything the parts share: users' pseudonyms and splits (profiles and history written),
    the item index (items written; ``item_index``: an earlier run's, the items left as they are;
    in shards on disk where the bundle is read in several parts), duplicate event ids settled.
    Small writes are queued first, so the writer thread's longer jobs (writing the items) never
    hold this thread up."""
    land = run.landed is not None and item_index is None  # a full run lands them; a new day its own
    raw_profiles = source.take("profiles")
    profiles = align.check_profiles(raw_profiles, pseudonymize)
    seen, source.users = source.users, []  # handed over: the assignment below is what the parts use
    users = user_assignment(pl.concat([*seen, profiles.rows["user_id"]]).unique(), pseudonymize, settings)
    del seen
    run.write("profiles", profile_rows(profiles.rows, users, pseudonymize))
    if land:
        run.writer.submit(run.landed.add_whole, "profiles", raw_profiles)
    history_rejects = write_history(source.history(), pseudonymize, settings, run, land)
    rejects: list[pl.DataFrame] = []
    if item_index is None:
        shards = ShardPieces(run.spill / "item_shards") if source.parts > 1 else None
        item_index, rejects, totals.duplicates["items"] = items_pass(
            source, settings, pseudonymize, run, shards
        )
        if run.landed is not None:
            run.writer.submit(run.landed.save_index, item_index)
    events = settle(
        source.event_hashes.by_range(),
        lambda: [
            align.map_actions(source.spill.read("events", p, release=False), settings.action_map)
            for p in range(source.parts)
        ],
        "event_id",
        lambda rows: align.dedupe_events(rows, pseudonymize),
    )
    totals.rejects += [*rejects, *profiles.rejects, *history_rejects, *events.rejects]
    totals.duplicates["profiles"], totals.duplicates["events"] = profiles.duplicates, events.duplicates
    max_ts = pl.lit(datetime.now(UTC) + timedelta(days=1)).dt.cast_time_unit("ms")
    profile_context = by_user_hash(align.profile_context(profiles.rows))
    return Context(settings, item_index, profile_context, by_user_hash(users), max_ts, events, source.cuts)


def write_history(
    history: Iterable[pl.DataFrame],
    pseudonymize: Pseudonymizer,
    settings: IngestSettings,
    run: StagedRun,
    land: bool,
) -> list[pl.DataFrame]:
    """History checked, keyed and written (and, ``land``, landed) ``HISTORY_ROWS`` rows at a time, so
    its copies stay a slice's size (history grows with the shoppers); returns its rejects."""
    rejects, part = [], 0
    for frame in history:
        for start in range(0, max(frame.height, 1), HISTORY_ROWS):
            rows = frame.slice(start, HISTORY_ROWS)
            checked = checked_history(rows, pseudonymize)
            rejects += checked.rejects
            run.write("history", history_rows(checked.rows, pseudonymize, settings), part)
            if land:
                run.writer.submit(run.landed.add_whole, "history", rows)
            part += 1
    return rejects


def align_parts(
    source: Raw,
    ctx: Context,
    run: StagedRun,
    totals: Totals,
    land: bool = True,
    map_parts: AlignMap | None = None,
) -> None:
    """Pass 2: ``ALIGN_THREADS`` parts align at once; their outputs are keyed and written in part
    order while the next ones align. ``land``: the parts' raw rows are landed (``run.landed``).
    ``map_parts``: a bundle read in several parts aligns each in a task of its own (``part_tasks``),
    run wherever ``map_parts`` runs its tasks."""
    land = land and run.landed is not None
    if map_parts is not None and source.parts > 1:
        _align_in_tasks(source, ctx, run, totals, land, map_parts)
        return

    ahead = _grouped_lookups(source, ctx, run.spill / "lookups")

    def aligned(p: int) -> tuple[Part, Context, Pseudonymizer]:
        keys = Pseudonymizer(ctx.settings.rekey_key, ctx.settings.keep_image_refs)  # the part's own ids
        events, feeds, marks = source.spill.read("events", p), source.feeds(p), source.marks(p)
        part_ctx = for_part(ctx, events, feeds, None if ahead is None else ahead.index(p))
        if land:
            buckets = view_buckets(events, part_ctx.users)
            run.writer.submit(run.landed.add_views, events, feeds, marks, buckets)
        return align_part(events, feeds, part_ctx, keys, marks), part_ctx, keys

    try:
        with ThreadPoolExecutor(max_workers=ALIGN_THREADS, thread_name_prefix="ingest-align") as pool:
            running = deque(pool.submit(aligned, p) for p in range(min(ALIGN_THREADS, source.parts)))
            for p in range(source.parts):
                part, part_ctx, keys = running.popleft().result()
                if p + ALIGN_THREADS < source.parts:
                    running.append(pool.submit(aligned, p + ALIGN_THREADS))
                _gather(totals, part)
                run.writer.submit(write_keyed_part, part, part_ctx, keys, run, p)
    finally:
        if ahead is not None:
            ahead.close()


def _grouped_lookups(source: Raw, ctx: Context, folder: Path) -> LookupsAhead | None:
    """The parts' item lookups made a group at a time (``LookupsAhead``) where the index lies in
    shards large enough for a group to pay (``group_size``) and the parts' rows lie on disk, where
    their ids can be read ahead of the part (rows held in memory are handed over to their part,
    never read before it)."""
    on_disk = source.spill.on_disk
    feeds_ahead = source.feeds_in_place is not None or "feeds" in on_disk
    if not isinstance(ctx.item_index, ItemShards) or "events" not in on_disk or not feeds_ahead:
        return None
    group = group_size(ctx.item_index, spill_part_rows(ctx.settings))
    if group < 2:
        return None

    def names(part: int) -> PartNames:
        return part_names(source.spill.columns("events", part, NAMING_COLUMNS), source.feed_item_ids(part))

    return LookupsAhead(ctx.item_index, names, source.parts, group, folder)


def _gather(totals: Totals, part: Part | PartOutcome) -> None:
    """What the run counts of an aligned part, in part order."""
    totals.rejects += part.rejects
    totals.flags += part.flags
    totals.no_profile.append(part.no_profile)
    totals.duplicates["feeds"] += part.feed_duplicates
    totals.dropped["events"] += part.dropped_events


def _align_in_tasks(
    source: Raw, ctx: Context, run: StagedRun, totals: Totals, land: bool, map_parts: AlignMap
) -> None:
    """Pass 2 as one task per part: the context and the parts' rows written to the spill, then mapped."""
    jobs = part_jobs(source, ctx, run.tables, run.landed if land else None, run.spill / "tasks")
    try:
        outcomes = map_parts(jobs)
    finally:
        forget_context(jobs[0].context)
    for outcome in outcomes:
        _gather(totals, outcome)
        for name, rows in outcome.rows.items():
            run.tables[name].rows += rows


def land(
    run: StagedRun,
    files: dict[str, str],
    settings: IngestSettings,
    lake: str | Path,
    staging: str | Path | None,
) -> dict[str, str]:
    """Seal the run's landed rows; swap them in now when the tables went straight into the lake, else
    leave them staged (``landed_staged``) for the caller to commit after its own swap."""
    sealed = run.landed.seal(files, settings)
    if staging is None:
        commit_landed(sealed, lake)
        return {}
    return {"landed_staged": str(sealed)}


def ingest_bundle(
    raw: str | Path,
    lake: str | Path,
    settings: IngestSettings | None = None,
    progress: Callable[[str], None] = _silent,
    source_format: str = "bundle",
    staging: str | Path | None = None,
    new_files_only: bool = True,
    map_parts: AlignMap | None = None,
) -> IngestResult:
    """Read ``raw``, align, and (re)write the lake tables atomically. Idempotent.

    A bundle that has only grown by new files since the lake's last ingest is ingested from those
    files (``new_files``; ``new_files_only`` False reads the whole bundle all the same).

    ``source_format`` is ``bundle`` (a raw log bundle folder) or ``userarena``
    (release JSONL). ``progress`` is called with the name of each phase as it starts.
    ``staging``: a lake-shaped folder (``transforms.lake.Staging``) that receives the tables
    instead of the lake, so they can be validated before they replace the lake's; the
    reported paths are still the lake's, and the landed rows wait beside the lake
    (``increment["landed_staged"]``) for ``landed.commit_landed`` after that swap.
    ``map_parts``: a bundle read in several parts aligns each in a task of its own, run wherever
    ``map_parts`` runs them (``part_tasks``); the lake is the same.
    """
    started = time.perf_counter()
    settings = settings or IngestSettings()
    pseudonymize = Pseudonymizer(settings.rekey_key, settings.keep_image_refs)
    out = Path(staging) if staging is not None else Path(lake)
    landing = settings.keep_landed and source_format == "bundle"
    plan = plan_new_files(raw, lake, settings) if landing and new_files_only else "asked to read all"
    run = StagedRun(out, settings.zstd_level, LandedWriter(lake, settings.zstd_level) if landing else None)
    totals, increment = Totals(), {}
    try:
        if isinstance(plan, NewFiles):
            return ingest_new_files(raw, lake, out, settings, plan, run, progress)
        progress("read")
        source, notes = read_source(raw, source_format, settings, pseudonymize, run)
        progress("items")
        ctx = shared_context(source, settings, pseudonymize, run, totals)
        progress("align")
        align_parts(source, ctx, run, totals, map_parts=map_parts)
        progress("write")
        totals.flags.append(profile_flags(totals.no_profile, pseudonymize))
        quarantine = ingest_quarantine([*source.rejects, *totals.rejects], totals.flags)
        run.writer.wait()
        output_rows = {name: run.tables[name].rows for name in WRITE_ORDER}
        counts = count_rows(source.reads, output_rows, quarantine, totals.duplicates, totals.dropped)
        paths = run.commit(quarantine)
        if landing:
            increment = land(run, bundle_files(check_bundle(raw)), settings, lake, staging) | {
                "whole_bundle": plan
            }
        elif staging is None:  # rows landed by an earlier ingest would describe another lake
            shutil.rmtree(landed_dir(lake), ignore_errors=True)
    finally:
        run.discard()
    return ingest_result(
        raw, lake, out, counts=counts, quarantine=quarantine, output_rows=output_rows, paths=paths,
        reads=source.reads, seconds=time.perf_counter() - started, notes=notes, increment=increment,
        settings=json.loads(settings.model_dump_json(exclude={"rekey_key"})),
    )  # fmt: skip
