"""Repeated id hashes found one range of the hash space at a time give what one count over all gives."""

from __future__ import annotations

import random
from collections import Counter

import polars as pl
import pytest

from transforms.ingest import duplicate_ids

TOP = 2**64 - 1


def chunks_of_hashes(seed: int) -> list[pl.Series]:
    """Hash chunks as pass 1 keeps them: repeats within a chunk, across chunks, and at both ends of
    the hash space (where the ranges start and stop)."""
    rng = random.Random(seed)
    values = [rng.getrandbits(64) for _ in range(300)]
    repeats = [values[3], values[3], values[17], 0, 0, TOP, TOP, TOP, values[250]]
    pool = values + repeats
    rng.shuffle(pool)
    cuts = sorted(rng.sample(range(1, len(pool)), 6))
    return [
        pl.Series(pool[a:b], dtype=pl.UInt64) for a, b in zip([0, *cuts], [*cuts, len(pool)], strict=True)
    ]


@pytest.mark.parametrize("per_range", [7, 64, 1 << 23])
def test_repeated_hashes_by_range_are_the_repeats_of_the_whole(monkeypatch, per_range):
    monkeypatch.setattr(duplicate_ids, "RANGE_HASHES", per_range)  # 7: 44 ranges; 1 << 23: one
    chunks = chunks_of_hashes(seed=per_range)
    counts = Counter(v for chunk in chunks for v in chunk.to_list())
    expected = sorted(v for v, n in counts.items() if n > 1)
    found = duplicate_ids.repeated_hashes(duplicate_ids.in_ranges(chunks))
    assert sorted(found.to_list()) == expected
    assert {0, TOP} <= set(expected) and found.len() == len(expected)  # each repeat named once


def test_no_hashes_repeat_nothing():
    assert duplicate_ids.repeated_hashes(duplicate_ids.in_ranges([])).len() == 0
    assert (
        duplicate_ids.repeated_hashes(duplicate_ids.in_ranges([pl.Series([1, 2, 3], dtype=pl.UInt64)])).len()
        == 0
    )


@pytest.mark.parametrize(("expected", "buffer"), [(1, 1 << 22), (7 * 40, 50), (7 * 300, 1)])
def test_hashes_kept_on_disk_by_range_give_the_repeats_of_the_whole(tmp_path, monkeypatch, expected, buffer):
    # 7 hashes a range: one range, 40 ranges and 300 (most of them empty); flushed at the end,
    # every 50 hashes, or every chunk
    monkeypatch.setattr(duplicate_ids, "RANGE_HASHES", 7)
    monkeypatch.setattr(duplicate_ids, "HASH_BUFFER", buffer)
    chunks = chunks_of_hashes(seed=buffer)
    kept = duplicate_ids.IdHashes.on_disk(tmp_path / "hashes", expected)
    for chunk in chunks:
        kept.add(chunk)
    by_range = list(kept.by_range())
    assert len(by_range) == kept.ranges == max(1, -(-expected // 7))
    every = [v for chunk in chunks for v in chunk.to_list()]
    assert sorted(v for r in by_range for v in r.to_list()) == sorted(every)  # each hash once, none lost
    assert all(r.len() == 0 or r.min() <= r.max() for r in by_range)
    lows = [r.min() for r in by_range if r.len()]
    assert lows == sorted(lows)  # ranges come in hash order
    counts = Counter(every)
    found = duplicate_ids.repeated_hashes(
        duplicate_ids.IdHashes.on_disk(tmp_path / "again", expected).by_range()
    )
    assert found.len() == 0  # nothing added: nothing repeats
    assert sorted(duplicate_ids.repeated_hashes(by_range).to_list()) == sorted(
        v for v, n in counts.items() if n > 1
    )
    assert (tmp_path / "hashes").is_dir() and any((tmp_path / "hashes").rglob("*.arrow"))
