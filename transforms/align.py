"""Step alignment: raw events, feeds, catalog and profiles become lake tables.

Pure functions over Polars frames. Every check is a step that splits a frame
into rows that go on and rows that leave with a reason code; checks that
depend on the sequence (what is on screen, which detail page is open) run
after the row-level ones, on the rows that survived them.

Ordering: events of a page view are ordered by ``ts``, ties broken by source
order (part file name, then row). A tie is flagged ``duplicate_timestamp`` and
an event whose ``ts`` is earlier than one before it in the source is flagged
``out_of_order_timestamp``; both are kept (re-ordered by time), the flags are
quarantine rows with ``kept = true``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from transforms.config import Geometry
from transforms.readers import Pseudonymize, empty_rejects, reject_rows
from transforms.schemas import ACTION_GROUPS, ACTIONS, FEED_ACTIONS, IPV_ACTIONS, PROFILE_FIELDS, SCREENS

CARD_KEY_SPAN = 1 << 40  # page-view stride in the global sorted card-midpoint key
FIRST_SCREEN_CARDS = 10  # a session without clicks takes the top category of its first cards


@dataclass
class Checked:
    """Rows that passed, rows quarantined, and exact duplicates merged."""

    rows: pl.DataFrame
    rejects: list[pl.DataFrame] = field(default_factory=list)
    duplicates: int = 0
    flags: list[pl.DataFrame] = field(default_factory=list)


def split_by_reason(
    frame: pl.DataFrame,
    reason: pl.Expr,
    table: str,
    detail: pl.Expr | None = None,
    pseudonymize: Pseudonymize | None = None,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Rows where ``reason`` is null go on; the others become quarantine rows."""
    detail = detail if detail is not None else pl.lit(None, dtype=pl.String)
    reasons = frame.select(reason.alias("_reason")).to_series()
    if reasons.null_count() == frame.height:
        return frame, empty_rejects()  # the common case: every row goes on, nothing to copy
    tagged = frame.with_columns(reasons, detail.alias("_detail"))
    bad = tagged.filter(pl.col("_reason").is_not_null())
    good = tagged.filter(pl.col("_reason").is_null()).drop("_reason", "_detail")
    data = bad.drop([c for c in bad.columns if c.startswith("_") and c not in ("_file", "_row")])
    return good, reject_rows(table, data, bad["_reason"], bad["_detail"], pseudonymize)


def dedupe(
    frame: pl.DataFrame, keys: list[str], table: str, reason: str, pseudonymize: Pseudonymize | None = None
) -> Checked:
    """Merge exact duplicate rows (counted); later rows that reuse a key with other values are rejected."""
    # hashes first: equal keys hash equal, so no duplicate hash means no duplicate key
    if frame.select(pl.struct(keys).hash(seed=0).n_unique()).item() == frame.height:
        return Checked(frame)  # the common case: every key once, nothing to merge or reject
    data = [c for c in frame.columns if not c.startswith("_")]
    ordered = frame.sort("_file", "_row")
    exact = ordered.unique(subset=data, keep="first", maintain_order=True)
    first = pl.int_range(pl.len()).over(keys) == 0
    kept, rejects = split_by_reason(
        exact,
        pl.when(~first).then(pl.lit(reason)),
        table,
        pl.lit(f"another row has the same {', '.join(keys)} with different values"),
        pseudonymize,
    )
    return Checked(kept, [rejects], frame.height - exact.height)


# --- catalog, profiles, feeds ------------------------------------------------


def check_prices(items: pl.DataFrame, pseudonymize: Pseudonymize) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Prices are checked row by row, so items go chunk by chunk once duplicate ids are settled
    (``dedupe`` on ``item_id`` first: a duplicate's price is never looked at)."""
    price = pl.col("price")
    return split_by_reason(
        items,
        pl.when(price.is_nan() | price.is_infinite() | (price <= 0)).then(pl.lit("invalid_price")),
        "items",
        pl.lit("price must be a finite number > 0"),
        pseudonymize,
    )


def item_context(items: pl.DataFrame) -> pl.DataFrame:
    """What the event checks and outputs need of an item: title, top category, review count
    (``build_items``' first level where it ran)."""
    known = "category_l1" in items.columns
    top = items["category_l1"] if known else category_levels(items["category"])["category_l1"]
    context = items.select("item_id", "title", pl.col("reviews").list.len().alias("review_count"))
    return context.insert_column(2, top.alias("top_category"))


def check_profiles(profiles: pl.DataFrame, pseudonymize: Pseudonymize) -> Checked:
    return dedupe(profiles, ["user_id"], "profiles", "duplicate_profile", pseudonymize)


def check_feeds(feeds: pl.DataFrame, in_catalog: pl.Expr, pseudonymize: Pseudonymize) -> Checked:
    """``in_catalog``: true where the card's item passed the catalog checks."""
    checked = dedupe(feeds, ["page_view_id", "item_id"], "feeds", "duplicate_feed_card", pseudonymize)
    reason = (
        pl.when(~in_catalog)
        .then(pl.lit("item_not_in_catalog"))
        .when(
            (pl.col("width") <= 0)
            | (pl.col("height") <= 0)
            | (pl.col("x") < 0)
            | (pl.col("y") < 0)
            | (pl.col("feed_height") < pl.col("y") + pl.col("height"))
        )
        .then(pl.lit("invalid_geometry"))
    )
    rows, bad = split_by_reason(checked.rows, reason, "feeds", None, pseudonymize)
    checked.rows, checked.rejects = rows, [*checked.rejects, bad]
    return checked


def layouts(feeds: pl.DataFrame) -> pl.DataFrame:
    """Card geometry per page view; rank is reading order (top to bottom, left to right).

    Rows come grouped by page view, with ``_pv`` a dense page-view number (integer keys for the
    per-view windows and joins that follow). Feeds logged grouped by view in reading order (the
    usual case) are taken as they come instead of being sorted.
    """
    if not _in_reading_order(feeds):
        feeds = feeds.sort("page_view_id", "y", "x")
    return feeds.with_columns(pl.col("page_view_id").rle_id().alias("_pv")).with_columns(
        pl.int_range(pl.len(), dtype=pl.Int32).over("_pv").alias("rank"),
        pl.col("feed_height").max().over("_pv").alias("feed_height"),
    )


def _in_reading_order(feeds: pl.DataFrame) -> bool:
    """Each page view's cards contiguous and ordered by (y, x)."""
    y, x, view = pl.col("y"), pl.col("x"), pl.col("page_view_id")
    new_view = view != view.shift(1)
    ordered = new_view | (y > y.shift(1)) | ((y == y.shift(1)) & (x >= x.shift(1)))
    runs, views, in_order = feeds.select(
        new_view.fill_null(True).sum().alias("runs"),
        view.n_unique().alias("views"),
        ordered.fill_null(True).all().alias("in_order"),
    ).row(0)
    return runs == views and in_order


# --- events: row-level checks --------------------------------------------------


def map_actions(events: pl.DataFrame, action_map: dict[str, str]) -> pl.DataFrame:
    """Platform action names -> the 13 actions (before duplicate ids are compared)."""
    return events.with_columns(pl.col("action").replace(action_map)) if action_map else events


def dedupe_events(events: pl.DataFrame, pseudonymize: Pseudonymize) -> Checked:
    return dedupe(events, ["event_id"], "events", "duplicate_event_id", pseudonymize)


def row_checks(
    events: pl.DataFrame,
    *,
    in_catalog: pl.Expr,
    feed_views: pl.Series,
    max_ts: pl.Expr,
    pseudonymize: Pseudonymize,
) -> Checked:
    """Checks that need one row (plus keys): vocabulary, screen, ids, timestamps, ownership.

    ``events`` have their actions mapped and duplicate ids settled (``map_actions``, ``dedupe_events``);
    ``in_catalog`` is true where ``item_id`` passed the catalog checks.
    """
    checked = Checked(events)
    action, screen = pl.col("action"), pl.col("screen")
    needs_item = action.eq("click") | screen.eq("ipv")
    owner = pl.col("user_id").sort_by("ts", "_file", "_row").first().over("page_view_id")
    reason = (
        pl.when(~action.is_in(ACTIONS))
        .then(pl.lit("unknown_action"))
        .when(~screen.is_in(SCREENS))
        .then(pl.lit("unknown_screen"))
        .when(
            (screen.eq("feed") & ~action.is_in(FEED_ACTIONS))
            | (screen.eq("ipv") & ~action.is_in(IPV_ACTIONS))
        )
        .then(pl.lit("illegal_action_on_screen"))
        .when(pl.col("ts") > max_ts)
        .then(pl.lit("future_timestamp"))
        .when((pl.col("scroll_top") < 0) | (pl.col("ipv_scroll") < 0))
        .then(pl.lit("negative_offset"))
        .when(pl.col("user_id") != owner)
        .then(pl.lit("page_view_user_conflict"))
        .when(needs_item & pl.col("item_id").is_not_null() & ~in_catalog)
        .then(pl.lit("item_not_in_catalog"))
        .when(action.eq("click") & pl.col("item_id").is_null())
        .then(pl.lit("missing_click_target"))
        .when(~pl.col("page_view_id").is_in(feed_views.implode()))
        .then(pl.lit("missing_feed_layout"))
        .when(screen.eq("feed") & pl.col("scroll_top").is_null())
        .then(pl.lit("missing_required_field"))
    )
    detail = (
        pl.when(~action.is_in(ACTIONS))
        .then(pl.concat_str(pl.lit("action not in the 13-action vocabulary: "), action.str.slice(0, 40)))
        .when(screen.eq("feed") & pl.col("scroll_top").is_null() & action.is_in(ACTIONS))
        .then(pl.lit("required field is null: scroll_top (feed events)"))
    )
    rows, bad = split_by_reason(checked.rows, reason, "events", detail, pseudonymize)
    checked.rows, checked.rejects = rows, [*checked.rejects, bad]
    return checked


def order_events(events: pl.DataFrame, pseudonymize: Pseudonymize) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Sort each page view by (ts, source order); flag ties and out-of-order rows (kept)."""
    source = events if _in_source_order(events) else events.sort("_file", "_row")
    ordered = source.with_columns(pl.int_range(pl.len(), dtype=pl.Int64).alias("_source_order")).sort(
        "page_view_id", "ts", "_source_order"
    )
    # late: an event that came before it in the source has a later ts, i.e. sorts after it; the
    # view's number above the source order keeps the suffix minimum inside the view
    order = pl.col("page_view_id").rle_id().cast(pl.Int64) * (1 << 32) + pl.col("_source_order")
    ordered = ordered.with_columns(
        (order.cum_min(reverse=True).shift(-1) < order).fill_null(False).alias("_late"),
        (pl.col("ts") == _in_view(pl.col("ts"), 1)).fill_null(False).alias("_tie"),
    )
    flag = (
        pl.when(pl.col("_late"))
        .then(pl.lit("out_of_order_timestamp"))
        .when(pl.col("_tie"))
        .then(pl.lit("duplicate_timestamp"))
    )
    flagged = ordered.filter(flag.is_not_null())
    flags = (
        reject_rows(
            "events",
            flagged.drop("_late", "_tie", "_source_order"),
            flagged.select(flag).to_series(),
            flagged.select(
                pl.when(pl.col("_late"))
                .then(pl.lit("kept, re-ordered by ts (ties by source order)"))
                .otherwise(pl.lit("kept, tie broken by source order"))
            ).to_series(),
            pseudonymize,
        )
        if flagged.height
        else empty_rejects()
    )
    return ordered.drop("_late", "_tie", "_source_order"), flags


def _in_source_order(frame: pl.DataFrame) -> bool:
    """Rows already in (file, row) order: how a reader hands them over, so no sort is needed."""
    file, row = pl.col("_file"), pl.col("_row")
    ascending = (file > file.shift(1)) | ((file == file.shift(1)) & (row > row.shift(1)))
    return bool(frame.select(ascending.fill_null(True).all()).item())


# --- events: sequence checks ---------------------------------------------------
# From ``order_events`` on, the rows of a page view come together, so a step of the sequence is
# a shift with a test at the view's edges, not a window that first gathers each view's rows.


def _view_start() -> pl.Expr:
    """True on the first row of each page view."""
    view = pl.col("page_view_id")
    return view.ne_missing(view.shift(1))


def _in_view(expr: pl.Expr, n: int) -> pl.Expr:
    """``expr`` n rows back (ahead when n < 0), null where that row is in another page view."""
    view = pl.col("page_view_id")
    return pl.when(view.shift(n) == view).then(expr.shift(n))


def _index_in_view() -> pl.Expr:
    """0, 1, 2, ... within each page view."""
    row = pl.int_range(pl.len(), dtype=pl.Int32)
    return row - pl.when(_view_start()).then(row).forward_fill()


def drop_after_end(events: pl.DataFrame, pseudonymize: Pseudonymize) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Anything after a page view's first ``end`` is not part of the session (rows grouped by view)."""
    is_end = (pl.col("action") == "end").cast(pl.Int32)
    ends_before = is_end.cum_sum() - is_end  # over the whole frame; minus those before the view began
    ended_before = ends_before - pl.when(_view_start()).then(ends_before).forward_fill()
    return split_by_reason(
        events,
        pl.when(ended_before > 0).then(pl.lit("event_after_end")),
        "events",
        pl.lit("the session already ended"),
        pseudonymize,
    )


def visible_cards(events: pl.DataFrame, cards: pl.DataFrame, geometry: Geometry) -> pl.DataFrame:
    """``visible_items`` (reading order) for feed events, from the layout (``layouts``) and ``scroll_top``.

    A card's ``_item`` (its catalog row, where the layout carries one) rides along as ``_visible_item``.

    A card is visible when >= ``visible_fraction`` of its height lies in the
    viewport. With a fraction of at least one half such a card has its midpoint
    in the viewport; with less, its midpoint is at most half the tallest card
    outside it. Either way the candidates are one contiguous range of cards
    sorted by midpoint, found by binary search instead of a page-view x card
    cross join, then checked exactly.
    """
    view = geometry.feed_viewport
    views = cards.filter(pl.col("rank") == 0).select("page_view_id", "_pv")
    carried = [c for c in ("_item",) if c in cards.columns]
    cards = cards.select(
        (pl.col("_pv").cast(pl.Int64) * CARD_KEY_SPAN + 2 * pl.col("y") + pl.col("height")).alias("_key"),
        "y",
        "height",
        "rank",
        "item_id",
        *carried,
    ).sort("_key")
    feed = (
        events.filter(pl.col("screen") == "feed")
        .select("_eid", "page_view_id", "scroll_top")
        .join(views, on="page_view_id")
        .with_columns((pl.col("_pv").cast(pl.Int64) * CARD_KEY_SPAN).alias("_base"))
    )
    keys = cards["_key"]
    # keys hold twice the midpoint; widen the window by the tallest card when a fraction < 1/2 counts
    margin = 0 if geometry.visible_fraction >= 0.5 or cards.height == 0 else int(cards["height"].max())
    top = feed["scroll_top"].cast(pl.Int64)
    lo = keys.search_sorted(feed["_base"] + 2 * top - margin, side="left")
    hi = keys.search_sorted(feed["_base"] + 2 * (top + view) + margin, side="right")
    candidates = feed.with_columns(pl.int_ranges(lo, hi).alias("_card")).explode("_card").drop_nulls("_card")
    candidates = pl.concat(  # the candidate cards' rows, by position: no join needed
        [candidates, cards.drop("_key").gather(candidates["_card"])],
        how="horizontal",
    )
    top, bottom = pl.col("scroll_top"), pl.col("scroll_top") + view
    shown = pl.min_horizontal(pl.col("y") + pl.col("height"), bottom) - pl.max_horizontal(pl.col("y"), top)
    visible = (
        candidates.filter(shown >= geometry.visible_fraction * pl.col("height"))
        .sort("_eid", "rank")
        .group_by("_eid", maintain_order=True)
        .agg(pl.col("item_id").alias("_visible"), *[pl.col(c).alias(f"_visible{c}") for c in carried])
    )
    lists = [c for c in visible.columns if c != "_eid"]
    return (
        feed.select("_eid")
        .join(visible, on="_eid", how="left")
        .with_columns([pl.col(c).fill_null(pl.lit([], dtype=visible.schema[c])) for c in lists])
    )


def screen_checks(
    events: pl.DataFrame,
    layout: pl.DataFrame,
    items: pl.DataFrame,
    geometry: Geometry,
    pseudonymize: Pseudonymize,
) -> Checked:
    """What was on screen: visible cards, click targets, scroll legality, open detail page.

    ``items``: ``item_context`` by catalog row (row k describes the item that ``_item`` = k names)."""
    events = events.with_row_index("_eid")
    visible = visible_cards(events, layout, geometry)
    # layouts() put each view's max feed_height on all its cards: its rank-0 card speaks for it
    heights = layout.filter(pl.col("rank") == 0).select(
        "page_view_id", pl.col("feed_height").alias("_feed_height")
    )
    events = (
        events.join(visible, on="_eid", how="left", maintain_order="left")
        .join(heights, on="page_view_id", how="left", maintain_order="left")
        .with_columns(
            pl.when(pl.col("visible_items").is_not_null())
            .then(pl.col("visible_items"))
            .otherwise(pl.col("_visible"))
            .alias("visible_items"),
            pl.when(pl.col("screen") != "feed")
            .then(None)
            .when(pl.col("visible_items").is_not_null())
            .then(pl.lit("logged"))
            .otherwise(pl.lit("layout"))
            .alias("visible_source"),
        )
    )
    checked = Checked(events)
    for step in (_feed_legality, _detail_page_legality):
        rows, bad = step(checked.rows, items, geometry, pseudonymize)
        checked.rows, checked.rejects = rows, [*checked.rejects, bad]
    return checked


def _scroll_distance() -> pl.Expr:
    """Logged |scroll_delta|, else the move between this and the next offset on the same screen."""
    nxt = pl.when(pl.col("screen") == "feed").then(pl.col("scroll_top")).otherwise(pl.col("ipv_scroll"))
    moved = (_in_view(nxt, -1) - nxt).abs()
    same_screen = _in_view(pl.col("screen"), -1) == pl.col("screen")
    return pl.coalesce(pl.col("scroll_delta").abs(), pl.when(same_screen).then(moved)).cast(pl.Int32)


def _feed_legality(
    events: pl.DataFrame, items: pl.DataFrame, geometry: Geometry, pseudonymize: Pseudonymize
) -> tuple[pl.DataFrame, pl.DataFrame]:
    action, top = pl.col("action"), pl.col("scroll_top")
    max_offset = pl.max_horizontal(pl.col("_feed_height") - geometry.feed_viewport, pl.lit(0))
    events = events.with_columns(
        pl.when(action.is_in(["scroll_down", "scroll_up", "ipv_scroll_down", "ipv_scroll_up"]))
        .then(_scroll_distance())
        .alias("distance")
    )
    limit = (
        pl.when(action.str.starts_with("ipv_"))
        .then(geometry.max_ipv_scroll)
        .otherwise(geometry.max_feed_scroll)
    )
    is_scroll = pl.col("distance").is_not_null() | action.str.contains("scroll")
    reason = (
        pl.when(action.eq("click") & ~pl.col("visible_items").list.contains(pl.col("item_id")))
        .then(pl.lit("click_target_not_visible"))
        .when(action.eq("scroll_up") & (top <= 0))
        .then(pl.lit("illegal_in_state"))
        .when(action.eq("scroll_down") & (top >= max_offset))
        .then(pl.lit("illegal_in_state"))
        .when(action.eq("ipv_scroll_up") & (pl.col("ipv_scroll") <= 0))
        .then(pl.lit("illegal_in_state"))
        .when(is_scroll & pl.col("distance").is_null())
        .then(pl.lit("missing_scroll_distance"))
        .when(is_scroll & ((pl.col("distance") < 1) | (pl.col("distance") > limit)))
        .then(pl.lit("scroll_distance_out_of_range"))
    )
    detail = (
        pl.when(action.eq("scroll_up") & (top <= 0))
        .then(pl.lit("scroll_up at the top of the feed"))
        .when(action.eq("scroll_down") & (top >= max_offset))
        .then(pl.lit("scroll_down at the bottom of the feed"))
        .when(action.eq("ipv_scroll_up") & (pl.col("ipv_scroll") <= 0))
        .then(pl.lit("ipv_scroll_up at the top of the detail page"))
    )
    return split_by_reason(events, reason, "events", detail, pseudonymize)


def _detail_page_legality(
    events: pl.DataFrame, items: pl.DataFrame, geometry: Geometry, pseudonymize: Pseudonymize
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The detail page open at each ipv step is the last click not followed by a return to the feed:
    ``_open_item`` its catalog row (``items``: ``item_context`` by row), ``_open`` its id."""
    closed = -1
    setter = (
        pl.when(pl.col("action") == "click")
        .then(pl.col("_item").cast(pl.Int64))
        .when((pl.col("screen") == "feed") | (pl.col("action") == "back_home"))
        .then(pl.lit(closed))
    )
    # a view starts with nothing open: ``closed`` there also keeps the fill inside the view
    open_before = pl.when(_view_start()).then(pl.lit(closed)).otherwise(setter.shift(1)).forward_fill()
    ipv = pl.col("screen") == "ipv"
    events = events.with_columns(
        pl.when(ipv & (open_before != closed))
        .then(open_before)
        .cast(pl.get_index_type())
        .alias("_open_item"),
        pl.when(ipv)
        .then(pl.col("scroll_top").forward_fill().over("page_view_id"))
        .otherwise(pl.col("scroll_top"))
        .alias("scroll_top"),
    )
    opened = items.select("item_id", "review_count").gather(events["_open_item"])
    events = events.with_columns(opened["item_id"].alias("_open"), opened["review_count"].alias("_reviews"))
    reason = (
        pl.when(ipv & pl.col("_open").is_null())
        .then(pl.lit("ipv_without_open_item"))
        .when(ipv & pl.col("item_id").is_not_null() & (pl.col("item_id") != pl.col("_open")))
        .then(pl.lit("ipv_item_mismatch"))
        .when(
            (pl.col("action") == "ipv_click_comment")
            & (
                pl.col("review_index").is_null()
                | (pl.col("review_index") < 0)
                | (pl.col("review_index") >= pl.col("_reviews").fill_null(0))
            )
        )
        .then(pl.lit("review_not_found"))
    )
    return split_by_reason(events, reason, "events", None, pseudonymize)


# --- outputs --------------------------------------------------------------------


def profile_columns(profiles: pl.DataFrame) -> pl.DataFrame:
    """user_id, profile struct of the six fields, extra attribute columns as one JSON object."""
    extras = [c for c in profiles.columns if c not in ("user_id", *PROFILE_FIELDS) and not c.startswith("_")]
    extra = pl.struct(extras).struct.json_encode() if extras else pl.lit(None, dtype=pl.String)
    return profiles.select(
        "user_id",
        pl.struct([pl.col(c) for c in PROFILE_FIELDS]).alias("profile"),
        extra.alias("profile_extra"),
    )


def profile_context(profiles: pl.DataFrame) -> pl.DataFrame:
    """The profile snapshot joined onto steps (computed once per run)."""
    return profile_columns(profiles).with_columns(pl.lit(False).alias("profile_missing"))


def build_steps(events: pl.DataFrame, items: pl.DataFrame, known: pl.DataFrame) -> pl.DataFrame:
    """One row per accepted event, in session order, with item (``item_context`` by catalog row, as
    in ``screen_checks``) and profile (``profile_context``) context."""
    action = pl.col("action")
    events = events.sort("page_view_id", "_eid")
    titles = items["title"]
    return (
        events.with_columns(
            _index_in_view().alias("step"),
            titles.gather(events["_item"]).alias("target_title"),
            titles.gather(events["_open_item"]).alias("ipv_item_title"),
        )
        .join(known, on="user_id", how="left", maintain_order="left")
        .with_columns(
            pl.col("page_view_id").alias("session_id"),
            action.replace_strict(ACTION_GROUPS, return_dtype=pl.String).alias("action_group"),
            pl.when(action == "click").then(pl.col("item_id")).alias("target_item_id"),
            pl.when(action == "click").then(pl.col("target_title")).alias("target_title"),
            pl.when(action == "ipv_click_comment")
            .then(pl.concat_str(pl.lit("C"), (pl.col("review_index") + 1).cast(pl.String)))
            .alias("review_alias"),
            pl.col("_open").alias("ipv_item_id"),
            pl.when(pl.col("screen") == "ipv").then(pl.col("ipv_scroll").fill_null(0)).alias("ipv_scroll"),
            pl.when(pl.col("screen") == "ipv").then(pl.col("ui_state")).alias("ui_state"),
            pl.when(pl.col("screen") == "feed").then(pl.col("visible_items")).alias("visible_items"),
            pl.col("profile_missing").fill_null(True),
        )
    )


def build_sessions(steps: pl.DataFrame, layout: pl.DataFrame, items: pl.DataFrame) -> pl.DataFrame:
    """One row per page view: counts, terminal state, categories.

    ``layout``: ``layouts`` with ``page_view_id`` renamed ``session_id``; ``items``: ``item_context``
    by catalog row (steps and cards carry theirs as ``_item``).
    """
    action = pl.col("action")
    sessions = steps.group_by("session_id").agg(
        pl.col("user_id").first(),
        pl.col("ts").min().alias("start_ts"),
        pl.col("ts").max().alias("end_ts"),
        pl.len().cast(pl.Int32).alias("length"),
        (action == "click").sum().cast(pl.Int32).alias("clicks"),
        (action == "ipv_cart").sum().cast(pl.Int32).alias("carts"),
        (action == "ipv_buy").sum().cast(pl.Int32).alias("buys"),
        (pl.col("screen") == "feed").sum().cast(pl.Int32).alias("feed_steps"),
        (action == "end").any().alias("ended"),
        pl.col("profile_missing").first(),
    )
    clicks = steps.select("session_id", "step", "_item").filter(steps["action"] == "click")
    cards = layout.filter(pl.col("rank") < FIRST_SCREEN_CARDS)
    clicked = (
        _with_top_category(clicks, items)
        .sort("session_id", "step")
        .group_by("session_id")
        .agg(
            pl.col("_top").unique(maintain_order=True).alias("categories"),
            pl.col("_top").mode().sort().first().alias("_clicked_top"),
        )
    )
    shown = (
        _with_top_category(cards, items)
        .group_by("session_id", "_top")
        .agg(pl.len().alias("_n"), pl.col("rank").min().alias("_first"))
        .sort("session_id", "_n", "_first", descending=[False, True, False])
        .group_by("session_id", maintain_order=True)
        .agg(pl.col("_top").first().alias("_shown_top"))
    )
    # layouts() keeps each view's cards together, rank 0 first, with the view's feed_height on all
    geometry = layout.filter(pl.col("rank") == 0).select(
        "session_id",
        layout["_pv"].rle().struct.field("len").cast(pl.Int32).alias("feed_items"),
        "feed_height",
    )
    return (
        sessions.join(clicked, on="session_id", how="left")
        .join(shown, on="session_id", how="left")
        .join(geometry, on="session_id", how="left")
        .with_columns(
            pl.col("categories").fill_null(pl.lit([], dtype=pl.List(pl.String))),
            pl.coalesce("_clicked_top", "_shown_top").alias("top_category"),
            pl.when(pl.col("buys") > 0)
            .then(pl.lit("purchase"))
            .when(~pl.col("ended"))
            .then(pl.lit("truncated"))
            .when(pl.col("carts") > 0)
            .then(pl.lit("cart_only"))
            .otherwise(pl.lit("browse_only"))
            .alias("terminal"),
        )
        .sort("session_id")
    )


def _with_top_category(rows: pl.DataFrame, items: pl.DataFrame) -> pl.DataFrame:
    """``rows`` with the top category of their catalog row ``_item`` as ``_top``."""
    return rows.with_columns(items["top_category"].gather(rows["_item"]).alias("_top"))


def build_items(items: pl.DataFrame) -> pl.DataFrame:
    """The catalog with its category levels, rows in input order (ids are keyed afterwards, so an
    order by raw id would mean nothing downstream)."""
    return pl.concat([items, category_levels(items["category"])], how="horizontal")


CATEGORY_LEVELS = ("category_l1", "category_l2", "category_l3")


def category_levels(categories: pl.Series) -> pl.DataFrame:
    """``category_l1..l3`` of each row (null beyond a path's depth), split once per distinct
    category: a catalog has far fewer categories than items."""
    levels = pl.col("category").str.split("-")
    paths = categories.unique().to_frame("category").with_columns(
        levels.list.get(n, null_on_oob=True).alias(name) for n, name in enumerate(CATEGORY_LEVELS)
    )
    rows = categories.to_frame("category").join(paths, on="category", how="left", maintain_order="left")
    return rows.drop("category")
