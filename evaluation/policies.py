"""Ranking policies: what orders a shopper's feed, behind one plain interface a team's ranker can meet
without importing trajforge.

A policy is any callable ``rank(context, candidates)`` (or an object with such a ``rank`` method):

* ``context`` — a plain dict of what a recommender may know of the shopper when the session starts:
  ``session_id``, ``user_id``, ``profile`` (attribute -> value), ``history`` (``clicks``: a list of
  ``{"title", "category"}`` newest first, ``buys``: a list of ``{"title"}``), ``prior_clicks``,
  ``prior_buys``;
* ``candidates`` — a list of plain dicts, one per item that may be shown: ``item_id``, ``title``,
  ``price``, ``category`` (``L1-L2-L3``), ``category_l1`` and ``popularity`` (how often the lake's
  training logs showed or opened the item, 0 where it never did);

and it returns those dicts (or their ``item_id``) in the order to show; candidates it leaves out are
not shown, and anything it returns that is not a candidate is an error.

Built-in policies, by name: ``popularity`` (log popularity plus noise), ``personalised`` (the
shopper's category affinity learnt from its click history, plus a little popularity and noise) and
``random``. They mirror the synthetic world's ``baseline`` and
``treatment`` with what a recommender outside the world can see. ``mix:W:A:B`` interleaves two built-in
policies, taking each next card from ``B``'s order with probability ``W`` (graded-quality policies).
A team's policy is named ``module:object``: an importable callable, or a class built without
arguments. Noise is drawn per session from ``(seed, session_id)``, so a policy ranks a session alike
every time it is asked.
"""

from __future__ import annotations

import hashlib
import importlib
import math
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from evaluation.session import Session

Context = dict[str, Any]
Candidate = dict[str, Any]
RankFunction = Callable[[Context, list[Candidate]], Sequence[Candidate | str]]
CANDIDATE_FIELDS = ("item_id", "title", "price", "category", "category_l1", "popularity")


@runtime_checkable
class RankingPolicy(Protocol):
    """An object whose ``rank`` orders the candidates of one feed."""

    def rank(self, context: Context, candidates: list[Candidate]) -> Sequence[Candidate | str]: ...


def session_context(session: Session) -> Context:
    """What a policy may know of ``session``'s shopper: its profile and its history before the session."""
    categories = list(session.recent_click_categories) + [None] * len(session.recent_clicks)
    clicks = [
        {"title": title, "category": category}
        for title, category in zip(session.recent_clicks, categories, strict=False)
    ]
    return {
        "session_id": session.session_id,
        "user_id": session.user_id,
        "profile": dict(session.profile),
        "history": {"clicks": clicks, "buys": [{"title": title} for title in session.recent_buys]},
        "prior_clicks": session.prior_clicks,
        "prior_buys": session.prior_buys,
    }


def session_rng(seed: int, session_id: str | None) -> np.random.Generator:
    """A generator of its own for one session's ranking: the same order whenever the session is ranked."""
    digest = hashlib.sha256(f"{seed}:{session_id}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def log_popularity(candidates: list[Candidate]) -> np.ndarray:
    return np.log1p(np.array([c.get("popularity") or 0 for c in candidates], dtype=np.float64))


def by_score(candidates: list[Candidate], score: np.ndarray) -> list[Candidate]:
    """Candidates by descending score; ties keep the candidates' order."""
    return [candidates[i] for i in np.argsort(-score, kind="stable")]


class PopularityPolicy:
    """Most popular first, with noise: the world's ``baseline`` (log popularity + N(0, noise))."""

    def __init__(self, noise: float = 1.0, seed: int = 0) -> None:
        self.noise, self.seed = noise, seed

    def rank(self, context: Context, candidates: list[Candidate]) -> list[Candidate]:
        rng = session_rng(self.seed, context.get("session_id"))
        return by_score(
            candidates, log_popularity(candidates) + self.noise * rng.normal(size=len(candidates))
        )


class PersonalisedPolicy:
    """The shopper's top-category affinity from its click history (Laplace-smoothed shares over the
    categories clicked or offered), plus a little popularity and noise: the world's ``treatment``
    weights (affinity 1.0, popularity 0.4, noise 0.6) on what the history shows. Not relative to the
    candidates' mix: a feed already leaning to the session's category would push that category down."""

    def __init__(
        self, affinity: float = 1.0, popularity: float = 0.4, noise: float = 0.6, seed: int = 0
    ) -> None:
        self.affinity, self.popularity, self.noise, self.seed = affinity, popularity, noise, seed

    def rank(self, context: Context, candidates: list[Candidate]) -> list[Candidate]:
        tops = [_top_category(c) for c in candidates]
        clicked = Counter(_top_category(click) for click in (context.get("history") or {}).get("clicks", []))
        clicked.pop(None, None)
        kinds, seen = len(set(tops) | set(clicked)) or 1, sum(clicked.values())
        log_affinity = np.array([math.log((clicked[t] + 1) / (seen + kinds)) for t in tops])
        rng = session_rng(self.seed, context.get("session_id"))
        score = (
            self.affinity * log_affinity
            + self.popularity * log_popularity(candidates)
            + self.noise * rng.normal(size=len(candidates))
        )
        return by_score(candidates, score)


class RandomPolicy:
    """A uniformly random order per session."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def rank(self, context: Context, candidates: list[Candidate]) -> list[Candidate]:
        order = session_rng(self.seed, context.get("session_id")).permutation(len(candidates))
        return [candidates[i] for i in order]


class MixturePolicy:
    """Each next card from ``second``'s order with probability ``weight``, else from ``first``'s (the
    next not yet placed): between the two policies' quality as ``weight`` goes from 0 to 1."""

    def __init__(self, first: RankFunction, second: RankFunction, weight: float, seed: int = 0) -> None:
        if not 0 <= weight <= 1:
            raise ValueError(f"a mixture's weight is within [0, 1], not {weight}")
        self.first, self.second, self.weight, self.seed = first, second, weight, seed

    def rank(self, context: Context, candidates: list[Candidate]) -> list[Candidate]:
        orders = [ranked(policy, context, candidates) for policy in (self.first, self.second)]
        ids = [[c["item_id"] for c in order] for order in orders]
        by_id = {c["item_id"]: c for c in candidates}
        picks = session_rng(self.seed + 1, context.get("session_id")).random(len(candidates)) < self.weight
        placed: dict[str, None] = {}
        cursors = [0, 0]
        for pick in picks:
            source = int(pick)
            while ids[source][cursors[source]] in placed:
                cursors[source] += 1
            placed[ids[source][cursors[source]]] = None
        return [by_id[i] for i in placed]


def _top_category(candidate: Candidate) -> str | None:
    top = candidate.get("category_l1")
    category = candidate.get("category")
    return top or (category.split("-")[0] if category else None)


#: built-in name -> builder from a seed
BUILT_IN: dict[str, Callable[[int], RankingPolicy]] = {
    "popularity": lambda seed: PopularityPolicy(seed=seed),
    "personalised": lambda seed: PersonalisedPolicy(seed=seed),
    "random": lambda seed: RandomPolicy(seed=seed),
}


def as_rank_function(policy: object) -> RankFunction:
    """The ranking callable of ``policy``: its ``rank`` method, or the policy itself when callable."""
    if isinstance(policy, RankingPolicy):
        return policy.rank
    if callable(policy):
        return policy  # type: ignore[return-value]
    raise TypeError(f"a ranking policy is a callable rank(context, candidates) or has one, not {policy!r}")


def policy_from_spec(
    spec: str, seed: int = 0, extra: dict[str, Callable[[int], object]] | None = None
) -> RankFunction:
    """The policy a spec names: a built-in name, ``mix:W:A:B``, a name of ``extra`` (e.g. the
    world's own arms), or ``module:object`` (a class is built without arguments)."""
    named = {**BUILT_IN, **(extra or {})}
    if spec in named:
        return as_rank_function(named[spec](seed))
    if spec.startswith("mix:"):
        weight, _, rest = spec.removeprefix("mix:").partition(":")
        first, _, second = rest.partition(":")
        try:
            share = float(weight)
        except ValueError:
            share = math.nan
        if math.isnan(share) or first not in named or second not in named:
            raise ValueError(
                f"a mixture is mix:WEIGHT:A:B with A, B among {', '.join(sorted(named))}: {spec!r}"
            )
        pair = (policy_from_spec(first, seed, extra), policy_from_spec(second, seed, extra))
        return MixturePolicy(*pair, weight=share, seed=seed).rank
    module_name, colon, attribute = spec.partition(":")
    if not colon or not module_name or not attribute:
        known = ", ".join(sorted(named))
        raise ValueError(f"unknown policy {spec!r}: name a built-in ({known}) or module:object")
    try:
        found = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"policy {spec!r} cannot be imported: {err}") from None
    return as_rank_function(found() if isinstance(found, type) else found)


def ranked(policy: RankFunction, context: Context, candidates: list[Candidate]) -> list[Candidate]:
    """The policy's order of ``candidates``, each a copy (a policy may not change what the feed shows);
    an answer naming anything but a candidate, or one twice, is a plain error."""
    by_id = {c["item_id"]: c for c in candidates}
    answer = policy(context, [dict(c) for c in candidates])
    order = [
        a if isinstance(a, str) else (a or {}).get("item_id") if isinstance(a, dict) else None for a in answer
    ]
    unknown = [i for i in order if i not in by_id]
    if unknown:
        raise ValueError(
            f"the policy returned {len(unknown)} items that are not candidates (e.g. {unknown[0]!r})"
        )
    if len(set(order)) != len(order):
        raise ValueError("the policy returned a candidate twice")
    return [dict(by_id[i]) for i in order]
