"""Every logged action is legal in the state the log itself implies (PROTOCOL.md §1).

The state is rebuilt here from the events and the feed layout alone (plus page
heights from the world's catalog), independently of the generator's code.
"""

from __future__ import annotations

import polars as pl
import pytest

from transforms.schemas import IPV_ACTIONS

FEED_VIEWPORT = 693  # PROTOCOL.md reference geometry
IPV_VIEWPORT = 837
MAX_FEED_SCROLL = 694
MAX_IPV_SCROLL = 837
FEED_ONLY = ("scroll_down", "scroll_up", "click")
IPV_ONLY = tuple(a for a in IPV_ACTIONS if a != "end")  # "end" is legal on both screens
SCROLLS = ("scroll_down", "scroll_up", "ipv_scroll_down", "ipv_scroll_up")


@pytest.fixture(scope="module")
def events(small_bundle) -> pl.DataFrame:
    """Events in session order with the next event's fields alongside."""
    ev = small_bundle.events.sort("page_view_id", "ts")
    nxt = [
        pl.col(c).shift(-1).over("page_view_id").alias(f"next_{c}")
        for c in ("action", "screen", "scroll_top", "ipv_scroll", "item_id", "ui_state")
    ]
    return ev.with_columns(*nxt)


@pytest.fixture(scope="module")
def page_heights(small_world) -> pl.DataFrame:
    return pl.DataFrame({"item_id": small_world.item_ids, "page_height": small_world.catalog.page_height})


def test_clicked_card_is_visible_at_scroll_top(events, small_bundle):
    clicks = events.filter(pl.col("action") == "click").join(
        small_bundle.feeds, on=["page_view_id", "item_id"], how="left"
    )
    assert clicks["y"].null_count() == 0  # every clicked card is in that page view's feed
    top, bottom = pl.col("scroll_top"), pl.col("scroll_top") + FEED_VIEWPORT
    inside = pl.min_horizontal(pl.col("y") + pl.col("height"), bottom) - pl.max_horizontal(pl.col("y"), top)
    assert clicks.select((inside >= 0.5 * pl.col("height")).all()).item()
    assert clicks.height > 100


def test_feed_scrolls_stay_inside_the_feed(events, small_bundle):
    heights = small_bundle.feeds.group_by("page_view_id").agg(pl.col("feed_height").first())
    scrolls = events.filter(pl.col("action").is_in(["scroll_down", "scroll_up"])).join(
        heights, on="page_view_id"
    )
    max_offset = pl.col("feed_height") - FEED_VIEWPORT
    # logged in fractional px: the action distance is the nearest whole px (halves up), 1..694
    assert (scrolls["scroll_delta"] + 0.5).floor().is_between(1, MAX_FEED_SCROLL).all()
    assert (scrolls["scroll_delta"] <= MAX_FEED_SCROLL).all()
    down = scrolls.filter(pl.col("action") == "scroll_down")
    up = scrolls.filter(pl.col("action") == "scroll_up")
    assert down.select((pl.col("scroll_top") + pl.col("scroll_delta") <= max_offset).all()).item()
    assert up.select((pl.col("scroll_delta") <= pl.col("scroll_top")).all()).item()
    assert (events["scroll_top"] >= 0).all()


def test_feed_offset_is_continuous(events):
    # after a feed scroll the next event starts at top +/- delta; everything else keeps the offset
    moved = pl.col("scroll_top") + pl.when(pl.col("action") == "scroll_down").then(
        pl.col("scroll_delta")
    ).when(pl.col("action") == "scroll_up").then(-pl.col("scroll_delta")).otherwise(0)
    pairs = events.filter(pl.col("next_action").is_not_null())
    assert pairs.select((moved == pl.col("next_scroll_top")).all()).item()


def test_detail_page_scrolls_are_continuous_and_bounded(events, page_heights):
    ipv = events.filter(pl.col("screen") == "ipv").join(page_heights, on="item_id")
    assert (ipv["ipv_scroll"] >= 0).all()
    scrolls = ipv.filter(pl.col("action").is_in(["ipv_scroll_down", "ipv_scroll_up"]))
    assert scrolls["scroll_delta"].is_between(1, MAX_IPV_SCROLL).all()
    down = scrolls.filter(pl.col("action") == "ipv_scroll_down")
    assert down.select(
        (pl.col("ipv_scroll") + pl.col("scroll_delta") <= pl.col("page_height") - IPV_VIEWPORT).all()
    ).item()
    assert (
        scrolls.filter(pl.col("action") == "ipv_scroll_up")
        .select((pl.col("scroll_delta") <= pl.col("ipv_scroll")).all())
        .item()
    )
    moved = pl.col("ipv_scroll") + pl.when(pl.col("action") == "ipv_scroll_down").then(
        pl.col("scroll_delta")
    ).when(pl.col("action") == "ipv_scroll_up").then(-pl.col("scroll_delta")).otherwise(0)
    same_visit = ipv.filter((pl.col("next_screen") == "ipv") & (pl.col("action") != "back_home"))
    assert same_visit.select((moved == pl.col("next_ipv_scroll")).all()).item()
    assert (same_visit["item_id"] == same_visit["next_item_id"]).all()


def test_one_end_per_session_and_it_is_last(events):
    per_session = events.group_by("page_view_id").agg(
        (pl.col("action") == "end").sum().alias("ends"), pl.col("action").last().alias("last")
    )
    assert (per_session["ends"] == 1).all()
    assert (per_session["last"] == "end").all()


def test_timestamps_strictly_increase_within_a_session(events):
    gaps = events.select(pl.col("ts").diff().over("page_view_id").dt.total_milliseconds().alias("gap"))
    assert (gaps["gap"].drop_nulls() > 0).all()
    assert gaps["gap"].drop_nulls().median() < 30_000  # a few seconds apart


def test_screens_fields_and_transitions(events):
    feed_only = events.filter(pl.col("action").is_in(FEED_ONLY))
    ipv_only = events.filter(pl.col("action").is_in(IPV_ONLY))
    assert (feed_only["screen"] == "feed").all() and (ipv_only["screen"] == "ipv").all()
    on_feed, on_ipv = events.filter(pl.col("screen") == "feed"), events.filter(pl.col("screen") == "ipv")
    assert (
        on_feed["ui_state"].null_count() == on_feed.height
        and on_feed["ipv_scroll"].null_count() == on_feed.height
    )
    assert (
        set(on_ipv["ui_state"]) <= {"main", "params", "comments"} and on_ipv["ipv_scroll"].null_count() == 0
    )
    assert on_ipv["item_id"].null_count() == 0
    assert (
        feed_only.filter(pl.col("action") != "click")["item_id"].null_count()
        == feed_only.filter(pl.col("action") != "click").height
    )
    assert (
        events.filter(~pl.col("action").is_in(SCROLLS))["scroll_delta"].null_count()
        == events.filter(~pl.col("action").is_in(SCROLLS)).height
    )
    # a click opens that item's page at the top; back_home returns to the feed where it left
    clicks = events.filter(pl.col("action") == "click")
    assert (clicks["next_screen"] == "ipv").all() and (clicks["next_item_id"] == clicks["item_id"]).all()
    assert (clicks["next_ipv_scroll"] == 0).all() and (clicks["next_ui_state"] == "main").all()
    homes = events.filter(pl.col("action") == "back_home")
    assert (homes["next_screen"] == "feed").all() and (homes["next_scroll_top"] == homes["scroll_top"]).all()
    assert events["image"].str.contains(r"^img/pv-[0-9a-f]{16}/\d+\.jpg$").all()


def test_review_clicks_are_valid(events, small_bundle, page_heights):
    n_reviews = small_bundle.items.select("item_id", pl.col("reviews").list.len().alias("n_reviews"))
    taps = (
        events.filter(pl.col("action") == "ipv_click_comment")
        .join(n_reviews, on="item_id")
        .join(page_heights, on="item_id")
    )
    assert taps.height > 10
    assert (taps["review_index"] >= 0).all() and (taps["review_index"] < taps["n_reviews"]).all()
    assert (
        events.filter(pl.col("action") != "ipv_click_comment")["review_index"].null_count()
        == events.filter(pl.col("action") != "ipv_click_comment").height
    )
    # the list must be open (opened by ipv_enter_comment earlier in this visit), or the review block -
    # which starts 60 % down the page - must have been scrolled into the viewport
    visit = (pl.col("action") == "click").cum_sum().over("page_view_id")
    opened = (pl.col("action") == "ipv_enter_comment").cast(pl.Int32).cum_sum().over(
        "page_view_id", visit
    ) > 0
    tagged = (
        events.with_columns(opened.alias("opened"))
        .filter(pl.col("action") == "ipv_click_comment")
        .join(page_heights, on="item_id")
    )
    in_view = pl.col("ipv_scroll") + IPV_VIEWPORT >= 0.6 * pl.col("page_height")
    assert tagged.select(((pl.col("ui_state") == "comments") & pl.col("opened") | in_view).all()).item()


def test_swipes_do_not_wrap_and_conversions_once_per_visit(events):
    visit = (pl.col("action") == "click").cum_sum().over("page_view_id").alias("visit")
    per_visit = (
        events.with_columns(visit)
        .filter(pl.col("screen") == "ipv")
        .group_by("page_view_id", "visit")
        .agg(
            (pl.col("action") == "ipv_swipe_pic").sum().alias("swipes"),
            (pl.col("action") == "ipv_cart").sum().alias("carts"),
            (pl.col("action") == "ipv_buy").sum().alias("buys"),
        )
    )
    assert per_visit["swipes"].max() <= 8  # at most 9 pictures per item, no wrap
    assert per_visit["carts"].max() <= 1 and per_visit["buys"].max() <= 1


def test_fractional_pixels_are_logged_and_ingest_clean(written, tmp_path):
    from transforms.ingest import ingest_bundle
    from transforms.lake import read_lake_table

    raw = written["parquet"]
    events = pl.read_parquet(raw / "events")
    feeds = pl.read_parquet(raw / "feeds")
    assert (events["scroll_top"] % 1 != 0).any() and (feeds["height"] % 1 != 0).any()
    result = ingest_bundle(raw, tmp_path / "lake")
    # a legal log loses nothing: every event a step, every card in a layout, no quarantine row
    assert result.quarantine_by_reason == {} and result.flagged_by_reason == {}
    assert (
        result.counts["events"].rows_out == events.height and result.counts["feeds"].rows_out == feeds.height
    )
    steps = read_lake_table(tmp_path / "lake", "steps")
    assert steps["scroll_top"].dtype == pl.Float64 and (steps["scroll_top"] % 1 != 0).any()
