"""Feeds read where they lie in pass 2 instead of spilled, when every view's cards come together."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from transforms.ingest.chunks import TableReader, stack_frames
from transforms.ingest.hashes import ID_SEED, merge_lookup
from transforms.readers import TableRead, chunk_plan, file_format


@dataclass
class FeedsInPlace:
    """Feeds read where they lie in pass 2, not spilled: when every feeds file is Parquet with string
    ids and each page view's cards come together (the usual layout), a view belongs to the part its
    first card falls in (rows numbered over the files in ``_file`` order), so a part's feeds are one
    run of whole views. One reader walks the files once, in order, and hands each part its rows; pass 1
    reads the ``page_view_id`` column alone and spills only the events, by the same map."""

    views: pl.DataFrame  # _h (a hash of page_view_id; flagged sorted, unique), _view_part
    seed: int
    cuts: pl.Series  # the global row where each part's feed rows begin
    bases: dict[str, int]  # _file -> global row of its first row
    reader: TableReader  # the typed chunks, in order
    rows: int  # rows of every file
    chunks: Iterator[TableRead] | None = None
    ready: dict[int, list[pl.DataFrame]] = field(default_factory=dict)
    complete_below: int = 0  # parts below this one have all their rows in ``ready``
    lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def plan(cls, reader: TableReader, parts: int) -> FeedsInPlace | None:
        """None when the feeds are not all Parquet, or some view's cards are not together."""
        found = _feed_view_runs(reader.root, reader.chunk_rows)
        if found is None:
            return None
        runs, bases = found
        total = int(runs["_rows"].sum())
        per_part = max(1, -(-total // parts))
        part = (pl.col("_start") // per_part).clip(upper_bound=parts - 1)
        runs = runs.with_columns(part.alias("_view_part"))
        first_run = runs["_view_part"].search_sorted(pl.Series(range(parts), dtype=pl.Int64), side="left")
        starts = pl.concat([runs["_start"], pl.Series([total], dtype=pl.Int64)])
        views = runs.filter(pl.col("page_view_id").is_not_null())
        seed = ID_SEED
        while (hashes := views["page_view_id"].hash(seed)).n_unique() < views.height:
            seed += 1  # two views share a hash under this seed: another one separates them
        views = views.select(hashes.alias("_h"), pl.col("_view_part").cast(pl.Int32)).sort("_h")
        return cls(
            views.with_columns(pl.col("_h").set_sorted()),
            seed,
            starts.gather(first_run),
            bases,
            reader,
            total,
        )

    def part_of(self, ids: pl.Series) -> pl.Series:
        """The part of each page view (``merge_lookup``); null for a view without feed rows (whose
        events are rejected in any part: should its hash equal a feed view's, odds about 2^-64, it
        lands in that view's part and finds no cards there either)."""
        return merge_lookup(ids.hash(self.seed), self.views, pl.col("_view_part")).alias("_view_part")

    def item_ids(self, part: int) -> pl.Series:
        """The ``item_id`` of every row of ``part``'s range, read from that column alone (a string
        column in every file, as ``plan`` checked: the typed rows keep it as it is)."""
        start = self.cuts[part]
        end = self.cuts[part + 1] if part + 1 < self.cuts.len() else self.rows
        files = [self.reader.root / name for name in sorted(self.bases, key=self.bases.__getitem__)]
        scan = pl.scan_parquet(files, hive_partitioning=False).select("item_id")
        return scan.slice(start, end - start).collect().to_series()

    def take(self, part: int, count: Callable[[TableRead], None]) -> pl.DataFrame:
        """The feed rows of ``part``; reads on (counting each chunk once) until the part is whole."""
        with self.lock:
            if self.chunks is None:
                self.chunks = self.reader.chunks()
            while part >= self.complete_below:
                chunk = next(self.chunks, None)
                if chunk is None:
                    self.complete_below = len(self.cuts)
                    break
                count(chunk)
                self._deal(chunk.frame)
            frames = self.ready.pop(part, [])
        return stack_frames(frames, "feeds").rechunk()

    def _deal(self, frame: pl.DataFrame) -> None:
        """Split a typed chunk (rows in global order) where parts begin."""
        if frame.width == 0 or frame.height == 0:
            return
        files = frame["_file"]
        if files[0] == files[-1]:  # files come in order: one file (the usual chunk)
            rows = frame["_row"] + self.bases[files[0]]
        else:
            rows = frame.select(pl.col("_file").replace_strict(self.bases) + pl.col("_row")).to_series()
        bounds = [*rows.search_sorted(self.cuts, side="left").to_list(), frame.height]
        first = self.cuts.search_sorted(rows[0], side="right") - 1
        last = self.cuts.search_sorted(rows[-1], side="right") - 1
        for p in range(first, last + 1):
            start = 0 if p == first else bounds[p]
            self.ready.setdefault(p, []).append(frame.slice(start, bounds[p + 1] - start))
        self.complete_below = last


def _feed_view_runs(root: Path, chunk_rows: int) -> tuple[pl.DataFrame, dict[str, int]] | None:
    """The feeds' runs of one page view (``page_view_id``, ``_start``: global row, ``_rows``), read
    from that column alone, with the global row of each file's first row (files in ``_file`` order);
    None unless every file is Parquet with string ``page_view_id`` and ``item_id`` columns and every
    view is one run (null ids, rejected when typed, may recur)."""
    pieces, bases, offset = [], {}, 0
    for chunk in chunk_plan(root, "feeds", chunk_rows):
        for path in chunk.paths:
            if file_format(path) != "parquet":
                return None
            name = path.relative_to(root).as_posix()
            first = name not in bases  # a file's footer is read once, for its first chunk
            bases.setdefault(name, offset)
            scan = pl.scan_parquet(path, hive_partitioning=False).select("page_view_id")
            try:
                column = (scan.slice(*chunk.rows) if chunk.rows else scan).collect().to_series()
                ids = pl.read_parquet_schema(path).get("item_id") if first else pl.String
            except Exception:  # unreadable, or no such column: the spilled path reports it
                return None
            if column.dtype != pl.String or ids != pl.String:
                return None  # (string ids pass the typing as they are, so they can be read ahead)
            pieces.append(column.rle().struct.unnest())
            offset += column.len()
    if not pieces:
        return None
    runs = (
        pl.concat(pieces)
        .group_by(pl.col("value").rle_id().alias("_run"), maintain_order=True)
        .agg(pl.col("value").first().alias("page_view_id"), pl.col("len").sum().cast(pl.Int64).alias("_rows"))
        .select("page_view_id", (pl.col("_rows").cum_sum() - pl.col("_rows")).alias("_start"), "_rows")
    )
    if runs["page_view_id"].drop_nulls().is_duplicated().any():
        return None
    return runs, bases
