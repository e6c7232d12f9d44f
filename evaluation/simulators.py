"""Simulators behind one interface: chat prompts in, response texts out, batched across sessions.

A simulator sees exactly what a trained checkpoint sees, the rendered messages, and
answers in the PROTOCOL.md §2 format; the environment judges every answer the same
way whoever wrote it. ``drive`` steps a batch of rollouts with one simulator until
every episode has ended.

A simulator that samples takes each prompt's key, (session id, step), and draws for that prompt
from a seed derived from (its seed, its name, the key) alone (``derived_seed``): an episode's
answers then depend on neither the batch it was asked in nor the sessions asked before it, so an
evaluation killed and run again (the sessions already written are skipped) writes what one never
stopped would have.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import random
import re
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel, Field

from evaluation.rollout import Rollout

Messages = list[dict[str, str]]
#: what a prompt's draws are keyed by: its session id and step (a rollout's 0-based output index, a
#: replay's recorded step)
Key = tuple[str, int]
T = TypeVar("T")

ACTIONS_HEADING = "## Executable actions\n"
#: ``N. title | id ITEM | price | category`` (render.card_line): the id is read up to the price
CARD_LINE = re.compile(r"^\d+\. .* \| id (?P<item>.+?) \| (?:\d+\.\d\d|n/a) \| (?P<category>.*)$")
REVIEW_LINE = re.compile(r"^(?P<alias>C\d+): ")
DISTANCE_RANGE = re.compile(r'"distance": 1\.\.(?P<top>\d+)')


@dataclass(frozen=True)
class NoAnswer:
    """In place of a response: the simulator could not answer this one prompt (its request failed for
    good); that episode alone ends truncated with reason ``error``."""

    error: str


class Simulator(Protocol):
    """Answers a batch of prompts, one response text (or :class:`NoAnswer`) per prompt, in order.

    One that samples also takes ``keys`` (one :data:`Key` per prompt) and draws by them alone; one
    whose ``act`` has no ``keys`` parameter is asked without them."""

    def act(self, prompts: Sequence[Messages]) -> Sequence[str | NoAnswer]: ...


@runtime_checkable
class ConcurrentSimulator(Simulator, Protocol):
    """A simulator that also answers one prompt at a time, many in flight (a remote endpoint): each
    episode then moves on as soon as its own answer is back, instead of waiting for a whole batch.
    ``run`` runs a coroutine on the simulator's event loop and returns its result."""

    concurrency: int

    async def answer(self, messages: Messages) -> str | NoAnswer: ...

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T: ...


@runtime_checkable
class StateSimulator(Protocol):
    """A simulator that reads the environment's state rather than the prompt text (the synthetic
    world's shoppers); it still answers in the PROTOCOL.md §2 format, judged like any other."""

    def act_on(self, rollouts: Sequence[Rollout]) -> list[str]: ...


def derived_seed(*parts: str | int, bits: int = 63) -> int:
    """A seed of ``bits`` bits from ``parts`` alone (e.g. a simulator's seed, its name, a session id and
    a step): the same parts give the same seed in any process, different parts unrelated ones."""
    digest = hashlib.sha256(json.dumps(list(parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> (64 - bits)


def rollout_key(rollout: Rollout) -> Key:
    """The key of an episode's next prompt: its session and how many outputs it has had (a rejected
    output's retry draws anew)."""
    return (rollout.session.session_id, len(rollout.attempts))


def keys_or_positions(keys: Sequence[Key] | None, count: int) -> Sequence[Key]:
    """``keys``, or for a call without them each prompt keyed by its position in the call."""
    if keys is None:
        return [("", i) for i in range(count)]
    if len(keys) != count:
        raise ValueError(f"{len(keys)} keys for {count} prompts")
    return keys


def _takes(method: Callable[..., Any], name: str) -> bool:
    try:
        return name in inspect.signature(method).parameters
    except (TypeError, ValueError):  # a builtin without a signature takes no keys
        return False


def act_keyed(
    simulator: Simulator, prompts: Sequence[Messages], keys: Sequence[Key]
) -> Sequence[str | NoAnswer]:
    """``simulator.act``, with the prompts' keys where it takes them."""
    if _takes(simulator.act, "keys"):
        return simulator.act(prompts, keys=keys)  # type: ignore[call-arg]
    return simulator.act(prompts)


def answer_keyed(
    simulator: ConcurrentSimulator, messages: Messages, key: Key
) -> Coroutine[Any, Any, str | NoAnswer]:
    """``simulator.answer``, with the prompt's key where it takes one."""
    if _takes(simulator.answer, "key"):
        return simulator.answer(messages, key=key)  # type: ignore[call-arg]
    return simulator.answer(messages)


def answers(simulator: Simulator, live: Sequence[Rollout]) -> Sequence[str | NoAnswer]:
    """One response per live episode: from the episodes' states where the simulator reads them, else
    from their rendered prompts (keyed by session and step)."""
    if isinstance(simulator, StateSimulator):
        return simulator.act_on(live)
    return act_keyed(simulator, [r.messages() for r in live], [rollout_key(r) for r in live])


def executable_lines(prompt: str) -> list[str]:
    """The signatures listed under the prompt's executable actions, e.g. ``scroll_down {...}``."""
    listed = prompt.split(ACTIONS_HEADING, 1)[1].split("\n\n", 1)[0]
    return [line.removeprefix("- ") for line in listed.splitlines() if line.startswith("- ")]


def observation_text(prompt: str) -> str:
    return prompt.split("## Current observation\n", 1)[1].split(ACTIONS_HEADING, 1)[0]


class RandomSimulator:
    """Uniform over the executable actions of each prompt, then uniform over that action's arguments
    (a card in view, a review alias in view, a distance in the listed range); each prompt's draws
    come from a generator seeded by (seed, ``random``, its key)."""

    def __init__(self, seed: int = 42) -> None:
        self.seed = seed
        self.parameters = {"spec": "random", "seed": seed}

    def act(self, prompts: Sequence[Messages], keys: Sequence[Key] | None = None) -> list[str]:
        keyed = keys_or_positions(keys, len(prompts))
        return [
            self.answer(messages[-1]["content"], self.rng(key))
            for messages, key in zip(prompts, keyed, strict=True)
        ]

    def rng(self, key: Key) -> random.Random:
        return random.Random(derived_seed(self.seed, "random", *key))

    @staticmethod
    def answer(prompt: str, rng: random.Random) -> str:
        signature = rng.choice(executable_lines(prompt))
        kind = signature.split(" ", 1)[0]
        action: dict[str, object] = {"type": kind}
        seen = observation_text(prompt).splitlines()
        if kind == "click":
            cards = [m["item"] for m in map(CARD_LINE.match, seen) if m]
            action["target_item_id"] = rng.choice(cards)
        elif kind == "ipv_click_comment":
            aliases = [m["alias"] for m in map(REVIEW_LINE.match, seen) if m]
            action["target"] = rng.choice(aliases)
        elif found := DISTANCE_RANGE.search(signature):
            action["distance"] = rng.randint(1, int(found["top"]))
        return json.dumps({"rationale": "a random choice", "action": action})


class Sampling(BaseModel):
    """How a language-model simulator samples its answers (PROTOCOL.md §3 for evaluation)."""

    temperature: float = Field(1.0, ge=0.0, le=2.0, description="0 decodes greedily")
    top_p: float = Field(0.95, gt=0.0, le=1.0)
    max_new_tokens: int = Field(512, ge=1, description="tokens per answer at most")
    seed: int = 42


def random_from_spec(argument: str, sampling: Sampling | None = None) -> RandomSimulator:
    """``random:SEED``, or ``random`` with the evaluation's seed."""
    if not argument:
        return RandomSimulator(seed=(sampling or Sampling()).seed)
    if not argument.isdigit():
        raise ValueError(f"random:SEED takes a whole-number seed, not {argument!r}")
    return RandomSimulator(seed=int(argument))


def checkpoint_from_spec(argument: str, sampling: Sampling) -> Simulator:
    from evaluation.checkpoint_simulator import CheckpointSimulator  # torch is imported only when asked for

    return CheckpointSimulator.from_spec(argument, sampling)


def openai_from_spec(argument: str, sampling: Sampling) -> Simulator:
    from evaluation.openai_simulator import OpenAISimulator

    return OpenAISimulator.from_spec(argument, sampling)


def markov_from_lake(lake: Path, sampling: Sampling) -> Simulator:
    from evaluation.markov import MarkovSimulator

    return MarkovSimulator.fit(lake, seed=sampling.seed)


#: spec name -> builder taking the text after "name:" ("" when there is none)
SIMULATORS: dict[str, Callable[[str], Simulator]] = {
    "random": random_from_spec,
    "checkpoint": lambda argument: checkpoint_from_spec(argument, Sampling()),
    "openai": lambda argument: openai_from_spec(argument, Sampling()),
}
#: spec name -> builder taking the text after "name:" and the sampling to answer with (its seed the
#: one a simulator's draws derive from)
SAMPLED_SIMULATORS: dict[str, Callable[[str, Sampling], Simulator]] = {
    "random": random_from_spec,
    "checkpoint": checkpoint_from_spec,
    "openai": openai_from_spec,
}
#: spec name -> builder taking the lake under evaluation (a simulator fitted on its train split) and
#: the sampling (its seed the one the simulator's draws derive from)
LakeBuilder = Callable[[Path, Sampling], Simulator]
LAKE_SIMULATORS: dict[str, LakeBuilder] = {"markov": markov_from_lake}


def simulator_from_spec(spec: str) -> Simulator:
    """The simulator a spec string names: ``random`` or ``random:SEED`` (seed 42 by default),
    ``checkpoint:PATH``, ``openai:MODEL@BASE_URL``."""
    name, _, argument = spec.partition(":")
    if name not in SIMULATORS:
        raise ValueError(f"unknown simulator {spec!r}; known: {', '.join(sorted(SIMULATORS))}")
    return SIMULATORS[name](argument)


def simulator_for_lake(
    spec: str,
    lake: str | Path,
    sampling: Sampling | None = None,
    lake_builders: Mapping[str, LakeBuilder] | None = None,
) -> Simulator:
    """The simulator a spec names when evaluating ``lake``: those of LAKE_SIMULATORS (``markov``) and
    ``lake_builders`` (the caller's own, e.g. a synthetic world's shoppers) are built from it, the
    others answer with ``sampling`` where they sample, as :func:`simulator_from_spec` builds them
    otherwise; every one draws from ``sampling``'s seed unless its spec names its own."""
    name, _, argument = spec.partition(":")
    chosen = sampling or Sampling()
    builders = {**LAKE_SIMULATORS, **(lake_builders or {})}
    if spec in builders:
        return builders[spec](Path(lake), chosen)
    if name in SAMPLED_SIMULATORS:
        return SAMPLED_SIMULATORS[name](argument, chosen)
    if name not in SIMULATORS:
        known = ", ".join(sorted({*SIMULATORS, *builders}))
        raise ValueError(f"unknown simulator {spec!r}; known: {known}")
    return simulator_from_spec(spec)


def ask(
    simulator: Simulator, prompts: Sequence[Messages], keys: Sequence[Key] | None = None
) -> list[str | NoAnswer]:
    """One output per prompt (keyed by ``keys`` where given), asked in one call; a failing call (or one
    answering the wrong number of prompts) is a :class:`NoAnswer` for each, so the failure is
    recorded, never raised past them."""
    if keys is None:
        return _guarded(lambda: simulator.act(prompts), len(prompts))
    return _guarded(lambda: act_keyed(simulator, prompts, keys), len(prompts))


def ask_episodes(simulator: Simulator, live: Sequence[Rollout]) -> list[str | NoAnswer]:
    """``ask`` for live episodes: from their states where the simulator reads them, else their prompts."""
    return _guarded(lambda: answers(simulator, live), len(live))


def _guarded(call: Callable[[], Sequence[str | NoAnswer]], expected: int) -> list[str | NoAnswer]:
    try:
        outputs = list(call())
        if len(outputs) != expected:
            raise ValueError(f"{len(outputs)} responses for {expected} prompts")
    except Exception as error:  # the simulator's failure ends its episodes, not the evaluation
        return [NoAnswer(f"{type(error).__name__}: {error}")] * expected
    return outputs


def step_all(live: Sequence[Rollout], simulator: Simulator) -> int:
    """One round: one output for every live episode, asked in one call; returns the outputs asked.

    A failing call ends every episode of the round with ``error``; an output the simulator marks as
    :class:`NoAnswer` ends only its own episode so.
    """
    for rollout, output in zip(live, ask_episodes(simulator, live), strict=True):
        deliver(rollout, output)
    return len(live)


def deliver(rollout: Rollout, output: str | NoAnswer) -> None:
    """Hand one simulator output to its episode: judged and executed, or the episode ends with error."""
    if isinstance(output, NoAnswer):
        rollout.fail(output.error)
    else:
        rollout.submit(output)


def drive(rollouts: Sequence[Rollout], simulator: Simulator) -> None:
    """Step every rollout until it ends, asking ``simulator`` for all live sessions at once.

    A failing batch ends each of its episodes truncated with reason ``error``.
    """
    live = [r for r in rollouts if not r.done]
    while live:
        step_all(live, simulator)
        live = [r for r in live if not r.done]
