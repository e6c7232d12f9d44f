"""Ingest: a raw log bundle becomes the lake tables steps, sessions, feed_layouts,
items, profiles, history and the ingest part of quarantine.

``align_bundle`` is pure (frames in, frames out); ``ingest_bundle`` reads the
bundle, aligns it and writes the lake atomically, table by table.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl

from transforms import align
from transforms.config import IngestSettings
from transforms.lake import write_quarantine, write_table
from transforms.readers import TableRead, empty_rejects, read_bundle, reject_rows
from transforms.rekey import Pseudonymizer, bucket_of, split_of
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


@dataclass
class TableCount:
    """Accounting for one raw table: rows_in = rows_out + quarantined + duplicates."""

    rows_in: int
    rows_out: int
    quarantined: int
    duplicates: int
    flagged: int = 0

    @property
    def balanced(self) -> bool:
        return self.rows_in == self.rows_out + self.quarantined + self.duplicates


@dataclass
class Aligned:
    tables: dict[str, pl.DataFrame]
    quarantine: pl.DataFrame
    counts: dict[str, TableCount]


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


def _checked_history(history: pl.DataFrame, pseudonymize: Pseudonymizer) -> align.Checked:
    rows, bad = align.split_by_reason(
        history,
        pl.when(~pl.col("kind").is_in(HISTORY_KINDS)).then(pl.lit("unknown_history_kind")),
        "history",
        pl.lit("history kind must be click or buy"),
        pseudonymize,
    )
    return align.Checked(rows, [bad])


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


def _missing_profile_flags(steps: pl.DataFrame, pseudonymize: Pseudonymizer) -> pl.DataFrame:
    """One kept-and-flagged row per user whose profile is missing."""
    missing = steps.filter(pl.col("profile_missing")).group_by("user_id").agg(pl.all().first())
    if missing.height == 0:
        return empty_rejects()
    return reject_rows(
        "events",
        missing.select("user_id", "page_view_id", "_file", "_row"),
        "missing_profile",
        "kept with an empty profile",
        pseudonymize,
    )


def _take(bundle: dict[str, TableRead], name: str) -> pl.DataFrame:
    """Hand a raw frame over to the checks, leaving the counts and rejects behind (frees memory)."""
    frame = bundle[name].frame
    bundle[name].frame = frame.clear()
    return frame


def align_bundle(
    bundle: dict[str, TableRead], settings: IngestSettings, pseudonymize: Pseudonymizer
) -> Aligned:
    """Run every check and build the lake frames (ids still raw except in quarantine payloads)."""
    geometry = settings.geometry
    items = align.check_items(_take(bundle, "items"), pseudonymize)
    profiles = align.check_profiles(_take(bundle, "profiles"), pseudonymize)
    feeds = align.check_feeds(_take(bundle, "feeds"), items.rows["item_id"], pseudonymize)
    history = _checked_history(_take(bundle, "history"), pseudonymize)
    max_ts = pl.lit(datetime.now(UTC) + timedelta(days=1)).dt.cast_time_unit("ms")
    events = align.row_checks(
        _take(bundle, "events"),
        item_ids=items.rows["item_id"],
        feed_views=feeds.rows["page_view_id"].unique(),
        action_map=settings.action_map,
        max_ts=max_ts,
        pseudonymize=pseudonymize,
    )
    ordered, order_flags = align.order_events(events.rows, pseudonymize)
    ordered, after_end = align.drop_after_end(ordered, pseudonymize)
    events.rows = ordered.clear()  # big frames are dropped as soon as the next form exists
    layout = align.layouts(feeds.rows)
    feeds.rows = layout.clear()
    screens = align.screen_checks(ordered, layout, items.rows, geometry, pseudonymize)
    steps = align.build_steps(screens.rows, items.rows, profiles.rows)
    layout, orphan_feeds = _sessionless_feeds(layout, steps["page_view_id"].unique(), pseudonymize)
    profile_flags = _missing_profile_flags(steps, pseudonymize)

    rejects = {
        "events": [*events.rejects, after_end, *screens.rejects],
        "feeds": [*feeds.rejects, orphan_feeds],
        "items": items.rejects,
        "profiles": profiles.rejects,
        "history": history.rejects,
    }
    duplicates = {
        "events": events.duplicates,
        "feeds": feeds.duplicates,
        "items": items.duplicates,
        "profiles": profiles.duplicates,
        "history": 0,
    }
    flags = _concat([order_flags, profile_flags])
    raw_rejects = _concat([bundle[name].rejects for name in bundle])
    quarantine = pl.concat(
        [
            _concat([raw_rejects, *[r for rs in rejects.values() for r in rs]]).with_columns(
                pl.lit(False).alias("kept")
            ),
            flags.with_columns(pl.lit(True).alias("kept")),
        ],
        how="vertical_relaxed",
    ).sort("table", "source_file", "source_row", "reason", nulls_last=True)
    tables = {
        "steps": steps,
        "feed_layouts": layout.rename({"page_view_id": "session_id"}),
        "items": align.build_items(items.rows),
        "profiles": profiles.rows,
        "history": history.rows,
    }
    counts = _count(bundle, tables, quarantine, duplicates)
    return Aligned(tables, quarantine, counts)


def _count(
    bundle: dict[str, TableRead],
    tables: dict[str, pl.DataFrame],
    quarantine: pl.DataFrame,
    duplicates: dict[str, int],
) -> dict[str, TableCount]:
    per_table = quarantine.group_by("table", "kept").len()
    lookup = {(t, k): n for t, k, n in per_table.iter_rows()}
    counts = {
        name: TableCount(
            rows_in=bundle[name].rows_in,
            rows_out=tables[OUTPUT_OF[name]].height,
            quarantined=lookup.get((name, False), 0),
            duplicates=duplicates[name] + bundle[name].merged,
            flagged=lookup.get((name, True), 0),
        )
        for name in OUTPUT_OF
    }
    broken = {name: c for name, c in counts.items() if not c.balanced}
    if broken:
        raise AccountingError(f"rows in != rows out + quarantined + duplicates for {broken}")
    return counts


def pseudonymize_outputs(
    tables: dict[str, pl.DataFrame], pseudonymize: Pseudonymizer, settings: IngestSettings
) -> dict[str, pl.DataFrame]:
    """Replace raw ids by pseudonyms; add split and bucket derived from the user pseudonym."""
    # event ids and helper columns are not part of any output: drop them before hashing ids
    unused = ("event_id",)
    keyed = {
        name: pseudonymize(frame.drop([c for c in frame.columns if c.startswith("_") or c in unused]))
        for name, frame in tables.items()
    }
    steps = keyed["steps"].with_columns(pl.col("page_view_id").alias("session_id"))
    users = pl.concat([steps["user_id"], keyed["profiles"]["user_id"]]).unique().sort()
    assignment = pl.DataFrame(
        {
            "user_id": users,
            "split": split_of(users, settings.split_seed, settings.split_ratios),
            "bucket": bucket_of(users, settings.buckets),
        }
    )
    steps = steps.join(assignment, on="user_id", how="left")
    buckets = steps.select("session_id", "bucket").unique("session_id")
    return {
        "steps": steps,
        "feed_layouts": keyed["feed_layouts"].join(buckets, on="session_id", how="inner"),
        "items": keyed["items"],
        "profiles": align.profile_columns(keyed["profiles"]).join(
            assignment.drop("bucket"), on="user_id", how="left"
        ),
        "history": keyed["history"],
    }


def _silent(phase: str) -> None:
    return None


def ingest_bundle(
    raw: str | Path,
    lake: str | Path,
    settings: IngestSettings | None = None,
    progress: Callable[[str], None] = _silent,
    source_format: str = "bundle",
) -> IngestResult:
    """Read ``raw``, align, and (re)write the lake tables atomically. Idempotent.

    ``source_format`` is ``bundle`` (a raw log bundle folder) or ``userarena``
    (release JSONL). ``progress`` is called with the name of each phase as it starts.
    """
    started = time.perf_counter()
    settings = settings or IngestSettings()
    pseudonymize = Pseudonymizer(settings.rekey_key, settings.keep_image_refs)
    progress("read")
    notes: dict[str, int] = {}
    if source_format == "userarena":
        bundle, notes = read_userarena(raw, settings.timestamp_unit, pseudonymize)
    elif source_format == "bundle":
        bundle = read_bundle(raw, settings.timestamp_unit, pseudonymize)
    else:
        raise ValueError(f"unknown source format {source_format!r}: expected bundle or userarena")
    progress("align")
    aligned = align_bundle(bundle, settings, pseudonymize)
    progress("pseudonymize")
    tables = pseudonymize_outputs(aligned.tables, pseudonymize, settings)
    aligned.tables.clear()
    tables["sessions"] = align.build_sessions(tables["steps"], tables["feed_layouts"], tables["items"]).join(
        tables["steps"].select("session_id", "split", "bucket").unique("session_id"), on="session_id"
    )
    output_rows = {name: frame.height for name, frame in tables.items()}
    paths = {
        name: str(write_table(lake, name, tables.pop(name), zstd_level=settings.zstd_level))
        for name in list(tables)
    }
    paths["quarantine"] = str(
        write_quarantine(lake, "ingest", aligned.quarantine, zstd_level=settings.zstd_level)
    )
    reasons = aligned.quarantine.group_by("kept", "reason").len()
    return IngestResult(
        lake=str(lake),
        raw=str(raw),
        counts=aligned.counts,
        quarantine_by_reason={r: n for k, r, n in reasons.sort("reason").iter_rows() if not k},
        flagged_by_reason={r: n for k, r, n in reasons.sort("reason").iter_rows() if k},
        output_rows=output_rows,
        paths=paths,
        naive_timestamps=sum(t.naive_timestamps for t in bundle.values()),
        notes=notes,
        wall_seconds=round(time.perf_counter() - started, 3),
        settings=json.loads(settings.model_dump_json(exclude={"rekey_key"})),
    )
