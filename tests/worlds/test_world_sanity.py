"""Sanity of the whole protocol: the world's own shoppers, rolled out in the environment, score at the
ceiling against held-out logs of the same world, and recover its A/B effect.

Size: a 2,000-shopper world (seed 5; about 11,700 sessions); the scorecard over its test split (about
180 users, 1,070 sessions, 9,200 actions), the effect over 1,000 of its shoppers (500 per arm, about
5,900 sessions each). Takes about three minutes on two cores.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from evaluation.loader import load_sessions
from evaluation.rollout import Rollout
from evaluation.scorecard import score
from evaluation.simulators import drive
from evaluation.traces import Trace, TraceProfile, TraceStep, load_traces, write_jsonl
from flows.score import export_real_traces
from tests.flows.generated_lakes import generated_lake
from transforms.lake import read_lake_table
from worlds.shoppers import effect_for_lake, world_from_lake

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> Path:
    return generated_lake(tmp_path_factory.mktemp("world-sanity"), users=2_000, seed=5)


def trace_of(rollout: Rollout) -> Trace:
    session = rollout.session
    profile = TraceProfile(
        prior_clicks=session.prior_clicks,
        prior_buys=session.prior_buys,
        recent_click_categories=[c for c in session.recent_click_categories if c],
    )
    return Trace(
        session_id=session.session_id,
        user_id=session.user_id or "",
        source="world",
        terminated=rollout.terminated,
        truncated=rollout.truncated,
        termination_reason=rollout.termination_reason,
        profile=profile,
        steps=[TraceStep.model_validate(a, from_attributes=True) for a in rollout.attempts],
    )


def test_world_scores_at_the_ceiling_against_its_held_out_logs(lake: Path, tmp_path):
    rollouts = [Rollout(s) for s in load_sessions(lake, split="test")]
    drive(rollouts, world_from_lake(lake))
    write_jsonl(tmp_path / "sim.jsonl", [trace_of(r) for r in rollouts])
    export_real_traces(lake, tmp_path / "real.jsonl", ["test"])
    figures = score(load_traces(tmp_path / "real.jsonl"), load_traces(tmp_path / "sim.jsonl"))
    assert figures["counts"]["real_sessions"] == len(rollouts) > 1_000
    assert figures["OVA"] == 1.0
    assert figures["DM-JSD"] <= 0.01 and figures["T-JSD"] <= 0.01
    assert figures["TE"] <= 0.5
    assert figures["PF"] >= 0.9


def test_world_recovers_the_worlds_ab_effect(lake: Path):
    users = sorted(read_lake_table(lake, "sessions", ["user_id"])["user_id"].unique().to_list())[:1_000]
    world = world_from_lake(lake)
    effect = effect_for_lake(lake, world, world, users=users, seed=0)
    assert effect.users == {"A": 500, "B": 500}
    assert effect.real_delta > 0  # the personalised policy B gets more clicks per page view
    # the shoppers draw numbers of their own, not the arms' real ones: the ratio is measured with the
    # noise of 500 users an arm, and since the same shoppers made the real effect its interval holds 1
    low, high = effect.ci
    assert low < effect.ratio < high and low <= 1.0 <= high and high - low < 0.5
