"""The item catalog: numeric attributes for simulation, text columns built only when written.

Items are stored sorted by top category so that "draw an item of category c in
proportion to its popularity" is one ``searchsorted`` on a cumulative array.
Popularity is a mild log-normal (so most clicked items are clicked once) times a
boost for a few bestsellers (so the top 1 % of clicked items take a few % of clicks).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow as pa

from synthetic import taxonomy as tx
from synthetic.ids import hex_ids, salt

ITEMS_PER_USER = 566_102 / 11_010  # UserArena catalog / users, so click sparsity matches at any scale
POPULARITY_SIGMA = 0.15
HIT_SHARE = 0.0006  # bestsellers: the few items that take a visible share of all clicks
HIT_BOOST = 7.0
PRICE_SIGMA = 0.55
IPV_PAGE_HEIGHT = (1500, 4000)
REVIEW_BLOCK_AT = 0.6  # the review block starts at 60 % of the detail-page height
MAX_REVIEWS = 20
TABLE_SLOTS = 8  # sampling-table slots per item on average


@dataclass(frozen=True)
class WorldCatalog:
    """Per-item arrays (index = item number) plus per-category sampling tables."""

    seed: int
    leaf: np.ndarray  # int16, index into taxonomy.LEAVES
    l1: np.ndarray  # int16, top category
    popularity: np.ndarray  # float64 weights, mean 1
    price: np.ndarray  # float64 > 0
    page_height: np.ndarray  # int32, detail page height px
    n_pics: np.ndarray  # int8, pictures in the gallery (swipe does not wrap)
    n_reviews: np.ndarray  # int8, 0..20
    table: np.ndarray  # int32 sampling table: items repeated in proportion to popularity, by category
    table_start: np.ndarray  # int64 first table slot of each top category
    table_len: np.ndarray  # int64 table slots of each top category

    @property
    def size(self) -> int:
        return len(self.leaf)

    @property
    def review_top(self) -> np.ndarray:
        return (self.page_height * REVIEW_BLOCK_AT).astype(np.int32)

    def ids(self) -> pl.Series:
        return hex_ids("itm-", self.size, salt("item", self.seed))

    def sample(self, rng: np.random.Generator, l1: np.ndarray) -> np.ndarray:
        """One item per entry of ``l1``, drawn within that top category in proportion to popularity."""
        slot = self.table_start[l1] + (rng.random(len(l1)) * self.table_len[l1]).astype(np.int64)
        return self.table[slot]


def _sampling_table(rng: np.random.Generator, l1: np.ndarray, popularity: np.ndarray) -> np.ndarray:
    """Items repeated ~TABLE_SLOTS times their share of popularity within their category.

    Stochastic rounding keeps the expected number of copies proportional to popularity,
    so a uniform slot draw is (in expectation) a popularity-weighted item draw.
    """
    share = popularity / np.bincount(l1, weights=popularity)[l1] * np.bincount(l1)[l1]
    expected = share * TABLE_SLOTS
    copies = np.floor(expected).astype(np.int64) + (rng.random(len(l1)) < expected % 1)
    copies[np.r_[True, l1[1:] != l1[:-1]]] += 1  # never leave a category without a slot
    return np.repeat(np.arange(len(l1), dtype=np.int32), copies)


def build_catalog(n_items: int, seed: int) -> WorldCatalog:
    rng = np.random.default_rng([seed, 1])
    # Every top category gets at least a few items so small worlds still cover all 41.
    counts = np.maximum(rng.multinomial(n_items, tx.L1_SHARES), 5)
    l1 = np.repeat(np.arange(tx.N_L1, dtype=np.int16), counts)
    leaf_of_l1 = [np.flatnonzero(c == tx.LEAF_L1) for c in range(tx.N_L1)]
    leaf = np.concatenate([rng.choice(leaf_of_l1[c], counts[c]) for c in range(tx.N_L1)]).astype(np.int16)
    n = len(l1)
    popularity = rng.lognormal(0.0, POPULARITY_SIGMA, n) * np.where(rng.random(n) < HIT_SHARE, HIT_BOOST, 1.0)
    popularity /= popularity.mean()
    price = np.round(tx.L1_PRICE[l1] * rng.lognormal(0.0, PRICE_SIGMA, n), 2).clip(0.5) - 0.01
    # Popular items collect more reviews; about one item in eight has none.
    n_reviews = np.minimum(rng.poisson(2.0 + 4.0 * popularity), MAX_REVIEWS)
    n_reviews[rng.random(n) < 0.12] = 0
    table = _sampling_table(rng, l1, popularity)
    table_len = np.bincount(l1[table], minlength=tx.N_L1)
    return WorldCatalog(
        seed=seed,
        leaf=leaf,
        l1=l1,
        popularity=popularity,
        price=price,
        page_height=rng.integers(*IPV_PAGE_HEIGHT, n, endpoint=True).astype(np.int32),
        n_pics=rng.integers(3, 9, n, endpoint=True).astype(np.int8),
        n_reviews=n_reviews.astype(np.int8),
        table=table,
        table_start=np.cumsum(table_len) - table_len,
        table_len=table_len,
    )


# --- text columns ----------------------------------------------------------------------------


def _family_pick(rng: np.random.Generator, family: np.ndarray, words: dict[str, list[str]]) -> pl.Series:
    """One word per item from its family's list."""
    flat = [w for f in tx.FAMILIES for w in words[f]]
    sizes = np.array([len(words[f]) for f in tx.FAMILIES])
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    idx = offsets[family] + (rng.random(len(family)) * sizes[family]).astype(np.int64)
    return pl.Series(flat, dtype=pl.String).gather(idx)


def _titles(rng: np.random.Generator, cat: WorldCatalog, family: np.ndarray) -> pl.Series:
    brand = pl.Series(tx.BRANDS.tolist()).gather(rng.integers(0, len(tx.BRANDS), cat.size))
    style = _family_pick(rng, family, tx.STYLE_WORDS)
    material = _family_pick(rng, family, tx.MATERIAL_WORDS)
    noun = pl.Series(tx.LEAF_NOUN.tolist()).gather(cat.leaf.astype(np.int64))
    frame = pl.DataFrame({"b": brand, "s": style, "m": material, "n": noun})
    return frame.select(pl.concat_str("b", "s", "m", "n", separator=" ")).to_series()


def _params(rng: np.random.Generator, family: np.ndarray) -> pa.Array:
    """list<{label, value}>: 2..6 distinct labels of the item's family, each with a random value."""
    n = len(family)
    k = rng.integers(2, 6, n, endpoint=True)
    start = rng.integers(0, 6, n)
    item = np.repeat(np.arange(n), k)
    pos = np.arange(k.sum()) - np.repeat(np.cumsum(k) - k, k)
    slot = (start[item] + pos) % 6  # rotate through the 6 labels: no duplicate label per item
    label_names = list(tx.PARAM_VALUES)
    label_of = np.array([[label_names.index(x) for x in tx.PARAM_LABELS[f]] for f in tx.FAMILIES])
    label = label_of[family[item], slot]
    sizes = np.array([len(tx.PARAM_VALUES[x]) for x in label_names])
    first_value = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    value = first_value[label] + (rng.random(len(label)) * sizes[label]).astype(np.int64)
    flat_values = [v for x in label_names for v in tx.PARAM_VALUES[x]]
    labels = pl.Series(label_names).gather(label).to_arrow().cast(pa.string())
    values = pl.Series(flat_values).gather(value).to_arrow().cast(pa.string())
    struct = pa.StructArray.from_arrays([labels, values], ["label", "value"])
    return pa.ListArray.from_arrays(pa.array(np.concatenate([[0], np.cumsum(k)]), pa.int32()), struct)


def _reviews(rng: np.random.Generator, n_reviews: np.ndarray) -> pa.Array:
    total = int(n_reviews.sum())
    opener = pl.Series(tx.REVIEW_OPENERS).gather(rng.integers(0, len(tx.REVIEW_OPENERS), total))
    closer = pl.Series(tx.REVIEW_CLOSERS).gather(rng.integers(0, len(tx.REVIEW_CLOSERS), total))
    text = pl.DataFrame({"o": opener, "c": closer}).select(pl.concat_str("o", pl.lit(", "), "c", pl.lit(".")))
    offsets = pa.array(np.concatenate([[0], np.cumsum(n_reviews.astype(np.int64))]), pa.int32())
    return pa.ListArray.from_arrays(offsets, text.to_series().to_arrow().cast(pa.string()))


def items_frame(cat: WorldCatalog) -> pl.DataFrame:
    """The ``items`` table (RAW_ITEMS columns), text generated from the catalog's own seed."""
    rng = np.random.default_rng([cat.seed, 2])
    family = tx.L1_FAMILY[cat.l1].astype(np.int64)
    ids = cat.ids()
    return pl.DataFrame(
        {
            "item_id": ids,
            "title": _titles(rng, cat, family),
            "price": cat.price,
            "category": pl.Series(tx.LEAF_PATH.tolist()).gather(cat.leaf.astype(np.int64)),
            "params": pl.from_arrow(_params(rng, family)),
            "reviews": pl.from_arrow(_reviews(rng, cat.n_reviews)),
            "image": "img/items/" + ids + ".jpg",
        }
    )
