"""Readers for the raw log bundle: Parquet, JSONL (plain or gzip) and CSV part files.

Every table is read into a frame with the declared types of ``RAW_TABLES`` plus
two locator columns, ``_file`` (path relative to the bundle) and ``_row``
(0-based row or line). Rows that cannot be read or typed never vanish: they
come back as quarantine rows with a reason code. Of a rejected ``events`` row,
what can still be read of its place (``rejected_event_marks``) comes back beside
them, so alignment can cut its session there instead of joining the events
around it; a line that is not JSON has no readable page view and no mark.

A file that cannot be read at all is quarantined as ``unreadable_file``, one row for each row it
held (from its Parquet footer or its lines), so the accounting still balances; only I/O and parse
errors are caught so: any other exception is a bug of the reader and stops the run.

Values are coerced column by column: a value that is present but does not
convert to the declared type is a ``schema_mismatch``; a required column that
is null is ``missing_required_field``. Numeric epoch timestamps are accepted in
s/ms/us/ns (unit inferred from magnitude unless configured); ISO-8601 strings
with an offset or ``Z`` are converted to UTC, naive ones are read as UTC.
"""

from __future__ import annotations

import gzip
import itertools
import json
import zlib
from collections import deque
from collections.abc import Callable, Collection, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from transforms.schemas import OPTIONAL_TABLES, RAW_REQUIRED, RAW_TABLES, polars_schema

SUFFIXES: dict[str, str] = {
    ".parquet": "parquet",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".jsonl.gz": "jsonl.gz",
    ".ndjson.gz": "jsonl.gz",
    ".csv": "csv",
    ".csv.gz": "csv.gz",
}
LOCATORS = ("_file", "_row")
REJECT_COLUMNS = ("table_name", "source_file", "source_row", "reason", "detail", "payload")
MAX_FIELD_CHARS = 65_536  # a longer string field is quarantined, not carried into the lake
ISO_AWARE = ("%Y-%m-%dT%H:%M:%S%.f%#z", "%Y-%m-%d %H:%M:%S%.f%#z")
ISO_NAIVE = ("%Y-%m-%dT%H:%M:%S%.f", "%Y-%m-%d %H:%M:%S%.f", "%Y-%m-%d")
NESTED = {"params", "reviews", "visible_items"}
ROW_BYTES = {"jsonl": 200, "jsonl.gz": 40, "csv": 100, "csv.gz": 20}  # rough row sizes, to plan parts
#: what reading a broken, truncated or misnamed file raises; anything else is a bug of ours
READ_ERRORS: tuple[type[BaseException], ...] = (
    OSError,  # gzip.BadGzipFile too
    EOFError,
    zlib.error,
    UnicodeDecodeError,
    pa.ArrowException,
    pl.exceptions.PolarsError,
)


class BundleError(Exception):
    """The bundle as a whole cannot be ingested (missing folder or required table)."""


EVENT_MARKS = {
    "page_view_id": pl.String,
    "ts": pl.Datetime("ms", "UTC"),
    "action": pl.String,
    "_file": pl.String,
    "_row": pl.Int64,
    "reason": pl.String,
}


def no_event_marks() -> pl.DataFrame:
    return pl.DataFrame(schema=EVENT_MARKS)


def rejected_event_marks(
    rejected: pl.DataFrame, typed: dict[str, pl.Expr], carry: Sequence[str] = ()
) -> pl.DataFrame:
    """Where rejected events rows stood, from their raw values (never the pseudonymized payload):
    ``page_view_id`` and ``action`` where their own values are usable text, ``ts`` where it typed
    (else null), the source locator (with the ``carry`` columns) and the reject reason.
    ``rejected``: rows of ``coerce``'s tagged frame, whose typed columns ``typed`` names."""

    def usable(name: str) -> pl.Expr:
        text = typed[name]
        fine = (text.str.len_bytes() <= MAX_FIELD_CHARS) & ~text.str.contains("\x00", literal=True)
        return pl.when(fine).then(text)

    return rejected.select(
        usable("page_view_id").alias("page_view_id"),
        typed["ts"].alias("ts"),
        usable("action").alias("action"),
        "_file",
        pl.col("_row").cast(pl.Int64),
        *carry,
        pl.col("_reason").alias("reason"),
    ).cast(EVENT_MARKS)


@dataclass
class TableRead:
    """One raw table: typed rows, rejected rows, and how many rows came in."""

    name: str
    frame: pl.DataFrame
    rejects: pl.DataFrame
    rows_in: int
    files: list[str] = field(default_factory=list)
    naive_timestamps: int = 0
    merged: int = 0  # exact repeats merged by the reader itself (counted as duplicates)
    rejected_events: pl.DataFrame = field(default_factory=no_event_marks)  # events only


def empty_rejects() -> pl.DataFrame:
    return pl.DataFrame(
        schema={
            "table_name": pl.String,
            "source_file": pl.String,
            "source_row": pl.Int64,
            "reason": pl.String,
            "detail": pl.String,
            "payload": pl.String,
        }
    )


Pseudonymize = Callable[[pl.DataFrame], pl.DataFrame]


def reject_rows(
    table: str,
    rows: pl.DataFrame,
    reason: str | pl.Expr | pl.Series,
    detail: str | pl.Expr | pl.Series | None = None,
    pseudonymize: Pseudonymize | None = None,
) -> pl.DataFrame:
    """Quarantine rows from a frame carrying ``_file``/``_row``.

    The payload is the row as JSON with identifiers replaced by their pseudonyms,
    so quarantine never stores a platform id.
    """
    if pseudonymize is not None:
        rows = pseudonymize(rows)
    data = [c for c in rows.columns if not c.startswith("_")]
    as_expr = lambda v: v if isinstance(v, pl.Expr | pl.Series) else pl.lit(v, dtype=pl.String)  # noqa: E731
    payload = pl.struct(data).struct.json_encode() if data else pl.lit(None, dtype=pl.String)
    return rows.select(
        pl.lit(table).alias("table_name"),
        pl.col("_file").alias("source_file"),
        pl.col("_row").cast(pl.Int64).alias("source_row"),
        as_expr(reason).alias("reason"),
        as_expr(detail).alias("detail"),
        payload.alias("payload"),
    )


def raw_table_files(root: Path, name: str) -> list[Path]:
    """Part files of one table: ``root/name/**`` or a single ``root/name.<ext>``."""
    folder = root / name
    candidates = sorted(p for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else []
    candidates += sorted(p for p in root.glob(f"{name}.*") if p.is_file())
    return [p for p in candidates if file_format(p) is not None]


def file_format(path: Path) -> str | None:
    name = path.name.lower()
    for suffix in sorted(SUFFIXES, key=len, reverse=True):
        if name.endswith(suffix):
            return SUFFIXES[suffix]
    return None


# --- loose frames: whatever types the file holds ------------------------------


def _loose_parquet(path: Path, rows: tuple[int, int] | None = None) -> pl.DataFrame:
    """The file (or the row range ``(offset, length)``) with Polars' reader, several times faster than
    Arrow's on nested columns; a file Polars refuses is read by Arrow, whose error, if any, is the one
    quarantined."""
    try:
        scan = pl.scan_parquet(path, hive_partitioning=False)
        return (scan.slice(*rows) if rows else scan).collect()
    except READ_ERRORS:
        frame = pl.from_arrow(pq.read_table(path))
        return frame.slice(*rows) if rows else frame


def _decode_lines(data: bytes) -> list[tuple[int, str | None]]:
    """(line number, text or None when not UTF-8) for every non-blank line."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    lines = []
    for number, raw in enumerate(data.split(b"\n")):
        raw = raw.rstrip(b"\r")
        if not raw.strip():
            continue
        try:
            lines.append((number, raw.decode("utf-8")))
        except UnicodeDecodeError:
            lines.append((number, None))
    return lines


def _json_scalar(value: object) -> str | None:
    """JSON scalars as text for the common string->type coercion; containers stay JSON."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(value, ensure_ascii=False)


def _loose_jsonl(path: Path, table: str, rel: str, gz: bool) -> tuple[pl.DataFrame, pl.DataFrame]:
    data = path.read_bytes()
    if gz:
        data = gzip.decompress(data)
    parsed: list[dict] = []
    rows: list[int] = []
    bad: list[tuple[int, str]] = []
    for number, text in _decode_lines(data):
        if text is None:
            bad.append((number, "line is not valid UTF-8"))
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            bad.append((number, f"invalid JSON: {exc.msg} at column {exc.colno}"))
            continue
        if not isinstance(obj, dict):
            bad.append((number, f"JSON line is a {type(obj).__name__}, not an object"))
            continue
        parsed.append(obj)
        rows.append(number)
    keys: dict[str, None] = {}
    for obj in parsed:
        keys.update(dict.fromkeys(obj))
    columns = {
        k: pl.Series(k, [o.get(k) if k in NESTED else _json_scalar(o.get(k)) for o in parsed], strict=False)
        if k in NESTED
        else pl.Series(k, [_json_scalar(o.get(k)) for o in parsed], dtype=pl.String)
        for k in keys
    }
    frame = pl.DataFrame(columns).with_columns(
        pl.lit(rel).alias("_file"), pl.Series("_row", rows, dtype=pl.Int64)
    )
    rejects = pl.DataFrame(
        {
            "table_name": [table] * len(bad),
            "source_file": [rel] * len(bad),
            "source_row": [n for n, _ in bad],
            "reason": ["unparseable_row"] * len(bad),
            "detail": [d for _, d in bad],
            "payload": [None] * len(bad),
        },
        schema=empty_rejects().schema,
    )
    return frame, rejects


def _loose_csv(path: Path, gz: bool) -> pl.DataFrame:
    data = path.read_bytes()
    if gz:
        data = gzip.decompress(data)
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    return pl.read_csv(data, infer_schema=False, encoding="utf8", truncate_ragged_lines=False)


# --- coercion to the declared schema --------------------------------------


def _epoch_to_ms(values: pl.Expr, unit: str) -> pl.Expr:
    """Integer epoch in ``unit`` (or inferred from magnitude) to UTC ms timestamps."""
    v = values.cast(pl.Float64)
    if unit == "auto":
        scale = (
            pl.when(v.abs() < 1e11)
            .then(1000.0)
            .when(v.abs() < 1e14)
            .then(1.0)
            .when(v.abs() < 1e17)
            .then(1e-3)
            .otherwise(1e-6)
        )
    else:
        scale = pl.lit({"s": 1000.0, "ms": 1.0, "us": 1e-3, "ns": 1e-6}[unit])
    return (v * scale).round().cast(pl.Int64).cast(pl.Datetime("ms", "UTC"))


def _timestamp_from_text(text: pl.Expr, unit: str) -> pl.Expr:
    cleaned = text.str.strip_chars().str.replace(r"Z$", "+00:00")
    aware = [
        cleaned.str.strptime(pl.Datetime("ms"), f, strict=False).dt.convert_time_zone("UTC")
        for f in ISO_AWARE
    ]
    naive = [
        cleaned.str.strptime(pl.Datetime("ms"), f, strict=False).dt.replace_time_zone("UTC")
        for f in ISO_NAIVE
    ]
    numeric = _epoch_to_ms(cleaned.cast(pl.Float64, strict=False), unit)
    return pl.coalesce([*aware, *naive, numeric])


def _naive_text(text: pl.Expr) -> pl.Expr:
    """True where a text timestamp carries no offset (read as UTC, counted in the summary)."""
    cleaned = text.str.strip_chars()
    return cleaned.str.contains(r"^\d{4}-\d{2}-\d{2}") & ~cleaned.str.contains(r"(Z|[+-]\d{2}:?\d{2})$")


def _coerce_timestamp(col: pl.Expr, dtype: pl.DataType, unit: str) -> pl.Expr:
    if isinstance(dtype, pl.Datetime):
        if dtype.time_zone is None:
            return col.dt.replace_time_zone("UTC").dt.cast_time_unit("ms")
        return col.dt.convert_time_zone("UTC").dt.cast_time_unit("ms")
    if dtype.is_numeric():
        return _epoch_to_ms(col, unit)
    return _timestamp_from_text(col.cast(pl.String), unit)


def _coerce_scalar(col: pl.Expr, source: pl.DataType, target: pa.DataType, unit: str) -> pl.Expr:
    if pa.types.is_timestamp(target):
        return _coerce_timestamp(col, source, unit)
    if pa.types.is_string(target):
        return col if source == pl.String else col.cast(pl.String, strict=False)
    if pa.types.is_integer(target):
        as_float = col.cast(pl.Float64, strict=False) if source == pl.String else col.cast(pl.Float64)
        whole = as_float.is_finite() & (as_float == as_float.round()) & (as_float.abs() < 2**31)
        return pl.when(whole).then(as_float).otherwise(None).cast(pl.Int32)
    if pa.types.is_floating(target):
        return (
            col.str.strip_chars().cast(pl.Float64, strict=False)
            if source == pl.String
            else col.cast(pl.Float64)
        )
    raise TypeError(f"no coercion to {target}")


def _nested_value(value: object, kind: str) -> tuple[object, bool]:
    """Validate one nested value (list of params or of strings); JSON text is decoded."""
    if value is None:
        return None, True
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return None, False
    if isinstance(value, pl.Series):
        value = value.to_list()
    if not isinstance(value, list):
        return None, False
    if kind == "params":
        ok = all(isinstance(p, dict) and {"label", "value"} <= set(p) for p in value)
        cleaned = (
            [{"label": _json_scalar(p["label"]), "value": _json_scalar(p["value"])} for p in value]
            if ok
            else None
        )
        return cleaned, ok
    ok = all(isinstance(v, str) for v in value)
    return (value if ok else None), ok


def _coerce_nested(series: pl.Series, name: str, target: pa.DataType) -> tuple[pl.Series, pl.Series]:
    dtype = (
        pl.List(pl.Struct({"label": pl.String, "value": pl.String}))
        if name == "params"
        else pl.List(pl.String)
    )
    fine = pl.repeat(True, series.len(), eager=True).alias(name)
    if series.dtype == dtype:
        return series, fine
    if series.null_count() == series.len():  # e.g. an absent optional column: nothing to convert
        return pl.repeat(None, series.len(), dtype=dtype, eager=True).alias(name), fine
    if series.dtype == pl.List(pl.Struct) or (
        isinstance(series.dtype, pl.List) and series.dtype.inner == pl.String and name != "params"
    ):
        try:
            return series.cast(dtype), pl.Series(name, [True] * len(series))
        except pl.exceptions.PolarsError:
            pass
    kind = "params" if name == "params" else "strings"
    pairs = [_nested_value(v, kind) for v in series.to_list()]
    values = pl.Series(name, [p[0] for p in pairs], dtype=dtype)
    return values, pl.Series(name, [p[1] for p in pairs])


@cache
def _target_dtypes(table: str) -> dict[str, pl.DataType]:
    return dict(polars_schema(RAW_TABLES[table]))


def coerce(
    loose: pl.DataFrame,
    table: str,
    unit: str = "auto",
    pseudonymize: Pseudonymize | None = None,
    carry: Sequence[str] = (),
) -> tuple[pl.DataFrame, pl.DataFrame, int, pl.DataFrame]:
    """Cast a loose frame to the declared raw schema.

    Returns (typed rows, rejects, naive timestamp count, ``rejected_event_marks`` of the rejected
    rows: events only, else empty). Undeclared columns are
    dropped except for ``profiles`` (extra attributes are data there) and the ``carry`` columns,
    which locate a row more finely than ``_file``/``_row`` and go on beside them in the typed rows
    and the marks (never into a payload). Columns that already have their declared type pass
    through untouched.
    """
    schema, targets = RAW_TABLES[table], _target_dtypes(table)
    frame = loose.with_columns(
        [pl.lit(None, dtype=pl.String).alias(f.name) for f in schema if f.name not in loose.columns]
    )
    converted: dict[str, pl.Expr] = {}
    bad_type: dict[str, pl.Expr] = {}
    naive = 0
    for f in schema:
        source = frame.schema[f.name]
        if source == targets[f.name]:
            continue
        if f.name in NESTED:
            values, ok = _coerce_nested(frame[f.name], f.name, f.type)
            frame = frame.with_columns(values.alias(f"_typed_{f.name}"), ok.alias(f"_ok_{f.name}"))
            bad_type[f.name] = ~pl.col(f"_ok_{f.name}")
            continue
        if pa.types.is_timestamp(f.type) and source == pl.String:
            naive = int(frame.select(_naive_text(pl.col(f.name)).sum()).item() or 0)
        converted[f.name] = _coerce_scalar(pl.col(f.name), source, f.type, unit)
        bad_type[f.name] = pl.col(f.name).is_not_null() & pl.col(f"_typed_{f.name}").is_null()
    frame = frame.with_columns([e.alias(f"_typed_{n}") for n, e in converted.items()])
    typed = {
        f.name: pl.col(f"_typed_{f.name}" if f"_typed_{f.name}" in frame.columns else f.name) for f in schema
    }
    reason, detail = _reject_reason(schema, table, typed, bad_type)
    tagged = frame.with_columns(reason.alias("_reason"))
    declared = [f.name for f in schema]
    extras = (
        [c for c in loose.columns if c not in declared and not c.startswith("_")]
        if table == "profiles"
        else []
    )
    clean = tagged["_reason"].null_count() == tagged.height  # the common case: nothing to reject
    outputs = [typed[c].alias(c) for c in declared] + [pl.col(c).cast(pl.String) for c in extras]
    locators = [*LOCATORS, *carry]
    rejected = tagged.clear() if clean else tagged.filter(pl.col("_reason").is_not_null())
    marks = rejected_event_marks(rejected, typed, carry) if table == "events" else no_event_marks()
    if clean:
        return tagged.select([*outputs, *locators]), empty_rejects(), naive, marks
    rejected = rejected.with_columns(detail.alias("_detail"))
    rejects = reject_rows(
        table,
        rejected.select([*declared, *extras, *LOCATORS]),
        rejected["_reason"],
        rejected["_detail"],
        pseudonymize,
    )
    good = tagged.filter(pl.col("_reason").is_null()).select([*outputs, *locators])
    return good, rejects, naive, marks


def _reject_reason(
    schema: pa.Schema, table: str, typed: dict[str, pl.Expr], bad_type: dict[str, pl.Expr]
) -> tuple[pl.Expr, pl.Expr]:
    """The reason and detail expressions of a row: first failing check wins (type, size, NUL,
    required)."""
    strings = [typed[f.name] for f in schema if pa.types.is_string(f.type)]
    required = RAW_REQUIRED[table]
    mistyped = pl.any_horizontal(list(bad_type.values())) if bad_type else pl.lit(False)
    oversized = pl.any_horizontal([c.str.len_bytes().fill_null(0) > MAX_FIELD_CHARS for c in strings])
    nul = pl.any_horizontal([c.str.contains("\x00", literal=True).fill_null(False) for c in strings])
    missing = pl.any_horizontal([typed[c].is_null() for c in required])

    def names(flags: list[tuple[str, pl.Expr]]) -> pl.Expr:
        parts = [pl.when(flag).then(pl.lit(name)) for name, flag in flags]
        return pl.concat_str(parts, separator=",", ignore_nulls=True) if parts else pl.lit("")

    reason = (
        pl.when(mistyped)
        .then(pl.lit("schema_mismatch"))
        .when(oversized)
        .then(pl.lit("field_too_large"))
        .when(nul)
        .then(pl.lit("nul_byte"))
        .when(missing)
        .then(pl.lit("missing_required_field"))
    )
    detail = (
        pl.when(mistyped)
        .then(
            pl.concat_str(
                pl.lit("value does not convert to the declared type: "), names(list(bad_type.items()))
            )
        )
        .when(oversized)
        .then(pl.lit(f"a text field is longer than {MAX_FIELD_CHARS} bytes"))
        .when(nul)
        .then(pl.lit("a text field contains a NUL byte"))
        .when(missing)
        .then(
            pl.concat_str(
                pl.lit("required field is null: "), names([(c, typed[c].is_null()) for c in required])
            )
        )
    )
    return reason, detail


def read_file(
    path: Path, root: Path, table: str, unit: str, pseudonymize: Pseudonymize | None = None
) -> tuple[pl.DataFrame, pl.DataFrame, int, int, pl.DataFrame]:
    """One part file -> (typed rows, rejects, rows in, naive timestamps, rejected events' marks)."""
    return _read_rows(path, root, table, unit, pseudonymize)


def _read_rows(
    path: Path,
    root: Path,
    table: str,
    unit: str,
    pseudonymize: Pseudonymize | None,
    rows: tuple[int, int] | None = None,
) -> tuple[pl.DataFrame, pl.DataFrame, int, int, pl.DataFrame]:
    """A whole file, or the Parquet row range ``rows`` (``_row`` counts from the file's start)."""
    rel = path.relative_to(root).as_posix()
    fmt = file_format(path)
    try:
        if fmt == "parquet":
            loose, rejects = _loose_parquet(path, rows), empty_rejects()
            first = rows[0] if rows else 0
            loose = loose.with_columns(
                pl.lit(rel).alias("_file"),
                pl.int_range(first, first + pl.len(), dtype=pl.Int64).alias("_row"),
            )
        elif fmt in ("jsonl", "jsonl.gz"):
            loose, rejects = _loose_jsonl(path, table, rel, gz=fmt == "jsonl.gz")
        else:
            loose, rejects = _loose_csv(path, gz=fmt == "csv.gz"), empty_rejects()
            # CSV row k is line k+1 (after the header)
            loose = loose.with_columns(
                pl.lit(rel).alias("_file"), pl.int_range(pl.len(), dtype=pl.Int64).alias("_row")
            )
    except READ_ERRORS as exc:  # the file is lost, never its rows: each counts as quarantined
        unreadable = unreadable_rows(path, rel, table, exc, rows)
        return pl.DataFrame(), unreadable, unreadable.height, 0, no_event_marks()
    good, typed_rejects, naive, marks = coerce(loose, table, unit, pseudonymize)
    rows_in = loose.height + rejects.height
    return good, pl.concat([rejects, typed_rejects]), rows_in, naive, marks


def rows_held(path: Path) -> tuple[int, str] | None:
    """How many rows an unreadable file held, and how that is known: its Parquet footer, or its
    non-blank lines (CSV: less the header); None when neither can be read."""
    fmt = file_format(path)
    try:
        if fmt == "parquet":
            return pq.read_metadata(path).num_rows, "its Parquet footer"
        data = path.read_bytes()
        data = gzip.decompress(data) if fmt in ("jsonl.gz", "csv.gz") else data
    except READ_ERRORS:
        return None
    lines = sum(1 for line in data.split(b"\n") if line.strip())
    if fmt in ("csv", "csv.gz"):
        return max(lines - 1, 0), "its lines less the header"
    return lines, "its lines"


def unreadable_rows(
    path: Path, rel: str, table: str, error: BaseException, rows: tuple[int, int] | None = None
) -> pl.DataFrame:
    """One ``unreadable_file`` quarantine row per row the file (or its row range ``rows``) held; one
    row for the whole file when its rows cannot be counted."""
    held = (rows[1], "its Parquet footer") if rows else rows_held(path)
    first = rows[0] if rows else 0
    count, source = held if held is not None else (1, None)
    message = str(error).splitlines()[0][:200] if str(error) else ""
    counted = f"{count:,} rows counted from {source}" if source else "its rows could not be counted"
    return pl.DataFrame(
        {
            "table_name": table,
            "source_file": rel,
            "source_row": pl.int_range(first, first + count, dtype=pl.Int64, eager=True)
            if source
            else pl.Series([None], dtype=pl.Int64),
            "reason": "unreadable_file",
            "detail": f"{type(error).__name__}: {message} ({counted})",
            "payload": None,
        },
        schema=empty_rejects().schema,
    )


def row_ranges(meta: pq.FileMetaData, chunk_rows: int) -> list[tuple[int, int]]:
    """Row ranges of a Parquet file (its footer ``meta``), about ``chunk_rows`` rows each: whole row
    groups, several together where they are small, and a group larger than ``chunk_rows`` in even
    slices of at most that (a writer's million-row groups of wide item rows would otherwise be
    several times the chunk that the reader's memory is planned for)."""
    ranges, start, size = [], 0, 0
    for group in range(meta.num_row_groups):
        rows = meta.row_group(group).num_rows
        if rows > chunk_rows:
            if size:
                ranges.append((start, size))
                start, size = start + size, 0
            slices = -(-rows // chunk_rows)
            bounds = [start + rows * k // slices for k in range(slices + 1)]
            ranges += [(a, b - a) for a, b in itertools.pairwise(bounds)]
            start += rows
            continue
        size += rows
        if size >= chunk_rows:
            ranges.append((start, size))
            start, size = start + size, 0
    if size:
        ranges.append((start, size))
    return ranges


@dataclass
class Chunk:
    """What one read covers: a row range of one file, or several small Parquet files whole."""

    table: str
    paths: list[Path]
    rows: tuple[int, int] | None = None


def chunk_plan(root: Path, table: str, chunk_rows: int, only: Collection[str] | None = None) -> list[Chunk]:
    """The table's chunks in ``_file`` order: big Parquet files by row groups (``row_ranges``);
    consecutive small ones together up to ``chunk_rows`` rows (daily part files are typical, and
    every read has a fixed cost); other formats, and files whose footer cannot be read (the
    reader quarantines them with its own error), one file each. ``only``: the files (relative to
    ``root``) to read, the others left out."""
    chunks: list[Chunk] = []
    small: list[Path] = []
    small_rows = 0
    files = sorted(raw_table_files(root, table), key=lambda p: p.relative_to(root).as_posix())
    if only is not None:
        files = [p for p in files if p.relative_to(root).as_posix() in only]
    for path in files:
        meta = _parquet_footer(path)
        rows = meta.num_rows if meta is not None else None
        if rows is not None and rows <= chunk_rows:
            if small and small_rows + rows > chunk_rows:
                chunks.append(Chunk(table, small))
                small, small_rows = [], 0
            small.append(path)
            small_rows += rows
            continue
        if small:
            chunks.append(Chunk(table, small))
            small, small_rows = [], 0
        if meta is None:
            chunks.append(Chunk(table, [path]))
        else:
            chunks += [Chunk(table, [path], rows) for rows in row_ranges(meta, chunk_rows)]
    if small:
        chunks.append(Chunk(table, small))
    return chunks


def _parquet_footer(path: Path) -> pq.FileMetaData | None:
    """A Parquet file's footer; None for other formats and unreadable footers."""
    if file_format(path) != "parquet":
        return None
    try:
        return pq.read_metadata(path)
    except READ_ERRORS:
        return None


def read_tables(
    root: Path,
    tables: Sequence[str],
    unit: str,
    pseudonymize: Pseudonymize | None,
    chunk_rows: int,
    workers: int = 2,
    only: Collection[str] | None = None,
) -> Iterator[TableRead]:
    """Each table in turn as a stream of typed chunks (``chunk_plan``), in ``_file`` order, with
    ``workers`` chunks read and typed ahead in threads (a Parquet row group decodes on one core):
    at most ``workers + 1`` chunks of about ``chunk_rows`` rows are in memory at once. ``only``: the
    files to read (relative to ``root``), the others left out."""
    chunks = (chunk for table in tables for chunk in chunk_plan(root, table, chunk_rows, only))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="read") as pool:
        ahead: deque[Future[TableRead]] = deque()
        for chunk in chunks:
            ahead.append(pool.submit(read_chunk, root, chunk, unit, pseudonymize))
            if len(ahead) > workers:
                yield ahead.popleft().result()
        while ahead:
            yield ahead.popleft().result()


def read_chunk(root: Path, chunk: Chunk, unit: str, pseudonymize: Pseudonymize | None) -> TableRead:
    """One chunk, typed. Several files are read as one frame when their schemas agree (the typing is
    row by row, so the result is the files' own); otherwise, or when any of them fails, file by file."""
    rels = [p.relative_to(root).as_posix() for p in chunk.paths]
    if len(chunk.paths) > 1:
        try:
            loose = _loose_parquet_files(chunk.paths, root)
        except READ_ERRORS:
            pass  # read one by one below: each file gets its own reader and its own error
        else:
            good, bad, naive, marks = coerce(loose, chunk.table, unit, pseudonymize)
            return TableRead(chunk.table, good, bad, loose.height, rels, naive, rejected_events=marks)
    reads = [_read_rows(path, root, chunk.table, unit, pseudonymize, chunk.rows) for path in chunk.paths]
    frames = [good for good, *_ in reads if good.width]
    return TableRead(
        chunk.table,
        pl.concat(frames, how="diagonal_relaxed") if frames else pl.DataFrame(),
        pl.concat([bad for _, bad, *_ in reads]),
        sum(n for _, _, n, *_ in reads),
        rels,
        sum(naive for _, _, _, naive, _ in reads),
        rejected_events=pl.concat([marks for *_, marks in reads]),
    )


def _loose_parquet_files(paths: list[Path], root: Path) -> pl.DataFrame:
    """Parquet files with one schema as one frame, each row with its file and row locator."""
    frame = pl.scan_parquet(paths, hive_partitioning=False, include_file_paths="_path").collect()
    rels = {str(p): p.relative_to(root).as_posix() for p in paths}
    # a path the scan spells otherwise fails here, and the files are read one by one instead
    rel = pl.col("_path").replace_strict(rels, return_dtype=pl.String)
    return frame.with_columns(
        rel.alias("_file"), pl.int_range(pl.len(), dtype=pl.Int64).over("_path").alias("_row")
    ).drop("_path")


def estimated_rows(root: Path, table: str) -> int:
    """Rows of a table from Parquet footers, else from file sizes (enough to choose a part count)."""
    total = 0
    for path in raw_table_files(root, table):
        fmt = file_format(path)
        try:
            total += (
                pq.read_metadata(path).num_rows if fmt == "parquet" else path.stat().st_size // ROW_BYTES[fmt]
            )
        except READ_ERRORS:
            continue  # an unreadable file is quarantined by the reader; nothing to plan for
    return total


def _no_table(root: Path, table: str) -> BundleError:
    return BundleError(
        f"The raw bundle {root} has no '{table}' table: expected a folder {table}/ of part files "
        f"or a file {table}.parquet|.jsonl|.jsonl.gz|.csv."
    )


def check_bundle(root: str | Path) -> Path:
    """The bundle folder, or the ``BundleError`` that ``read_bundle`` would raise for it."""
    root = Path(root)
    if not root.is_dir():
        raise BundleError(f"The raw bundle folder {root} does not exist or is not a folder.")
    missing = [t for t in RAW_TABLES if t not in OPTIONAL_TABLES and not raw_table_files(root, t)]
    if missing:
        raise _no_table(root, missing[0])
    return root


def read_raw_table(
    root: Path, table: str, unit: str = "auto", pseudonymize: Pseudonymize | None = None
) -> TableRead:
    files = raw_table_files(root, table)
    if not files:
        if table in OPTIONAL_TABLES:
            empty = (
                polars_schema(RAW_TABLES[table])
                .to_frame()
                .with_columns(
                    pl.lit(None, dtype=pl.String).alias("_file"), pl.lit(None, dtype=pl.Int64).alias("_row")
                )
            )
            return TableRead(table, empty.clear(), empty_rejects(), 0)
        raise _no_table(root, table)
    frames, rejects, rows_in, naive, marks = [], [], 0, 0, []
    for path in files:
        good, bad, n, nv, rejected = read_file(path, root, table, unit, pseudonymize)
        if good.width:
            frames.append(good)
        rejects.append(bad)
        rows_in += n
        naive += nv
        marks.append(rejected)
    frame = pl.concat(frames, how="diagonal_relaxed") if frames else empty_typed(table)
    rels = [p.relative_to(root).as_posix() for p in files]
    return TableRead(table, frame, pl.concat(rejects), rows_in, rels, naive, rejected_events=pl.concat(marks))


def empty_typed(table: str) -> pl.DataFrame:
    return (
        polars_schema(RAW_TABLES[table])
        .to_frame()
        .with_columns(
            pl.lit(None, dtype=pl.String).alias("_file"), pl.lit(None, dtype=pl.Int64).alias("_row")
        )
        .clear()
    )


def read_bundle(
    root: str | Path, unit: str = "auto", pseudonymize: Pseudonymize | None = None
) -> dict[str, TableRead]:
    """Read every table of a raw bundle folder."""
    root = check_bundle(root)
    return {name: read_raw_table(root, name, unit, pseudonymize) for name in RAW_TABLES}
