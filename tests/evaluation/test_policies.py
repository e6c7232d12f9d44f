"""Ranking policies behind the plain interface: built-ins, mixtures, a team's module:object, the guard."""

from __future__ import annotations

import pytest

from evaluation.policies import MixturePolicy, PopularityPolicy, RandomPolicy, policy_from_spec, ranked

CANDIDATES = [
    {"item_id": "a", "title": "A", "price": 30.0, "category": "X-1-1", "category_l1": "X", "popularity": 1},
    {"item_id": "b", "title": "B", "price": 10.0, "category": "Y-1-1", "category_l1": "Y", "popularity": 50},
    {"item_id": "c", "title": "C", "price": 20.0, "category": "X-2-1", "category_l1": "X", "popularity": 5},
]
CONTEXT = {"session_id": "s1", "user_id": "u1", "profile": {}, "history": {"clicks": [], "buys": []}}


def cheapest_first(context, candidates):
    return sorted(candidates, key=lambda c: c["price"])


class Reverse:
    def rank(self, context, candidates):
        return [c["item_id"] for c in reversed(candidates)]


def ids(order):
    return [c["item_id"] for c in order]


def test_a_team_policy_is_a_callable_or_a_class_named_module_object():
    # cheapest first: 10 (b) < 20 (c) < 30 (a); the class answers ids, reversed
    assert ids(ranked(policy_from_spec(f"{__name__}:cheapest_first"), CONTEXT, CANDIDATES)) == ["b", "c", "a"]
    assert ids(ranked(policy_from_spec(f"{__name__}:Reverse"), CONTEXT, CANDIDATES)) == ["c", "b", "a"]


def test_noiseless_popularity_orders_by_popularity_and_noise_is_fixed_per_session():
    # popularity 50 (b) > 5 (c) > 1 (a)
    assert ids(PopularityPolicy(noise=0.0).rank(CONTEXT, CANDIDATES)) == ["b", "c", "a"]
    random = RandomPolicy(seed=3)
    assert random.rank(CONTEXT, CANDIDATES) == random.rank(CONTEXT, CANDIDATES)


def test_a_mixture_is_its_first_policy_at_weight_0_and_its_second_at_1():
    first, second = PopularityPolicy(noise=0.0).rank, f"{__name__}:cheapest_first"
    cheap = policy_from_spec(second)
    assert ids(MixturePolicy(first, cheap, 0.0).rank(CONTEXT, CANDIDATES)) == ["b", "c", "a"]
    assert ids(MixturePolicy(first, cheap, 1.0).rank(CONTEXT, CANDIDATES)) == ["b", "c", "a"]
    # popularity vs popularity reversed: weight 1 is the second's order exactly
    assert ids(MixturePolicy(first, Reverse().rank, 1.0).rank(CONTEXT, CANDIDATES)) == ["c", "b", "a"]
    assert sorted(ids(policy_from_spec("mix:0.5:popularity:random")(CONTEXT, CANDIDATES))) == ["a", "b", "c"]


def test_personalised_puts_the_clicked_category_first_without_noise():
    policy = policy_from_spec("personalised")
    policy.__self__.noise = policy.__self__.popularity = 0.0
    context = CONTEXT | {"history": {"clicks": [{"title": "t", "category": "Y-1-1"}] * 5, "buys": []}}
    # smoothed click shares over {X, Y}: Y (5 + 1) / 7, X (0 + 1) / 7
    assert ids(policy(context, CANDIDATES))[0] == "b"


def test_a_policy_answering_other_items_or_unknown_names_is_a_plain_error():
    with pytest.raises(ValueError, match="not candidates"):
        ranked(lambda context, candidates: ["zzz"], CONTEXT, CANDIDATES)
    with pytest.raises(ValueError, match="twice"):
        ranked(lambda context, candidates: ["a", "a"], CONTEXT, CANDIDATES)
    with pytest.raises(ValueError, match="unknown policy 'nope'"):
        policy_from_spec("nope")
    with pytest.raises(ValueError, match="cannot be imported"):
        policy_from_spec("no_such_module_here:rank")
