"""What the ingest counts: rows in, out, quarantined, merged and dropped per raw table, and the
quarantine frame those counts are read from."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import polars as pl

from transforms.readers import TableRead, empty_rejects, reject_rows
from transforms.rekey import Pseudonymizer

#: raw input table -> the lake table its accepted rows land in
OUTPUT_OF: dict[str, str] = {
    "events": "steps",
    "feeds": "feed_layouts",
    "items": "items",
    "profiles": "profiles",
    "history": "history",
}


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
    # what a bundle grown by new files read: the files and users read and reused, or why it read all
    increment: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)


def ingest_result(
    raw: str | Path,
    lake: str | Path,
    out: str | Path,
    *,
    counts: dict[str, TableCount],
    quarantine: pl.DataFrame,
    output_rows: dict[str, int],
    paths: dict[str, str],
    reads: dict[str, TableRead],
    seconds: float,
    settings: dict,
    notes: dict | None = None,
    increment: dict | None = None,
) -> IngestResult:
    """The run's result: ``quarantine`` the rows this run quarantined, ``paths`` the staged tables
    (in ``out``), reported at their place in the lake."""
    reasons = quarantine.group_by("kept", "reason").len().sort("reason")
    return IngestResult(
        lake=str(lake),
        raw=str(raw),
        counts=counts,
        quarantine_by_reason={r: n for k, r, n in reasons.iter_rows() if not k},
        flagged_by_reason={r: n for k, r, n in reasons.iter_rows() if k},
        output_rows=output_rows,
        paths={name: str(Path(lake) / Path(path).relative_to(out)) for name, path in paths.items()},
        naive_timestamps=sum(t.naive_timestamps for t in reads.values()),
        wall_seconds=round(seconds, 3),
        settings=settings,
        notes=notes or {},
        increment=increment or {},
    )


class AccountingError(AssertionError):
    """Rows were lost or invented: a bug in the pipeline, never a data problem."""


@dataclass
class Totals:
    """What the run gathers beside the lake rows: quarantine rows, flags, merged duplicates."""

    rejects: list[pl.DataFrame] = field(default_factory=list)
    flags: list[pl.DataFrame] = field(default_factory=list)
    no_profile: list[pl.DataFrame] = field(default_factory=list)
    duplicates: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTPUT_OF, 0))
    dropped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTPUT_OF, 0))


def _concat(frames: list[pl.DataFrame]) -> pl.DataFrame:
    frames = [f for f in frames if f.height]
    return pl.concat(frames, how="vertical_relaxed") if frames else empty_rejects()


def profile_flags(candidates: list[pl.DataFrame], pseudonymize: Pseudonymizer) -> pl.DataFrame:
    """One kept-and-flagged row per user whose profile is missing, at the user's first step."""
    rows = pl.concat(candidates, how="vertical_relaxed") if candidates else pl.DataFrame()
    if rows.height == 0:
        return empty_rejects()
    first = rows.sort("page_view_id").group_by("user_id", maintain_order=True).first()
    return reject_rows("events", first, "missing_profile", "kept with an empty profile", pseudonymize)


def ingest_quarantine(rejects: list[pl.DataFrame], flags: list[pl.DataFrame]) -> pl.DataFrame:
    return pl.concat(
        [
            _concat(rejects).with_columns(pl.lit(False).alias("kept")),
            _concat(flags).with_columns(pl.lit(True).alias("kept")),
        ],
        how="vertical_relaxed",
    ).sort("table_name", "source_file", "source_row", "reason", nulls_last=True)


def count_rows(
    reads: dict[str, TableRead],
    rows_out: dict[str, int],
    quarantine: pl.DataFrame,
    duplicates: dict[str, int],
    dropped: dict[str, int],
) -> dict[str, TableCount]:
    per_table = quarantine.group_by("table_name", "kept").len()
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
