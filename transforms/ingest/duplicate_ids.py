"""Ids that cross parts: duplicate event and item ids, found by hash and settled over all parts at once."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import polars as pl

from transforms import align
from transforms.ingest.hashes import id_hash


@dataclass
class Settled:
    """Duplicate ids settled over all parts at once: the rows ``align.dedupe`` merged or rejected
    (by ``_file``, ``_row``), its rejects and its merge count."""

    dropped: pl.DataFrame
    rejects: list[pl.DataFrame]
    duplicates: int

    def apply(self, frame: pl.DataFrame) -> pl.DataFrame:
        if self.dropped.height == 0:
            return frame
        return frame.join(self.dropped, on=["_file", "_row"], how="anti", maintain_order="left")


def settle(
    hashes: list[pl.Series],
    frames: Callable[[], Iterable[pl.DataFrame]],
    key: str,
    dedupe: Callable[[pl.DataFrame], align.CheckedRows],
) -> Settled:
    """Ids whose hash occurs once are unique (the common case: nothing to read again); the rows
    of the others are gathered from every part and deduplicated together."""
    every = pl.concat(hashes) if hashes else pl.Series(dtype=pl.UInt64)
    if every.n_unique() == every.len():
        return Settled(pl.DataFrame(schema={"_file": pl.String, "_row": pl.Int64}), [], 0)
    suspects = every.filter(every.is_duplicated()).unique().implode()
    rows = pl.concat((f.filter(id_hash(key).is_in(suspects)) for f in frames()), how="vertical_relaxed")
    checked = dedupe(rows)
    dropped = rows.select("_file", "_row").join(
        checked.rows.select("_file", "_row"), on=["_file", "_row"], how="anti"
    )
    return Settled(dropped, checked.rejects, checked.duplicates)
