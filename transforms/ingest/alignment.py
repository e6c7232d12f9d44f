"""Pass 2, pure: every check and the step alignment of one part's page views. No threads, no files;
ids stay raw (``keying.key_part`` keys them)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import polars as pl

from transforms import align
from transforms.config import IngestSettings
from transforms.ingest.hashes import ID_SEED, id_hash
from transforms.ingest.item_shards import ItemShards, PartNames
from transforms.rekey import Pseudonymizer

if TYPE_CHECKING:
    from transforms.ingest.duplicate_ids import Settled
    from transforms.ingest.item_index import ItemIndex


HISTORY_KINDS = ("click", "buy")
USER_HASH = "_uh"  # the run-wide user tables' sort key (``by_user_hash``)
# what an event names of the catalog: the item it acts on (whose id, title and review count the
# checks and steps read), and the logged cards in view (found and keyed, as feed cards are)
ACTED_ON, LOGGED_IN_VIEW = ("item_id",), ("visible_items",)
NAMING_COLUMNS = (*ACTED_ON, *LOGGED_IN_VIEW)


@dataclass
class Context:
    """Run-wide inputs of every part."""

    settings: IngestSettings
    item_index: ItemIndex | ItemShards  # shards: a part takes its own items (``for_part``)
    profiles: pl.DataFrame  # align.profile_context (``by_user_hash``; a part's: its users' only)
    users: pl.DataFrame  # user_id (raw) -> _user (pseudonym), split, bucket (as ``profiles``)
    max_ts: pl.Expr
    events: Settled  # duplicate event ids, settled over all parts
    source_cuts: pl.DataFrame  # page_view_id, cut_reason: sessions the reader already cut (UserArena)


@dataclass
class Part:
    """One part's lake rows (ids still raw), quarantine rows and merged feed duplicates."""

    steps: pl.DataFrame
    layout: pl.DataFrame
    sessions: pl.DataFrame
    rejects: list[pl.DataFrame]
    flags: list[pl.DataFrame]
    no_profile: pl.DataFrame  # first step of each user without a profile
    feed_duplicates: int
    dropped_events: int  # align.drop_declared


def by_user_hash(frame: pl.DataFrame) -> pl.DataFrame:
    """A run-wide table with one row per raw ``user_id``, sorted by a hash of the id (``_uh``):
    ``for_part`` takes a part's users from it by binary search rather than joining the part to
    every shopper of the run, so a part's cost follows the part, not the run."""
    return frame.with_columns(id_hash("user_id").alias(USER_HASH)).sort(USER_HASH)


def _rows_of_users(table: pl.DataFrame, user_ids: pl.Series) -> pl.DataFrame:
    """The rows of ``table`` (``by_user_hash``) whose hash one of ``user_ids`` has: those users'
    rows (and, rarely, another user's sharing a hash, which the joins on ``user_id`` pass over)."""
    probes = user_ids.drop_nulls().hash(ID_SEED).unique().sort()
    hashes = table[USER_HASH]
    first, past = hashes.search_sorted(probes, side="left"), hashes.search_sorted(probes, side="right")
    rows = pl.select(pl.int_ranges(first, past)).to_series().explode().drop_nulls()
    return table.gather(rows).drop(USER_HASH)


def part_names(events: pl.DataFrame, feed_items: pl.Series) -> PartNames:
    """What a part's events and feed cards (their ``item_id``) name of the catalog: every item id a
    part looks up is among them."""
    shown = (feed_items, *(events[c] for c in LOGGED_IN_VIEW if c in events.columns))
    return PartNames(shown, tuple(events[c] for c in ACTED_ON if c in events.columns))


def for_part(
    ctx: Context, events: pl.DataFrame, feeds: pl.DataFrame, item_index: ItemIndex | None = None
) -> Context:
    """``ctx`` for one part's rows: the users and profiles of its events' users, and where the item
    index lies in shards, the index of the items those rows name (``item_index``: that index, made
    ahead)."""
    users = events["user_id"]
    part = replace(ctx, users=_rows_of_users(ctx.users, users), profiles=_rows_of_users(ctx.profiles, users))
    if item_index is not None:
        return replace(part, item_index=item_index)
    if not isinstance(ctx.item_index, ItemShards):
        return part
    return replace(part, item_index=ctx.item_index.index_for(part_names(events, feeds["item_id"])))


def _sessionless_feeds(
    layout: pl.DataFrame, steps_views: pl.Series, pseudonymize: Pseudonymizer
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Feed rows of page views that kept no action at all leave as session_without_actions."""
    return align.split_by_reason(
        layout,
        pl.when(~pl.col("page_view_id").is_in(steps_views.implode())).then(pl.lit("session_without_actions")),
        "feeds",
        pl.lit("no action of this page view survived ingest"),
        pseudonymize,
    )


def _first_step_without_profile(steps: pl.DataFrame) -> pl.DataFrame:
    """Per user without a profile, the first step in (page view, step) order: the flag's locator."""
    return (
        steps.filter(pl.col("profile_missing"))
        .sort("page_view_id", "step")
        .group_by("user_id", maintain_order=True)
        .first()
        .select("user_id", "page_view_id", "_file", "_row")
    )


def align_part(
    events: pl.DataFrame,
    feeds: pl.DataFrame,
    ctx: Context,
    pseudonymize: Pseudonymizer,
    rejected_events: pl.DataFrame | None = None,
) -> Part:
    """Every check and the step alignment of one part's page views; ids stay raw (``key_part``).
    ``rejected_events``: the part's ``readers.rejected_event_marks`` (quarantined by the reader; here
    they only cut their sessions, in the row checks).

    A rejected event cuts its session (``align.cut_sessions``), in two places: after the row checks
    (before ordering, in session order) and after the screen checks (which run on what the row cut
    kept, so their cut lies inside the earlier one's prefix and is the one that holds). A scroll
    whose distance is not logged takes it from the next kept event, so the last step before a row
    cut may itself be rejected (``missing_scroll_distance``) and move the cut one step earlier."""
    index, settings = ctx.item_index, ctx.settings
    known = pl.col("_item").is_not_null()
    feeds = feeds.with_columns(index.rows_of(feeds["item_id"]).alias("_item"))
    cards = align.check_feeds(feeds, known, settings.geometry, pseudonymize)
    events, dropped = align.drop_declared(ctx.events.apply(align.map_actions(events, settings.action_map)))
    marks = None if rejected_events is None else align.map_actions(rejected_events, settings.action_map)
    events = events.with_columns(index.rows_of(events["item_id"]).alias("_item"))
    checked = align.row_checks(
        events,
        in_catalog=known,
        feed_views=cards.rows["page_view_id"].unique(),
        max_ts=ctx.max_ts,
        pseudonymize=pseudonymize,
        on_bad_event=settings.on_bad_event,
        reader_rejected=marks,
    )
    ordered, order_flags = align.order_events(checked.rows, pseudonymize)
    ordered, after_end = align.drop_after_end(ordered, pseudonymize)
    layout = align.layouts(cards.rows)
    items = index.context
    screens = align.screen_checks(
        ordered, layout, items, settings.geometry, pseudonymize, on_bad_event=settings.on_bad_event
    )
    steps = align.build_steps(screens.rows, items, ctx.profiles)
    layout, orphans = _sessionless_feeds(layout, steps["page_view_id"].unique(), pseudonymize)
    layout = layout.rename({"page_view_id": "session_id"})
    cuts = align.session_cuts([ctx.source_cuts, *checked.cuts, *screens.cuts])
    return Part(
        steps=steps,
        layout=layout,
        sessions=align.build_sessions(steps, layout, items, cuts),
        rejects=[*checked.rejects, after_end, *screens.rejects, *cards.rejects, orphans],
        flags=[order_flags, *cards.flags],
        no_profile=_first_step_without_profile(steps),
        feed_duplicates=cards.duplicates,
        dropped_events=dropped,
    )


def checked_history(history: pl.DataFrame, pseudonymize: Pseudonymizer) -> align.CheckedRows:
    rows, bad = align.split_by_reason(
        history,
        pl.when(~pl.col("kind").is_in(HISTORY_KINDS)).then(pl.lit("unknown_history_kind")),
        "history",
        pl.lit("history kind must be click or buy"),
        pseudonymize,
    )
    return align.CheckedRows(rows, [bad])
