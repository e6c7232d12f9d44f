"""Keyed pseudonyms for platform ids, and the user split derived from them.

Each raw id becomes ``<prefix>_<16 hex>`` = keyed BLAKE2b(raw id): stable for a
key, unlinkable to the platform id without it. Hashing runs once per *distinct*
id and is joined back, so cost scales with the id vocabulary, not the rows.
"""

from __future__ import annotations

import hashlib

import polars as pl

PREFIXES: dict[str, str] = {"user": "u", "session": "s", "item": "i", "event": "e", "image": "m"}


def _digest(value: str, key: bytes, person: bytes) -> bytes:
    return hashlib.blake2b(value.encode("utf-8"), key=key, person=person, digest_size=8).digest()


#: raw id column -> id kind (lists are re-keyed element-wise)
ID_COLUMNS: dict[str, str] = {
    "user_id": "user",
    "page_view_id": "session",
    "session_id": "session",
    "event_id": "event",
    "item_id": "item",
    "target_item_id": "item",
    "ipv_item_id": "item",
    "visible_items": "item",
}


class Pseudonymizer:
    """Keyed pseudonyms, computed once per distinct raw id and cached per kind."""

    def __init__(self, key: str, keep_image_refs: bool = False) -> None:
        self._secret = key.encode("utf-8")[:64]
        empty = pl.DataFrame(schema={"raw": pl.String, "key": pl.String})
        self._known: dict[str, pl.DataFrame] = dict.fromkeys(PREFIXES, empty)
        # image refs are platform URLs/paths that often embed ids: keyed too unless told otherwise
        self._columns = ID_COLUMNS if keep_image_refs else {**ID_COLUMNS, "image": "image"}

    def mapping(self, values: pl.Series, kind: str) -> pl.DataFrame:
        """Frame ``raw -> key`` covering the distinct non-null values of ``values``."""
        distinct = values.drop_nulls().unique()
        known = self._known[kind]
        fresh = distinct.filter(~distinct.is_in(known["raw"].implode())) if known.height else distinct
        if fresh.len():
            prefix, person = PREFIXES[kind], kind.encode("utf-8")[:16]
            keys = [f"{prefix}_{_digest(v, self._secret, person).hex()}" for v in fresh.to_list()]
            known = pl.concat([known, pl.DataFrame({"raw": fresh, "key": keys}, schema=known.schema)])
            self._known[kind] = known
        return known

    def column(self, values: pl.Series, kind: str) -> pl.Series:
        """``values`` (strings, or lists of strings) with every id replaced by its pseudonym."""
        if isinstance(values.dtype, pl.List):
            flat = pl.DataFrame({"ids": values}).with_row_index("row").explode("ids")
            flat = flat.with_columns(self.column(flat["ids"], kind))
            rebuilt = flat.group_by("row", maintain_order=True).agg(pl.col("ids").drop_nulls())
            return (
                rebuilt.with_columns(original=values)
                .select(pl.when(pl.col("original").is_null()).then(None).otherwise(pl.col("ids")))
                .to_series()
                .alias(values.name)
            )
        mapping = self.mapping(values.cast(pl.String), kind)
        return (
            values.cast(pl.String)
            .to_frame("raw")
            .join(mapping, on="raw", how="left", maintain_order="left")["key"]
            .alias(values.name)
        )

    def __call__(self, frame: pl.DataFrame) -> pl.DataFrame:
        """Re-key every known id column present in ``frame``."""
        keyed = [
            self.column(frame[c], kind).alias(c) for c, kind in self._columns.items() if c in frame.columns
        ]
        return frame.with_columns(keyed) if keyed else frame


def split_of(user_keys: pl.Series, seed: int, ratios: tuple[float, float, float]) -> pl.Series:
    """train/val/test per user from an unkeyed hash of the pseudonym and the seed.

    The assignment depends on nothing but (pseudonym, seed), so it never changes
    when users or days are added; proportions converge to ``ratios``.
    """
    if abs(sum(ratios) - 1.0) > 1e-9:
        raise ValueError(f"split ratios must sum to 1, got {ratios}")
    salt = f"split-{seed}".encode()
    uniform = [
        int.from_bytes(hashlib.blake2b(k.encode("utf-8"), person=salt[:16], digest_size=8).digest(), "big")
        / 2**64
        for k in user_keys.to_list()
    ]
    u = pl.Series(uniform, dtype=pl.Float64)
    train, val = ratios[0], ratios[0] + ratios[1]
    return (
        pl.select(
            pl.when(u < train)
            .then(pl.lit("train"))
            .when(u < val)
            .then(pl.lit("val"))
            .otherwise(pl.lit("test"))
        )
        .to_series()
        .alias("split")
    )


def bucket_of(user_keys: pl.Series, buckets: int) -> pl.Series:
    """Partition bucket from the pseudonym's hex digits (stable, uniform)."""
    return (user_keys.str.slice(2, 8).str.to_integer(base=16) % buckets).cast(pl.Int32).alias("bucket")
