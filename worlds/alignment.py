"""SalesSim-style decision alignment (seed 004) of each source's traces, on a lake generated from a world.

A session with a purchase is aligned when every bought item is acceptable to its shopper; a session
without one is aligned when nothing acceptable was shown (``evaluation.supplementary.decision_alignment``).
Only the world knows what is acceptable: its shoppers accept an item when, opening its page afresh,
their own page policy weighs taking it (cart or buy) at least as much as leaving it
(``synthetic.behaviour.accepts_on_visit``, via ``WorldSimulator.acceptable``).

What a session *showed* is its feed: the slate the ranking policy served for the page view, SalesSim's
set of recommended products. It is the same for every source of the session, so the figure judges the
purchase decision alone and not how far a simulator browsed: a simulator that leaves at once would
otherwise be credited with declining every card it never scrolled to. A lake of real logs has no ground
truth, so there the figures are absent and the report gives the reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import polars as pl

from evaluation.metrics import Side
from evaluation.scorecard import rounded
from evaluation.supplementary import decision_alignment
from evaluation.traces import load_traces
from transforms.lake import read_lake_table
from worlds.shoppers import NoWorldError, WorldSimulator, world_from_lake

ACCEPTABLE = (
    "an item is acceptable to a shopper who, opening its page afresh, weighs taking it (cart or buy) at "
    "least as much as leaving it (back_home) under the world's own page policy"
)
SHOWN = "the cards of the session's feed, the slate its ranking policy served"


def feed_slates(lake: str | Path) -> pl.DataFrame:
    """(session_id, item_id) of every card of every session's feed in the lake."""
    return read_lake_table(lake, "feed_layouts", ["session_id", "item_id"]).unique(maintain_order=True)


def acceptable_shown(world: WorldSimulator, slates: pl.DataFrame, session_ids: pl.Series) -> pl.DataFrame:
    """(session_id, item_id) of the cards on the feeds of ``session_ids`` that their shoppers accept."""
    wanted = slates.join(session_ids.to_frame("session_id").unique(), on="session_id", how="semi")
    return world.acceptable(wanted)


def source_alignment(world: WorldSimulator, slates: pl.DataFrame, path: str | Path) -> dict[str, float | int]:
    """Decision alignment of one rollout trace file against the world's shoppers."""
    side = Side.of(load_traces(path))
    return decision_alignment(side, acceptable_shown(world, slates, side.sessions["session_id"]))


def alignment_report(
    lake: str | Path, real: str | Path, simulators: Mapping[str, str | Path]
) -> dict[str, Any]:
    """Decision alignment of the real rollout traces and of each simulator's (spec -> trace file).

    ``reference`` says what acceptable and shown mean and holds the real sessions' figures (the world's
    own shoppers: the reference row), or for a lake without a world only why there are none;
    ``simulators`` holds each spec's figures under their name, to join its other figures (none without
    a world)."""
    try:
        world = world_from_lake(lake)
    except NoWorldError as err:
        return {"reference": {"unavailable": str(err)}, "simulators": {}}
    slates = feed_slates(lake)
    figures = lambda path: rounded(source_alignment(world, slates, path))  # noqa: E731
    return {
        "reference": {"acceptable": ACCEPTABLE, "shown": SHOWN, "real": figures(real)},
        "simulators": {spec: {"decision_alignment": figures(path)} for spec, path in simulators.items()},
    }
