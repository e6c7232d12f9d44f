"""Opaque, collision-free string ids with a type prefix (``usr-``, ``pv-``, ``ev-``, ``itm-``).

An id is ``prefix + hex(splitmix64(counter ^ salt))``. splitmix64's finaliser is a
bijection on 64-bit integers, so distinct counters can never collide, yet the ids
look random and carry no order. The prefixes let leak checks grep for raw ids.
"""

from __future__ import annotations

import hashlib

import numpy as np
import polars as pl
import pyarrow as pa


def salt(*parts: object) -> np.uint64:
    """A 64-bit salt derived from the parts (stable across runs and platforms)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return np.uint64(int.from_bytes(digest, "big"))


def splitmix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser, vectorised; a bijection on uint64 (wrapping arithmetic is intended)."""
    z = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def hex_ids(prefix: str, n: int, key: np.uint64) -> pl.Series:
    """``n`` distinct ids ``prefix + 16 hex digits`` for counters 0..n-1 under ``key``."""
    with np.errstate(over="ignore"):
        words = splitmix64(np.arange(n, dtype=np.uint64) ^ key)
    raw = pa.Array.from_buffers(pa.binary(8), n, [None, pa.py_buffer(words.astype(">u8").tobytes())])
    hexed = pl.Series(pl.from_arrow(raw.cast(pa.binary()))).bin.encode("hex")
    return (prefix + hexed).alias("id")
