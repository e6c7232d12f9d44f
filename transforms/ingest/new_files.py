"""A bundle grown by new files (a day's ``events/part-YYYYMMDD``, new parts of feeds, profiles or
history), ingested from those files alone, with the landed rows (``landed``) of the users they touch.

What a new row can change lies within its user's page views, with three exceptions the plan follows:
an event id repeated in another user's rows (duplicates are settled together, so every user holding
a repeated id is done again), a page view whose rows name more than one user (its users go together),
and the profiles and history tables, small enough to be redone whole. The affected users' page views
are aligned as a full run would align them; every other user keeps their rows of ``steps``,
``sessions``, ``feed_layouts`` and the ingest's quarantine as they are, and the items stay as they
were. A new items file, changed or removed files, other settings or other code: the whole bundle is
read (``plan_new_files`` says why).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from transforms.config import IngestSettings
from transforms.files import link_tree
from transforms.fingerprints import code_version
from transforms.ingest.accounting import Totals, count_rows, ingest_quarantine, ingest_result, profile_flags
from transforms.ingest.chunks import TableReader, read_chunk_rows, stack_frames
from transforms.ingest.item_index import ItemIndex
from transforms.ingest.keying import user_assignment
from transforms.ingest.landed import (
    ORPHAN_BUCKET,
    Landed,
    bundle_files,
    settings_key,
    view_buckets,
)
from transforms.ingest.parts import Raw, Spill
from transforms.lake import quarantine_dir, read_lake_table, table_dir, table_files
from transforms.readers import TableRead, check_bundle, empty_rejects, no_event_marks
from transforms.rekey import Pseudonymizer
from transforms.schemas import LAKE_TABLES, RAW_TABLES

if TYPE_CHECKING:
    from transforms.ingest.accounting import IngestResult
    from transforms.ingest.run import StagedRun

#: tables whose new files are ingested on their own; a new items file means the whole bundle
GROWING = ("events", "feeds", "profiles", "history")
#: lake tables holding one user's (or one page view's) rows, kept for the users a new file leaves alone
PER_USER = ("steps", "sessions", "feed_layouts")
KEPT_PART = 1  # file number of the kept rows in a rewritten bucket (the new rows are part 0)


@dataclass
class NewFiles:
    """The bundle against what was landed: every file's fingerprint now and the files not landed yet."""

    files: dict[str, str]
    new: list[str]


def plan_new_files(raw: str | Path, lake: str | Path, settings: IngestSettings) -> NewFiles | str:
    """The new files of ``raw`` if they can be ingested alone, else why the whole bundle is read."""
    record = Landed(lake).record()
    if record is None:
        return "the lake has no landed rows"
    if record.get("settings") != settings_key(settings):
        return "the settings differ from the landed rows'"
    if record.get("code") != code_version():
        return "the code differs from the one that landed the rows"
    if any(not table_files(lake, name) for name in (*PER_USER, "items")):
        return "the lake lacks a table"
    files = bundle_files(check_bundle(raw))
    gone = [name for name, digest in record["files"].items() if files.get(name) != digest]
    if gone:
        return f"{len(gone)} landed files changed or are gone (first: {gone[0]})"
    new = sorted(name for name in files if name not in record["files"])
    if not new:
        return "no new files"
    if any(name.split("/")[0] not in GROWING for name in new):
        return "new items files: the catalog is read whole"
    return NewFiles(files, new)


@dataclass
class Fresh:
    """The new files' rows as the reader typed them, by table."""

    reads: dict[str, list[TableRead]]

    def frame(self, table: str) -> pl.DataFrame:
        return stack_frames([r.frame for r in self.reads[table] if r.frame.width], table)

    def marks(self) -> pl.DataFrame:
        return pl.concat([no_event_marks(), *(r.rejected_events for r in self.reads["events"])])


def read_new_files(
    root: Path, new: list[str], settings: IngestSettings, pseudonymize: Pseudonymizer
) -> Fresh:
    reader = TableReader(
        root, GROWING, settings.timestamp_unit, pseudonymize, read_chunk_rows(settings), frozenset(new)
    )
    reads: dict[str, list[TableRead]] = {name: [] for name in GROWING}
    for chunk in reader.chunks():
        reads[chunk.name].append(chunk)
    return Fresh(reads)


def _in(column: str, values: pl.Series) -> pl.Expr:
    return pl.col(column).is_in(values.implode())


def affected_users(keys: pl.DataFrame, fresh: Fresh) -> pl.Series:
    """The users whose rows a full run would align differently: those of the new events, of page
    views the new feeds or rejected events name, of new profiles, and every user holding a repeated
    event id; closed over page views shared between users. ``keys``: (event_id, user_id,
    page_view_id) of every landed and new event row."""
    new_events, new_feeds = fresh.frame("events"), fresh.frame("feeds")
    named_views = pl.concat([new_feeds["page_view_id"], fresh.marks()["page_view_id"]]).drop_nulls()
    users = (
        pl.concat(
            [
                new_events["user_id"],
                keys.filter(pl.col("event_id").is_duplicated())["user_id"],
                keys.filter(_in("page_view_id", named_views))["user_id"],
                fresh.frame("profiles")["user_id"],
            ]
        )
        .drop_nulls()
        .unique()
    )
    while True:
        views = keys.filter(_in("user_id", users))["page_view_id"].unique()
        grown = pl.concat([users, keys.filter(_in("page_view_id", views))["user_id"]]).drop_nulls().unique()
        if grown.len() == users.len():
            return users.sort()
        users = grown


def _read_order(frame: pl.DataFrame) -> pl.DataFrame:
    """Rows in the order a full read meets them: by file, then row."""
    return frame.sort("_file", "_row", maintain_order=True)


def subset_source(
    landed: Landed, fresh: Fresh, users: pl.Series, buckets: list[int], run_spill: Spill
) -> tuple[Raw, pl.DataFrame, pl.Series]:
    """The affected users' landed rows and every new row, as pass 1 would have left them (one part in
    memory); also the landed (table, file, row) locators it holds and the page views it covers."""
    source = Raw(run_spill, 1)
    old_events = landed.read("events", _in("user_id", users), buckets)
    views = (
        pl.concat(
            [
                old_events["page_view_id"],
                fresh.frame("events")["page_view_id"],
                fresh.frame("feeds")["page_view_id"],
            ]
        )
        .drop_nulls()
        .unique()
    )
    old_feeds = landed.read("feeds", _in("page_view_id", views), [*buckets, ORPHAN_BUCKET])
    old_marks = landed.read("marks", _in("page_view_id", views))
    old = {"events": old_events, "feeds": old_feeds, "profiles": landed.read("profiles"),
           "history": landed.read("history")}  # fmt: skip
    for name in RAW_TABLES:
        source.reads[name] = TableRead(name, pl.DataFrame(), empty_rejects(), 0)
    for name in GROWING:
        reads = fresh.reads[name]
        rows = _read_order(stack_frames([old[name], *(r.frame for r in reads if r.frame.width)], name))
        marks = pl.concat([no_event_marks(), old_marks, *(r.rejected_events for r in reads)])
        source.add(TableRead(name, rows, empty_rejects(), old[name].height, rejected_events=marks))
        for read in reads:  # the new files' own counts and rejects (their rows are in ``rows``)
            source.count(TableRead(name, pl.DataFrame(), read.rejects, read.rows_in,
                                   naive_timestamps=read.naive_timestamps, merged=read.merged))  # fmt: skip
    located = pl.concat(
        [frame.select(pl.lit(name).alias("table_name"), pl.col("_file").alias("source_file"),
                      pl.col("_row").cast(pl.Int64).alias("source_row"))
         for name, frame in (("events", old_events), ("feeds", old_feeds))]
    )  # fmt: skip
    return source, located, views


def with_titles(index: ItemIndex, lake: str | Path, named: pl.Series) -> ItemIndex:
    """The index with the titles of the items ``named`` (ids) that an earlier run left out (titles
    are kept only for items an event named), read from the lake's items."""
    rows = index.rows_of(named.drop_nulls().unique()).drop_nulls()
    missing = rows.filter(index.frame["title"].gather(rows).is_null())
    if missing.len() == 0:
        return index
    wanted = pl.DataFrame({"_index_row": missing, "item_id": index.keys.gather(missing)})
    titles = wanted.join(read_lake_table(lake, "items", ["item_id", "title"]), on="item_id", how="left")
    index.frame = index.frame.with_columns(
        index.frame["title"].scatter(titles["_index_row"], titles["title"])
    )
    return index


def table_rows(lake: str | Path, name: str) -> int:
    files = table_files(lake, name)
    return pl.scan_parquet(files, hive_partitioning=False).select(pl.len()).collect().item() if files else 0


def keep_other_users(
    lake: Path, run: StagedRun, users: pl.Series, views: pl.Series, pseudonymize: Pseudonymizer
) -> None:
    """Every unaffected user's rows of the per-user tables, bucket by bucket, beside the new rows."""
    user_keys = pseudonymize.column(users, "user").implode()
    session_keys = pseudonymize.column(views, "session").implode()
    for name in PER_USER:
        for folder in sorted(table_dir(lake, name).glob("bucket=*")):
            rows = pl.read_parquet(sorted(folder.glob("*.parquet")), hive_partitioning=False)
            rows = rows.with_columns(
                pl.lit(int(folder.name.removeprefix("bucket=")), pl.Int32).alias("bucket")
            )
            if "user_id" in LAKE_TABLES[name].names:
                rows = rows.filter(~pl.col("user_id").is_in(user_keys))
            else:
                rows = rows.filter(~pl.col("session_id").is_in(session_keys))
            run.tables[name].add(rows, KEPT_PART)
    link_tree(table_dir(lake, "items"), run.tables["items"].staged)


def kept_quarantine(lake: Path, located: pl.DataFrame) -> pl.DataFrame:
    """The ingest's quarantine rows nobody reads again: not those of the profiles and history (redone
    whole) nor those of the landed rows read again (``located``); the rows the reader rejected from
    earlier files stay, as do the items'."""
    files = sorted(quarantine_dir(lake, "ingest").glob("*.parquet"))
    if not files:
        return empty_rejects().with_columns(pl.lit(None, pl.Boolean).alias("kept"))
    rows = pl.read_parquet(files, hive_partitioning=False).drop("stage", strict=False)
    rows = rows.filter(~pl.col("table_name").is_in(["profiles", "history"]))
    return rows.join(located, on=["table_name", "source_file", "source_row"], how="anti", nulls_equal=False)


def ingest_new_files(
    raw: str | Path,
    lake: str | Path,
    out: Path,
    settings: IngestSettings,
    plan: NewFiles,
    run: StagedRun,
    progress: Callable[[str], None],
) -> IngestResult:
    """Ingest ``plan.new`` into ``out`` (the lake's staging folder, or the lake) with the landed rows
    of the users they touch; the tables are those a full run of the grown bundle writes."""
    from transforms.ingest.run import align_parts, land, shared_context

    started, lake, root = time.perf_counter(), Path(lake), check_bundle(raw)
    pseudonymize = Pseudonymizer(settings.rekey_key, settings.keep_image_refs)
    landed, totals = Landed(lake), Totals()
    progress("read")
    fresh = read_new_files(root, plan.new, settings, pseudonymize)
    new_events = fresh.frame("events")
    keys = pl.concat([landed.event_keys(), new_events.select("event_id", "user_id", "page_view_id")])
    users = affected_users(keys, fresh)
    everyone = user_assignment(keys["user_id"].drop_nulls().unique(), pseudonymize, settings)
    buckets = sorted(everyone.filter(_in("user_id", users))["bucket"].unique().to_list())
    source, located, views = subset_source(landed, fresh, users, buckets, Spill(run.spill, set(), run.writer))
    progress("align")
    index = with_titles(landed.item_index(), lake, source.spill.read("events", 0, release=False)["item_id"])
    ctx = shared_context(source, settings, pseudonymize, run, totals, item_index=index)
    align_parts(source, ctx, run, totals, land=False)
    run.landed.link_from(lake)
    run.writer.submit(run.landed.add_views, new_events, fresh.frame("feeds"), fresh.marks(),
                      view_buckets(keys, everyone))  # fmt: skip
    for name in ("profiles", "history"):
        run.writer.submit(run.landed.add_whole, name, fresh.frame(name))
    run.writer.submit(run.landed.save_index, index)
    progress("write")
    totals.flags.append(profile_flags(totals.no_profile, pseudonymize))
    redone = ingest_quarantine([*source.rejects, *totals.rejects], totals.flags)
    run.writer.wait()
    read_rows = {name: run.tables[name].rows for name in run.tables}
    counts = count_rows(source.reads, read_rows, redone, totals.duplicates, totals.dropped)
    keep_other_users(lake, run, users, views, pseudonymize)
    kept = kept_quarantine(lake, located).select(redone.columns)
    quarantine = pl.concat([kept, redone], how="vertical_relaxed")
    quarantine = quarantine.sort("table_name", "source_file", "source_row", "reason", nulls_last=True)
    paths = run.commit(quarantine)
    landed_staged = land(run, plan.files, settings, lake, None if out == lake else out)
    output_rows = {**{name: run.tables[name].rows for name in run.tables}, "items": table_rows(lake, "items")}
    return ingest_result(
        raw, lake, out, counts=counts, quarantine=redone, reads=source.reads, paths=paths,
        output_rows=output_rows, seconds=time.perf_counter() - started,
        settings=settings.model_dump(mode="json", exclude={"rekey_key"}),
        increment={
            "files_read": plan.new,
            "files_reused": len(plan.files) - len(plan.new),
            "users_read": users.len(),
            "users_reused": everyone.height - users.len(),
            **landed_staged,
        },
    )  # fmt: skip
