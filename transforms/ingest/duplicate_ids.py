"""Ids that cross parts: duplicate event and item ids, found by hash and settled over all parts at once."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from transforms import align
from transforms.ingest.hashes import id_hash

RANGE_HASHES = 1 << 23  # hashes checked for repeats at once: a range of the hash space
HASH_BUFFER = 1 << 22  # hashes buffered before they are written by range (``IdHashes`` on disk)


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


def _range_width(ranges: int) -> int:
    return -(-(2**64) // ranges)


def in_ranges(hashes: list[pl.Series]) -> Iterator[pl.Series]:
    """``hashes`` one range of the hash space at a time, ``RANGE_HASHES`` hashes each, about."""
    ranges = max(1, -(-sum(h.len() for h in hashes) // RANGE_HASHES))
    width = _range_width(ranges)
    for low in range(0, 2**64, width):
        high = min(low + width, 2**64) - 1
        yield pl.concat([pl.Series(dtype=pl.UInt64), *(h.filter(h.is_between(low, high)) for h in hashes)])


@dataclass
class IdHashes:
    """The hashes of one id column, every row's, for the duplicate check. In memory, or (``folder``
    set) written to disk by range of the hash space, ``ranges`` of them, as they come: a big
    bundle's event ids would otherwise stay in memory from the first chunk read to the check."""

    folder: Path | None = None
    ranges: int = 1
    chunks: list[pl.Series] = field(default_factory=list)
    buffered: int = 0
    pieces: int = 0

    @classmethod
    def on_disk(cls, folder: Path, expected: int) -> IdHashes:
        """Hashes of about ``expected`` ids, on disk in ranges of about ``RANGE_HASHES``."""
        return cls(folder, max(1, -(-expected // RANGE_HASHES)))

    def add(self, hashes: pl.Series) -> None:
        self.chunks.append(hashes)
        self.buffered += hashes.len()
        if self.folder is not None and self.buffered >= HASH_BUFFER:
            self._flush()

    def _flush(self) -> None:
        hashes = pl.concat([pl.Series("h", dtype=pl.UInt64), *self.chunks]).rename("h")
        self.chunks, self.buffered = [], 0
        width = pl.lit(min(_range_width(self.ranges), 2**64 - 1), pl.UInt64)  # 2**64 is not a UInt64
        by_range = pl.DataFrame({"h": hashes}).with_columns(
            r=(pl.col("h") // width).clip(upper_bound=self.ranges - 1)
        )
        for (r,), rows in by_range.partition_by("r", as_dict=True).items():
            path = self.folder / f"range={r}" / f"{self.pieces:06d}.arrow"
            path.parent.mkdir(parents=True, exist_ok=True)
            rows.select("h").write_ipc(path, compression="uncompressed")
        self.pieces += 1

    def by_range(self) -> Iterator[pl.Series]:
        """Every hash, one range of the hash space at a time; handed over (none are kept)."""
        if self.folder is None:
            chunks, self.chunks = self.chunks, []
            yield from in_ranges(chunks)
            return
        self._flush()
        for r in range(self.ranges):
            files = sorted((self.folder / f"range={r}").glob("*.arrow"))
            pieces = (pl.read_ipc(f)["h"] for f in files)
            yield pl.concat([pl.Series("h", dtype=pl.UInt64), *pieces])


def repeated_hashes(by_range: Iterable[pl.Series]) -> pl.Series:
    """The hashes that occur more than once, from every hash given one range of the hash space at a
    time (``in_ranges``, ``IdHashes.by_range``): counting them all at once would hold a copy and a
    hash table of every id of the bundle."""
    repeated = [pl.Series(dtype=pl.UInt64)]
    for in_range in by_range:
        repeated.append(in_range.filter(in_range.is_duplicated()).unique())
    return pl.concat(repeated)


def settle(
    by_range: Iterable[pl.Series],
    frames: Callable[[], Iterable[pl.DataFrame]],
    key: str,
    dedupe: Callable[[pl.DataFrame], align.CheckedRows],
) -> Settled:
    """``by_range``: the hash of every row's id, one range of the hash space at a time. Ids whose
    hash occurs once are unique (the common case: nothing to read again); the rows
    of the others are gathered from every part and deduplicated together."""
    suspects = repeated_hashes(by_range)
    if suspects.len() == 0:
        return Settled(pl.DataFrame(schema={"_file": pl.String, "_row": pl.Int64}), [], 0)
    suspects = suspects.implode()
    rows = pl.concat((f.filter(id_hash(key).is_in(suspects)) for f in frames()), how="vertical_relaxed")
    checked = dedupe(rows)
    dropped = rows.select("_file", "_row").join(
        checked.rows.select("_file", "_row"), on=["_file", "_row"], how="anti"
    )
    return Settled(dropped, checked.rejects, checked.duplicates)
