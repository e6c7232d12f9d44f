"""The world wired into evaluation: its manifest through ingest, its shoppers as the ``world`` simulator,
its policies as A/B arms (a 60-shopper world, about 330 sessions)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from evaluation.loader import load_sessions
from evaluation.rollout import Rollout
from evaluation.simulators import RandomSimulator, Sampling, drive
from flows.ingest import ingest_flow
from synthetic.bundle import write_bundle
from tests.bundles import tiny_bundle
from tests.bundles import write_bundle as write_tiny_bundle
from tests.flows.generated_lakes import generated_lake
from transforms.lake import world_path
from worlds.shoppers import (
    NoWorldError,
    WorldSimulator,
    effect_for_lake,
    held_out_users,
    policy_arm,
    split_halves,
    world_from_lake,
)


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> Path:
    return generated_lake(tmp_path_factory.mktemp("world"), users=60, seed=5)


def test_ingest_flow_carries_a_generated_bundles_world_and_real_logs_have_none(prefect_harness, tmp_path):
    write_bundle(tmp_path / "raw", users=12, seed=2)
    lake = tmp_path / "lake"
    ingest_flow(str(tmp_path / "raw"), str(lake))
    manifest = json.loads((tmp_path / "raw" / "manifest.json").read_text())
    assert json.loads(world_path(lake).read_text()) == manifest
    world_from_lake(lake)  # the lake alone is enough
    write_tiny_bundle(tiny_bundle(), tmp_path / "real")
    ingest_flow(str(tmp_path / "real"), str(lake), force=True)
    assert not world_path(lake).exists()
    with pytest.raises(NoWorldError, match="has no world: it was not ingested from a generated bundle"):
        world_from_lake(lake)


def test_world_shoppers_act_in_the_environment_and_keep_their_session_lengths(lake: Path):
    sessions = load_sessions(lake, split="test")
    rollouts = [Rollout(s) for s in sessions]
    drive(rollouts, world_from_lake(lake))
    assert sessions and all(a.accepted for r in rollouts for a in r.attempts)
    # a shopper ends exactly at its session's budget, the length of its logged session; the
    # environment's single-session budget (31 actions) truncates the longer ones
    for rollout in rollouts:
        logged = len(rollout.session.steps)
        expected = ("end", logged) if logged <= 31 else ("budget", 31)
        assert (rollout.termination_reason, rollout.accepted_steps) == expected
    assert Counter(a.action for r in rollouts for a in r.attempts)["click"] > 0


def test_the_world_refuses_prompt_text_and_foreign_keys(lake: Path, tmp_path):
    world = world_from_lake(lake)
    with pytest.raises(TypeError, match="act on the environment's state"):
        world.act([[{"role": "user", "content": "hello"}]])
    foreign = WorldSimulator(world.world, world.seed, rekey_key="not the lake's key")
    with pytest.raises(ValueError, match="another rekey key"):
        policy_arm(foreign, "A", "baseline", held_out_users(lake), tmp_path)


def test_policy_arms_replay_the_worlds_own_shoppers_under_shared_draws(lake: Path, tmp_path):
    own = world_from_lake(lake)
    world = WorldSimulator(own.world, own.seed, own.rekey_key, draws=None)  # common random numbers
    users = sorted({s.user_id for s in load_sessions(lake)})[:30]
    half_a, half_b = split_halves(users, seed=1)
    assert (len(half_a), len(half_b)) == (15, 15) and not set(half_a) & set(half_b)
    arm = policy_arm(world, "B", "treatment", half_b, tmp_path)
    assert {s.user_id for s in arm.sessions} == set(half_b)
    # the real side, counted from the arm's ingested sessions
    logged = Counter()
    for session in arm.sessions:
        logged[session.user_id] += sum(step.action == "click" for step in session.steps)
    assert dict(zip(arm.real["user_id"], arm.real["clicks"], strict=True)) == dict(logged)
    views = Counter(s.user_id for s in arm.sessions)
    assert dict(zip(arm.real["user_id"], arm.real["views"], strict=True)) == dict(views)
    # on shared draws the shoppers in the environment mostly repeat their logged sessions action
    # for action; they part where the environment's page layout differs from the world's
    rollouts = [Rollout(s) for s in arm.sessions]
    drive(rollouts, world)
    same = sum([a.action for a in r.attempts] == [s.action for s in r.session.steps] for r in rollouts)
    assert same >= 0.8 * len(rollouts)


def test_effect_of_a_prompt_simulator_against_the_worlds_arms(lake: Path, tmp_path):
    world = world_from_lake(lake)
    users = sorted({s.user_id for s in load_sessions(lake)})[:30]
    effect = effect_for_lake(lake, RandomSimulator(seed=3), world, users=users, seed=1)
    assert effect.users == {"A": 15, "B": 15}
    # the real delta, worked out from the arms' logged sessions: clicks / sessions, B minus A
    half_a, half_b = split_halves(users, seed=1)
    ctr = {}
    for name, policy, half in (("A", "baseline", half_a), ("B", "treatment", half_b)):
        sessions = policy_arm(world, name, policy, half, tmp_path).sessions
        ctr[name] = sum(step.action == "click" for s in sessions for step in s.steps) / len(sessions)
    assert effect.real_delta == pytest.approx(ctr["B"] - ctr["A"], rel=1e-12)
    assert effect.ratio == pytest.approx(effect.sim_delta / effect.real_delta, rel=1e-12)
    assert effect.error == pytest.approx(abs(1 - effect.ratio), rel=1e-12)


def actions(rollouts: list[Rollout]) -> list[list[str | None]]:
    return [[a.action for a in r.attempts] for r in rollouts]


def test_the_world_as_a_simulator_draws_its_own_numbers_the_same_for_a_seed(lake: Path):
    sessions = load_sessions(lake, split="test")
    together = [Rollout(s) for s in sessions]
    drive(together, world_from_lake(lake, Sampling(seed=42)))
    # its own draws part from the logged sessions somewhere (the same shoppers, other random numbers)
    assert any(
        a != [step.action for step in s.steps] for a, s in zip(actions(together), sessions, strict=True)
    )
    # the same seed repeats every episode, whether stepped with the others or alone; another draws anew
    alone = [Rollout(s) for s in sessions[:5]]
    world = world_from_lake(lake, Sampling(seed=42))
    for rollout in alone:
        drive([rollout], world)
    assert actions(alone) == actions(together)[:5]
    other = [Rollout(s) for s in sessions]
    drive(other, world_from_lake(lake, Sampling(seed=7)))
    assert actions(other) != actions(together)


def test_the_worlds_effect_is_measured_not_repeated(lake: Path):
    users = sorted({s.user_id for s in load_sessions(lake)})[:30]
    world = world_from_lake(lake)
    effect = effect_for_lake(lake, world, world, users=users, seed=1)
    # its shoppers' own draws make other clicks than the arms' real ones: the simulated delta is not the
    # real one, and the bootstrap interval of the ratio is not the single point [1, 1]
    assert effect.sim_delta != effect.real_delta
    low, high = effect.ci
    assert low < high
    again = world_from_lake(lake)
    assert effect_for_lake(lake, again, again, users=users, seed=1).as_dict() == effect.as_dict()
