"""A Gymnasium environment where a ranking policy serves the feeds and a simulator shops in them.

    import gymnasium as gym
    env = gym.make("evaluation.gym_env:trajforge/Shopping-v0", lake="lake", simulator="markov")
    obs, info = env.reset(seed=0, options={"user_id": USER})
    slate = my_ranker(info["context"], info["candidates"])      # or an array of scores
    obs, reward, terminated, truncated, info = env.step(slate)

An episode is one held-out session of the lake (``reset``; ``options={"user_id": U}`` picks that
shopper's first session of the split, ``{"session_id": S}`` one session). Each ``step`` serves one
feed page: the action orders the candidates not shown yet — as an array of scores (the action space:
one score per candidate slot, highest first) or as a slate (candidate dicts or item ids in order,
what a ``rank(context, candidates)`` policy returns) — and the page is laid out in the session's
feed geometry (``evaluation.slate``). The simulator then acts until it ends the session (terminated),
its episode is truncated (budget, invalid outputs, an error), or, with candidates left to show, it
reaches the bottom of the feed: it asks for the next page, laid out below the ones before. With
``page_cards`` unset a page shows every candidate, so an episode is one step.

Observation (fixed shapes, ``max_candidates`` slots in candidate order, zero-padded): per candidate
``features`` (present, log1p price, log1p popularity), ``category`` (index into ``categories``, 0 =
unknown or padding), and whether it was ``shown``, ``clicked``, ``carted`` and ``bought``; plus
``steps`` (accepted actions so far). Reward: the weighted count of the page's accepted clicks, carts
and buys (``reward="clicks"`` / ``"carts"`` / ``"buys"``, or a dict of weights by action). ``info``
carries the context and candidates a policy ranks, and the page's step trace (one dict per simulator
output, accepted or not).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import polars as pl
from gymnasium import spaces

from evaluation.environment import EnvironmentSettings
from evaluation.loader import load_sessions
from evaluation.policies import Candidate, session_context
from evaluation.rollout import Rollout
from evaluation.session import Session
from evaluation.simulators import Simulator, simulator_for_lake, step_all
from evaluation.slate import (
    CandidateSettings,
    candidate,
    catalog,
    category_mix_candidates,
    lake_popularity,
    lay_out,
    logged_candidates,
)

ENV_ID = "trajforge/Shopping-v0"
MAX_CANDIDATES = 120  # the synthetic world's largest feed
REWARDS = {"clicks": {"click": 1.0}, "carts": {"ipv_cart": 1.0}, "buys": {"ipv_buy": 1.0}}
FEATURES = ("present", "log_price", "log_popularity")
FEATURE_MAX = 100.0  # log1p of a price or a count stays far below


def reward_weights(reward: str | dict[str, float]) -> dict[str, float]:
    if isinstance(reward, dict):
        return dict(reward)
    if reward not in REWARDS:
        raise ValueError(f"reward is one of {', '.join(REWARDS)} or a dict of weights, not {reward!r}")
    return REWARDS[reward]


class ShoppingEnv(gym.Env):
    """A held-out session per episode, a served feed page per step, the simulator's actions in it."""

    metadata = {"render_modes": []}  # noqa: RUF012 - gymnasium's own class attribute

    def __init__(
        self,
        lake: str | Path | None = None,
        simulator: str | Simulator = "random",
        *,
        sessions: Sequence[Session] | None = None,
        split: str = "test",
        reward: str | dict[str, float] = "clicks",
        candidates: CandidateSettings | None = None,
        page_cards: int | None = None,
        max_candidates: int = MAX_CANDIDATES,
        environment: EnvironmentSettings | None = None,
        popularity: dict[str, int] | None = None,
    ) -> None:
        if lake is None and sessions is None:
            raise ValueError("the environment needs a lake or sessions")
        self.settings = environment or EnvironmentSettings()
        self.candidate_settings = candidates or CandidateSettings()
        self.sessions = (
            list(sessions)
            if sessions is not None
            else load_sessions(lake, split=split, settings=self.settings)
        )  # type: ignore[arg-type]
        if not self.sessions:
            raise ValueError(f"no sessions of split {split!r} to serve")
        if popularity is None and lake is not None:
            popularity = dict(lake_popularity(lake).iter_rows())
        self.popularity = popularity or {}
        self.lake = lake
        self._catalog = (
            catalog(lake) if lake is not None and self.candidate_settings.source == "category_mix" else {}
        )
        self.simulator = (
            simulator_for_lake(simulator, lake or ".") if isinstance(simulator, str) else simulator
        )
        self.weights = reward_weights(reward)
        self.page_cards, self.max_candidates = page_cards, max_candidates
        self.categories = [
            "unknown",
            *sorted({i.category_l1 for s in self.sessions for i in s.items.values() if i.category_l1}),
        ]
        self._category_index = {c: k for k, c in enumerate(self.categories)}
        flags = {
            name: spaces.MultiBinary(max_candidates) for name in ("shown", "clicked", "carted", "bought")
        }
        self.observation_space = spaces.Dict(
            {
                "features": spaces.Box(0.0, FEATURE_MAX, (max_candidates, len(FEATURES)), np.float32),
                "category": spaces.Box(0, len(self.categories) - 1, (max_candidates,), np.int64),
                **flags,
                "steps": spaces.Box(0, np.iinfo(np.int32).max, (1,), np.int64),
            }
        )
        self.action_space = spaces.Box(-1.0, 1.0, (max_candidates,), np.float32)
        self._first_of_user = {}
        for k, s in enumerate(self.sessions):
            self._first_of_user.setdefault(s.user_id, k)
        self._session_index = {s.session_id: k for k, s in enumerate(self.sessions)}
        self.rollout: Rollout | None = None

    # --- episode -----------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]:
        super().reset(seed=seed)
        options = options or {}
        if "session_id" in options:
            index = self._session_index[options["session_id"]]
        elif "user_id" in options:
            if options["user_id"] not in self._first_of_user:
                raise ValueError(f"user {options['user_id']!r} has no session to serve")
            index = self._first_of_user[options["user_id"]]
        else:
            index = int(self.np_random.integers(len(self.sessions)))
        self.session = self.sessions[index]
        self.context = session_context(self.session)
        self.candidates = self._candidates(self.session)[: self.max_candidates]
        self.shown: list[str] = []
        self.rollout = None
        return self._observation(), self._info([])

    def step(self, action: Any) -> tuple[dict, float, bool, bool, dict]:
        if not hasattr(self, "session"):
            raise RuntimeError("reset the environment before stepping it")
        if self.rollout is not None and self.rollout.done:
            raise RuntimeError("the episode is over: reset the environment")
        remaining = [c for c in self.candidates if c["item_id"] not in set(self.shown)]
        page = self.slate(action, remaining)
        if self.page_cards is not None:
            page = page[: self.page_cards]
        self._serve(page)
        rollout = self.rollout
        assert rollout is not None
        before = len(rollout.attempts)
        while not rollout.done and not self._wants_next_page():
            step_all([rollout], self.simulator)
        trace = rollout.attempts[before:]
        reward = sum(self.weights.get(a.action or "", 0.0) for a in trace if a.accepted)
        info = self._info([asdict(a) for a in trace])
        return self._observation(), float(reward), rollout.terminated, rollout.truncated, info

    def slate(self, action: Any, remaining: list[Candidate]) -> list[str]:
        """Item ids in the order to show: from a score per candidate slot (the action space), or from a
        policy's slate (candidate dicts or ids among the remaining ones, in order)."""
        offered = {c["item_id"] for c in remaining}
        if isinstance(action, np.ndarray) and action.dtype.kind == "f":
            slots = {c["item_id"]: k for k, c in enumerate(self.candidates)}
            scores = np.array([action[slots[c["item_id"]]] for c in remaining], dtype=np.float64)
            return [remaining[k]["item_id"] for k in np.argsort(-scores, kind="stable")]
        ids = [a if isinstance(a, str) else a["item_id"] for a in action]
        stray = [i for i in ids if i not in offered]
        if stray or len(set(ids)) != len(ids):
            raise ValueError(
                f"a slate orders candidates not yet shown, each once; not {stray[:3] or 'repeats'}"
            )
        return ids

    # --- internals ---------------------------------------------------------------------------

    def _candidates(self, session: Session) -> list[Candidate]:
        if self.candidate_settings.source == "logged":
            return logged_candidates(session, self.popularity)
        items = pl.DataFrame(
            {"item_id": list(self._catalog), "category": [i.category for i in self._catalog.values()]},
            schema={"item_id": pl.String, "category": pl.String},
        )
        popularity = pl.DataFrame(
            {"item_id": list(self.popularity), "popularity": list(self.popularity.values())},
            schema={"item_id": pl.String, "popularity": pl.Int64},
        )
        ids = category_mix_candidates(session, items, popularity, self.candidate_settings.top_n)
        return [candidate(self._catalog[i], self.popularity) for i in ids]

    def _serve(self, page: list[str]) -> None:
        self.shown += page
        served = lay_out(
            self.session,
            self.shown,
            default_height=self.settings.default_card_height,
            viewport=self.settings.geometry.feed_viewport,
            items=self._catalog,
        )
        self.shown = [card.item_id for card in served.cards]  # a page holds as many cards as the feed's slots
        if self.rollout is None:
            self.rollout = Rollout(served, self.settings)
            return
        env = self.rollout.env
        env.session = served
        env.max_offset = max((served.feed_height or 0.0) - self.settings.geometry.feed_viewport, 0.0)

    def _wants_next_page(self) -> bool:
        """The simulator reached the bottom of the feed with candidates left to show."""
        rollout = self.rollout
        assert rollout is not None
        left = len(self.shown) < len(self.candidates)
        return left and rollout.env.screen == "feed" and rollout.env.offset >= rollout.env.max_offset

    def _observation(self) -> dict[str, np.ndarray]:
        n = self.max_candidates
        features = np.zeros((n, len(FEATURES)), np.float32)
        category = np.zeros(n, np.int64)
        flags = {name: np.zeros(n, np.int8) for name in ("shown", "clicked", "carted", "bought")}
        slots = {c["item_id"]: k for k, c in enumerate(self.candidates)}
        for k, c in enumerate(self.candidates):
            features[k] = (1.0, np.log1p(c["price"] or 0.0), np.log1p(c["popularity"] or 0))
            category[k] = self._category_index.get(c["category_l1"], 0)
        for item in self.shown:
            flags["shown"][slots[item]] = 1
        attempts = self.rollout.attempts if self.rollout is not None else []
        for a in attempts:
            flag = {"click": "clicked", "ipv_cart": "carted", "ipv_buy": "bought"}.get(a.action or "")
            if a.accepted and flag and a.target_item_id in slots:
                flags[flag][slots[a.target_item_id]] = 1
        steps = np.array([self.rollout.accepted_steps if self.rollout is not None else 0], np.int64)
        return {"features": features, "category": category, **flags, "steps": steps}

    def _info(self, trace: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "session_id": self.session.session_id,
            "user_id": self.session.user_id,
            "context": copy.deepcopy(self.context),
            "candidates": [dict(c) for c in self.candidates if c["item_id"] not in set(self.shown)],
            "trace": trace,
            "termination_reason": self.rollout.termination_reason if self.rollout is not None else None,
        }


def register_env() -> None:
    """Register ``trajforge/Shopping-v0`` once."""
    if ENV_ID not in gym.registry:
        gym.register(id=ENV_ID, entry_point="evaluation.gym_env:ShoppingEnv")


register_env()
