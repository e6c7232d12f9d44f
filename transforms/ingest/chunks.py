"""Raw tables read in typed chunks: the chunk size, a reader a later pass can run again, frames stacked."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from transforms.config import IngestSettings
from transforms.readers import TableRead, empty_typed, read_tables
from transforms.rekey import Pseudonymizer

READ_CHUNK_ROWS = 1 << 20  # rows read at a time from a big Parquet file: one default row group


def read_chunk_rows(settings: IngestSettings) -> int:
    """Rows read at a time from a big Parquet file: about one default row group, at most a part."""
    return min(spill_part_rows(settings), READ_CHUNK_ROWS)


def spill_part_rows(settings: IngestSettings) -> int:
    """Feed + event rows per part."""
    return settings.spill_part_rows


@dataclass(frozen=True)
class TableReader:
    """How to read raw tables of a bundle in typed chunks, kept so that a later pass can read them
    (again) when it needs them: the items and feeds pass 2 reads where they lie."""

    root: Path
    tables: tuple[str, ...]
    unit: str
    pseudonymize: Pseudonymizer
    chunk_rows: int
    only: frozenset[str] | None = None  # the files to read (relative to root); None: every file

    def chunks(self) -> Iterator[TableRead]:
        """The tables' typed chunks, in reading order."""
        return read_tables(
            self.root, self.tables, self.unit, self.pseudonymize, self.chunk_rows, only=self.only
        )


def stack_frames(frames: list[pl.DataFrame], table: str) -> pl.DataFrame:
    return pl.concat(frames, how="diagonal_relaxed") if frames else empty_typed(table)
