"""Keyed pseudonyms for platform ids, and the user split derived from them.

Each raw id becomes ``<prefix>_<16 hex>``: the first 64 bits of
SHA-256(key block || kind || "\\x1f" || raw id), where the key block is the key as one
full 64-byte SHA-256 block (zero-padded; hashed first when longer). That is AMAC,
the truncated keyed hash that Bellare, Bernstein and Tessaro prove a PRF ("Hash-function
based PRFs: AMAC and its multi-user security", EUROCRYPT 2016): the key sets the
chaining value no one else knows, and the truncation removes the state a
length extension would need. An id of up to 47 bytes costs two SHA-256 blocks; HMAC costs four.
Stable for a key, unlinkable to the platform id without it. The hash runs vectorised
in Rust (``polars-hash``: SHA-256 with the CPU's SHA instructions where it has them),
once per *distinct* id; rows are mapped by a hash lookup (or per run, where a column
comes in runs).
"""

from __future__ import annotations

import hashlib
import threading

import polars as pl
import polars_hash  # noqa: F401 - registers the ``chash`` expression namespace
import pyarrow as pa
import pyarrow.compute as pc

PREFIXES: dict[str, str] = {"user": "u", "session": "s", "item": "i", "event": "e", "image": "m"}


SHA256_BLOCK = 64  # bytes


def key_block(key: bytes) -> bytes:
    """The key as exactly one SHA-256 block: zero-padded, or hashed first when longer."""
    if len(key) > SHA256_BLOCK:
        key = hashlib.sha256(key).digest()
    return key.ljust(SHA256_BLOCK, b"\0")


def keyed_hex(values: pl.Series, key: bytes, kind: str) -> pl.Series:
    """First 16 hex digits of SHA-256(key block || kind \\x1f raw) per value, in order (nulls stay)."""
    prefix = key_block(key) + f"{kind}\x1f".encode()
    # as bytes: a long key's block is a digest, not text. The values go in as a frame's column: a
    # literal Series run through ``pl.select`` keeps its memory after the call (Polars 2.1)
    message = pl.lit(prefix, dtype=pl.Binary) + pl.col("_raw").cast(pl.Binary)
    hexes = values.rename("_raw").to_frame().select(message.chash.sha2_256().str.head(16))
    return hexes.to_series().alias(values.name)


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
        self._secret = key.encode("utf-8")
        empty = pl.DataFrame(schema={"raw": pl.String, "key": pl.String})
        self._known: dict[str, pl.DataFrame] = dict.fromkeys(PREFIXES, empty)
        self._learning = threading.Lock()
        # image refs are platform URLs/paths that often embed ids: keyed too unless told otherwise
        self._columns = ID_COLUMNS if keep_image_refs else {**ID_COLUMNS, "image": "image"}

    def mapping(self, values: pl.Series, kind: str) -> pl.DataFrame:
        """Frame ``raw -> key`` covering the distinct non-null values of ``values``."""
        distinct = values.drop_nulls().unique()
        with self._learning:  # threads (e.g. parallel readers) add to one cache, never over each other
            known = self._known[kind]
            fresh = distinct.filter(~distinct.is_in(known["raw"].implode())) if known.height else distinct
            if fresh.len():
                hexes = keyed_hex(fresh, self._secret, kind)
                keyed = pl.DataFrame({"raw": fresh, "key": (f"{PREFIXES[kind]}_" + hexes).alias("key")})
                known = pl.concat([known, keyed])
                self._known[kind] = known
        return known

    def column(self, values: pl.Series, kind: str) -> pl.Series:
        """``values`` (strings, or lists of strings) with every id replaced by its pseudonym."""
        if isinstance(values.dtype, pl.List):
            return self._list_column(values, kind)
        strings = values.cast(pl.String)
        runs = strings.rle()
        if runs.len() * 4 < strings.len():  # sorted by this id: map each run once
            keyed = self._lookup(runs.struct.field("value"), kind)
            return keyed.repeat_by(runs.struct.field("len")).explode().alias(values.name)
        return self._lookup(strings, kind).alias(values.name)

    def _lookup(self, strings: pl.Series, kind: str) -> pl.Series:
        """Map through the pseudonyms known so far; learn (hash) only the values not yet known."""
        keyed = self._replace(strings, kind)
        unknown = keyed.is_null() & strings.is_not_null()
        if unknown.any():
            self.mapping(strings.filter(unknown), kind)
            keyed = self._replace(strings, kind)
        return keyed

    def _replace(self, strings: pl.Series, kind: str) -> pl.Series:
        known = self._known[kind]
        return strings.replace_strict(known["raw"], known["key"], default=None, return_dtype=pl.String)

    def _list_column(self, values: pl.Series, kind: str) -> pl.Series:
        """Map the flattened ids and rebuild the lists from the same offsets (nulls stay null)."""
        lists = values.cast(pl.List(pl.String)).to_arrow()
        lists = lists.combine_chunks() if isinstance(lists, pa.ChunkedArray) else lists
        offsets = pc.subtract(lists.offsets, lists.offsets[0])
        flat = self.column(pl.from_arrow(lists.flatten()).cast(pl.String), kind).to_arrow()
        mask = lists.is_null() if lists.null_count else None
        rebuilt = type(lists).from_arrays(offsets, flat, mask=mask)
        return pl.from_arrow(rebuilt).alias(values.name)

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
    u = pl.col("u")
    train, val = ratios[0], ratios[0] + ratios[1]
    return (
        pl.DataFrame({"u": uniform}, schema={"u": pl.Float64})
        .select(
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
