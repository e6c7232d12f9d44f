"""The ingest's item index: lookups by hash agree with a plain dictionary, and both hashes decide."""

from __future__ import annotations

import random

import polars as pl

from transforms.ingest import hashes
from transforms.ingest.item_index import ItemIndex


def _index(n: int) -> tuple[ItemIndex, list[str]]:
    ids = [f"itm-{i:06d}" for i in range(n)]
    random.Random(3).shuffle(ids)  # arrival order unrelated to the hash order
    items = pl.DataFrame({"item_id": ids, "title": [f"title of {i}" for i in ids]})
    index = ItemIndex.build(items)
    index.attach([pl.Series([f"key-{i}" for i in ids[:500]]), pl.Series([f"key-{i}" for i in ids[500:]])])
    return index, ids


def test_lookups_agree_with_a_dictionary():
    index, ids = _index(2_000)
    probes = random.Random(5).choices(ids, k=3_000) + [f"absent-{i}" for i in range(3_000)] + [None] * 10
    random.Random(7).shuffle(probes)
    rows = index.rows_of(pl.Series("item_id", probes))
    found = [None if r is None else index.frame["item_id"][r] for r in rows.to_list()]
    assert found == [p if p in set(ids) else None for p in probes]


def test_pseudonyms_follow_their_items_into_index_order():
    index, ids = _index(2_000)
    rows = index.rows_of(pl.Series(ids))
    assert index.keys.gather(rows).to_list() == [f"key-{i}" for i in ids]


def test_a_match_needs_the_confirming_hash_too(monkeypatch):
    index, ids = _index(100)
    assert index.rows_of(pl.Series(ids)).null_count() == 0
    # the same sort hash with another confirming hash: every probe now fails the confirmation
    monkeypatch.setattr(hashes, "CHECK_SEED", hashes.CHECK_SEED + 1)
    assert index.rows_of(pl.Series(ids)).null_count() == len(ids)
