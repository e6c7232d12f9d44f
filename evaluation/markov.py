"""The ``markov`` baseline: a first-order action chain fitted on the lake's train split.

The next action is drawn given the screen and the previous action of the session (``start`` before
the first), from the train split's counts, restricted to the actions executable in the shown state
(uniform over them where the counts give none mass). A click picks its card by category affinity:
each card in view weighs one plus the number of the shopper's recent clicks in its top category
(the titles of the prompt's recent clicks, read as categories through the lake's catalog and
history). A scroll's distance is drawn from the real distances of that action, clipped to the range
the prompt lists. It reads only what a simulator is shown, the prompt. Each prompt's draws come from
a generator seeded by (seed, ``markov``, the prompt's key), whatever else is asked with it.
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from evaluation.metrics import top_category
from evaluation.simulators import (
    CARD_LINE,
    DISTANCE_RANGE,
    REVIEW_LINE,
    Key,
    Messages,
    derived_seed,
    executable_lines,
    keys_or_positions,
    observation_text,
)
from transforms.lake import read_lake_table, table_files
from transforms.prompts import clean

START = "start"  # the previous action of a session's first step
SCROLLS = ("scroll_down", "scroll_up", "ipv_scroll_down", "ipv_scroll_up")
PAST_ACTION = re.compile(r'\| action: \{"type":\s*"(?P<type>[a-z_]+)"')
SECTION = re.compile(r"^## (?P<name>.+)$", re.MULTILINE)


def transition_counts(steps: pl.DataFrame) -> pl.DataFrame:
    """(screen, previous, action, count) over the steps' sessions, ``start`` before a first step."""
    return (
        steps.sort("session_id", "step")
        .with_columns(pl.col("action").shift(1).over("session_id").fill_null(START).alias("previous"))
        .group_by("screen", "previous", "action")
        .len("count")
    )


def scroll_distances(steps: pl.DataFrame) -> pl.DataFrame:
    """(action, distance): every positive recorded scroll distance."""
    return steps.filter(pl.col("action").is_in(SCROLLS) & (pl.col("distance") > 0)).select(
        "action", "distance"
    )


def title_categories(lake: Path) -> pl.DataFrame:
    """(title, top): the top category of every title the catalog or the history names."""
    named = [read_lake_table(lake, "items", ["title", "category"])]
    if table_files(lake, "history"):
        named.append(read_lake_table(lake, "history", ["title", "category"]))
    return (
        pl.concat(named)
        .drop_nulls()
        .select(
            pl.col("title").str.replace_all(r"[\r\n\t]", " "),  # as the prompt shows it (clean)
            top_category(pl.col("category")).alias("top"),
        )
        .unique("title", keep="first", maintain_order=True)
    )


def sections(prompt: str) -> dict[str, str]:
    """The prompt's ``## Heading`` sections by heading (its first line)."""
    marks = list(SECTION.finditer(prompt))
    ends = [m.start() for m in marks[1:]] + [len(prompt)]
    return {m["name"]: prompt[m.end() : end].strip("\n") for m, end in zip(marks, ends, strict=True)}


@dataclass(frozen=True)
class Shown:
    """What the markov chain reads from a prompt."""

    screen: str
    previous: str
    executable: dict[str, str]  # action -> its listed signature
    cards: list[tuple[str, str]]  # (item id, top category) in view
    aliases: list[str]
    recent_titles: list[str]


def read_prompt(prompt: str) -> Shown:
    parts = sections(prompt)
    history = next((body for name, body in parts.items() if name.startswith("Interaction history")), "")
    past = PAST_ACTION.findall(history)
    seen = observation_text(prompt).splitlines()
    cards = [(m["item"], m["category"]) for m in map(CARD_LINE.match, seen) if m]
    recent = parts.get("Recent clicks (newest first)", "").splitlines()
    return Shown(
        screen="feed" if "Screen: feed" in seen else "ipv",
        previous=past[-1] if past else START,
        executable={line.split(" ", 1)[0]: line for line in executable_lines(prompt)},
        cards=cards,
        aliases=[m["alias"] for m in map(REVIEW_LINE.match, seen) if m],
        recent_titles=[line.removeprefix("- ") for line in recent if line.startswith("- ")],
    )


class MarkovSimulator:
    """Action given (screen, previous action) from the train split; clicks by category affinity."""

    def __init__(
        self,
        transitions: pl.DataFrame,
        distances: pl.DataFrame,
        categories: pl.DataFrame,
        seed: int = 42,
    ) -> None:
        self.seed = seed
        self.parameters = {"seed": seed}
        self.next_counts: dict[tuple[str, str], dict[str, int]] = {}
        for screen, previous, action, count in transitions.iter_rows():
            self.next_counts.setdefault((screen, previous), {})[action] = count
        self.distances = {
            action: group["distance"].to_list()
            for (action,), group in distances.partition_by("action", as_dict=True).items()
        }
        self.category_of = dict(categories.iter_rows())

    @classmethod
    def fit(cls, lake: str | Path, split: str = "train", seed: int = 42) -> MarkovSimulator:
        """Fitted on the steps of ``split`` (the train split by default) of ``lake``."""
        lake = Path(lake)
        columns = ["session_id", "step", "screen", "action", "distance", "split"]
        steps = read_lake_table(lake, "steps", columns)
        steps = steps.filter(pl.col("split") == split)
        if steps.height == 0:
            raise ValueError(f"markov: the lake {lake} has no steps in its {split!r} split to fit on")
        return cls(transition_counts(steps), scroll_distances(steps), title_categories(lake), seed)

    def act(self, prompts: Sequence[Messages], keys: Sequence[Key] | None = None) -> list[str]:
        keyed = keys_or_positions(keys, len(prompts))
        return [
            self.answer(read_prompt(messages[-1]["content"]), self.rng(key))
            for messages, key in zip(prompts, keyed, strict=True)
        ]

    def rng(self, key: Key) -> random.Random:
        return random.Random(derived_seed(self.seed, "markov", *key))

    def answer(self, shown: Shown, rng: random.Random) -> str:
        kind = self.next_action(shown, rng)
        action: dict[str, Any] = {"type": kind}
        if kind == "click":
            action["target_item_id"] = self.card(shown, rng)
        elif kind == "ipv_click_comment":
            action["target"] = rng.choice(shown.aliases)
        elif found := DISTANCE_RANGE.search(shown.executable[kind]):
            action["distance"] = self.distance(kind, int(found["top"]), rng)
        return json.dumps({"rationale": "the usual next step", "action": action})

    def next_action(self, shown: Shown, rng: random.Random) -> str:
        counts = self.next_counts.get((shown.screen, shown.previous), {})
        options = list(shown.executable)
        weights = [counts.get(name, 0) for name in options]
        if not any(weights):
            return rng.choice(options)
        return rng.choices(options, weights)[0]

    def card(self, shown: Shown, rng: random.Random) -> str:
        affinity = Counter(self.category_of.get(clean(title)) for title in shown.recent_titles)
        weights = [1 + affinity[category] for _, category in shown.cards]
        return rng.choices([item for item, _ in shown.cards], weights)[0]

    def distance(self, action: str, top: int, rng: random.Random) -> int:
        observed = self.distances.get(action)
        drawn = rng.choice(observed) if observed else rng.randint(1, top)
        return max(1, min(top, int(drawn)))
