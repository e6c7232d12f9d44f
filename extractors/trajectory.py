"""What the extractors look at: one user's steps in time order, the items they saw, and the jobs.

A ``Timeline`` holds a user's steps (sessions ordered by start, steps within a
session) and knows, for every item, the first position at which it was on
screen. That is what "seen so far" and "not seen yet" mean for the checks.
Jobs are plain data: an intent per training trajectory (a session in single
mode, a user's chained history in cross mode), a rationale per recorded action.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from statistics import median

import polars as pl

from extractors.leakage import IndexEntry, LeakIndex

STEP_COLUMNS: tuple[str, ...] = (
    "session_id",
    "user_id",
    "step",
    "ts",
    "screen",
    "action",
    "target_item_id",
    "review_alias",
    "distance",
    "visible_items",
    "ipv_item_id",
    "profile",
)
ITEM_COLUMNS: tuple[str, ...] = (
    "item_id",
    "title",
    "price",
    "category",
    "category_l1",
    "category_l2",
    "category_l3",
)


@dataclass(frozen=True)
class Item:
    item_id: str
    title: str | None
    price: float | None
    category: str | None
    leaf: str  # the most specific category name, lower case ("dresses")


@dataclass(frozen=True)
class Step:
    session_id: str
    step: int
    screen: str
    action: str
    target_item_id: str | None
    review_alias: str | None
    distance: int | None
    visible_items: tuple[str, ...]
    ipv_item_id: str | None

    def shown(self) -> tuple[str, ...]:
        """Items on screen at this step (the detail page's item, the feed cards, the clicked card)."""
        extra = tuple(i for i in (self.ipv_item_id, self.target_item_id) if i)
        return self.visible_items + extra


@dataclass
class Timeline:
    user_id: str
    profile: dict[str, str | None]
    steps: list[Step]
    items: dict[str, Item]
    generic_terms: frozenset[str] = frozenset()

    @cached_property
    def position(self) -> dict[tuple[str, int], int]:
        return {(s.session_id, s.step): i for i, s in enumerate(self.steps)}

    @cached_property
    def first_seen(self) -> dict[str, int]:
        seen: dict[str, int] = {}
        for i, s in enumerate(self.steps):
            for item in s.shown():
                seen.setdefault(item, i)
        return seen

    @cached_property
    def index(self) -> LeakIndex:
        """Every item of the timeline, owned by its id (rationale checks decide seen vs future)."""
        return leak_index(self.items.values(), self.identifiers, self.generic_terms, owner=None)

    @property
    def identifiers(self) -> list[str]:
        return [self.user_id, *dict.fromkeys(s.session_id for s in self.steps)]

    def sessions(self) -> list[str]:
        return list(dict.fromkeys(s.session_id for s in self.steps))


def leak_index(
    items: Iterable[Item], identifiers: Iterable[str], generic: Iterable[str], owner: str | None
) -> LeakIndex:
    entries = [IndexEntry(owner or i.item_id, i.item_id, i.title, i.price) for i in items]
    return LeakIndex.build(entries, identifiers=identifiers, generic_terms=generic)


@dataclass(frozen=True)
class IntentJob:
    trajectory_id: str
    mode: str
    user_id: str
    session_ids: tuple[str, ...]
    bucket: int
    timeline: Timeline = field(compare=False, repr=False)

    @cached_property
    def steps(self) -> list[Step]:
        wanted = set(self.session_ids)
        return [s for s in self.timeline.steps if s.session_id in wanted]

    @cached_property
    def items(self) -> dict[str, Item]:
        shown = {i for s in self.steps for i in s.shown()}
        return {k: v for k, v in self.timeline.items.items() if k in shown}

    @cached_property
    def index(self) -> LeakIndex:
        """Only this trajectory's items, ids and prices: all of them count as seen."""
        ids = [self.user_id, *self.session_ids]
        return leak_index(self.items.values(), ids, self.timeline.generic_terms, owner="seen")


@dataclass(frozen=True)
class RationaleJob:
    record_id: str
    session_id: str
    user_id: str
    step: int
    split: str
    bucket: int
    action: str
    action_json: str
    context: str  # the record's rendered prompt: profile, history, window, observation
    timeline: Timeline = field(compare=False, repr=False)

    @property
    def position(self) -> int:
        return self.timeline.position[(self.session_id, self.step)]

    @property
    def current(self) -> Step:
        return self.timeline.steps[self.position]

    def is_future(self, item_id: str) -> bool:
        return self.timeline.first_seen.get(item_id, len(self.timeline.steps)) > self.position


# --- building from lake frames ---------------------------------------------------------------


def _leaf(row: dict) -> str:
    for key in ("category_l3", "category_l2", "category_l1"):
        if row.get(key):
            return str(row[key]).lower()
    return "items"


def items_by_id(items: pl.DataFrame) -> dict[str, Item]:
    return {
        r["item_id"]: Item(r["item_id"], r["title"], r["price"], r["category"], _leaf(r))
        for r in items.select(ITEM_COLUMNS).iter_rows(named=True)
    }


def generic_terms(items: pl.DataFrame) -> frozenset[str]:
    """Category names and parameter labels/values: vocabulary no single item owns."""
    cats = items.select(pl.concat_list("category_l1", "category_l2", "category_l3").alias("t")).explode("t")
    terms = set(cats["t"].drop_nulls().to_list())
    if "params" in items.columns:
        params = items.select(pl.col("params").explode().struct.unnest()).drop_nulls()
        terms |= set(params["label"].to_list()) | set(params["value"].to_list())
    return frozenset(terms)


def build_timelines(steps: pl.DataFrame, items: pl.DataFrame) -> dict[str, Timeline]:
    """One timeline per user: sessions in start order, steps in order within each."""
    catalog = items_by_id(items)
    generic = generic_terms(items)
    ordered = steps.with_columns(pl.col("ts").min().over("session_id").alias("_start")).sort(
        "user_id", "_start", "session_id", "step"
    )
    timelines: dict[str, Timeline] = {}
    for (user,), frame in ordered.partition_by("user_id", as_dict=True, maintain_order=True).items():
        rows = frame.select(STEP_COLUMNS).to_dicts()
        shown = {i for r in rows for i in _shown(r)}
        timelines[user] = Timeline(
            user_id=user,
            profile=rows[0]["profile"] or {},
            steps=[_step(r) for r in rows],
            items={i: catalog[i] for i in shown if i in catalog},
            generic_terms=generic,
        )
    return timelines


def _shown(row: dict) -> list[str]:
    return [*(row["visible_items"] or []), *(i for i in (row["ipv_item_id"], row["target_item_id"]) if i)]


def _step(row: dict) -> Step:
    return Step(
        session_id=row["session_id"],
        step=row["step"],
        screen=row["screen"],
        action=row["action"],
        target_item_id=row["target_item_id"],
        review_alias=row["review_alias"],
        distance=row["distance"],
        visible_items=tuple(row["visible_items"] or ()),
        ipv_item_id=row["ipv_item_id"],
    )


def median_price(items: Iterable[Item]) -> float | None:
    prices = [i.price for i in items if i.price is not None]
    return median(prices) if prices else None
