"""A synthetic shopping world with a known ground truth.

``World.build(users, seed)`` draws a catalog and shoppers with latent traits;
``World.simulate(user_ids, policy, seed)`` runs those shoppers through sessions
under a feed-ranking policy and returns the raw log tables (DATA.md input
contract) plus the per-session ground truth. The behaviour model is documented
in ``synthetic.behaviour``; feeds and the two ranking policies in
``synthetic.feeds``.

Policies: ``"baseline"`` (popularity), ``"treatment"`` (personalised) or ``"ab"``
(the "real" logs: each shopper's arm comes from a hash of the user id, see
``shoppers.ab_arm_is_treatment``, and is recorded as the ``ab_arm`` profile
extra). Simulating the same shoppers under ``baseline`` and ``treatment`` with the
same seed uses the same random draws for everything the policy does not change
(common random numbers), so the difference is the policy's true effect.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

import numpy as np
import polars as pl

from synthetic import taxonomy as tx
from synthetic.behaviour import UI_STATES, BehaviourParams, SessionTraits, Steps, simulate_steps
from synthetic.catalog import ITEMS_PER_USER, WorldCatalog, build_catalog, items_frame
from synthetic.feeds import Feeds, build_feeds
from synthetic.ids import hex_ids, salt
from synthetic.shoppers import Shoppers, build_shoppers, profiles_frame, traits_frame
from synthetic.timing import dwell_ms, session_starts_ms
from transforms.config import Geometry
from transforms.schemas import ACTIONS

Policy = Literal["baseline", "treatment", "ab"]
MIN_ITEMS = 2_000
HISTORY_DAYS = 120.0


@dataclass(frozen=True)
class Bundle:
    """Raw log tables (RAW_* columns) plus ``sessions``: the ground truth per page view (not a raw table)."""

    profiles: pl.DataFrame
    items: pl.DataFrame
    feeds: pl.DataFrame
    events: pl.DataFrame
    history: pl.DataFrame
    sessions: pl.DataFrame

    def tables(self) -> dict[str, pl.DataFrame]:
        return {
            "profiles": self.profiles,
            "items": self.items,
            "feeds": self.feeds,
            "events": self.events,
            "history": self.history,
        }


@dataclass(frozen=True)
class _Plan:
    user: np.ndarray  # world user index per session, sessions sorted by user then order
    first: np.ndarray  # bool: the user's first session
    intent: np.ndarray  # top category the session is about
    budget: np.ndarray  # actions including the final ``end``
    treatment: np.ndarray  # bool: feed ranked by the treatment policy


@dataclass(frozen=True)
class Run:
    """One simulation: whose sessions, their plan, feeds and traits, and what the shoppers did."""

    policy: Policy
    seed: int
    users: np.ndarray  # world user indices, sorted
    plan: _Plan
    feeds: Feeds
    traits: SessionTraits  # one row per session
    steps: Steps
    ts: np.ndarray  # epoch ms per step
    pv_ids: pl.Series  # raw page view id per session
    keyed_draws: int | None = None  # see World.run


@dataclass(frozen=True)
class World:
    seed: int
    catalog: WorldCatalog
    shoppers: Shoppers
    params: BehaviourParams = field(default_factory=BehaviourParams)
    geometry: Geometry = field(default_factory=Geometry)

    @classmethod
    def build(
        cls, users: int, seed: int, params: BehaviourParams | None = None, geometry: Geometry | None = None
    ) -> World:
        n_items = max(MIN_ITEMS, round(users * ITEMS_PER_USER))
        return cls(
            seed=seed,
            catalog=build_catalog(n_items, seed),
            shoppers=build_shoppers(users, seed),
            params=params or BehaviourParams(),
            geometry=geometry or Geometry(),
        )

    # --- ground truth ----------------------------------------------------------------------

    @cached_property
    def user_ids(self) -> pl.Series:
        return self.shoppers.ids()

    @cached_property
    def item_ids(self) -> pl.Series:
        return self.catalog.ids()

    @cached_property
    def _user_index(self) -> dict[str, int]:
        return {u: i for i, u in enumerate(self.user_ids.to_list())}

    @cached_property
    def _traits(self) -> pl.DataFrame:
        return traits_frame(self.shoppers).with_columns(pl.col("affinity").cast(pl.List(pl.Float64)))

    def traits_frame(self) -> pl.DataFrame:
        """Every shopper's latent traits; ``affinity`` is a list in ``taxonomy.L1_NAMES`` order."""
        return self._traits

    def traits(self, user_id: str) -> dict[str, Any]:
        """One shopper's traits, with ``affinity`` as {top category: weight}."""
        row = self._traits.row(self._user_index[user_id], named=True)
        row["affinity"] = dict(zip(tx.L1_NAMES, row["affinity"], strict=True))
        return row

    @cached_property
    def items(self) -> pl.DataFrame:
        return items_frame(self.catalog)

    def profiles(self) -> pl.DataFrame:
        return profiles_frame(self.shoppers)

    # --- simulation ------------------------------------------------------------------------

    def run(
        self,
        user_ids: list[str] | pl.Series | None = None,
        policy: Policy = "ab",
        seed: int = 0,
        keyed_draws: int | None = None,
    ) -> Run:
        """The sessions of the given shoppers (default: all) under ``policy``: their plan, feeds, traits
        and the actions the shoppers took; deterministic per seed. ``keyed_draws``: the shoppers' actions
        draw from streams keyed by (world seed, seed, keyed_draws, session, step), which shoppers acting
        stepwise elsewhere can share (``behaviour.KeyedDraws``)."""
        if policy not in ("baseline", "treatment", "ab"):
            raise ValueError(f"unknown policy {policy!r}")
        users = self._users(user_ids)
        rng = np.random.default_rng([self.seed, seed, 17])  # same draws for every policy
        plan = self._plan(rng, users, policy)
        s = self.shoppers
        u = plan.user
        feeds = build_feeds(
            rng,
            self.catalog,
            s.affinity[u],
            s.price_level[u],
            s.price_sensitivity[u],
            plan.intent,
            plan.treatment,
            self.params.feed,
        )
        traits = SessionTraits(
            click=s.click_propensity[u],
            scroll_px=s.scroll_px[u],
            review=s.review_propensity[u],
            purchase=s.purchase_propensity[u],
            price_sensitivity=s.price_sensitivity[u],
            price_level=s.price_level[u],
        )
        keyed = None if keyed_draws is None else (self.seed, seed, keyed_draws)
        steps = simulate_steps(
            rng, plan.budget, feeds, self.catalog, traits, self.params, self.geometry, keyed
        )
        ts = self._timestamps(rng, plan, steps)
        pv_ids = hex_ids("pv-", len(u), salt("pv", self.seed, seed, policy))
        return Run(policy, seed, users, plan, feeds, traits, steps, ts, pv_ids, keyed_draws)

    def simulate(
        self, user_ids: list[str] | pl.Series | None = None, policy: Policy = "ab", seed: int = 0
    ) -> Bundle:
        """Sessions of the given shoppers (default: all) under ``policy`` as raw log tables."""
        return self.bundle(self.run(user_ids, policy, seed))

    def bundle(self, run: Run) -> Bundle:
        """A run's raw log tables plus its per-session ground truth."""
        plan, steps, ts, pv_ids = run.plan, run.steps, run.ts, run.pv_ids
        u, event_key = plan.user, salt("event", self.seed, run.seed, run.policy)
        return Bundle(
            profiles=self.profiles().filter(
                pl.col("user_id").is_in(self.user_ids.gather(run.users).implode())
            ),
            items=self.items,
            feeds=self._feeds_frame(run.feeds, pv_ids),
            events=self._events_frame(steps, ts, plan, pv_ids, event_key),
            history=self._history_frame(run.users, plan, ts, steps),
            sessions=pl.DataFrame(
                {
                    "page_view_id": pv_ids,
                    "user_id": self.user_ids.gather(u),
                    "policy": np.where(plan.treatment, "treatment", "baseline"),
                    "intent_category": np.array(tx.L1_NAMES)[plan.intent],
                    "budget": plan.budget.astype(np.int32),
                }
            ),
        )

    def ab_effect(self, user_ids: list[str] | pl.Series | None = None, seed: int = 0) -> dict[str, float]:
        """Ground-truth A/B effect: PV-CTR (clicks / feed page views) of the same shoppers per policy."""
        ctr = {}
        for policy in ("baseline", "treatment"):
            events = self.simulate(user_ids, policy=policy, seed=seed).events
            ctr[policy] = (events["action"] == "click").sum() / events["page_view_id"].n_unique()
        return ctr | {"delta": ctr["treatment"] - ctr["baseline"]}

    def _users(self, user_ids: list[str] | pl.Series | None) -> np.ndarray:
        if user_ids is None:
            return np.arange(self.shoppers.size)
        unknown = [u for u in user_ids if u not in self._user_index]
        if unknown or len(user_ids) == 0:
            raise ValueError(f"need known user ids; unknown: {unknown[:3]}")
        return np.unique([self._user_index[u] for u in user_ids])

    def _plan(self, rng: np.random.Generator, users: np.ndarray, policy: Policy) -> _Plan:
        p, s = self.params, self.shoppers
        n_sessions = s.n_sessions[users]
        user = np.repeat(users, n_sessions)
        first = np.r_[True, user[1:] != user[:-1]]
        # Intent: continue the previous session's with probability p.continue_intent, else draw afresh.
        cum = np.cumsum(s.affinity[user], axis=1)
        fresh = np.minimum((cum < rng.random(len(user))[:, None]).sum(axis=1), tx.N_L1 - 1)
        reset = first | (rng.random(len(user)) >= p.continue_intent)
        intent = fresh[np.maximum.accumulate(np.where(reset, np.arange(len(user)), 0))]
        multi = s.multi_session[user]
        mean = np.where(multi, p.multi_budget, p.single_budget) * s.patience[user]
        mean = mean * rng.gamma(p.budget_shape, 1.0 / p.budget_shape, len(user))
        budget = np.minimum(2 + rng.poisson(mean), np.where(multi, p.multi_cap, p.single_cap))
        treatment = {
            "baseline": np.zeros(len(user), bool),
            "treatment": np.ones(len(user), bool),
            "ab": s.treatment[user],
        }[policy]
        return _Plan(
            user=user, first=first, intent=intent.astype(np.int64), budget=budget, treatment=treatment
        )

    def _timestamps(self, rng: np.random.Generator, plan: _Plan, steps: Steps) -> np.ndarray:
        """Epoch ms per step: session start + the dwell of every earlier action of the session."""
        dwell = dwell_ms(rng, steps.action)
        elapsed = np.cumsum(dwell) - dwell  # time before each step, counted from the very first step
        session_first = np.r_[True, steps.session[1:] != steps.session[:-1]]
        within = elapsed - elapsed[session_first][np.cumsum(session_first) - 1]  # 0 at each session start
        duration = within[np.r_[session_first[1:], True]]
        start = session_starts_ms(rng, plan.user, plan.first, duration)
        return start[steps.session] + within

    def _feeds_frame(self, feeds: Feeds, pv_ids: pl.Series) -> pl.DataFrame:
        pv, slot = np.nonzero(feeds.item >= 0)
        return pl.DataFrame(
            {
                "page_view_id": pv_ids.gather(pv),
                "item_id": self.item_ids.gather(feeds.item[pv, slot]),
                "x": feeds.x[pv, slot],
                "y": feeds.y[pv, slot],
                "width": np.full(len(pv), feeds.card_width),
                "height": feeds.height[pv, slot],
                "feed_height": feeds.feed_height[pv],
            }
        )

    def _events_frame(
        self, steps: Steps, ts: np.ndarray, plan: _Plan, pv_ids: pl.Series, key: np.uint64
    ) -> pl.DataFrame:
        null_if_negative = lambda name: pl.when(pl.col(name) >= 0).then(pl.col(name))  # noqa: E731
        on_ipv = steps.ipv_scroll >= 0
        frame = pl.DataFrame(
            {
                "event_id": hex_ids("ev-", len(ts), key),
                "user_id": self.user_ids.gather(plan.user[steps.session]),
                "page_view_id": pv_ids.gather(steps.session),
                "ts": pl.Series(ts, dtype=pl.Int64).cast(pl.Datetime("ms", "UTC")),
                "screen": np.where(on_ipv, "ipv", "feed"),
                "action": pl.Series(ACTIONS).gather(steps.action.astype(np.int64)),
                "_item": steps.item,
                "scroll_top": steps.scroll_top,
                "scroll_delta": steps.scroll_delta,
                "ipv_scroll": steps.ipv_scroll,
                "review_index": steps.review_index,
                "_ui": steps.ui_state.astype(np.int64),
                "_step": steps.step,
            }
        )
        return frame.select(
            "event_id",
            "user_id",
            "page_view_id",
            "ts",
            "screen",
            "action",
            pl.when(pl.col("_item") >= 0)
            .then(self.item_ids.gather(np.maximum(steps.item, 0)))
            .alias("item_id"),
            "scroll_top",
            null_if_negative("scroll_delta").alias("scroll_delta"),
            null_if_negative("ipv_scroll").alias("ipv_scroll"),
            null_if_negative("review_index").alias("review_index"),
            pl.when(pl.col("_ui") >= 0)
            .then(pl.Series(UI_STATES).gather(np.maximum(steps.ui_state, 0)))
            .alias("ui_state"),
            pl.concat_str(
                pl.lit("img/"), "page_view_id", pl.lit("/"), pl.col("_step").cast(pl.String), pl.lit(".jpg")
            ).alias("image"),
        ).sort("ts", "page_view_id", maintain_order=True)

    @cached_property
    def _history_draws(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """World-level pre-window history: (user, item, is_buy, age_ms) independent of any simulation."""
        rng = np.random.default_rng([self.seed, 5])
        s = self.shoppers
        n_click = np.minimum(rng.poisson(2.0 + 2.5 * s.n_sessions**0.7 * s.click_propensity), 120)
        n_buy = np.minimum(rng.poisson(0.08 * n_click * s.purchase_propensity), 40)
        user = np.repeat(np.arange(s.size), n_click + n_buy)
        is_buy = (
            np.arange(len(user)) - np.repeat(np.cumsum(n_click + n_buy) - n_click - n_buy, n_click + n_buy)
            >= n_click[user]
        )
        cum = np.cumsum(s.affinity[user], axis=1)
        l1 = np.minimum((cum < rng.random(len(user))[:, None]).sum(axis=1), tx.N_L1 - 1)
        item = self.catalog.sample(rng, l1)
        age = np.rint((0.02 + rng.random(len(user)) * HISTORY_DAYS) * 86_400_000).astype(np.int64)
        return user, item, is_buy, age

    def _history_frame(self, users: np.ndarray, plan: _Plan, ts: np.ndarray, steps: Steps) -> pl.DataFrame:
        user, item, is_buy, age = self._history_draws
        keep = np.isin(user, users)
        user, item, is_buy, age = user[keep], item[keep], is_buy[keep], age[keep]
        first_session = np.flatnonzero(plan.first)
        session_start = ts[np.r_[True, steps.session[1:] != steps.session[:-1]]]
        first_start = np.zeros(self.shoppers.size, np.int64)
        first_start[plan.user[first_session]] = session_start[first_session]
        return pl.DataFrame(
            {
                "user_id": self.user_ids.gather(user),
                "ts": pl.Series(first_start[user] - age, dtype=pl.Int64).cast(pl.Datetime("ms", "UTC")),
                "kind": np.where(is_buy, "buy", "click"),
                "title": self.items["title"].gather(item),
                "category": self.items["category"].gather(item),
            }
        ).sort("user_id", "ts", maintain_order=True)
