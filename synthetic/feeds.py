"""Pre-rendered feeds: candidate items, the two ranking policies, and the masonry layout.

Candidates of a page view: a share of cards from the session's intent category
(the shopper arrived with something in mind, e.g. from a category tab) and the
rest drawn from the whole catalog by popularity. Both policies rank the *same*
candidates, so an A/B difference comes from the ranking alone:

* ``baseline``  — popularity with noise;
* ``treatment`` — personalised: the shopper's category affinity (relative to the
  category's population share) and price fit, plus a little popularity (what a
  recommender can learn from history; it does not see the session intent).

Layout: two columns of ``CARD_WIDTH`` px at x = 4 and x = 203 (screen 402 px), card
heights 250-380 px, each card placed in the currently shorter column (left on ties),
8 px gaps; ``feed_height`` = tallest column + bottom padding. Like real logs (CSS px on
high-density screens), pixels are fractional by default (``FeedParams.fractional_px``):
columns of 196.5 px at x = 4.5 and 205.5, heights in quarter px. Quarters are exact in
binary floating point, so every consumer computes the same visibility from them.

All arrays are padded ``(page views, MAX_CARDS)`` matrices in reading (rank) order;
padding has ``height == 0`` and ``item == -1``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from synthetic import taxonomy as tx
from synthetic.catalog import WorldCatalog

CARDS = (30, 120)
MAX_CARDS = CARDS[1]
CARD_WIDTH = 195
COLUMN_X = (4, 203)
FRACTIONAL_CARD_WIDTH = 196.5  # the reference's card width (PROTOCOL.md §1)
FRACTIONAL_COLUMN_X = (4.5, 205.5)
PX_STEP = 0.25  # fractional heights are whole px plus a multiple of this
CARD_HEIGHT = (250, 380)
GAP = 8
PAD_Y = 1_000_000_000  # y of padding slots: never inside a viewport
EXTRA_CANDIDATES = 10  # over-draw, then drop duplicates within a page view


@dataclass(frozen=True)
class Feeds:
    item: np.ndarray  # int32 (pv, K), -1 = padding
    x: np.ndarray  # px (float64 when fractional, else int32)
    y: np.ndarray  # px, top of card in the feed (PAD_Y for padding)
    height: np.ndarray  # px, 0 for padding
    n_cards: np.ndarray  # int32 (pv,)
    feed_height: np.ndarray  # px (pv,)
    appeal: np.ndarray  # float32 (pv, K): the shopper's utility of each card, -inf for padding
    card_width: float = CARD_WIDTH


@dataclass(frozen=True)
class FeedParams:
    intent_share: float = 0.35  # candidates drawn from the session's intent category
    baseline_noise: float = 1.0  # sd of the noise added to log popularity
    treat_affinity: float = 1.0  # treatment score weight on log category affinity
    treat_price: float = 0.8  # treatment score weight on price misfit
    treat_popularity: float = 0.4
    treat_noise: float = 0.6
    # The shopper's own utility of a card.
    appeal_affinity: float = 0.55
    appeal_intent: float = 1.6
    appeal_price: float = 0.9
    appeal_popularity: float = 0.05
    appeal_noise: float = 0.8
    fractional_px: bool = True  # card boxes in fractional CSS px, as real logs have them; False: whole px


def price_misfit(cat: WorldCatalog, items: np.ndarray, price_level: np.ndarray) -> np.ndarray:
    """|log(price / the shopper's preferred price for that category)|."""
    return np.abs(np.log(cat.price[items] / (tx.L1_PRICE[cat.l1[items]] * price_level)))


def policy_score(
    treatment: np.ndarray | bool,
    log_aff: np.ndarray,
    misfit: np.ndarray,
    log_pop: np.ndarray,
    noise: np.ndarray,
    params: FeedParams,
) -> np.ndarray:
    """The two ranking policies' score of each candidate (higher is shown first): ``treatment`` where
    true, ``baseline`` elsewhere. Shared with rankers outside the world that rank as its arms do."""
    return np.where(
        treatment,
        params.treat_affinity * log_aff
        - params.treat_price * misfit
        + params.treat_popularity * log_pop
        + params.treat_noise * noise,
        log_pop + params.baseline_noise * noise,
    )


def _candidates(
    rng: np.random.Generator, cat: WorldCatalog, intent: np.ndarray, n_cards: np.ndarray, share: float
) -> np.ndarray:
    """Candidate items (pv, n_cards.max() + EXTRA) sorted per row; -1 marks padding and duplicates."""
    n_pv, width = len(intent), int(n_cards.max()) + EXTRA_CANDIDATES
    l1 = np.where(
        rng.random((n_pv, width)) < share,
        intent[:, None],
        np.searchsorted(np.cumsum(tx.L1_SHARES), rng.random((n_pv, width)) * tx.L1_SHARES.sum()),
    ).clip(0, tx.N_L1 - 1)
    item = cat.sample(rng, l1.ravel()).reshape(n_pv, width)
    big = np.int32(np.iinfo(np.int32).max)
    item = np.sort(np.where(np.arange(width) < (n_cards + EXTRA_CANDIDATES)[:, None], item, big), axis=1)
    dup = np.zeros_like(item, dtype=bool)
    dup[:, 1:] = item[:, 1:] == item[:, :-1]
    return np.where(dup | (item == big), -1, item)


def _masonry(
    height: np.ndarray, columns: tuple[float, float] = COLUMN_X
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Place cards (pv, K) in rank order into the shorter of two columns; padding (height 0) is skipped."""
    n_pv, k_max = height.shape
    bottom = np.zeros((n_pv, 2), dtype=height.dtype)
    x = np.zeros_like(height)
    y = np.full_like(height, PAD_Y)
    rows = np.arange(n_pv)
    for k in range(k_max):
        real = height[:, k] > 0
        col = (bottom[:, 1] < bottom[:, 0]).astype(np.int64)  # left on ties
        top = bottom[rows, col] + GAP
        x[:, k] = np.where(real, np.array(columns, dtype=height.dtype)[col], 0)
        y[:, k] = np.where(real, top, PAD_Y)
        bottom[rows, col] = np.where(real, top + height[:, k], bottom[rows, col])
    return x, y, bottom.max(axis=1) + GAP


def build_feeds(
    rng: np.random.Generator,
    cat: WorldCatalog,
    affinity: np.ndarray,
    price_level: np.ndarray,
    price_sensitivity: np.ndarray,
    intent: np.ndarray,
    treatment: np.ndarray,
    params: FeedParams,
) -> Feeds:
    """Feeds for sessions; per-session arrays (affinity rows, price traits, intent, arm) are aligned."""
    n_pv = len(intent)
    n_cards = rng.integers(CARDS[0], CARDS[1], n_pv, endpoint=True)
    cand = _candidates(rng, cat, intent, n_cards, params.intent_share)
    real = cand >= 0
    item = np.where(real, cand, 0)
    l1 = cat.l1[item]
    log_pop = np.log(cat.popularity[item])
    # Affinity relative to the population share: the average shopper is category-neutral.
    log_aff = np.log(np.take_along_axis(affinity, l1.astype(np.int64), axis=1) / tx.L1_SHARES[l1])
    misfit = price_misfit(cat, item, price_level[:, None])
    noise = rng.normal(0, 1, item.shape)
    score = policy_score(treatment[:, None], log_aff, misfit, log_pop, noise, params)
    order = np.argsort(np.where(real, -score, np.inf), axis=1, kind="stable")[:, :MAX_CARDS]
    keep = np.arange(MAX_CARDS) < np.minimum(n_cards, real.sum(axis=1))[:, None]
    pick = lambda a: np.take_along_axis(a, order, axis=1)  # noqa: E731
    appeal = (
        params.appeal_affinity * pick(log_aff)
        + params.appeal_intent * (pick(l1) == intent[:, None])
        - params.appeal_price * price_sensitivity[:, None] * pick(misfit)
        + params.appeal_popularity * pick(log_pop)
        + params.appeal_noise * rng.normal(0, 1, order.shape)
    )
    grid_item = np.where(keep, pick(item), -1).astype(np.int32)
    grid_h = np.where(keep, rng.integers(CARD_HEIGHT[0], CARD_HEIGHT[1], order.shape, endpoint=True), 0)
    grid_h = grid_h.astype(np.int32)
    grid_appeal = np.where(keep, appeal, -np.inf).astype(np.float32)
    columns, width = COLUMN_X, CARD_WIDTH
    if params.fractional_px:
        # from a spawned generator: the parent's stream, hence the rest of the world, stays as it was
        (child,) = rng.spawn(1)
        quarters = child.integers(0, round(1 / PX_STEP), grid_h.shape) * PX_STEP
        grid_h = np.where(grid_h > 0, grid_h + quarters, 0.0)
        columns, width = FRACTIONAL_COLUMN_X, FRACTIONAL_CARD_WIDTH
    x, y, feed_height = _masonry(grid_h, columns)
    return Feeds(
        item=grid_item,
        x=x,
        y=y,
        height=grid_h,
        n_cards=keep.sum(axis=1).astype(np.int32),
        feed_height=feed_height,
        appeal=grid_appeal,
        card_width=width,
    )
