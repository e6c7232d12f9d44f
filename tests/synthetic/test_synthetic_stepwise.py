"""The stepwise shoppers decide with the log generator's own policy and, on keyed draws, its numbers."""

from __future__ import annotations

import numpy as np
import pytest

from synthetic.behaviour import KeyedDraws
from synthetic.stepwise import ShopperState, StepwiseShoppers
from synthetic.world import World
from transforms.schemas import ACTIONS


@pytest.fixture(scope="module")
def world() -> World:
    return World.build(60, seed=3)


def test_keyed_draws_of_a_session_do_not_depend_on_the_batch():
    key = (3, 1, 0)
    batch = KeyedDraws(key, np.array([4, 9]), np.array([2, 2]))
    alone = np.random.default_rng([*key, 9, 2])  # session 9's own stream at step 2
    assert np.array_equal(batch.random((2, 5))[1], alone.random(5))
    assert batch.lognormal(0.0, 0.35, 2)[1] == alone.lognormal(0.0, 0.35)


def test_keyed_runs_are_deterministic_and_differ_from_the_shared_stream(world: World):
    first = world.run(policy="baseline", seed=1, keyed_draws=0)
    again = world.run(policy="baseline", seed=1, keyed_draws=0)
    shared = world.run(policy="baseline", seed=1)
    assert np.array_equal(first.steps.action, again.steps.action)
    assert np.array_equal(first.plan.budget, shared.plan.budget)  # the plan is the run's, not the draws'
    assert not np.array_equal(first.steps.action, shared.steps.action)


def first_screens(world: World, run) -> ShopperState:
    """Every session on its feed at offset 0 before its first action; cards in view by the 50 % rule
    (at least half of a card's height within the 693 px viewport)."""
    feeds, n = run.feeds, len(run.plan.budget)
    inside = np.minimum(feeds.y + feeds.height, 693) - np.maximum(feeds.y, 0)
    in_view = (feeds.height > 0) & (2 * inside >= feeds.height)
    visible = np.where(in_view, feeds.item, -1)
    zeros, no = np.zeros(n), np.zeros(n, bool)
    return ShopperState(
        session=np.arange(n), step=np.zeros(n, np.int64), on_page=no, offset=zeros,
        max_offset=(feeds.feed_height - 693).astype(float), visible=visible, returned=no,
        item=np.full(n, -1), page=zeros, page_max=zeros, ui=np.zeros(n, np.int64), pic=zeros,
        tappable_reviews=zeros, visit_step=zeros, carted=no, bought=no, param_seen=no, comments_seen=no,
    )  # fmt: skip


def test_first_decisions_are_those_of_the_keyed_run(world: World):
    run = world.run(policy="treatment", seed=2, keyed_draws=5)
    decided = StepwiseShoppers(world, run).decide(first_screens(world, run))
    first = run.steps.step == 0
    assert np.array_equal(run.steps.session[first], np.arange(len(run.plan.budget)))
    assert np.array_equal(decided.action, run.steps.action[first])
    clicked = decided.action == ACTIONS.index("click")
    assert clicked.any() and (~clicked).any()
    assert np.array_equal(decided.item[clicked], run.steps.item[first][clicked])
    assert np.array_equal(decided.distance[~clicked], run.steps.scroll_delta[first][~clicked])


def test_a_session_ends_on_its_budgets_last_action(world: World):
    run = world.run(policy="baseline", seed=2, keyed_draws=0)
    state = first_screens(world, run)
    last = run.plan.budget - 1  # the budget counts the final end
    at_end = ShopperState(**{**state.__dict__, "step": last})
    assert (StepwiseShoppers(world, run).decide(at_end).action == ACTIONS.index("end")).all()
