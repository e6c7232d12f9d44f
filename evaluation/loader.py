"""Sessions for the environment, read from the lake's ``sessions``, ``feed_layouts``, ``items`` and ``steps``.

Each session gets only its own layout rows, the catalog rows of the items it may
show or open, and its recorded steps. Its profile is the snapshot on its first
step; from ``history`` (events strictly before the session starts) come the recent
click and purchase titles as the single-mode training prompts show them, newest
first, and the prior counts and recent click categories the cohort metrics use.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import polars as pl

from evaluation.environment import EnvironmentSettings
from evaluation.session import Session
from transforms.lake import scan_table, table_files
from transforms.prompts import PromptSettings

STEP_COLUMNS = (
    "session_id",
    "profile",
    "profile_extra",
    "step",
    "screen",
    "action",
    "target_item_id",
    "target_title",
    "review_alias",
    "distance",
    "scroll_top",
    "visible_items",
    "visible_source",
    "ipv_item_id",
    "ipv_scroll",
    "ui_state",
)


def _sessions(lake: str | Path, session_ids: Sequence[str] | None, split: str | None) -> pl.DataFrame:
    frame = scan_table(lake, "sessions")
    if session_ids is not None:
        frame = frame.filter(pl.col("session_id").is_in(list(session_ids)))
    if split is not None:
        frame = frame.filter(pl.col("split") == split)
    return frame.collect()


def session_items(layout: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """(session_id, item_id): every item a session's feed shows or its record names."""
    named = [
        layout.select("session_id", "item_id"),
        steps.select("session_id", pl.col("target_item_id").alias("item_id")),
        steps.select("session_id", pl.col("ipv_item_id").alias("item_id")),
        steps.select("session_id", pl.col("visible_items").alias("item_id")).explode("item_id"),
    ]
    return pl.concat(named).drop_nulls().unique()


def prior_history(history: pl.LazyFrame, sessions: pl.DataFrame, prompt: PromptSettings) -> pl.DataFrame:
    """Per session, from the user's history strictly before it started: the recent click and purchase
    titles the prompt shows (newest first), the recent clicks' categories, and the prior counts."""
    starts = sessions.lazy().select("session_id", "user_id", "start_ts")
    click, buy = pl.col("kind") == "click", pl.col("kind") == "buy"
    return (
        starts.join(history, on="user_id")
        .filter(pl.col("ts") < pl.col("start_ts"))
        .sort("ts", "title", descending=True, nulls_last=True)
        .group_by("session_id")
        .agg(
            pl.col("title").filter(click).head(prompt.recent_clicks).alias("recent_clicks"),
            pl.col("title").filter(buy).head(prompt.recent_buys).alias("recent_buys"),
            pl.col("category").filter(click).head(prompt.recent_clicks).alias("recent_click_categories"),
            click.sum().alias("prior_clicks"),
            buy.sum().alias("prior_buys"),
        )
        .collect()
    )


def session_profiles(lake: str | Path, sessions: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """(session_id, profile, profile_extra): the snapshot on the session's first step, as its
    training prompts show it; the user's ``profiles`` row for a session without steps."""
    snapshot = steps.sort("step").group_by("session_id").agg(pl.col("profile", "profile_extra").first())
    users = scan_table(lake, "profiles", ["user_id", "profile", "profile_extra"]).collect()
    fallback = sessions.select("session_id", "user_id").join(users, on="user_id", how="left")
    return fallback.join(snapshot, on="session_id", how="left", suffix="_step").select(
        "session_id",
        pl.coalesce("profile_step", "profile").alias("profile"),
        pl.coalesce("profile_extra_step", "profile_extra").alias("profile_extra"),
    )


def _with_context(
    lake: str | Path, sessions: pl.DataFrame, steps: pl.DataFrame, settings: EnvironmentSettings
) -> pl.DataFrame:
    out = sessions.join(session_profiles(lake, sessions, steps), on="session_id", how="left")
    if not table_files(lake, "history"):
        return out
    prior = prior_history(scan_table(lake, "history"), sessions, settings.prompt)
    return out.join(prior, on="session_id", how="left")


def with_rationales(lake: str | Path, steps: pl.DataFrame) -> pl.DataFrame:
    """``steps`` with the lake's extracted rationale of each action (null where there is none): the
    records show a past step's rationale in the history window, and so does replay."""
    if not table_files(lake, "rationales"):
        return steps.with_columns(pl.lit(None, dtype=pl.String).alias("rationale"))
    rationales = scan_table(lake, "rationales", ["session_id", "step", "rationale"]).collect()
    keyed = rationales.with_columns(pl.col("step").cast(steps.schema["step"])).unique(["session_id", "step"])
    return steps.join(keyed, on=["session_id", "step"], how="left")


def load_sessions(
    lake: str | Path,
    session_ids: Sequence[str] | None = None,
    *,
    split: str | None = None,
    settings: EnvironmentSettings | None = None,
) -> list[Session]:
    """The environment's view of the chosen sessions (all of them by default), in session order."""
    s = settings or EnvironmentSettings()
    sessions = _sessions(lake, session_ids, split).sort("session_id")
    ids = sessions.select("session_id").lazy()
    layout = scan_table(lake, "feed_layouts").join(ids, on="session_id", how="semi").collect()
    steps = scan_table(lake, "steps", list(STEP_COLUMNS)).join(ids, on="session_id", how="semi").collect()
    steps = with_rationales(lake, steps)
    wanted = session_items(layout, steps)
    items = scan_table(lake, "items").join(wanted.lazy().select("item_id").unique(), on="item_id", how="semi")
    per_session_items = wanted.join(items.collect(), on="item_id")
    rows = _with_context(lake, sessions, steps, s)
    layouts = layout.partition_by("session_id", as_dict=True)
    recorded = steps.partition_by("session_id", as_dict=True)
    catalog = per_session_items.partition_by("session_id", as_dict=True)
    empty_layout, empty_items = layout.clear(), per_session_items.clear()
    out = []
    for row in rows.iter_rows(named=True):
        key = (row["session_id"],)
        out.append(
            Session.from_frames(
                row,
                layouts.get(key, empty_layout),
                catalog.get(key, empty_items),
                recorded.get(key),
                default_card_height=s.default_card_height,
            )
        )
    return out
