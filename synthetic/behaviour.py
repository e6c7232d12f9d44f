"""The ground-truth shopper: a stochastic policy over the 13 actions, stepped for all sessions at once.

Session plan
    Each session has an *intent* top category and an action *budget* ``L``.
    Intent: the first session draws from the shopper's category affinities; each
    later one continues the previous session's intent with probability
    ``continue_intent``, else draws afresh (so continuation is above chance).
    Budget: ``L = 2 + Poisson(mean * patience * Gamma(shape)/shape)``, capped (30
    actions for one-session shoppers, 41 for returning ones). One-session
    shoppers browse longer (mean about 15, median 14) than returning shoppers
    (mean about 8.4, median 8). The session ends, with ``end``, exactly at action
    ``L`` (wherever the shopper is); before that it never ends.

Feed policy (offset ``o``, visible cards by the 50 % rule, not yet clicked)
    ``click`` with probability ``sigmoid(click_bias + click_slope * best_visible_appeal)``
    times the shopper's click propensity; otherwise ``scroll_down`` or, less
    often (more often right after returning from a detail page), ``scroll_up``.
    Appeal (see ``synthetic.feeds``) = category affinity + a bonus for the
    session's intent category - price misfit * price sensitivity + popularity +
    taste noise, so a better-ranked feed shows more appealing cards early and gets
    more clicks: that is the A/B effect. The clicked card is drawn among the
    visible ones with probability proportional to ``exp(appeal / click_temperature)``.
    Scroll distances scale with the shopper's scroll speed and are clipped to the
    feed (``1 .. 694`` px, never past ``[0, feed_height - 693]``); with fractional
    pixels (the default) they are logged in quarter px, so offsets are fractional too.

Detail-page policy (visit step ``j``, page offset, open panel, picture index)
    weights per action, zero where illegal or pointless, then normalised:
    ``ipv_scroll_down`` (decaying with ``j``), ``ipv_scroll_up`` (offset > 0),
    ``ipv_swipe_pic`` (not on the last picture), ``ipv_click_param`` and
    ``ipv_enter_comment`` (once per visit, scaled by review propensity; comments
    need reviews), ``ipv_click_comment`` (review propensity; needs the review list
    open or the review block scrolled into view), ``ipv_cart`` / ``ipv_buy``
    (purchase propensity * interest in the item * price fit; buying is likelier
    after carting), ``back_home`` (hazard rising with ``j``, higher after a
    cart/buy). Scrolling the page closes an open panel (``ui_state`` back to
    ``main``); opening params / comments sets ``params`` / ``comments``.

Winding down
    One action before the budget runs out the shopper rarely opens a new card
    and usually leaves an open detail page (``back_home``), so most sessions end on
    the feed (UserArena: clicks - back_homes = 2.1 % of actions end on a detail page).

Parameters live in ``BehaviourParams`` / ``feeds.FeedParams``; their defaults were
tuned so that the world reproduces UserArena (DATA.md + ERRATA.md): action mix,
session lengths, clicks per session, cart/buy rates, category continuation,
apparel share, click long tail. ``python -m synthetic.calibration`` prints the
comparison; ``tests/synthetic/test_synthetic_calibration.py`` asserts it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from synthetic import taxonomy as tx
from synthetic.catalog import WorldCatalog
from synthetic.feeds import PX_STEP, FeedParams, Feeds
from transforms.config import Geometry
from transforms.schemas import ACTIONS, IPV_ACTIONS

A = {name: code for code, name in enumerate(ACTIONS)}
# Detail-page actions the policy chooses among (``end`` is decided by the budget).
IPV_CHOICES = tuple(name for name in IPV_ACTIONS if name != "end")
IPV_CODES = np.array([A[name] for name in IPV_CHOICES], dtype=np.int8)
UI_STATES = ("main", "params", "comments")
INLINE_REVIEWS = 2  # reviews shown in the page's review block
PANEL_REVIEWS = 4  # reviews visible in the opened review list
MIN_MOVE = 0.5  # px: the smallest scroll that rounds to the protocol's 1 px (align.scroll_distance)
REVIEW_ROW = 120  # px of the review block that must be in view to tap a review


@dataclass(frozen=True)
class BehaviourParams:
    # session plan
    single_budget: float = 13.0
    multi_budget: float = 6.38
    budget_shape: float = 7.0
    single_cap: int = 30
    multi_cap: int = 41
    continue_intent: float = 0.30
    # feed
    click_bias: float = -2.3
    click_slope: float = 0.6
    click_temperature: float = 0.6
    scroll_up: float = 0.07
    scroll_up_after_return: float = 0.2
    scroll_sigma: float = 0.35
    # detail page
    ipv_scroll_down: float = 1.05
    ipv_scroll_decay: float = 0.55
    ipv_scroll_up: float = 0.25
    ipv_scroll_px: float = 520.0
    swipe: float = 0.18
    param: float = 0.11
    enter_comment: float = 0.15
    click_comment: float = 0.5
    cart: float = 0.5
    buy: float = 0.07
    buy_after_cart: float = 3.0
    back_home: float = 0.25
    back_home_growth: float = 0.35
    back_home_after_cart: float = 1.5
    interest_scale: float = 1.0
    # winding down (the action before ``end``)
    last_click: float = 0.15
    last_back_home: float = 6.0
    feed: FeedParams = field(default_factory=FeedParams)


@dataclass(frozen=True)
class Steps:
    """One row per action, in session order then step order."""

    session: np.ndarray  # int64
    step: np.ndarray  # int32
    action: np.ndarray  # int8 code into ``ACTIONS``
    item: np.ndarray  # int32 catalog index: clicked card (feed) or open item (ipv); -1 = none
    scroll_top: np.ndarray  # float64 feed offset before the action (ipv: where back_home returns)
    scroll_delta: np.ndarray  # float64 px moved by scrolls, -1 = none
    ipv_scroll: np.ndarray  # int32 page offset before the action, -1 on the feed
    review_index: np.ndarray  # int32, -1 = none
    ui_state: np.ndarray  # int8 index into UI_STATES, -1 on the feed


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _categorical(rng: np.random.Generator, weights: np.ndarray) -> np.ndarray:
    """Row-wise draw of a column index proportional to non-negative weights."""
    cum = np.cumsum(weights, axis=1)
    u = rng.random(len(weights)) * cum[:, -1]
    return np.minimum((cum <= u[:, None]).sum(axis=1), weights.shape[1] - 1)


class KeyedDraws:
    """Random draws keyed by (session, step): each session's draws at a step come from a stream of its
    own, seeded by ``key + (session, step)``, whoever steps it and whatever other sessions do.

    A stand-in for ``np.random.Generator`` in the decision functions (``random``, ``lognormal``), so
    two runs of the same shoppers (the world's own, and the shoppers acting inside another environment)
    share their random numbers step by step: common random numbers, for comparisons with little noise.
    """

    def __init__(self, key: tuple[int, ...], sessions: np.ndarray, step: np.ndarray | int) -> None:
        steps = np.broadcast_to(step, np.shape(sessions))
        pairs = zip(sessions, steps, strict=True)
        self._streams = [np.random.default_rng([*key, int(s), int(t)]) for s, t in pairs]

    def random(self, size: int | tuple[int, ...]) -> np.ndarray:
        shape = (size,) if isinstance(size, int) else tuple(size)
        return np.array([g.random(shape[1:]) for g in self._streams]).reshape(shape)

    def lognormal(self, mean: float, sigma: float, size: int) -> np.ndarray:
        return np.array([g.lognormal(mean, sigma) for g in self._streams]).reshape(size)


@dataclass
class _State:
    """Mutable per-session state while stepping."""

    screen: np.ndarray  # 0 feed, 1 detail page
    offset: np.ndarray
    max_offset: np.ndarray
    clicked: np.ndarray  # (sessions, cards) bool
    returned: np.ndarray  # last action was back_home
    item: np.ndarray
    interest: np.ndarray
    page: np.ndarray
    page_max: np.ndarray
    ui: np.ndarray
    pic: np.ndarray
    visit_step: np.ndarray
    carted: np.ndarray
    bought: np.ndarray
    param_seen: np.ndarray
    comments_seen: np.ndarray

    @classmethod
    def start(cls, feeds: Feeds, geometry: Geometry) -> _State:
        if (feeds.feed_height <= geometry.feed_viewport).any():
            raise ValueError("every feed must be taller than the viewport (a scroll must be possible)")
        n = len(feeds.n_cards)
        zeros = lambda dtype: np.zeros(n, dtype=dtype)  # noqa: E731
        return cls(
            screen=zeros(np.int8),
            offset=zeros(np.float64),  # CSS px: fractional at the feed's bottom
            max_offset=(feeds.feed_height - geometry.feed_viewport).astype(np.float64),
            clicked=np.zeros(feeds.item.shape, dtype=bool),
            returned=zeros(bool),
            item=np.full(n, -1, dtype=np.int32),
            interest=zeros(np.float64),
            page=zeros(np.int32),
            page_max=zeros(np.int32),
            ui=zeros(np.int8),
            pic=zeros(np.int32),
            visit_step=zeros(np.int32),
            carted=zeros(bool),
            bought=zeros(bool),
            param_seen=zeros(bool),
            comments_seen=zeros(bool),
        )


@dataclass(frozen=True)
class SessionTraits:
    """Per-session copies of the shopper traits the policy reads."""

    click: np.ndarray
    scroll_px: np.ndarray
    review: np.ndarray
    purchase: np.ndarray
    price_sensitivity: np.ndarray
    price_level: np.ndarray

    def take(self, rows: np.ndarray) -> SessionTraits:
        return SessionTraits(*(getattr(self, name)[rows] for name in self.__dataclass_fields__))


@dataclass(frozen=True)
class FeedView:
    """What shoppers on the feed see, one row per session: ``appeal`` is -inf for a card that is not
    in view or was already opened in this session (only the others can be clicked)."""

    offset: np.ndarray
    max_offset: np.ndarray
    appeal: np.ndarray  # (sessions, cards)
    returned: np.ndarray  # bool: the last action was back_home


@dataclass(frozen=True)
class FeedChoice:
    action: np.ndarray  # int8 code: click, scroll_up or scroll_down
    card: np.ndarray  # column of the clicked card (meaningful where action is click)
    distance: np.ndarray  # px of the scroll, clipped to the feed (meaningful where it scrolls)


def choose_on_feed(
    rng: np.random.Generator,
    view: FeedView,
    traits: SessionTraits,
    winding: np.ndarray,
    p: BehaviourParams,
    geo: Geometry,
) -> FeedChoice:
    """One feed action per session (the shopper policy of the module docstring)."""
    n, off, appeal = len(view.offset), view.offset, view.appeal
    best = appeal.max(axis=1)
    can_click = np.isfinite(best)
    logit = p.click_bias + p.click_slope * np.where(can_click, best, 0.0) + np.log(traits.click)
    p_click = np.where(can_click, sigmoid(logit), 0.0) * np.where(winding, p.last_click, 1.0)
    # room for a move of at least MIN_MOVE px, which is an action distance of at least 1
    w_up = (off >= MIN_MOVE) * np.where(view.returned, p.scroll_up_after_return, p.scroll_up)
    w_down = (view.max_offset - off >= MIN_MOVE) * (1.0 - w_up)
    click = rng.random(n) < p_click
    up = ~click & (rng.random(n) * (w_up + w_down) < w_up)
    down = ~click & ~up
    # Scroll distance: the shopper's habit, clipped to the room left and to the protocol's 694 px.
    # Logged in quarter px like the layout (whole px without fractions); the action is its rounding.
    px = PX_STEP if p.feed.fractional_px else 1
    habit = traits.scroll_px * rng.lognormal(0, p.scroll_sigma, n)
    dist = np.clip(np.rint(habit / px) * px, 40, geo.max_feed_scroll)
    dist = np.where(down, np.minimum(dist, view.max_offset - off), np.minimum(dist, off))
    # Which card: Gumbel-max over the visible cards, softmax(appeal / temperature).
    gumbel = -np.log(-np.log(rng.random(appeal.shape)))
    card = np.argmax(appeal / p.click_temperature + gumbel, axis=1)
    action = np.select([click, up], [A["click"], A["scroll_up"]], A["scroll_down"])
    return FeedChoice(action=action, card=card, distance=dist)


@dataclass(frozen=True)
class PageView:
    """What shoppers on a detail page see and have done in this visit, one row per session."""

    page: np.ndarray  # page offset
    page_max: np.ndarray  # largest page offset
    ui: np.ndarray  # index into UI_STATES
    pic: np.ndarray  # 0-based picture shown
    n_pics: np.ndarray
    n_reviews: np.ndarray
    tappable_reviews: np.ndarray  # reviews in view that can be opened (0: none)
    price: np.ndarray
    category_price: np.ndarray  # the median price of the item's top category
    visit_step: np.ndarray  # actions taken in this visit
    interest: np.ndarray  # how much the opened card appealed, in (0, 1)
    carted: np.ndarray
    bought: np.ndarray
    param_seen: np.ndarray
    comments_seen: np.ndarray


@dataclass(frozen=True)
class PageChoice:
    choice: np.ndarray  # index into IPV_CHOICES
    distance: np.ndarray  # px of a page scroll, clipped to the page (meaningful where it scrolls)
    review_index: np.ndarray  # 0-based review opened, -1 = none

    @property
    def action(self) -> np.ndarray:
        return IPV_CODES[self.choice]


def visit_interest(appeal: np.ndarray, p: BehaviourParams) -> np.ndarray:
    """How much an opened card interests the shopper on its page, in (0, 1), from its appeal."""
    return sigmoid(p.interest_scale * appeal - 1.0)


def page_weights(
    view: PageView, traits: SessionTraits, winding: np.ndarray, p: BehaviourParams
) -> np.ndarray:
    """The unnormalised weight of each of ``IPV_CHOICES`` per session (the module docstring's)."""
    page, j = view.page, view.visit_step
    carted, bought = view.carted, view.bought
    review, purchase = traits.review, traits.purchase * view.interest
    # Paying above one's usual level for the category puts buying off, in proportion to price sensitivity.
    over_price = np.log(view.price / (view.category_price * traits.price_level)).clip(0)
    price_fit = np.exp(-traits.price_sensitivity * over_price)
    weights = np.stack(
        [
            p.ipv_scroll_down * p.ipv_scroll_decay**j * (page < view.page_max),
            p.ipv_scroll_up * (page > 0),
            p.swipe * (view.pic < view.n_pics - 1),
            p.param * review**0.5 * ~view.param_seen,
            p.enter_comment * review * (view.n_reviews > 0) * ~view.comments_seen,
            p.click_comment * review * (view.tappable_reviews > 0),
            p.cart * purchase * ~carted * ~bought,
            p.buy * purchase * price_fit**0.5 * (1 + p.buy_after_cart * carted) * ~bought,
            p.back_home
            * (1 + p.back_home_growth * j)
            * (1 + p.back_home_after_cart * (carted | bought))
            * np.where(winding, p.last_back_home, 1.0),
        ],
        axis=1,
    )
    return weights


def accepts_on_visit(
    interest: np.ndarray,
    price: np.ndarray,
    category_price: np.ndarray,
    traits: SessionTraits,
    p: BehaviourParams,
) -> np.ndarray:
    """Whether each shopper would accept the item: opening its page afresh (the visit's first action,
    nothing carted, not winding down), the page policy weighs taking it (``ipv_cart`` + ``ipv_buy``)
    at least as much as leaving it (``back_home``). One row per (shopper, item); ``interest`` is
    ``visit_interest`` of the card's appeal."""
    n = len(interest)
    zero, none = np.zeros(n, np.int32), np.zeros(n, bool)
    fresh = PageView(
        page=zero,
        page_max=zero,
        ui=zero,
        pic=zero,
        n_pics=zero + 1,
        n_reviews=zero,
        tappable_reviews=zero,
        price=price,
        category_price=category_price,
        visit_step=zero,
        interest=interest,
        carted=none,
        bought=none,
        param_seen=none,
        comments_seen=none,
    )
    weights = page_weights(fresh, traits, none, p)
    take = weights[:, IPV_CHOICES.index("ipv_cart")] + weights[:, IPV_CHOICES.index("ipv_buy")]
    return take >= weights[:, IPV_CHOICES.index("back_home")]


def choose_on_page(
    rng: np.random.Generator,
    view: PageView,
    traits: SessionTraits,
    winding: np.ndarray,
    p: BehaviourParams,
    geo: Geometry,
) -> PageChoice:
    """One detail-page action per session (weights of the module docstring, then one draw)."""
    page, n = view.page, len(view.page)
    choice = _categorical(rng, page_weights(view, traits, winding, p))
    dist = np.clip(
        np.rint(p.ipv_scroll_px * rng.lognormal(0, p.scroll_sigma, n)), 40, geo.max_ipv_scroll
    ).astype(np.int32)
    dist = np.where(choice == 0, np.minimum(dist, view.page_max - page), np.minimum(dist, page))
    review_index = np.where(choice == 5, (rng.random(n) * view.tappable_reviews).astype(np.int32), -1)
    return PageChoice(choice=choice, distance=dist, review_index=review_index)


class _Recorder:
    def __init__(self) -> None:
        self.parts: list[tuple[np.ndarray, ...]] = []

    def add(
        self,
        idx: np.ndarray,
        t: int,
        action: np.ndarray,
        st: _State,
        item: np.ndarray,
        delta: np.ndarray,
        review: np.ndarray,
        on_ipv: bool,
    ) -> None:
        n = len(idx)
        self.parts.append(
            (
                idx,
                np.full(n, t, np.int32),
                action.astype(np.int8),
                item.astype(np.int32),
                st.offset[idx].copy(),
                delta.astype(np.float64),
                st.page[idx].copy() if on_ipv else np.full(n, -1, np.int32),
                review.astype(np.int32),
                st.ui[idx].copy() if on_ipv else np.full(n, -1, np.int8),
            )
        )

    def steps(self) -> Steps:
        cols = [np.concatenate(c) for c in zip(*self.parts, strict=True)]
        order = np.lexsort((cols[1], cols[0]))
        return Steps(*(c[order] for c in cols))


@dataclass
class _Simulation:
    """Everything one run reads (world, feeds, traits) plus the state it mutates."""

    rng: np.random.Generator
    feeds: Feeds
    cat: WorldCatalog
    traits: SessionTraits
    p: BehaviourParams
    geometry: Geometry
    st: _State
    rec: _Recorder
    keyed: tuple[int, ...] | None = None  # draws keyed by (session, step) instead of one stream

    def draws(self, idx: np.ndarray, t: int) -> np.random.Generator | KeyedDraws:
        return self.rng if self.keyed is None else KeyedDraws(self.keyed, idx, t)

    def feed_step(self, idx: np.ndarray, t: int, winding: np.ndarray) -> None:
        feeds, geo, st = self.feeds, self.geometry, self.st
        off = st.offset[idx]
        y, h = feeds.y[idx], feeds.height[idx]
        top = np.maximum(y, off[:, None])
        bottom = np.minimum(y + h, off[:, None] + geo.feed_viewport)
        # "at least half the card's height inside the viewport", without a division
        visible = (2 * (bottom - top) >= h) & (h > 0) & ~st.clicked[idx]
        appeal = np.where(visible, feeds.appeal[idx], -np.inf)
        view = FeedView(offset=off, max_offset=st.max_offset[idx], appeal=appeal, returned=st.returned[idx])
        chosen = choose_on_feed(self.draws(idx, t), view, self.traits.take(idx), winding, self.p, geo)
        click, up = chosen.action == A["click"], chosen.action == A["scroll_up"]
        down, card, dist = chosen.action == A["scroll_down"], chosen.card, chosen.distance
        item = np.where(click, feeds.item[idx, card], -1)
        self.rec.add(idx, t, chosen.action, st, item, np.where(click, -1, dist), np.full(len(idx), -1), False)
        st.offset[idx] = off + np.where(down, dist, 0) - np.where(up, dist, 0)
        st.returned[idx] = False
        self._open(idx[click], card[click], item[click], appeal[click, card[click]])

    def _open(self, c: np.ndarray, card: np.ndarray, item: np.ndarray, appeal: np.ndarray) -> None:
        """Clicked sessions move to a fresh detail page of ``item``."""
        st = self.st
        st.clicked[c, card] = True
        st.screen[c] = 1
        st.item[c] = item
        st.interest[c] = visit_interest(appeal, self.p)
        st.page_max[c] = self.cat.page_height[item] - self.geometry.ipv_viewport
        for counter in (st.page, st.ui, st.pic, st.visit_step):
            counter[c] = 0
        for flag in (st.carted, st.bought, st.param_seen, st.comments_seen):
            flag[c] = False

    def ipv_step(self, idx: np.ndarray, t: int, winding: np.ndarray) -> None:
        cat, geo, st = self.cat, self.geometry, self.st
        item, page, ui = st.item[idx], st.page[idx], st.ui[idx]
        n_rev = cat.n_reviews[item].astype(np.int32)
        review_row_in_view = page + geo.ipv_viewport >= cat.review_top[item] + REVIEW_ROW
        can_tap_review = (n_rev > 0) & ((ui == 2) | (ui == 0) & review_row_in_view)  # panels cover the page
        shown = np.minimum(n_rev, np.where(ui == 2, PANEL_REVIEWS, INLINE_REVIEWS))
        view = PageView(
            page=page,
            page_max=st.page_max[idx],
            ui=ui,
            pic=st.pic[idx],
            n_pics=cat.n_pics[item],
            n_reviews=n_rev,
            tappable_reviews=np.where(can_tap_review, shown, 0),
            price=cat.price[item],
            category_price=tx.L1_PRICE[cat.l1[item]],
            visit_step=st.visit_step[idx],
            interest=st.interest[idx],
            carted=st.carted[idx],
            bought=st.bought[idx],
            param_seen=st.param_seen[idx],
            comments_seen=st.comments_seen[idx],
        )
        chosen = choose_on_page(self.draws(idx, t), view, self.traits.take(idx), winding, self.p, geo)
        choice, dist = chosen.choice, chosen.distance
        scrolls = choice <= 1
        self.rec.add(idx, t, chosen.action, st, item, np.where(scrolls, dist, -1), chosen.review_index, True)
        st.page[idx] = page + np.where(choice == 0, dist, 0) - np.where(choice == 1, dist, 0)
        st.ui[idx] = np.select([scrolls, choice == 3, (choice == 4) | (choice == 5)], [0, 1, 2], ui)
        st.pic[idx] += choice == 2
        st.param_seen[idx] |= choice == 3
        st.comments_seen[idx] |= choice == 4
        st.carted[idx] |= choice == 6
        st.bought[idx] |= choice == 7
        st.visit_step[idx] = view.visit_step + 1
        home = idx[choice == 8]
        st.screen[home] = 0
        st.returned[home] = True
        st.item[home] = -1

    def end_step(self, idx: np.ndarray, t: int) -> None:
        """``end`` wherever the shopper is (feed, or the open detail page)."""
        for on_ipv in (False, True):
            sel = idx[(self.st.screen[idx] == 1) == on_ipv]
            none = np.full(len(sel), -1)
            item = self.st.item[sel] if on_ipv else none
            self.rec.add(sel, t, np.full(len(sel), A["end"]), self.st, item, none, none, on_ipv)


def simulate_steps(
    rng: np.random.Generator,
    budget: np.ndarray,
    feeds: Feeds,
    cat: WorldCatalog,
    traits: SessionTraits,
    params: BehaviourParams,
    geometry: Geometry,
    keyed: tuple[int, ...] | None = None,
) -> Steps:
    """Run every session to its budget; the Python loop is over the step index only. ``keyed``: the
    shoppers draw from streams keyed by (session, step) (see ``KeyedDraws``) instead of ``rng``."""
    state = _State.start(feeds, geometry)
    sim = _Simulation(rng, feeds, cat, traits, params, geometry, state, _Recorder(), keyed)
    for t in range(int(budget.max())):
        live, last, winding = budget > t, budget == t + 1, budget == t + 2
        sim.end_step(np.flatnonzero(last), t)
        on_feed = live & ~last & (sim.st.screen == 0)
        on_ipv = live & ~last & (sim.st.screen == 1)
        # Both index sets are taken before either step runs: a session acts once per step.
        ipv_idx, feed_idx = np.flatnonzero(on_ipv), np.flatnonzero(on_feed)
        sim.feed_step(feed_idx, t, winding[feed_idx])
        sim.ipv_step(ipv_idx, t, winding[ipv_idx])
    return sim.rec.steps()
