"""The world's shoppers acting one step at a time on screens described from outside.

``World.run`` steps every session of a run to its budget inside the world's own
state machine. ``StepwiseShoppers`` lets the same shoppers act inside another
environment instead: the caller describes, per live session, what is on screen
and what was done so far (``ShopperState``), and each shopper answers with one
action chosen by the very decision functions the log generator uses
(``behaviour.choose_on_feed`` / ``choose_on_page``), with the session's plan
(budget), feed appeal and traits taken from the run. The random draws are keyed by
(session, step) (``behaviour.KeyedDraws``): with a run made with ``keyed_draws`` and
no seed of their own, the stepwise shoppers draw the very numbers the run's shoppers
drew, step by step (common random numbers); given a seed, or with any other run,
numbers of their own.

Items are catalog indices and sessions are indices into the run's sessions; mapping
another environment's ids onto them is the caller's business.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from synthetic import taxonomy as tx
from synthetic.behaviour import (
    IPV_CHOICES,
    A,
    FeedView,
    KeyedDraws,
    PageView,
    accepts_on_visit,
    choose_on_feed,
    choose_on_page,
    visit_interest,
)
from synthetic.world import Run, World


@dataclass(frozen=True)
class ShopperState:
    """One row per live session: the screen it shows and the shopper's memory of the session."""

    session: np.ndarray  # index into the run's sessions
    step: np.ndarray  # actions taken so far in the session
    on_page: np.ndarray  # bool: a detail page is open
    offset: np.ndarray  # feed offset px
    max_offset: np.ndarray  # largest feed offset px
    visible: np.ndarray  # (sessions, cards) catalog index of each card in view not opened yet, -1 = none
    returned: np.ndarray  # bool: the last action was back_home
    item: np.ndarray  # catalog index of the open page, -1 on the feed
    page: np.ndarray  # page offset px
    page_max: np.ndarray  # largest page offset px
    ui: np.ndarray  # index into behaviour.UI_STATES
    pic: np.ndarray  # 0-based picture shown
    tappable_reviews: np.ndarray  # reviews in view that can be opened
    visit_step: np.ndarray  # actions taken on this page in this visit
    carted: np.ndarray  # bool, in this visit
    bought: np.ndarray
    param_seen: np.ndarray
    comments_seen: np.ndarray


@dataclass(frozen=True)
class Decision:
    """One action per session of a ``ShopperState``."""

    action: np.ndarray  # int8 code into transforms.schemas.ACTIONS
    item: np.ndarray  # catalog index of the clicked card, -1 = none
    distance: np.ndarray  # float px of a scroll (quarter px with fractional pixels), -1 = none
    review_index: np.ndarray  # 0-based review opened, -1 = none


class StepwiseShoppers:
    """The shoppers of one ``World.run``, deciding one step per call for any subset of its sessions."""

    def __init__(self, world: World, run: Run, seed: int | None = None) -> None:
        """``seed`` keys the shoppers' own draws; None shares the run's keyed draws (0 for a run
        without them)."""
        self.world, self.run = world, run
        if seed is None:
            seed = run.keyed_draws if run.keyed_draws is not None else 0
        self.key = (world.seed, run.seed, seed)
        # (session, item) -> feed column, for the appeal of a card named by its item
        session, column = np.nonzero(run.feeds.item >= 0)
        keys = session.astype(np.int64) * world.catalog.size + run.feeds.item[session, column]
        order = np.argsort(keys)
        self._card_keys, self._card_columns = keys[order], column[order]

    @property
    def budget(self) -> np.ndarray:
        """Actions per session, the final ``end`` included."""
        return self.run.plan.budget

    def columns(self, session: np.ndarray, items: np.ndarray) -> np.ndarray:
        """The feed column of each item on its session's feed (rows of ``items``); -1 for -1 and for an
        item its feed does not show."""
        keys = session[:, None].astype(np.int64) * self.world.catalog.size + items
        at = np.searchsorted(self._card_keys, keys).clip(0, len(self._card_keys) - 1)
        found = (items >= 0) & (self._card_keys[at] == keys)
        return np.where(found, self._card_columns[at], -1)

    def accepts(self, session: np.ndarray, items: np.ndarray) -> np.ndarray:
        """Whether each session's shopper would accept each of its ``items`` (rows of catalog indices)
        by ``behaviour.accepts_on_visit``, with the appeal its feed gives the card; False for -1 and for
        an item its feed does not show (the shopper's utility of it is unknown)."""
        column = self.columns(session, items)
        found = column >= 0
        rows = np.broadcast_to(session[:, None], items.shape)[found]
        item, cat, params = items[found], self.world.catalog, self.world.params
        interest = visit_interest(self.run.feeds.appeal[rows, column[found]].astype(np.float64), params)
        accepted = np.zeros(items.shape, bool)
        accepted[found] = accepts_on_visit(
            interest, cat.price[item], tx.L1_PRICE[cat.l1[item]], self.run.traits.take(rows), params
        )
        return accepted

    def decide(self, state: ShopperState) -> Decision:
        """The next action of every session of ``state``: ``end`` on its budget's last action, else
        the feed or page policy."""
        n = len(state.session)
        out = Decision(np.full(n, A["end"], np.int8), np.full(n, -1), np.full(n, -1.0), np.full(n, -1))
        budget = self.budget[state.session]
        last, winding = state.step >= budget - 1, state.step == budget - 2
        feed, page = np.flatnonzero(~last & ~state.on_page), np.flatnonzero(~last & state.on_page)
        if len(feed):
            self._on_feed(state, feed, winding[feed], out)
        if len(page):
            self._on_page(state, page, winding[page], out)
        return out

    def _on_feed(self, state: ShopperState, rows: np.ndarray, winding: np.ndarray, out: Decision) -> None:
        session, feeds = state.session[rows], self.run.feeds
        # the feed's columns, as the log generator sees them: appeal only where a card may be clicked
        column = self.columns(session, state.visible[rows])
        row = np.broadcast_to(np.arange(len(rows))[:, None], column.shape)
        clickable = np.zeros(feeds.appeal[session].shape, bool)
        clickable[row[column >= 0], column[column >= 0]] = True
        view = FeedView(
            offset=state.offset[rows],
            max_offset=state.max_offset[rows],
            appeal=np.where(clickable, feeds.appeal[session], -np.inf),
            returned=state.returned[rows],
        )
        traits = self.run.traits.take(session)
        draws = KeyedDraws(self.key, session, state.step[rows])
        chosen = choose_on_feed(draws, view, traits, winding, self.world.params, self.world.geometry)
        click = chosen.action == A["click"]
        out.action[rows] = chosen.action
        out.item[rows] = np.where(click, feeds.item[session, chosen.card], -1)
        out.distance[rows] = np.where(click, -1, chosen.distance)

    def _on_page(self, state: ShopperState, rows: np.ndarray, winding: np.ndarray, out: Decision) -> None:
        cat, session, item = self.world.catalog, state.session[rows], state.item[rows]
        column = self.columns(session, item[:, None])[:, 0]
        opened_appeal = np.where(column >= 0, self.run.feeds.appeal[session, column], -np.inf)
        view = PageView(
            page=state.page[rows],
            page_max=state.page_max[rows],
            ui=state.ui[rows],
            pic=state.pic[rows],
            n_pics=cat.n_pics[item],
            n_reviews=cat.n_reviews[item].astype(np.int32),
            tappable_reviews=state.tappable_reviews[rows],
            price=cat.price[item],
            category_price=tx.L1_PRICE[cat.l1[item]],
            visit_step=state.visit_step[rows],
            # the generator's interest in the card it opened; an item off the feed interests little
            interest=visit_interest(opened_appeal, self.world.params),
            carted=state.carted[rows],
            bought=state.bought[rows],
            param_seen=state.param_seen[rows],
            comments_seen=state.comments_seen[rows],
        )
        traits = self.run.traits.take(session)
        draws = KeyedDraws(self.key, session, state.step[rows])
        chosen = choose_on_page(draws, view, traits, winding, self.world.params, self.world.geometry)
        scrolls = chosen.choice <= IPV_CHOICES.index("ipv_scroll_up")
        out.action[rows] = chosen.action
        out.distance[rows] = np.where(scrolls, chosen.distance, -1)
        out.review_index[rows] = chosen.review_index
