"""Simulators behind one interface: chat prompts in, response texts out, batched across sessions.

A simulator sees exactly what a trained checkpoint sees, the rendered messages, and
answers in the PROTOCOL.md §2 format; the environment judges every answer the same
way whoever wrote it. ``drive`` steps a batch of rollouts with one simulator until
every episode has ended.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from evaluation.rollout import Rollout

Messages = list[dict[str, str]]

ACTIONS_HEADING = "## Executable actions\n"
CARD_LINE = re.compile(r"^\d+\. .* \| id (?P<item>.+)$")
REVIEW_LINE = re.compile(r"^(?P<alias>C\d+): ")
DISTANCE_RANGE = re.compile(r'"distance": 1\.\.(?P<top>\d+)')


class Simulator(Protocol):
    """Answers a batch of prompts, one response text per prompt, in order."""

    def act(self, prompts: Sequence[Messages]) -> list[str]: ...


@runtime_checkable
class StateSimulator(Protocol):
    """A simulator that reads the environment's state rather than the prompt text (the synthetic
    world's shoppers); it still answers in the PROTOCOL.md §2 format, judged like any other."""

    def act_on(self, rollouts: Sequence[Rollout]) -> list[str]: ...


def answers(simulator: Simulator, live: Sequence[Rollout]) -> list[str]:
    """One response per live episode: from the episodes' states where the simulator reads them, else
    from their rendered prompts."""
    if isinstance(simulator, StateSimulator):
        return list(simulator.act_on(live))
    return list(simulator.act([r.messages() for r in live]))


def executable_lines(prompt: str) -> list[str]:
    """The signatures listed under the prompt's executable actions, e.g. ``scroll_down {...}``."""
    listed = prompt.split(ACTIONS_HEADING, 1)[1].split("\n\n", 1)[0]
    return [line.removeprefix("- ") for line in listed.splitlines() if line.startswith("- ")]


def observation_text(prompt: str) -> str:
    return prompt.split("## Current observation\n", 1)[1].split(ACTIONS_HEADING, 1)[0]


class RandomSimulator:
    """Uniform over the executable actions of each prompt, then uniform over that action's arguments
    (a card in view, a review alias in view, a distance in the listed range)."""

    def __init__(self, seed: int = 42) -> None:
        self.rng = random.Random(seed)

    def act(self, prompts: Sequence[Messages]) -> list[str]:
        return [self.answer(messages[-1]["content"]) for messages in prompts]

    def answer(self, prompt: str) -> str:
        signature = self.rng.choice(executable_lines(prompt))
        kind = signature.split(" ", 1)[0]
        action: dict[str, object] = {"type": kind}
        seen = observation_text(prompt).splitlines()
        if kind == "click":
            cards = [m["item"] for m in map(CARD_LINE.match, seen) if m]
            action["target_item_id"] = self.rng.choice(cards)
        elif kind == "ipv_click_comment":
            aliases = [m["alias"] for m in map(REVIEW_LINE.match, seen) if m]
            action["target"] = self.rng.choice(aliases)
        elif found := DISTANCE_RANGE.search(signature):
            action["distance"] = self.rng.randint(1, int(found["top"]))
        return json.dumps({"rationale": "a random choice", "action": action})


def random_from_spec(argument: str) -> RandomSimulator:
    if not argument:
        return RandomSimulator()
    if not argument.isdigit():
        raise ValueError(f"random:SEED takes a whole-number seed, not {argument!r}")
    return RandomSimulator(seed=int(argument))


#: spec name -> builder taking the text after "name:" ("" when there is none)
SIMULATORS: dict[str, Callable[[str], Simulator]] = {"random": random_from_spec}


def simulator_from_spec(spec: str) -> Simulator:
    """The simulator a spec string names: ``random`` or ``random:SEED`` (seed 42 by default)."""
    name, _, argument = spec.partition(":")
    if name not in SIMULATORS:
        raise ValueError(f"unknown simulator {spec!r}; known: {', '.join(sorted(SIMULATORS))}")
    return SIMULATORS[name](argument)


def drive(rollouts: Sequence[Rollout], simulator: Simulator) -> None:
    """Step every rollout until it ends, asking ``simulator`` for all live sessions at once.

    A failing batch ends each of its episodes truncated with reason ``error``.
    """
    live = [r for r in rollouts if not r.done]
    while live:
        try:
            outputs = answers(simulator, live)
            if len(outputs) != len(live):
                raise ValueError(f"{len(outputs)} responses for {len(live)} prompts")
        except Exception as error:  # the simulator's failure is recorded, never raised past the episode
            for rollout in live:
                rollout.fail(f"{type(error).__name__}: {error}")
            return
        for rollout, text in zip(live, outputs, strict=True):
            rollout.submit(text)
        live = [r for r in live if not r.done]
