"""The validation gate: run the suites over lake tables (and optionally a raw
bundle), stop on errors, route bad rows to quarantine, report.

Per table:

1. ``<table>.schema``: stored Parquet columns and Arrow types against the
   declared schema (a frame of one row per column, validated by GE).
2. ``<table>``: the data, read frame by frame (``LakeTableReader``: a partitioned table one
   user bucket at a time, so the helpers over a session see all of it; any other table by
   Parquet batches), helper columns computed per frame, then converted to Arrow-backed pandas
   in batches of at most ``batch_rows`` rows and ``BATCH_BYTES`` bytes and validated by GE batch by
   batch; counts and failing row numbers are combined across frames and batches (``mostly`` is
   judged on the totals). Key uniqueness, the one check across frames, comes from the keys'
   hashes counted by range of the hash space, the recurring ones confirmed on the keys
   (``duplicated_key_hashes``). Memory is bounded by a frame, not by the table.
   A partitioned table may instead be checked bucket by bucket wherever the caller runs them
   (``map_parts``: the flows' task runner, on Ray or several local workers), each bucket
   (``TablePart``) numbered and framed as the whole table's reader would, so combining the parts'
   results here gives the same verdict, the same routed rows and one Data Docs site.

Raw tables are read chunk by chunk through ``transforms.readers.read_tables`` (memory bounded by a
chunk); their key uniqueness is judged on the whole table from a first pass of key hashes.
Routed rows are moved and the table rewritten frame by frame too.

A stage's gate reads its tables from the stage's staging folder (``staged``), before they replace
the lake's, and first checks what the stage lost (``loss_outcomes``): nothing kept from a non-empty
input, or more than ``max_quarantined_share`` of an input table quarantined, stops the run.

If any error-severity expectation fails, nothing is rewritten and
:class:`GateError` is raised. Otherwise rows failing a row-level ``warn`` check
move to quarantine (stage ``validate-<table>``, reason
``expectation:<check>``) and the table is rewritten without them, so rows in =
rows out + quarantined. Results JSON and Data Docs are written in both cases.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from transforms.config import IngestSettings
from transforms.lake import StagedTable, table_dir, table_files, write_quarantine
from transforms.schemas import LAKE_TABLES, QUARANTINE, RAW_TABLES, polars_schema
from validation.report import (
    DOCS_DIR,
    EXAMPLES,
    RUNS_DIR,
    CheckOutcome,
    GateError,
    GateSummary,
    TableReport,
    write_docs_listing,
    write_run_files,
)
from validation.suites import RAW_ID_COLUMNS, TableSuite, all_suites, schema_suite

BATCH_ROWS = 1_000_000  # rows of a GE batch, at most (and of a raw table's chunk)
RAW_CHUNK_ROWS = 200_000  # rows of a raw table read at a time where its files are not all Parquet
FRAME_ROWS = 1_000_000  # rows of a lake table in memory at once (GE sees them BATCH_ROWS at a time)
# and at most this many bytes of them, as Parquet counts them uncompressed: a table of long texts
# (records, a few KB a row) comes in frames and GE batches of fewer rows than a narrow one
FRAME_BYTES = 96 * 2**20
BATCH_BYTES = 96 * 2**20
SPLIT_BUFFER_BYTES = 64 * 2**20  # a bucket's rows held while it is split by session, at most
ROW, FILE, FILE_ROW = "__gate_row", "__gate_file", "__gate_file_row"


def quarantine_stage(table: str) -> str:
    return f"validate-{table}"


# --- schema -------------------------------------------------------------------


def canonical(t: pa.DataType) -> str:
    """Arrow type text with large/view variants folded (same logical type on disk)."""
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string"
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return "binary"
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t):
        return f"list<{canonical(t.value_type)}>"
    if pa.types.is_struct(t):
        return "struct<" + ", ".join(f"{f.name}: {canonical(f.type)}" for f in t) + ">"
    return str(t)


def schema_frame(declared: pa.Schema, files: Sequence[Path]) -> pl.DataFrame:
    """One row per column seen or declared: its declared and stored (observed) type."""
    observed: dict[str, list[str]] = {}
    for path in files:
        for f in pq.read_schema(path):
            types = observed.setdefault(f.name, [])
            if canonical(f.type) not in types:
                types.append(canonical(f.type))
    names = [f.name for f in declared] + [n for n in observed if n not in declared.names]
    return pl.DataFrame(
        {
            "column": names,
            "declared_type": [
                canonical(declared.field(n).type) if n in declared.names else None for n in names
            ],
            "observed_type": [" | ".join(observed[n]) if n in observed else None for n in names],
        },
        schema={"column": pl.String, "declared_type": pl.String, "observed_type": pl.String},
    )


# --- loading ------------------------------------------------------------------


def _needed(suite: TableSuite) -> list[str]:
    helper_inputs = {c for h in suite.helpers for c in h.build().meta.root_names()}
    wanted = set(suite.columns()) | helper_inputs | set(suite.keys)
    return [n for n in suite.schema.names if n in wanted]


class LakeTableReader:
    """A lake table as frames of at most about ``frame_rows`` rows, each row with its file and row
    locator. A suite whose helpers look across a session (``whole_sessions``) gets whole sessions:
    whole user buckets packed together (a session never straddles buckets), a bucket bigger than a
    frame split by a hash of the session id; any other table comes in Parquet batches, small files'
    batches packed together.
    Every pass yields the same frames in the same order, so row numbers (``ROW``) agree between passes."""

    def __init__(
        self, root: Path, suite: TableSuite, files: Sequence[Path], frame_rows: int, bounded: bool = False
    ) -> None:
        """``bounded``: ``frame_rows`` is already within ``FRAME_BYTES`` (a part of a table read with the
        whole table's frame size, so that its frames split as the whole table's do)."""
        self.root, self.suite = root, suite
        self.full = any(c.level == "row" for c in suite.checks)  # rows can be routed: keep every column
        self.columns = suite.schema.names if self.full else _needed(suite)
        self.files = sorted(files, key=lambda f: f.relative_to(root).as_posix())
        self.row_bytes = uncompressed_row_bytes(self.files, self.columns)
        self.frame_rows = frame_rows if bounded else self.rows_within(frame_rows, FRAME_BYTES)

    def rows_within(self, rows: int, size: int) -> int:
        """At most ``rows`` rows, and no more than ``size`` bytes of them."""
        return max(1, min(rows, int(size // max(self.row_bytes, 1.0))))

    def _located(self, frame: pl.LazyFrame | pl.DataFrame, path: Path) -> pl.LazyFrame | pl.DataFrame:
        return frame.with_row_index(FILE_ROW).with_columns(
            pl.col(FILE_ROW).cast(pl.Int64), pl.lit(path.relative_to(self.root).as_posix()).alias(FILE)
        )

    def _scan(self, path: Path) -> pl.LazyFrame:
        return pl.scan_parquet(path, hive_partitioning=False).select(self.columns)

    def frames(self) -> Iterator[pl.DataFrame]:
        if self.suite.whole_sessions:
            yield from self._session_frames()
            return
        packed: list[pl.DataFrame] = []  # small files' batches share a frame: one GE run, not one a file
        packed_rows = 0
        for batch in self._batches():
            if packed and packed_rows + batch.height > self.frame_rows:
                yield pl.concat(packed, how="vertical_relaxed")
                packed, packed_rows = [], 0
            packed.append(batch)
            packed_rows += batch.height
        if packed:
            yield pl.concat(packed, how="vertical_relaxed")

    def _batches(self) -> Iterator[pl.DataFrame]:
        for path in self.files:
            first = 0
            for batch in pq.ParquetFile(path).iter_batches(batch_size=self.frame_rows, columns=self.columns):
                frame = self._located(pl.from_arrow(batch), path)
                yield frame.with_columns(pl.col(FILE_ROW) + first)
                first += frame.height
            if first == 0:  # a file of no rows still carries the table's schema to the checks
                yield self._located(self._scan(path).collect(), path)

    def _session_frames(self) -> Iterator[pl.DataFrame]:
        """Buckets packed together up to ``frame_rows`` (one GE run per frame, not per bucket); a bucket
        bigger than that alone, split by session hash."""
        packed: list[Path] = []
        packed_rows = 0
        for _, grouped in itertools.groupby(self.files, key=lambda f: f.parent):
            files = list(grouped)
            rows = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
            if packed and packed_rows + rows > self.frame_rows:
                yield self._whole_files(packed)
                packed, packed_rows = [], 0
            if rows > self.frame_rows:
                yield from self._split_sessions(files, -(-rows // self.frame_rows))
                continue
            packed += files
            packed_rows += rows
        if packed:
            yield self._whole_files(packed)

    def _whole_files(self, files: list[Path]) -> pl.DataFrame:
        return pl.concat([self._located(self._scan(f), f) for f in files], how="vertical_relaxed").collect()

    def _split_sessions(self, files: list[Path], parts: int) -> Iterator[pl.DataFrame]:
        """A bucket's rows in ``parts`` frames by a hash of the session id, each in file order. The
        files are read once, each row written to its frame's file on disk, and the frames read back
        one at a time: read once per frame, a bucket of many files would go through the allocator
        ``parts`` times over, most of it only to be filtered out."""
        with tempfile.TemporaryDirectory(prefix="trajforge-gate-sessions-") as folder:
            paths = [Path(folder) / f"frame-{part:05d}.arrow" for part in range(parts)]
            schema = _split_by_session(
                (self._located(self._scan(f), f).collect() for f in files), parts, paths
            )
            for path in paths:
                yield _read_frame(path, schema)

    def prepared(self, unique: Sequence[pl.Expr], first_row: int = 0) -> Iterator[pl.DataFrame]:
        """The frames with the suite's helpers and ``ROW`` numbered over the whole table (``first_row``:
        the place of this reader's first row in it)."""
        rows = first_row
        for frame in self.frames():
            yield with_check_columns(self.suite, frame, rows, unique)
            rows += frame.height


def _split_by_session(frames: Iterable[pl.DataFrame], parts: int, paths: Sequence[Path]) -> pl.Schema | None:
    """Each row of ``frames`` appended to ``paths[hash(session_id) % parts]`` (Arrow IPC, LZ4), in
    order; the frames' schema (the first frame's, the others cast to it), None without frames.
    Rows wait in memory until ``SPLIT_BUFFER_BYTES`` of them have gathered, so a frame's file holds
    a few large record batches, not one per file read."""
    writers: dict[int, ipc.RecordBatchFileWriter] = {}
    waiting: dict[int, list[pl.DataFrame]] = {}
    schema, held = None, 0

    def flush() -> None:
        for part, rows in waiting.items():
            # partition_by gathers each piece's rows, so its string views hold only their own strings
            table = pl.concat(rows, rechunk=True).to_arrow()
            if part not in writers:
                options = ipc.IpcWriteOptions(compression="lz4")
                writers[part] = ipc.new_file(str(paths[part]), table.schema, options=options)
            writers[part].write_table(table)
        waiting.clear()

    try:
        for frame in frames:
            schema = schema or frame.schema
            split = frame.cast(dict(schema)).with_columns(
                (pl.col("session_id").hash(KEY_SEED) % parts).alias("_frame")
            )
            for (part,), rows in split.partition_by("_frame", as_dict=True, include_key=False).items():
                waiting.setdefault(part, []).append(rows)
            held += frame.estimated_size()
            if held > SPLIT_BUFFER_BYTES:
                flush()
                held = 0
        flush()
    finally:
        for writer in writers.values():
            writer.close()
    return schema


def _read_frame(path: Path, schema: pl.Schema | None) -> pl.DataFrame:
    """A frame ``_split_by_session`` wrote, decompressed into memory of its own; empty where no row
    hashed to it."""
    return pl.read_ipc(path).rechunk() if path.exists() else pl.DataFrame(schema=schema)


def uncompressed_row_bytes(files: Sequence[Path], columns: Sequence[str]) -> float:
    """Mean bytes a row of ``columns`` takes uncompressed, from the files' Parquet footers."""
    wanted, size, rows = set(columns), 0, 0
    for path in files:
        metadata = pq.ParquetFile(path).metadata
        for group in range(metadata.num_row_groups):
            chunk = metadata.row_group(group)
            rows += chunk.num_rows
            for column in range(chunk.num_columns):
                part = chunk.column(column)
                if part.path_in_schema.split(".")[0] in wanted:
                    size += part.total_uncompressed_size
    return size / rows if rows else 0.0


def duplicated_key_hashes(files: Sequence[Path], suite: TableSuite) -> pl.Series:
    """``key_hash`` of every key that occurs more than once in the table. The keys' hashes are
    counted one range of the hash space at a time (``recurring_hashes``); the few rows whose hash
    recurs are then read again and grouped by the key itself, so two keys that share a hash are
    not taken for a repeat. Memory holds a range and a batch, whatever the table's size."""
    keys = list(suite.keys)
    rows = sum(pq.ParquetFile(path).metadata.num_rows for path in files)
    hashes = (batch.select(key_hash(keys)).to_series() for batch in _key_batches(files, suite))
    suspects = recurring_hashes(hashes, rows)
    if suspects.len() == 0:
        return suspects
    named = key_hash(keys).is_in(suspects.implode())
    candidates = pl.concat([batch.filter(named) for batch in _key_batches(files, suite)])
    repeated = candidates.group_by(keys).len().filter(pl.col("len") > 1)
    return repeated.select(key_hash(keys)).to_series()


def _key_batches(files: Sequence[Path], suite: TableSuite) -> Iterator[pl.DataFrame]:
    """The table's key columns, as declared, a Parquet batch of at most ``FRAME_ROWS`` rows at a time."""
    declared = polars_schema(suite.schema)
    for path in files:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=FRAME_ROWS, columns=list(suite.keys)):
            yield pl.from_arrow(batch).select(pl.col(k).cast(declared[k]) for k in suite.keys)


def recurring_hashes(hashes: Iterable[pl.Series], rows: int) -> pl.Series:
    """The values that occur more than once among ``hashes`` (about ``rows`` in all), counted one
    range of the hash space at a time; past a range they wait on disk meanwhile (a big bundle's
    feed cards are hundreds of millions of rows)."""
    from transforms.ingest.duplicate_ids import RANGE_HASHES, IdHashes, repeated_hashes

    with tempfile.TemporaryDirectory(prefix="trajforge-gate-keys-") as folder:
        kept = IdHashes.on_disk(Path(folder), rows) if rows > RANGE_HASHES else IdHashes()
        for chunk in hashes:
            kept.add(chunk)
        return repeated_hashes(kept.by_range())


def unique_helper(suite: TableSuite, repeated: pl.Series | None) -> list[pl.Expr]:
    """``_key_unique`` judged on the whole table (``repeated``: its ``duplicated_key_hashes``), for a
    table read in frames."""
    if not suite.keys or repeated is None:
        return []
    return [~key_hash(suite.keys).is_in(repeated.implode()).alias("_key_unique")]


def repeated_keys(files: Sequence[Path], suite: TableSuite) -> pl.Series | None:
    """The table's duplicated key hashes, computed once for every part; None for a suite without keys."""
    return duplicated_key_hashes(files, suite) if suite.keys else None


def located_raw_rows(frame: pl.DataFrame) -> pl.DataFrame:
    """A raw table as read by transforms.readers, its locators renamed (``with_check_columns`` drops
    raw ids)."""
    return frame.rename({"_file": FILE, "_row": FILE_ROW}) if "_file" in frame.columns else frame


def with_check_columns(
    suite: TableSuite, frame: pl.DataFrame, first_row: int = 0, helpers: Sequence[pl.Expr] = ()
) -> pl.DataFrame:
    """Helper columns (``helpers`` replace the suite's own of the same name), raw ids dropped, and
    ``ROW`` numbered from ``first_row`` (a chunk's place in its table)."""
    given = {h.meta.output_name() for h in helpers}
    built = [h.build().alias(h.name) for h in suite.helpers if h.name not in given]
    out = frame.with_columns([*built, *helpers]) if built or helpers else frame
    if suite.raw:
        out = out.drop([c for c in RAW_ID_COLUMNS if c in out.columns])
    return out.with_row_index(ROW, offset=first_row)


def batches(suite: TableSuite, frame: pl.DataFrame, batch_rows: int) -> Iterator[Any]:
    """``frame``'s columns that the suite reads, as GE batches of at most ``batch_rows`` rows and
    ``BATCH_BYTES`` bytes: GE copies a batch for each check with a row condition, so memory follows
    a batch's bytes, while each batch costs GE a fixed overhead, so a batch holds as many rows as
    that bound allows."""
    from validation.ge import to_pandas

    frame = frame.select(*suite.columns(), ROW)
    bounded = int(BATCH_BYTES * frame.height // max(frame.estimated_size(), 1))
    rows = max(1, min(batch_rows, bounded))
    for offset in range(0, max(frame.height, 1), rows):
        yield to_pandas(frame.slice(offset, rows), ROW)


# --- combining GE results -----------------------------------------------------


def _by_check(results: list[Any]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for result in results:
        for r in result.results:
            out.setdefault(r.expectation_config.meta["check"], []).append(r)
    return out


def _exception(parts: list[Any]) -> str | None:
    for r in parts:
        info = r.exception_info or {}
        if info.get("raised_exception"):
            return str(info.get("exception_message") or "unknown error").splitlines()[0][:300]
    return None


def _row_number(index: Any) -> int:
    # GE reports a named index as {index name: value, column: value}
    return int(index[ROW]) if isinstance(index, dict) else int(index)


def _failing_rows(result: dict[str, Any]) -> list[Any]:
    """Every failing row of a row-level check's result; the first few of any other's."""
    listed = result.get("unexpected_index_list")
    return listed if listed is not None else result.get("partial_unexpected_index_list") or []


def combine(suite: TableSuite, results: list[Any]) -> list[CheckOutcome]:
    """Outcomes per check over all batches; map expectations judged on total counts."""
    grouped = _by_check(results)
    outcomes = []
    for c in suite.checks:
        parts = grouped.get(c.name, [])
        o = CheckOutcome(
            suite.name, suite.table, c.name, c.expectation, c.severity, c.level, c.doc, success=True
        )
        o.exception = _exception(parts) if parts else "the expectation returned no result"
        counted = [r.result for r in parts if "unexpected_count" in r.result]
        if o.exception is None and counted and len(counted) == len(parts):
            o.evaluated = sum(r.get("element_count") or 0 for r in counted)
            missing = sum(r.get("missing_count") or 0 for r in counted)
            o.unexpected = sum(r["unexpected_count"] or 0 for r in counted)
            o.rows = [_row_number(i) for r in counted for i in _failing_rows(r)]
            nonmissing = o.evaluated - missing
            mostly = float(c.kwargs.get("mostly", 1.0))
            o.success = o.unexpected == 0 or (nonmissing > 0 and 1 - o.unexpected / nonmissing >= mostly)
        elif o.exception is None:
            o.success = all(r.success for r in parts)
            o.observed = [r.result.get("observed_value") for r in parts]
        else:
            o.success = False
        outcomes.append(o)
    return outcomes


def attach_examples(suite: TableSuite, frame: pl.DataFrame, outcomes: list[CheckOutcome]) -> None:
    """Up to EXAMPLES failing rows per failed check: locator, keys and the columns it read."""
    locators = [c for c in (FILE, FILE_ROW) if c in frame.columns]
    inputs = {h.name: h.build().meta.root_names() for h in suite.helpers}
    for o in outcomes:
        if o.success or not o.rows:
            continue
        read = [x for c in suite.check(o.check).columns() for x in (*inputs.get(c, []), c)]
        columns = [c for c in dict.fromkeys([*suite.keys, *read, *suite.shown]) if c in frame.columns]
        rows = frame.filter(pl.col(ROW).is_in(sorted(o.rows)[:EXAMPLES])).select(locators + columns)
        for row in rows.to_dicts():
            at = f"{row.pop(FILE)} row {row.pop(FILE_ROW)}" if locators else ""
            o.examples.append({"_at": at, **row} if at else row)


# --- routing ------------------------------------------------------------------


def _reasons(suite: TableSuite, outcomes: list[CheckOutcome]) -> pl.DataFrame:
    """ROW -> reason (first routed check in suite order) and detail (all routed checks)."""
    tags = [
        pl.DataFrame({ROW: o.rows, "check": o.check, "order": i}, schema_overrides={ROW: pl.UInt32})
        for i, o in enumerate(outcomes)
        if o.routes and o.rows
    ]
    if not tags:
        return pl.DataFrame(schema={ROW: pl.UInt32, "reason": pl.String, "detail": pl.String})
    docs = {c.name: f"{c.doc} ({c.expectation})" for c in suite.checks}
    return (
        pl.concat(tags)
        .sort(ROW, "order")
        .group_by(ROW, maintain_order=True)
        .agg(pl.col("check"))
        .select(
            ROW,
            pl.concat_str(pl.lit("expectation:"), pl.col("check").list.first()).alias("reason"),
            pl.col("check")
            .list.eval(pl.element().replace_strict(docs, default=""))
            .list.join("; ")
            .alias("detail"),
        )
    )


def route(
    lake: Path,
    suite: TableSuite,
    reader: LakeTableReader,
    outcomes: list[CheckOutcome],
    replace: bool,
    target: Path,
) -> int:
    """Move rows failing row-level warn checks to quarantine; rewrite the table under ``target`` (the
    lake, or the stage's staging folder) frame by frame. Returns rows moved."""
    tags = _reasons(suite, outcomes)
    stage = quarantine_stage(suite.table)
    existing = table_dir(lake, "quarantine") / f"stage={stage}"
    if tags.height == 0:
        if replace and existing.exists() and target == lake:
            shutil.rmtree(existing)  # the stage rewrote the table: earlier gate rejects are stale
        elif replace and existing.exists():
            # an empty partition, so the swap retires the stale one
            write_quarantine(target, stage, polars_schema(QUARANTINE).to_frame().drop("stage"))
        return 0
    declared = suite.schema.names
    rewritten = StagedTable(target, suite.table, schema=suite.schema)
    moved: list[pl.DataFrame] = []
    try:
        rows = 0
        for number, frame in enumerate(reader.frames()):
            numbered = frame.with_row_index(ROW, offset=rows)
            rows += frame.height
            rejected = numbered.join(tags, on=ROW, how="inner")
            moved.append(rejected.select(
                pl.lit(suite.table).alias("table_name"),
                pl.col(FILE).alias("source_file"),
                pl.col(FILE_ROW).alias("source_row"),
                "reason",
                "detail",
                pl.struct(declared).struct.json_encode().alias("payload"),
                pl.lit(False).alias("kept"),
            ))  # fmt: skip
            rewritten.add(numbered.join(tags, on=ROW, how="anti").select(declared), number)
        quarantined = pl.concat(moved)
        if not replace and existing.exists():
            earlier = pl.read_parquet(existing, hive_partitioning=False).select(quarantined.columns)
            quarantined = pl.concat([earlier, quarantined])
        rewritten.commit()
    finally:
        rewritten.discard()
    write_quarantine(target, stage, quarantined)
    return tags.height


# --- what a stage lost ----------------------------------------------------------

LOSS_SUITE = "stage.losses"
TOP_REASONS = 3


def lost_reasons(source: Path, stage: str) -> pl.DataFrame:
    """(table, reason, rows) of the rows ``stage`` rejected (kept flags are not losses), most first."""
    folder = table_dir(source, "quarantine") / f"stage={stage}"
    if not folder.exists():
        return pl.DataFrame(schema={"table_name": pl.String, "reason": pl.String, "rows": pl.UInt32})
    return (
        pl.scan_parquet(folder / "**" / "*.parquet", hive_partitioning=False)
        .filter(~pl.col("kept"))
        .group_by("table_name", "reason")
        .agg(pl.len().alias("rows"))
        .sort(["rows", "reason"], descending=[True, False])
        .collect()
    )


def _loss(table: str, check: str, expectation: str, doc: str, lost: int, rows_in: int) -> CheckOutcome:
    o = CheckOutcome(LOSS_SUITE, table, check, expectation, "error", "table", doc, success=lost == 0)
    o.evaluated, o.unexpected = rows_in, lost
    return o


def loss_outcomes(
    accounting: dict[str, dict[str, int]], reasons: pl.DataFrame, max_share: float
) -> list[CheckOutcome]:
    """Per input table: an error when no row was kept from a non-empty input, or when more than
    ``max_share`` of its rows were quarantined; examples are the top reasons with their counts."""
    outcomes = []
    for table, c in accounting.items():
        rows_in, quarantined = c["rows_in"], c.get("quarantined", 0)
        nothing_kept = rows_in > 0 and c["rows_out"] == 0
        too_many = quarantined > max_share * rows_in
        kept = _loss(
            table,
            "rows_kept",
            "rows out > 0 when rows in > 0",
            "the stage keeps rows of a non-empty input",
            rows_in if nothing_kept else 0,
            rows_in,
        )
        share = _loss(
            table,
            "quarantined_share",
            f"quarantined / rows in <= {max_share:g}",
            f"at most {max_share:.0%} of the rows are quarantined",
            quarantined if too_many else 0,
            rows_in,
        )
        top = (
            reasons.filter(pl.col("table_name") == table)
            .head(TOP_REASONS)
            .select("reason", "rows")
            .to_dicts()
        )
        for o in (kept, share):
            o.examples = [] if o.success else top
        outcomes += [kept, share]
    return outcomes


# --- a table in parts -----------------------------------------------------------


@dataclass
class CheckedRows:
    """What the suite found in some rows of a table: GE's results per batch, up to ``EXAMPLES``
    failing rows per check, and how many rows it read."""

    results: list[Any]
    examples: dict[str, list[dict[str, Any]]]
    rows: int


def check_frames(
    runner: Any, suite: TableSuite, frames: Iterable[pl.DataFrame], batch_rows: int
) -> CheckedRows:
    """``frames`` (prepared with the table's row numbers) through the suite, ``batch_rows`` at a time;
    one frame in memory."""
    checked = CheckedRows([], {}, 0)
    for frame in frames:
        first = runner.batches_of(suite, checked.results)
        part = runner.validate(suite, batches(suite, frame, batch_rows), first=first)
        found = combine(suite, part)
        for o in found:
            o.success = o.success and not o.rows  # a check judged on the totals keeps its examples
        attach_examples(suite, frame, found)
        for o in found:
            kept = checked.examples.setdefault(o.check, [])
            kept += o.examples[: EXAMPLES - len(kept)]
        checked.results += part
        checked.rows += frame.height
    return checked


@dataclass(frozen=True)
class TablePart:
    """One user bucket of a lake table in a gate run: its files, where its rows start in the whole
    table, and the whole table's frame and batch sizes, so that its rows are numbered and its frames
    split exactly as a reader of the whole table would (routing reads the whole table again)."""

    table: str
    source: str  # the folder the table is read from (the lake, or a stage's staging folder)
    files: tuple[str, ...]
    first_row: int
    frame_rows: int
    batch_rows: int
    run_name: str  # names the part's GE runs within the gate run


def table_parts(reader: LakeTableReader, batch_rows: int, run_id: str) -> list[TablePart]:
    """The reader's files as one part per bucket folder (a user's rows all lie in one)."""
    parts, first = [], 0
    for number, (_, grouped) in enumerate(itertools.groupby(reader.files, key=lambda f: f.parent)):
        files = list(grouped)
        part = TablePart(
            reader.suite.table, str(reader.root), tuple(str(f) for f in files), first, reader.frame_rows,
            batch_rows, f"{run_id}-part{number}",
        )  # fmt: skip
        parts.append(part)
        first += sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    return parts


def check_part(bucket: TablePart, repeated: pl.Series | None, settings: IngestSettings | None) -> CheckedRows:
    """One bucket of a table through its suite (``repeated``: the whole table's duplicated key hashes),
    in this process or a worker's: the gate's map step."""
    from validation.ge import Runner

    suite = all_suites(settings)[bucket.table]
    root = Path(bucket.source)
    reader = LakeTableReader(root, suite, [Path(f) for f in bucket.files], bucket.frame_rows, bounded=True)
    runner = Runner(None, bucket.run_name)  # no Data Docs here: the gate's runner adopts the results
    frames = reader.prepared(unique_helper(suite, repeated), bucket.first_row)
    return check_frames(runner, suite, frames, bucket.batch_rows)


#: runs ``check_part`` for every part (with the table's repeated key hashes and the gate's settings)
#: and returns the results in the parts' order: where the flows spread a table's buckets
PartsMap = Callable[[list[TablePart], pl.Series | None, IngestSettings | None], list[CheckedRows]]


# --- the run ------------------------------------------------------------------


@dataclass
class TableVerdict:
    suite: TableSuite
    reader: LakeTableReader | None  # a lake table's rows, read again when rows are routed
    outcomes: list[CheckOutcome]
    report: TableReport


class Gate:
    """One gate run: its id, folders, GE runner and everything it validated."""

    def __init__(
        self,
        lake: Path,
        stage: str,
        settings: IngestSettings | None,
        batch_rows: int,
        staged: Path | None = None,
        frame_rows: int = FRAME_ROWS,
        map_parts: PartsMap | None = None,
    ) -> None:
        from validation.ge import Runner

        self.lake, self.stage, self.batch_rows, self.frame_rows = lake, stage, batch_rows, frame_rows
        self.settings, self.map_parts = settings, map_parts
        # the tables validated (and rewritten by routing) live here; run files and docs go to the lake
        self.source = staged if staged is not None else lake
        self.suites = all_suites(settings)
        now = datetime.now(UTC)
        self.run_id = f"{now:%Y%m%dT%H%M%S}Z-{stage}-{uuid.uuid4().hex[:6]}"
        self.run_dir = lake / RUNS_DIR / self.run_id
        self.runner = Runner(lake / DOCS_DIR / "validation" / self.run_id, self.run_id)
        self.summary = GateSummary(self.run_id, stage, str(lake), now.isoformat())
        self.results: list[dict[str, Any]] = []
        self.checked: list[TableVerdict] = []

    def _run(self, suite: TableSuite, frame: pl.DataFrame) -> list[CheckOutcome]:
        results = self.runner.validate(suite, batches(suite, frame, self.batch_rows))
        self.results += [r.to_json_dict() for r in results]
        outcomes = combine(suite, results)
        attach_examples(suite, frame, outcomes)
        self.summary.outcomes += outcomes
        return outcomes

    def lake_table(self, name: str) -> TableVerdict:
        suite = self.suites[name]
        report = TableReport(name, suite.name, suite.version)
        files = table_files(self.source, name)
        if not files:
            return self._record(TableVerdict(suite, None, [self._missing(suite)], report))
        schema = schema_suite(suite)
        outcomes = self._run(schema, with_check_columns(schema, schema_frame(suite.schema, files)))
        if any(o.stops for o in outcomes):
            return self._record(TableVerdict(suite, None, outcomes, report))
        reader = LakeTableReader(self.source, suite, files, self.frame_rows)
        batch_rows = reader.rows_within(self.batch_rows, BATCH_BYTES)
        repeated = repeated_keys(files, suite)
        parts = table_parts(reader, batch_rows, self.run_id) if self.map_parts is not None else []
        if self.map_parts is not None and len(parts) > 1:
            checked = self.map_parts(parts, repeated, self.settings)
            self.runner.adopt(suite, [r for part in checked for r in part.results])
            outcomes, rows = self._outcomes(suite, checked)
        else:
            outcomes, rows = self._run_frames(
                suite, reader.prepared(unique_helper(suite, repeated)), batch_rows
            )
        report.rows_in = report.rows_out = rows
        return self._record(TableVerdict(suite, reader, outcomes, report))

    def _run_frames(
        self, suite: TableSuite, frames: Iterable[pl.DataFrame], batch_rows: int
    ) -> tuple[list[CheckOutcome], int]:
        """A table frame by frame (each prepared with ``with_check_columns``'s global row numbers): counts
        combined over all frames, examples taken from the frames they lie in; one frame in memory."""
        return self._outcomes(suite, [check_frames(self.runner, suite, frames, batch_rows)])

    def _outcomes(self, suite: TableSuite, parts: Sequence[CheckedRows]) -> tuple[list[CheckOutcome], int]:
        """The outcomes of a table checked in ``parts`` (in the table's row order), their results kept
        for the run's files and Data Docs."""
        results = [r for part in parts for r in part.results]
        self.results += [r.to_json_dict() for r in results]
        outcomes = combine(suite, results) if results else []
        for o in outcomes:
            found = [e for part in parts for e in part.examples.get(o.check, [])][:EXAMPLES]
            o.examples = [] if o.success else found
        self.summary.outcomes += outcomes
        return outcomes, sum(part.rows for part in parts)

    def raw_table(self, suite: TableSuite, chunks: Iterable[pl.DataFrame]) -> TableVerdict | None:
        """A raw table chunk by chunk; None when no chunk was readable."""
        outcomes, rows = self._run_frames(suite, chunks, self.batch_rows)
        if not outcomes:
            return None  # nothing readable: the ingest's quarantine has every row
        report = TableReport(suite.name, suite.name, suite.version, rows, rows)
        return self._record(TableVerdict(suite, None, outcomes, report))

    def _missing(self, suite: TableSuite) -> CheckOutcome:
        doc = f"the table has Parquet files under {table_dir(self.source, suite.table)}"
        outcome = CheckOutcome(
            suite.name, suite.table, "table_present", "-", "error", "table", doc, success=False
        )
        self.summary.outcomes.append(outcome)
        return outcome

    def _record(self, checked: TableVerdict) -> TableVerdict:
        for o in checked.outcomes:
            target = checked.report.errors if o.stops else checked.report.warnings
            if not o.success or o.exception:
                target.append(o.check)
        self.summary.tables[checked.report.table] = checked.report
        self.checked.append(checked)
        return checked

    def route_all(self, replace: bool) -> None:
        for c in self.checked:
            if c.reader is None or c.suite.raw:
                continue
            if not c.reader.full and any(o.routes for o in c.outcomes):
                raise AssertionError(f"{c.suite.name}: row-level checks need every column loaded")
            moved = route(self.lake, c.suite, c.reader, c.outcomes, replace, self.source)
            c.report.quarantined, c.report.rows_out = moved, c.report.rows_in - moved

    def finish(self, started: float, docs: bool) -> GateSummary:
        self.summary.results_path = str(self.run_dir / "results.json")
        self.summary.docs_index = str(self.runner.build_docs()) if docs else ""
        self.summary.seconds = round(time.perf_counter() - started, 3)
        write_run_files(self.run_dir, self.summary, self.results)
        write_docs_listing(self.lake)
        return self.summary


def lake_tables_present(lake: Path) -> list[str]:
    suites = all_suites()
    return [n for n in LAKE_TABLES if n in suites and table_files(lake, n)]


# --- raw bundles, chunk by chunk -----------------------------------------------------

KEY_SEED = 0x5EED  # any constant: the hashes never leave the gate run


def key_hash(keys: Sequence[str]) -> pl.Expr:
    return pl.struct(list(keys)).hash(KEY_SEED)


class RawBundle:
    """A raw bundle read through the chunked reader (``transforms.readers.read_tables``), so memory
    is bounded by a chunk: key uniqueness, the one check across rows, comes from a first pass that
    keeps only a 64-bit hash per row."""

    def __init__(
        self, raw: str | Path, settings: IngestSettings, chunk_rows: int, only: Collection[str] | None = None
    ) -> None:
        from transforms.readers import check_bundle
        from transforms.rekey import Pseudonymizer

        self.root, self.only = check_bundle(raw), only
        self.unit, self.chunk_rows = settings.timestamp_unit, chunk_rows
        self.pseudonymize = Pseudonymizer(settings.rekey_key)

    def rows_at_once(self, table: str) -> int:
        """Rows of ``table`` read at a time: at most ``chunk_rows``, and no more than ``BATCH_BYTES``
        of them as the Parquet footers count them uncompressed (a chunk is held more than once while
        it is typed and checked); ``RAW_CHUNK_ROWS`` where a file is not Parquet (its rows' size is
        unknown until read)."""
        from transforms.readers import file_format, raw_table_files

        files = raw_table_files(self.root, table)
        if any(file_format(path) != "parquet" for path in files):
            return min(self.chunk_rows, RAW_CHUNK_ROWS)
        names = {name for path in files for name in pq.ParquetFile(path).schema_arrow.names}
        row_bytes = uncompressed_row_bytes(files, sorted(names))
        return max(1, min(self.chunk_rows, int(BATCH_BYTES // max(row_bytes, 1.0))))

    def frames(self, table: str) -> Iterator[pl.DataFrame]:
        """The table's typed chunks, locators renamed for the gate."""
        from transforms.readers import read_tables

        chunk_rows = self.rows_at_once(table)
        chunks = read_tables(self.root, [table], self.unit, self.pseudonymize, chunk_rows, only=self.only)
        for chunk in chunks:
            if chunk.frame.width and chunk.frame.height:
                yield located_raw_rows(chunk.frame)

    def duplicated_keys(self, keys: Sequence[str], table: str) -> pl.Series:
        """Hashes of the keys that occur more than once in the whole table (``recurring_hashes``)."""
        from transforms.readers import estimated_rows

        hashes = (frame.select(key_hash(keys)).to_series() for frame in self.frames(table))
        return recurring_hashes(hashes, estimated_rows(self.root, table))

    def prepared(self, suite: TableSuite) -> Iterator[pl.DataFrame]:
        """Chunks ready for GE, ``_key_unique`` judged against the whole table."""
        duplicated = self.duplicated_keys(suite.keys, suite.table) if suite.keys else None
        unique = [] if duplicated is None else [~key_hash(suite.keys).is_in(duplicated).alias("_key_unique")]
        rows = 0
        for frame in self.frames(suite.table):
            yield with_check_columns(suite, frame, rows, unique)
            rows += frame.height


def run_gate(
    lake: str | Path,
    tables: Sequence[str] | None = None,
    *,
    stage: str = "validate",
    replace_quarantine: bool = False,
    raw: str | Path | None = None,
    settings: IngestSettings | None = None,
    batch_rows: int = BATCH_ROWS,
    frame_rows: int = FRAME_ROWS,
    docs: bool = True,
    staged: str | Path | None = None,
    accounting: dict[str, dict[str, int]] | None = None,
    raw_files: Collection[str] | None = None,
    map_parts: PartsMap | None = None,
) -> GateSummary:
    """Validate lake ``tables`` (default: every present table with a suite) and, if ``raw``
    is given, the raw bundle's tables (``raw_files``: only these files of it, relative to ``raw``).
    Raises :class:`GateError` on an error-severity failure.

    ``replace_quarantine``: the calling stage has just rewritten these tables, so the
    gate's earlier quarantine rows for them are replaced; on-demand runs append.
    ``docs=False`` skips rendering Data Docs (throwaway lakes in tests).
    ``frame_rows``: about how many rows of a lake table are in memory at once (``LakeTableReader``);
    GE validates them ``batch_rows`` at a time.
    ``staged``: the stage's staging folder (``transforms.lake.Staging``): the tables are read
    (and rewritten by routing) there, while run files and Data Docs go to the lake.
    ``map_parts``: checks a partitioned table's buckets (``check_part``) wherever it runs them, the
    whole table's key uniqueness and schema, the combining, routing and Data Docs staying here.
    ``accounting``: the stage's rows per input table (``rows_in``, ``rows_out``, ``quarantined``),
    judged by :func:`loss_outcomes` against ``settings.max_quarantined_share``; the reasons are
    read from the stage's quarantine partition.
    """
    started = time.perf_counter()
    lake = Path(lake)
    source = Path(staged) if staged is not None else lake
    names = list(tables) if tables else lake_tables_present(source)
    unknown = [n for n in names if n not in all_suites(settings) or n not in LAKE_TABLES]
    if unknown:
        known = ", ".join(n for n in LAKE_TABLES if n in all_suites(settings))
        raise ValueError(f"no validation suite for {', '.join(unknown)}; tables with suites: {known}")
    gate = Gate(lake, stage, settings, batch_rows, source, frame_rows, map_parts)
    settings = settings or IngestSettings()
    if accounting is not None:
        reasons = lost_reasons(source, stage)
        gate.summary.outcomes += loss_outcomes(accounting, reasons, settings.max_quarantined_share)
    for name in names:
        gate.lake_table(name)
    if raw is not None:
        bundle = RawBundle(raw, settings, batch_rows, raw_files)
        for name in RAW_TABLES:
            suite = gate.suites[f"raw.{name}"]
            gate.raw_table(suite, bundle.prepared(suite))
    if gate.summary.ok:
        gate.route_all(replace_quarantine)
    summary = gate.finish(started, docs)
    if not summary.ok:
        raise GateError(summary)
    return summary
