"""The run's hash seeds, the part a row belongs to, and the lookup of hashes in a sorted table."""

from __future__ import annotations

import polars as pl

PART_SEED = 7  # hash seeds: any constants, the hashes never leave the run


ID_SEED = 11


CHECK_SEED = 0x9E3779B97F4A7C15


def part_of(parts: int) -> pl.Expr:
    """The part of a row: all rows of one page view land in the same part."""
    return (pl.col("page_view_id").hash(PART_SEED) % parts).cast(pl.Int32)


def id_hash(column: str) -> pl.Expr:
    return pl.col(column).hash(ID_SEED)


def merge_lookup(
    hashes: pl.Series, table: pl.DataFrame, value: pl.Expr, probes: dict[str, pl.Series] | None = None
) -> pl.Series:
    """``value`` of the row of ``table`` (``_h`` unique, flagged sorted) whose ``_h`` each hash is,
    in the hashes' order; null where none (``probes``: columns beside each hash that ``value`` may
    use). Sorted probes meet the sorted table in one merge join: the cost follows the probes, not
    the table, which grows with the bundle."""
    order = hashes.arg_sort()
    beside = {name: column.gather(order) for name, column in (probes or {}).items()}
    sorted_probes = pl.DataFrame({"_h": hashes.gather(order).set_sorted(), **beside})
    found = sorted_probes.join(table, on="_h", how="left", maintain_order="left").select(value).to_series()
    return pl.repeat(None, hashes.len(), dtype=found.dtype, eager=True).scatter(order, found)


def check_hash(ids: pl.Series | pl.Expr) -> pl.Series | pl.Expr:
    """The item index's confirming hash of an id (a seed unrelated to the sort hash's)."""
    return ids.hash(CHECK_SEED)
