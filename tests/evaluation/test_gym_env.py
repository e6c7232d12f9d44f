"""The Gymnasium environment: a ranker serves a held-out session's feed, the world's shoppers shop in it
(a 40-shopper generated world)."""

from __future__ import annotations

from pathlib import Path

import pytest

gym = pytest.importorskip("gymnasium")

from gymnasium.utils.env_checker import check_env  # noqa: E402

from evaluation.environment import card_in_view  # noqa: E402
from evaluation.gym_env import ENV_ID, ShoppingEnv  # noqa: E402
from evaluation.slate import CandidateSettings  # noqa: E402
from tests.flows.generated_lakes import generated_lake  # noqa: E402
from worlds.shoppers import world_from_lake  # noqa: E402


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> Path:
    return generated_lake(tmp_path_factory.mktemp("gym"), users=40, seed=3)


@pytest.fixture(scope="module")
def world(lake):
    return world_from_lake(lake)


def cheapest_first(context, candidates):
    return sorted(candidates, key=lambda c: (c["price"], c["item_id"]))


def test_the_environment_passes_gymnasiums_checker(lake, world):
    # the world's shoppers draw per (session, step), so a seeded reset and the same action repeat exactly
    env = ShoppingEnv(lake, world)
    check_env(env, skip_render_check=True)


def test_a_ranker_written_here_gets_feeds_whose_visible_cards_follow_its_order(lake, world):
    env = gym.make(ENV_ID, lake=lake, simulator=world, disable_env_checker=True)
    observation, info = env.reset(seed=0)
    slate = cheapest_first(info["context"], info["candidates"])
    observation, reward, terminated, truncated, info = env.step(slate)
    served = env.unwrapped.rollout.session
    price = {c["item_id"]: c["price"] for c in slate}
    # the served feed's cards, in reading order, are the slate's order: cheapest first
    assert [c.item_id for c in served.cards] == [c["item_id"] for c in slate][: len(served.cards)]
    # and what the simulator saw first is the top of that order: visible cards non-decreasing in price
    first_view = info["trace"][0]["visible_item_ids"]
    assert first_view and first_view[0] == slate[0]["item_id"]
    assert [price[i] for i in first_view] == sorted(price[i] for i in first_view)
    geometry = env.unwrapped.settings.geometry
    assert list(first_view) == [c.item_id for c in served.cards if card_in_view(c, 0.0, geometry)]
    # one page holds every candidate: the episode ends in this step, rewarded with its accepted clicks
    assert terminated or truncated
    assert reward == sum(a["accepted"] and a["action"] == "click" for a in info["trace"])
    assert observation["shown"].sum() == len(served.cards)


def test_pages_after_the_first_are_served_when_the_shopper_reaches_the_bottom(lake, world):
    env = ShoppingEnv(lake, world, page_cards=6, reward="clicks")
    _, info = env.reset(options={"user_id": env.sessions[0].user_id})
    assert info["session_id"] == env.sessions[0].session_id
    pages = 0
    done = False
    while not done:
        _, _, terminated, truncated, info = env.step(cheapest_first(info["context"], info["candidates"]))
        pages += 1
        done = terminated or truncated
        assert len(env.shown) <= 6 * pages
    assert pages >= 1 and env.rollout.accepted_steps > 0


def test_a_slate_of_items_not_offered_is_refused(lake, world):
    env = ShoppingEnv(lake, world)
    env.reset(seed=1)
    with pytest.raises(ValueError, match="not yet shown"):
        env.step(["not-an-item"])


def test_candidates_from_a_category_mix_are_served_in_the_rankers_order(lake, world):
    env = ShoppingEnv(lake, world, candidates=CandidateSettings(source="category_mix", top_n=12))
    _, info = env.reset(seed=0)
    offered = [c["item_id"] for c in info["candidates"]]
    assert len(offered) == len(set(offered)) == 12
    slate = cheapest_first(info["context"], info["candidates"])
    env.step(slate)
    served = env.rollout.session
    # the page fills the logged feed's slots with the ranker's order of the mix
    assert [c.item_id for c in served.cards] == [c["item_id"] for c in slate][: len(served.cards)]
