"""Candidates from a category mix: the most popular items of each top category, in proportion to the
shopper's recent clicks, every category of the catalog getting at least one place."""

from __future__ import annotations

from types import SimpleNamespace

import polars as pl

from evaluation.slate import category_mix_candidates


def test_a_category_mix_interleaves_each_categorys_most_popular_items_by_click_share():
    items = pl.DataFrame(
        {
            "item_id": ["a1", "a2", "a3", "a4", "b1", "b2", "b3", "b4", "c1", "c2"],
            "category": ["A-x"] * 4 + ["B-y"] * 4 + ["C-z"] * 2,
        }
    )
    popularity = pl.DataFrame(
        {"item_id": ["a1", "a2", "a3", "a4", "b1", "b2", "b3", "b4", "c1", "c2"],
         "popularity": [10, 9, 8, 1, 20, 5, 4, 3, 7, 6]}
    )  # fmt: skip
    shopper = SimpleNamespace(recent_click_categories=["A-x-1", "A-x-2", "A-x-3", "B-y-1"])
    # weights: A 3 clicks + 1, B 1 + 1, C 0 + 1 -> of 7 places A takes 4, B 2, C 1; then the first of
    # every category by popularity, the second of every category, and so on
    assert category_mix_candidates(shopper, items, popularity, 7) == [
        "b1",
        "a1",
        "c1",
        "a2",
        "b2",
        "a3",
        "a4",
    ]
    # a shopper with no clicks: every category alike, ceil(3 / 3) = one place each
    newcomer = SimpleNamespace(recent_click_categories=[])
    assert category_mix_candidates(newcomer, items, popularity, 3) == ["b1", "a1", "c1"]
