"""The lake on disk: one folder per table, zstd Parquet, atomic replacement.

Layout::

    LAKE/steps/bucket=0/part-0.parquet      (partitioned tables: hive by user bucket)
    LAKE/items/part-0.parquet               (single-file tables)
    LAKE/quarantine/stage=ingest/part-0.parquet
    LAKE/warehouse.duckdb                   (views over all of the above)

A table is written into ``LAKE/.staging/<name>-<token>/`` and then swapped into
place with renames, so readers see the old table or the new one, never a
half-written one.

A stage writes all its tables into a :class:`Staging` folder first
(``LAKE/.staging/<stage>-<token>/``, laid out like the lake itself), so its gate can
validate them there; only tables that passed are swapped into the lake.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path

import polars as pl
import pyarrow as pa

from transforms.config import IngestSettings
from transforms.files import swap_into_place
from transforms.manifest import read_manifest
from transforms.schemas import LAKE_TABLES, PARTITIONED, QUARANTINE, polars_schema

STAGING = ".staging"
# Null counts only: rows lie in user-bucket and page-view-hash order, so the min/max of a row group
# spans nearly the whole range of any column and would prune nothing (they cost a fifth of a write).
ROW_GROUP_STATISTICS = {"min": False, "max": False, "distinct_count": False, "null_count": True}


def table_dir(lake: str | Path, name: str) -> Path:
    return Path(lake) / name


#: a generated bundle's manifest beside the lake ingested from it: enough to rebuild its world
WORLD_FILE = "world.json"


def world_path(lake: str | Path) -> Path:
    return Path(lake) / WORLD_FILE


def conform(frame: pl.DataFrame, schema: pa.Schema) -> pa.Table:
    """Select and cast ``frame`` to the declared schema (missing columns must not exist)."""
    missing = [f.name for f in schema if f.name not in frame.columns]
    if missing:
        raise ValueError(f"frame lacks declared columns {missing}")
    table = frame.select([f.name for f in schema]).to_arrow()
    return table.cast(schema)


def _write_parquet(frame: pl.DataFrame, schema: pa.Schema, path: Path, zstd_level: int) -> None:
    """Write ``frame`` with exactly the declared columns and types (Polars' own writer)."""
    missing = [f.name for f in schema if f.name not in frame.columns]
    if missing:
        raise ValueError(f"frame lacks declared columns {missing}")
    path.parent.mkdir(parents=True, exist_ok=True)
    declared = polars_schema(schema)
    frame.select(list(declared)).cast(dict(declared)).write_parquet(
        path,
        compression="zstd",
        compression_level=zstd_level,
        row_group_size=256_000,
        statistics=ROW_GROUP_STATISTICS,
    )


def _write_tree(
    frame: pl.DataFrame,
    schema: pa.Schema,
    root: Path,
    partition_by: str | None,
    zstd: int,
    file_name: str = "part-0.parquet",
) -> None:
    if partition_by is None:
        _write_parquet(frame, schema, root / file_name, zstd)
        return
    if frame.height == 0:
        # an empty table still exists, so readers and views find its schema
        _write_parquet(frame, schema, root / f"{partition_by}=0" / file_name, zstd)
        return
    # maintain_order keeps each partition in the frame's own (deterministic) order: no sort needed
    for (key,), part in frame.partition_by(partition_by, as_dict=True, maintain_order=True).items():
        _write_parquet(part, schema, root / f"{partition_by}={key}" / file_name, zstd)


class StagedTable:
    """A lake table written piece by piece into staging, then swapped into place whole.

    Each ``add`` writes ``part-<n>.parquet`` (under every ``bucket=K/`` it touches for
    partitioned tables), so a table may hold several files per bucket; readers and the
    DuckDB views read every ``*.parquet`` of the table folder.
    """

    def __init__(
        self, lake: str | Path, name: str, *, schema: pa.Schema | None = None, zstd_level: int = 1
    ) -> None:
        self.lake, self.name = Path(lake), name
        self.schema = schema or LAKE_TABLES[name]
        self.partition_by = "bucket" if name in PARTITIONED else None
        self.staged = self.lake / STAGING / f"{name}-{uuid.uuid4().hex[:8]}"
        self.zstd_level = zstd_level
        self.rows = 0

    def add(self, frame: pl.DataFrame, part: int = 0) -> None:
        if frame.height:
            name = f"part-{part}.parquet"
            _write_tree(frame, self.schema, self.staged, self.partition_by, self.zstd_level, name)
            self.rows += frame.height

    def commit(self) -> Path:
        """Swap the staged table into place (an empty table gets one empty file, as a schema)."""
        if not self.staged.exists():
            empty = polars_schema(self.schema).to_frame()
            _write_tree(empty, self.schema, self.staged, self.partition_by, self.zstd_level)
        swap_into_place(self.staged, table_dir(self.lake, self.name))
        return table_dir(self.lake, self.name)

    def discard(self) -> None:
        shutil.rmtree(self.staged, ignore_errors=True)


class Staging:
    """A stage's tables before they are swapped into the lake: a lake-shaped folder under
    ``LAKE/.staging``. Write into :attr:`root` with the usual writers (``write_table(root, ...)``,
    ``write_quarantine(root, ...)``), validate there, then :meth:`commit` or :meth:`discard`."""

    def __init__(self, lake: str | Path, root: str | Path | None = None) -> None:
        self.lake = Path(lake)
        self.root = Path(root) if root is not None else self.lake / STAGING / f"run-{uuid.uuid4().hex[:8]}"

    def open(self) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        return self.root

    def folders(self) -> list[tuple[Path, Path]]:
        """(staged folder, lake folder) of every staged table; quarantine by stage partition."""
        pairs = []
        for folder in sorted(p for p in self.root.iterdir() if p.is_dir() and p.name != STAGING):
            if folder.name == "quarantine":
                pairs += [(part, table_dir(self.lake, "quarantine") / part.name) for part in folder.iterdir()]
            else:
                pairs.append((folder, table_dir(self.lake, folder.name)))
        return pairs

    def commit(self) -> list[Path]:
        """Swap every staged table into the lake (one rename each); returns the lake folders."""
        swapped = []
        for staged, target in self.folders():
            swap_into_place(staged, target)
            swapped.append(target)
        self.discard()
        return swapped

    def discard(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def write_table(
    lake: str | Path,
    name: str,
    frame: pl.DataFrame,
    *,
    schema: pa.Schema | None = None,
    zstd_level: int = 1,
) -> Path:
    """Atomically (re)write lake table ``name`` from ``frame``; returns its folder."""
    staged = StagedTable(lake, name, schema=schema, zstd_level=zstd_level)
    try:
        staged.add(frame)
        return staged.commit()
    finally:
        staged.discard()


def write_table_part(
    root: str | Path, name: str, frame: pl.DataFrame, file_name: str, *, zstd_level: int = 1
) -> None:
    """One file of lake table ``name`` into the lake-shaped folder ``root`` (a staging folder several
    writers share, each with its own ``file_name``): under its ``bucket=K/`` folders when partitioned.
    An empty frame writes nothing."""
    if frame.height:
        partition_by = "bucket" if name in PARTITIONED else None
        _write_tree(frame, LAKE_TABLES[name], table_dir(root, name), partition_by, zstd_level, file_name)


def quarantine_dir(lake: str | Path, stage: str) -> Path:
    """The quarantine partition of one stage (``quarantine/stage=NAME``)."""
    return table_dir(lake, "quarantine") / f"stage={stage}"


def write_quarantine(lake: str | Path, stage: str, frame: pl.DataFrame, *, zstd_level: int = 1) -> Path:
    """Replace the quarantine rows of one stage (re-runs of a stage never duplicate rows)."""
    staged = Path(lake) / STAGING / f"quarantine-{stage}-{uuid.uuid4().hex[:8]}"
    target = quarantine_dir(lake, stage)
    try:
        rows = frame.with_columns(pl.lit(stage).alias("stage"))
        _write_parquet(rows, QUARANTINE, staged / "part-0.parquet", zstd_level)
        swap_into_place(staged, target)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    return target


def table_files(lake: str | Path, name: str) -> list[Path]:
    return sorted(table_dir(lake, name).rglob("*.parquet"))


def bucket_files(lake: str | Path, name: str) -> list[list[Path]]:
    """A partitioned table's files, bucket by bucket: a user's rows lie in one bucket, but across its
    files (an ingest writes a file per part, and parts follow page views, not users)."""
    by_bucket: dict[Path, list[Path]] = {}
    for path in table_files(lake, name):
        by_bucket.setdefault(path.parent, []).append(path)
    return list(by_bucket.values())


def scan_table(lake: str | Path, name: str, columns: Sequence[str] | None = None) -> pl.LazyFrame:
    """Lazy scan of a lake table with its declared types (hive columns included)."""
    files = table_files(lake, name)
    if not files:
        raise FileNotFoundError(f"lake table {name!r} not found under {lake}")
    return scan_files(name, files, columns)


def scan_files(name: str, files: Sequence[str | Path], columns: Sequence[str] | None = None) -> pl.LazyFrame:
    """Lazy scan of some files of lake table ``name`` (a bucket's, say) with its declared types."""
    frame = pl.scan_parquet(
        [str(f) for f in files],
        schema=polars_schema(LAKE_TABLES[name]),
        hive_partitioning=False,
    )
    return frame.select(columns) if columns else frame


def read_lake_table(lake: str | Path, name: str, columns: Sequence[str] | None = None) -> pl.DataFrame:
    return scan_table(lake, name, columns).collect()


def recorded_settings(lake: str | Path) -> IngestSettings:
    """The settings of the ingest that built ``lake``, so every later reader (gates, prompts, the
    environment) sees the lake as it was built; the key itself is never recorded (it comes from the
    environment). Defaults for a lake no ingest has recorded."""
    manifest = read_manifest(lake, "ingest")
    return IngestSettings(**((manifest and manifest.settings) or {}))


def differing_tables(lake: str | Path, other: str | Path, names: Sequence[str]) -> dict[str, str]:
    """The tables of ``names`` whose rows differ between two lakes (as sets of rows with their
    multiplicities: file layout and row order aside), each with a short reason; empty when they agree."""
    differences = {}
    for name in names:
        files = {str(root): sorted(table_dir(root, name).rglob("*.parquet")) for root in (lake, other)}
        if not any(files.values()):
            continue
        if not all(files.values()):
            differences[name] = "in one lake only"
            continue
        mine, theirs = (pl.read_parquet(f, hive_partitioning=False) for f in files.values())
        if mine.schema != theirs.schema:
            differences[name] = "columns differ"
        elif mine.height != theirs.height:
            differences[name] = f"{mine.height:,} rows against {theirs.height:,}"
        elif not mine.sort(pl.all()).equals(theirs.sort(pl.all())):
            differences[name] = "same row count, different rows"
    return differences
