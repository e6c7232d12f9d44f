"""Ids that cross parts: duplicate event and item ids, found by hash and settled over all parts at once."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import polars as pl

from transforms import align
from transforms.ingest.hashes import id_hash

RANGE_HASHES = 1 << 23  # hashes checked for repeats at once: a range of the hash space


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


def repeated_hashes(hashes: list[pl.Series]) -> pl.Series:
    """The hashes that occur more than once in ``hashes``, found one range of the hash space at a
    time (``RANGE_HASHES`` hashes each, about): counting them all at once would hold a copy and a
    hash table of every id of the bundle."""
    total = sum(h.len() for h in hashes)
    ranges = max(1, -(-total // RANGE_HASHES))
    width = -(-(2**64) // ranges)
    repeated = [pl.Series(dtype=pl.UInt64)]
    for low in range(0, 2**64, width):
        high = min(low + width, 2**64) - 1
        pieces = (h.filter(h.is_between(low, high)) for h in hashes)
        in_range = pl.concat([pl.Series(dtype=pl.UInt64), *pieces])
        repeated.append(in_range.filter(in_range.is_duplicated()).unique())
    return pl.concat(repeated)


def settle(
    hashes: list[pl.Series],
    frames: Callable[[], Iterable[pl.DataFrame]],
    key: str,
    dedupe: Callable[[pl.DataFrame], align.CheckedRows],
) -> Settled:
    """Ids whose hash occurs once are unique (the common case: nothing to read again); the rows
    of the others are gathered from every part and deduplicated together."""
    suspects = repeated_hashes(hashes)
    if suspects.len() == 0:
        return Settled(pl.DataFrame(schema={"_file": pl.String, "_row": pl.Int64}), [], 0)
    suspects = suspects.implode()
    rows = pl.concat((f.filter(id_hash(key).is_in(suspects)) for f in frames()), how="vertical_relaxed")
    checked = dedupe(rows)
    dropped = rows.select("_file", "_row").join(
        checked.rows.select("_file", "_row"), on=["_file", "_row"], how="anti"
    )
    return Settled(dropped, checked.rejects, checked.duplicates)
