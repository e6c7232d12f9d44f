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

A rejected event inside a session is never simply left out (``cut_sessions``): the session
is cut after its last good step, so no trajectory joins steps that did not follow each
other. Pixels are float CSS px throughout; a scroll's action distance is the nearest whole
px (``scroll_distance``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import polars as pl

from transforms.config import DROP_ACTION, Geometry
from transforms.readers import Pseudonymize, empty_rejects, reject_rows
from transforms.schemas import ACTION_GROUPS, ACTIONS, FEED_ACTIONS, IPV_ACTIONS, PROFILE_FIELDS, SCREENS

CARD_KEY_SPAN = 1 << 40  # page-view stride in the global sorted card-midpoint key
FIRST_SCREEN_CARDS = 10  # a session without clicks takes the top category of its first cards


@dataclass
class CheckedRows:
    """Rows that passed, rows quarantined, and exact duplicates merged."""

    rows: pl.DataFrame
    rejects: list[pl.DataFrame] = field(default_factory=list)
    duplicates: int = 0
    flags: list[pl.DataFrame] = field(default_factory=list)
    cuts: list[pl.DataFrame] = field(default_factory=list)  # page_view_id, cut_reason (cut_sessions)


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
) -> CheckedRows:
    """Merge exact duplicate rows (counted); later rows that reuse a key with other values are rejected."""
    # hashes first: equal keys hash equal, so no duplicate hash means no duplicate key
    if frame.select(pl.struct(keys).hash(seed=0).n_unique()).item() == frame.height:
        return CheckedRows(frame)  # the common case: every key once, nothing to merge or reject
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
    return CheckedRows(kept, [rejects], frame.height - exact.height)


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


def check_profiles(profiles: pl.DataFrame, pseudonymize: Pseudonymize) -> CheckedRows:
    return dedupe(profiles, ["user_id"], "profiles", "duplicate_profile", pseudonymize)


def check_feeds(
    feeds: pl.DataFrame, in_catalog: pl.Expr, geometry: Geometry, pseudonymize: Pseudonymize
) -> CheckedRows:
    """``in_catalog``: true where the card's item passed the catalog checks.

    Only ``y`` (and the feed's height) place a card for visibility, so a box without ``width`` or
    ``height`` takes the reference's defaults (``Geometry.default_card_width`` / ``_height``) and is
    flagged ``defaulted_geometry`` (kept); a missing ``x`` stays null (reading order then puts the
    card after those beside it). A box that cannot be placed is ``invalid_geometry``.
    """
    checked = dedupe(feeds, ["page_view_id", "item_id"], "feeds", "duplicate_feed_card", pseudonymize)
    checked.rows, flags = _default_card_size(checked.rows, geometry, pseudonymize)
    x, y, width, height, feed = (pl.col(c) for c in ("x", "y", "width", "height", "feed_height"))
    placed = pl.all_horizontal(c.is_finite() for c in (y, width, height, feed))
    finite = placed & x.is_finite().fill_null(True)
    reason = (
        pl.when(~in_catalog)
        .then(pl.lit("item_not_in_catalog"))
        .when(
            ~finite | (width <= 0) | (height <= 0) | (x < 0).fill_null(False) | (y < 0) | (feed < y + height)
        )
        .then(pl.lit("invalid_geometry"))
    )
    rows, bad = split_by_reason(checked.rows, reason, "feeds", None, pseudonymize)
    checked.rows, checked.rejects, checked.flags = rows, [*checked.rejects, bad], [flags]
    return checked


def _default_card_size(
    feeds: pl.DataFrame, geometry: Geometry, pseudonymize: Pseudonymize
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Missing widths and heights filled with the defaults; one kept flag per filled card."""
    no_width, no_height = pl.col("width").is_null(), pl.col("height").is_null()
    defaulted = feeds.filter(no_width | no_height)
    if defaulted.height == 0:
        return feeds, empty_rejects()
    detail = pl.concat_str(
        pl.lit("kept; defaulted "),
        pl.concat_str(
            pl.when(no_width).then(pl.lit(f"width = {geometry.default_card_width:g} px")),
            pl.when(no_height).then(pl.lit(f"height = {geometry.default_card_height:g} px")),
            separator=", ",
            ignore_nulls=True,
        ),
    )
    flags = reject_rows(
        "feeds",
        defaulted,
        "defaulted_geometry",
        defaulted.select(detail).to_series(),
        pseudonymize,
    )
    filled = feeds.with_columns(
        pl.col("width").fill_null(geometry.default_card_width),
        pl.col("height").fill_null(geometry.default_card_height),
    )
    return filled, flags


def layouts(feeds: pl.DataFrame) -> pl.DataFrame:
    """Card geometry per page view; rank is reading order (top to bottom, left to right).

    Rows come grouped by page view, with ``_pv`` a dense page-view number (integer keys for the
    per-view windows and joins that follow). Feeds logged grouped by view in reading order (the
    usual case) are taken as they come instead of being sorted.
    """
    if not _in_reading_order(feeds):
        feeds = feeds.sort("page_view_id", "y", "x", nulls_last=True, maintain_order=True)
    return feeds.with_columns(pl.col("page_view_id").rle_id().alias("_pv")).with_columns(
        pl.int_range(pl.len(), dtype=pl.Int32).over("_pv").alias("rank"),
        pl.col("feed_height").max().over("_pv").alias("feed_height"),
    )


def _in_reading_order(feeds: pl.DataFrame) -> bool:
    """Each page view's cards contiguous and ordered by (y, x)."""
    y, x, view = pl.col("y"), pl.col("x"), pl.col("page_view_id")
    new_view = view != view.shift(1)
    # a null x sorts last among cards of the same y
    beside = (y == y.shift(1)) & (x.is_null() | (x >= x.shift(1)).fill_null(x.shift(1).is_not_null()))
    ordered = (new_view | (y > y.shift(1)) | beside).fill_null(True)
    runs, views, in_order = feeds.select(
        new_view.fill_null(True).sum().alias("runs"),
        view.n_unique().alias("views"),
        ordered.all().alias("in_order"),
    ).row(0)
    return runs == views and in_order


# --- events: row-level checks --------------------------------------------------


def map_actions(events: pl.DataFrame, action_map: dict[str, str]) -> pl.DataFrame:
    """Platform action names -> the 13 actions, or ``drop`` (before duplicate ids are compared)."""
    return events.with_columns(pl.col("action").replace(action_map)) if action_map else events


def drop_declared(events: pl.DataFrame) -> tuple[pl.DataFrame, int]:
    """Events whose action ``action_map`` sends to ``drop`` are no part of the trajectory: they leave
    without cutting their session (not a rejection) and are counted as dropped."""
    declared = pl.col("action") == DROP_ACTION
    dropped = events.select(declared.sum()).item() or 0
    return (events.filter(~declared), dropped) if dropped else (events, 0)


# --- cutting a session at its first rejected event --------------------------------
# A session is a sequence: an event left out of it would join the steps around it into a
# trajectory no shopper made. So the first rejected event of a session (before its first ``end``:
# what comes after the end is no part of it anyway) cuts it: the steps before stay, the session
# ends ``truncated`` with ``cut_reason``, and the events after the cut are quarantined
# ``after_rejected_event`` (``on_bad_event = "cut"``); or every event of the session is
# quarantined ``dropped_with_session`` (``"drop_session"``). Duplicates merged and kept flags
# never cut; nor does the later copy of a conflicting event id (the id's first copy stays).
# An events row the reader rejected (``readers.rejected_event_marks``) cuts like any other
# (``place_reader_rejects``), but it was quarantined once already, under its own reason: a row
# marked ``_already_quarantined`` cuts and leaves no second quarantine row.

AFTER_REJECTED = "after_rejected_event"
DROPPED_WITH_SESSION = "dropped_with_session"
ALREADY_QUARANTINED = "_already_quarantined"


def _cum_in_view(expr: pl.Expr) -> pl.Expr:
    """Running sum of ``expr`` within each page view, this row included (rows grouped by view)."""
    total = expr.cast(pl.Int64).cum_sum()
    before_view = pl.when(_view_start()).then(total - expr.cast(pl.Int64)).forward_fill()
    return total - before_view


def cut_sessions(tagged: pl.DataFrame, on_bad_event: str, pseudonymize: Pseudonymize | None) -> CheckedRows:
    """Split events grouped by page view in session order, with ``_why`` / ``_why_detail`` (null:
    the row passed its check), into kept rows, quarantine rows and cuts.

    Rows after the cut leave as ``after_rejected_event`` whether or not a check rejected them too
    (the detail names their own reason): a check that reads the state left by the rows before
    judged them in a session that did not happen once the rejected event is gone."""
    why, action = pl.col("_why"), pl.col("action")
    rejected = why.is_not_null()
    good_end = (action == "end") & ~rejected
    ended_before = _cum_in_view(good_end) - good_end.cast(pl.Int64)
    cutting = rejected & (ended_before == 0)
    cuts_so_far = _cum_in_view(cutting)
    at_cut = cutting & (cuts_so_far == 1)
    if on_bad_event == "cut":
        code, context = AFTER_REJECTED, "the session was cut at an earlier rejected event: "
        follows = (cuts_so_far > 0) & ~at_cut
    else:
        code, context = DROPPED_WITH_SESSION, "drop_session: the session had a rejected event: "
        follows = cutting.any().over("page_view_id") & ~at_cut
    first_why = why.filter(at_cut).first().over("page_view_id")
    reason = pl.when(follows).then(pl.lit(code)).otherwise(why)
    detail = (
        pl.when(follows)
        .then(
            pl.concat_str(
                pl.lit(context),
                first_why,
                pl.when(rejected).then(pl.concat_str(pl.lit("; itself "), why)),
                ignore_nulls=True,
            )
        )
        .otherwise(pl.col("_why_detail"))
    )
    marked = tagged.with_columns(at_cut.alias("_at_cut"))
    cuts = (
        marked.filter(pl.col("_at_cut")).select("page_view_id", pl.col("_why").alias("cut_reason"))
        if on_bad_event == "cut"
        else no_cuts()
    )
    if ALREADY_QUARANTINED in marked.columns:  # the reasons read the whole view, these rows included
        marked = marked.with_columns(reason.alias("_cut_why"), detail.alias("_cut_detail"))
        marked = marked.filter(pl.col(ALREADY_QUARANTINED).is_null())
        reason, detail = pl.col("_cut_why"), pl.col("_cut_detail")
    rows, rejects = split_by_reason(marked, reason, "events", detail, pseudonymize)
    helpers = ["_why", "_why_detail", "_at_cut", ALREADY_QUARANTINED, "_cut_why", "_cut_detail"]
    return CheckedRows(rows.drop(helpers, strict=False), [rejects], cuts=[cuts])


def no_cuts() -> pl.DataFrame:
    return pl.DataFrame(schema={"page_view_id": pl.String, "cut_reason": pl.String})


def session_cuts(cuts: list[pl.DataFrame]) -> pl.DataFrame:
    """One ``cut_reason`` per cut page view. Each check runs on what the checks before it kept, so
    a later cut lies before an earlier one and is the one that holds: the last one listed wins."""
    frames = [c for c in cuts if c.height]
    if not frames:
        return no_cuts()
    return pl.concat(frames).group_by("page_view_id", maintain_order=True).last()


def _split_and_cut(
    frame: pl.DataFrame,
    reason: pl.Expr,
    detail: pl.Expr,
    on_bad_event: str,
    *,
    order: list[str] | None,
    pseudonymize: Pseudonymize | None,
    reader_rejected: pl.DataFrame | None = None,
) -> CheckedRows:
    """``reason`` per row, then ``cut_sessions`` on the page views with a rejection. ``order``: the
    session order to sort those views' rows by (None: ``frame`` is grouped and ordered already);
    ``reader_rejected``: ``place_reader_rejects`` rows, which join their views' rows to cut them
    (with ``order`` only)."""
    reasons = frame.select(reason.alias("_why")).to_series()
    no_reader_rejects = reader_rejected is None or reader_rejected.height == 0
    if reasons.null_count() == frame.height and no_reader_rejects:  # the common case: nothing to cut
        return CheckedRows(frame)
    tagged = frame.with_columns(reasons)
    if order is not None:  # the rows go on in the order they came
        tagged = tagged.with_row_index("_seq")
    rejected_views = tagged.filter(pl.col("_why").is_not_null())["page_view_id"]
    if not no_reader_rejects:
        rejected_views = pl.concat([rejected_views, reader_rejected["page_view_id"]])
    hit = pl.col("page_view_id").is_in(rejected_views.unique().implode())
    affected = tagged.filter(hit).with_columns(detail.alias("_why_detail"))
    if not no_reader_rejects:
        affected = pl.concat([affected, reader_rejected], how="diagonal_relaxed")
    if order is not None:
        # ties rejected first: a row that cannot be told apart from a rejected one is not kept; a
        # reader-rejected row whose place is after every event (null ``ts``) sorts last
        affected = affected.with_columns(pl.col("_why").is_null().alias("_passed"))
        affected = affected.sort("page_view_id", *order, "_passed", nulls_last=True).drop("_passed")
    checked = cut_sessions(affected, on_bad_event, pseudonymize)
    # each view lies wholly in one of the two, so the rows of a view stay together, in order
    checked.rows = pl.concat([tagged.filter(~hit).drop("_why"), checked.rows])
    if order is not None:
        checked.rows = checked.rows.sort("_seq").drop("_seq")
    return checked


def place_reader_rejects(rejected: pl.DataFrame, events: pl.DataFrame) -> pl.DataFrame:
    """Reader-rejected events rows (``readers.rejected_event_marks``, actions mapped) as rows that
    cut their sessions (``_why`` their reader reason, ``ALREADY_QUARANTINED``), placed in session
    order (ts, then source order) among ``events``, the part's events before the row checks.

    A row whose ``ts`` was read stands at that ``ts`` (ties by source order, as for any event). A
    row whose ``ts`` is unreadable stands at its source position (``_file``, ``_row``) among its
    view's events: it takes the earliest ``ts`` of the events after it in the source, so it sorts
    before all of them (ties by source order) and no event that followed it in the source is kept
    before the cut, even where the source is not in time order; with none after it, it sorts last
    (the session is still cut, truncated, unless it had ended already). A row without a readable
    ``page_view_id`` belongs to no session and never comes here (``ingest.parts.Raw``). Rows whose action
    ``action_map`` declares irrelevant (``drop``) cut nothing, as such events never do; nor do
    rows of views with no event in ``events``: there is no session to cut."""
    view = pl.col("page_view_id")
    near = events.filter(view.is_in(rejected["page_view_id"].unique().implode()))
    present = view.is_in(near["page_view_id"].unique().implode())
    rejected = rejected.filter(present & pl.col("action").ne_missing(DROP_ACTION))
    undated = rejected.filter(pl.col("ts").is_null())
    if undated.height:
        source = pl.concat(
            [
                near.select(
                    "page_view_id", "ts", "_file", "_row", pl.lit(None, dtype=pl.String).alias("reason")
                ),
                undated.select("page_view_id", "ts", "_file", "_row", "reason"),
            ]
        ).sort("page_view_id", "_file", "_row")
        # the suffix minimum of the events' ts, carried back onto the undated rows before them
        after = pl.col("ts").cum_min(reverse=True).backward_fill().over("page_view_id")
        undated = source.with_columns(after.alias("ts")).filter(pl.col("reason").is_not_null())
        rejected = pl.concat([rejected.filter(pl.col("ts").is_not_null()).drop("action"), undated])
    return rejected.select("page_view_id", "ts", "_file", "_row", *cutting_as_quarantined())


def cutting_as_quarantined() -> list[pl.Expr]:
    """A reader-rejected row's ``reason`` as the ``_why`` of a row that cuts its session and leaves
    no second quarantine row (``cut_sessions``)."""
    return [pl.col("reason").alias("_why"), pl.lit(True).alias(ALREADY_QUARANTINED)]


def dedupe_events(events: pl.DataFrame, pseudonymize: Pseudonymize) -> CheckedRows:
    return dedupe(events, ["event_id"], "events", "duplicate_event_id", pseudonymize)


def row_checks(
    events: pl.DataFrame,
    *,
    in_catalog: pl.Expr,
    feed_views: pl.Series,
    max_ts: pl.Expr,
    pseudonymize: Pseudonymize,
    on_bad_event: str = "cut",
    reader_rejected: pl.DataFrame | None = None,
) -> CheckedRows:
    """Checks that need one row (plus keys): vocabulary, screen, ids, timestamps, ownership; a
    rejection cuts its session (``cut_sessions``, in session order: ts, then source order).

    ``events`` have their actions mapped and duplicate ids settled (``map_actions``, ``dedupe_events``);
    ``in_catalog`` is true where ``item_id`` passed the catalog checks; ``reader_rejected``: the rows
    the reader rejected (``readers.rejected_event_marks``, actions mapped), which cut their sessions
    where they stood (``place_reader_rejects``) without being quarantined again.
    """
    action, screen = pl.col("action"), pl.col("screen")
    needs_item = action.eq("click") | screen.eq("ipv")
    owner = pl.col("user_id").sort_by("ts", "_file", "_row").first().over("page_view_id")
    offsets = (pl.col("scroll_top"), pl.col("ipv_scroll"), pl.col("scroll_delta"))
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
        .when(pl.any_horizontal(~c.is_finite() for c in offsets).fill_null(False))
        .then(pl.lit("non_finite_offset"))
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
    placed = None
    if reader_rejected is not None and reader_rejected.height:  # the common case: none
        placed = place_reader_rejects(reader_rejected, events)
    return _split_and_cut(
        events,
        reason,
        detail,
        on_bad_event,
        order=["ts", "_file", "_row"],
        pseudonymize=pseudonymize,
        reader_rejected=placed,
    )


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
    # the key: view number, then twice the midpoint rounded down, so fractional boxes keep integer
    # keys; floor is monotonic, so the search bounds below (floored alike) miss no candidate
    cards = cards.select(
        (
            pl.col("_pv").cast(pl.Int64) * CARD_KEY_SPAN
            + (2 * pl.col("y") + pl.col("height")).floor().cast(pl.Int64)
        ).alias("_key"),
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
    margin = 0 if geometry.visible_fraction >= 0.5 or cards.height == 0 else math.ceil(cards["height"].max())
    top = feed["scroll_top"]
    lo = keys.search_sorted(feed["_base"] + (2 * top).floor().cast(pl.Int64) - margin, side="left")
    hi = keys.search_sorted(feed["_base"] + (2 * (top + view)).floor().cast(pl.Int64) + margin, side="right")
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
    on_bad_event: str = "cut",
) -> CheckedRows:
    """What was on screen: visible cards, click targets, scroll legality, open detail page; the first
    rejection of a session cuts it (``cut_sessions``).

    ``events``: grouped by page view in session order, after ``drop_after_end``; ``items``:
    ``item_context`` by catalog row (row k describes the item that ``_item`` = k names).

    One pass is exact: the state a check reads at a row (the open detail page, the offsets) comes
    from the rows before it, or from the row itself (visible cards, from its own offset); only a
    scroll's derived distance reads the next row's logged offset, which is an observation whether or
    not that next event is kept. So every row before a session's first rejection sees the state it
    would see if nothing after it existed, and is judged as in a session cut there; rows after the
    first rejection are cut whatever their checks said.
    """
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
    events, feed_reason, feed_detail = _feed_legality(events, geometry)
    events, page_reason = _detail_page_legality(events, items)
    return _split_and_cut(
        events,
        pl.coalesce(feed_reason, page_reason),
        feed_detail,
        on_bad_event,
        order=None,
        pseudonymize=pseudonymize,
    )


def scroll_distance(px: pl.Expr) -> pl.Expr:
    """A scroll's action distance: the protocol's whole pixels, the nearest to the logged move
    (halves up: 331.4 -> 331, 331.5 -> 332); offsets stay exact."""
    return (px.abs() + 0.5).floor().cast(pl.Int32)


def _scroll_distance() -> pl.Expr:
    """Logged |scroll_delta|, else the move between this and the next offset on the same screen."""
    nxt = pl.when(pl.col("screen") == "feed").then(pl.col("scroll_top")).otherwise(pl.col("ipv_scroll"))
    moved = _in_view(nxt, -1) - nxt
    same_screen = _in_view(pl.col("screen"), -1) == pl.col("screen")
    return scroll_distance(pl.coalesce(pl.col("scroll_delta"), pl.when(same_screen).then(moved)))


def _feed_legality(events: pl.DataFrame, geometry: Geometry) -> tuple[pl.DataFrame, pl.Expr, pl.Expr]:
    """``events`` with their scroll ``distance``; the reason and detail of a feed-side rejection."""
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
    return events, reason, detail


def _detail_page_legality(events: pl.DataFrame, items: pl.DataFrame) -> tuple[pl.DataFrame, pl.Expr]:
    """The detail page open at each ipv step is the last click not followed by a return to the feed:
    ``_open_item`` its catalog row (``items``: ``item_context`` by row), ``_open`` its id; the reason
    of a detail-page rejection."""
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
    return events, reason


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


def build_sessions(
    steps: pl.DataFrame, layout: pl.DataFrame, items: pl.DataFrame, cuts: pl.DataFrame | None = None
) -> pl.DataFrame:
    """One row per page view: counts, terminal state, categories.

    ``layout``: ``layouts`` with ``page_view_id`` renamed ``session_id``; ``items``: ``item_context``
    by catalog row (steps and cards carry theirs as ``_item``); ``cuts``: ``session_cuts`` (a cut
    session is ``truncated``, whatever its kept steps did).
    """
    cuts = (cuts if cuts is not None else no_cuts()).rename({"page_view_id": "session_id"})
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
        .join(cuts, on="session_id", how="left")
        .with_columns(
            pl.col("categories").fill_null(pl.lit([], dtype=pl.List(pl.String))),
            pl.coalesce("_clicked_top", "_shown_top").alias("top_category"),
            pl.when(pl.col("cut_reason").is_not_null())
            .then(pl.lit("truncated"))
            .when(pl.col("buys") > 0)
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
    paths = (
        categories.unique()
        .to_frame("category")
        .with_columns(
            levels.list.get(n, null_on_oob=True).alias(name) for n, name in enumerate(CATEGORY_LEVELS)
        )
    )
    rows = categories.to_frame("category").join(paths, on="category", how="left", maintain_order="left")
    return rows.drop("category")
