"""Simulators driving the environment: the ``random`` baseline and the batched driver."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from evaluation.environment import EnvironmentSettings
from evaluation.rollout import Rollout
from evaluation.simulators import RandomSimulator, drive, executable_lines, simulator_from_spec
from tests.evaluation.test_environment import session


def test_random_only_ever_answers_executable_actions():
    rollouts = [Rollout(session(offset=float(offset))) for offset in (0, 120.5, 300, 607.5)]
    drive(rollouts, RandomSimulator(seed=7))
    attempts = [a for r in rollouts for a in r.attempts]
    assert attempts and all(a.accepted for a in attempts)
    # each episode ends by itself (end) or spends its 31 actions
    for rollout in rollouts:
        assert rollout.termination_reason in ("end", "budget")
        assert rollout.accepted_steps == len(rollout.attempts) <= 31
        if rollout.termination_reason == "budget":
            assert rollout.accepted_steps == 31


def test_random_is_uniform_over_the_listed_actions():
    prompt = Rollout(session(offset=0.0)).messages()
    # offset 0, cards in view: scroll_down, click, end
    assert [line.split()[0] for line in executable_lines(prompt[1]["content"])] == [
        "scroll_down",
        "click",
        "end",
    ]
    answers = RandomSimulator(seed=1).act([prompt] * 300)
    kinds = Counter(json.loads(a)["action"]["type"] for a in answers)
    # 300 draws, p = 1/3 each: mean 100, sd sqrt(300 * 1/3 * 2/3) = 8.2; 70..130 is beyond 3.5 sd
    assert set(kinds) == {"scroll_down", "click", "end"}
    assert all(70 <= n <= 130 for n in kinds.values())
    clicked = {json.loads(a)["action"]["target_item_id"] for a in answers if '"click"' in a}
    assert clicked == {"A", "B", "D", "C"}  # the cards in view at 0; E shows 693 - 649.25 = 43.75 px


def test_random_is_reproducible_with_its_seed():
    def run(seed: int) -> list[str]:
        rollout = Rollout(session())
        drive([rollout], RandomSimulator(seed=seed))
        return [a.raw_output for a in rollout.attempts]

    assert run(3) == run(3)


class Failing:
    def act(self, prompts):
        raise TimeoutError("no answer in 60 s")


class Short:
    def act(self, prompts):
        return ['{"rationale": "r", "action": {"type": "end"}}'][: len(prompts) - 1]


def test_a_failing_simulator_truncates_every_live_episode_with_error():
    rollouts = [Rollout(session()), Rollout(session())]
    drive(rollouts, Failing())
    assert [(r.truncated, r.termination_reason) for r in rollouts] == [(True, "error"), (True, "error")]
    assert rollouts[0].error == "TimeoutError: no answer in 60 s"


def test_a_simulator_answering_too_few_prompts_is_an_error():
    rollouts = [Rollout(session()), Rollout(session())]
    drive(rollouts, Short())
    assert {r.termination_reason for r in rollouts} == {"error"}


def test_drive_leaves_finished_episodes_alone():
    done = Rollout(session(), EnvironmentSettings(budget_single=1))
    done.submit('{"rationale": "r", "action": {"type": "end"}}')
    drive([done], Failing())
    assert done.termination_reason == "end"


def test_simulators_are_named_by_spec():
    prompt = Rollout(session()).messages()
    assert simulator_from_spec("random:5").act([prompt]) == RandomSimulator(seed=5).act([prompt])
    assert simulator_from_spec("random").act([prompt]) == RandomSimulator(seed=42).act([prompt])
    with pytest.raises(ValueError, match="unknown simulator 'oracle'; known: checkpoint, openai, random"):
        simulator_from_spec("oracle")
    with pytest.raises(ValueError, match="whole-number seed"):
        simulator_from_spec("random:abc")
