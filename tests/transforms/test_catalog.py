"""The ingest's item catalog: lookups by hash agree with a plain dictionary, and both hashes decide."""

from __future__ import annotations

import random

import polars as pl

from transforms import ingest
from transforms.ingest import Catalog


def _catalog(n: int) -> tuple[Catalog, list[str]]:
    ids = [f"itm-{i:06d}" for i in range(n)]
    random.Random(3).shuffle(ids)  # arrival order unrelated to the hash order
    items = pl.DataFrame({"item_id": ids, "title": [f"title of {i}" for i in ids]})
    catalog = Catalog.build(items)
    catalog.attach([pl.Series([f"key-{i}" for i in ids[:500]]), pl.Series([f"key-{i}" for i in ids[500:]])])
    return catalog, ids


def test_lookups_agree_with_a_dictionary():
    catalog, ids = _catalog(2_000)
    probes = random.Random(5).choices(ids, k=3_000) + [f"absent-{i}" for i in range(3_000)] + [None] * 10
    random.Random(7).shuffle(probes)
    rows = catalog.index(pl.Series("item_id", probes))
    found = [None if r is None else catalog.frame["item_id"][r] for r in rows.to_list()]
    assert found == [p if p in set(ids) else None for p in probes]


def test_pseudonyms_follow_their_items_into_catalog_order():
    catalog, ids = _catalog(2_000)
    rows = catalog.index(pl.Series(ids))
    assert catalog.keys.gather(rows).to_list() == [f"key-{i}" for i in ids]


def test_a_match_needs_the_confirming_hash_too(monkeypatch):
    catalog, ids = _catalog(100)
    assert catalog.index(pl.Series(ids)).null_count() == 0
    # the same sort hash with another confirming hash: every probe now fails the confirmation
    monkeypatch.setattr(ingest, "CHECK_SEED", ingest.CHECK_SEED + 1)
    assert catalog.index(pl.Series(ids)).null_count() == len(ids)
