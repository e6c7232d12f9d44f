"""Training/evaluation records: one row per recorded step, the prompt rendered.

``build_records`` renders whole tables with Polars expressions that mirror the
pure renderer in ``transforms.prompts.render`` line for line (the renderer is
the specification; ``tests/transforms/test_records.py`` checks that both give
the same text). The evaluation environment calls the renderer on live states.

Modes: ``single`` (trajectory = session, window of ``window_single`` steps of
that session, recent clicks/purchases from the pre-window ``history``) and
``cross`` (users with two or more sessions; trajectory = user, window of
``window_cross`` steps across sessions, recent lists also from earlier
sessions). Nothing a state shows happens at or after it: windows hold earlier
steps only, recent lists hold events strictly before the session start.
Key of the table: (mode, record_id).
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.parquet as pq
from pydantic import BaseModel, PrivateAttr

from transforms.chain import session_order
from transforms.files import atomic_file, swap_into_place
from transforms.increments import empty_not_executable, files_without_users
from transforms.lake import (
    STAGING,
    bucket_files,
    conform,
    recorded_settings,
    scan_table,
    table_dir,
    table_files,
    write_table,
)
from transforms.manifest import read_manifest
from transforms.prompts.render import (
    CLOSING,
    DONE_ACTIONS,
    PROMPT_VERSION,
    UNKNOWN_ITEM,
    Mode,
    PromptSettings,
    action_signatures,
    system_prompt,
    window_header,
)
from transforms.schemas import PROFILE_FIELDS, RECORDS, SCROLL_ACTIONS, polars_schema

MODES: tuple[str, ...] = ("single", "cross")
EXTRACT_STAGE = "extract"  # the stage whose quarantine holds rejected rationales
STR = pl.String  # text columns are built as Polars strings, cast to the schema on write

# --- expression twins of the render.py formatters ------------------------------------


def clean(e: pl.Expr) -> pl.Expr:
    for char in ("\r", "\n", "\t"):
        e = e.str.replace_all(char, " ", literal=True)
    return e


def text_or(e: pl.Expr, default: str) -> pl.Expr:
    """``clean(x) or default``."""
    cleaned = clean(e)
    return pl.when(cleaned.is_null() | (cleaned == "")).then(pl.lit(default)).otherwise(cleaned)


def fmt_price(e: pl.Expr) -> pl.Expr:
    cents = (e.fill_nan(None) * 100 + 0.5).floor().cast(pl.Int64)
    text = pl.concat_str((cents // 100).cast(STR), pl.lit("."), (cents % 100).cast(STR).str.zfill(2))
    return pl.when(cents.is_null()).then(pl.lit("n/a")).otherwise(text)


def fmt_px(e: pl.Expr) -> pl.Expr:
    """Twin of ``render.fmt_px``: CSS px as logged, whole ones without a decimal point."""
    px = e.cast(pl.Float64)
    text = pl.when(px == px.floor()).then(px.cast(pl.Int64).cast(STR)).otherwise(px.cast(STR))
    return pl.when(e.is_null()).then(pl.lit("unknown")).otherwise(pl.concat_str(text, pl.lit(" px")))


def fmt_gap(seconds: pl.Expr) -> pl.Expr:
    def whole(divisor: int) -> pl.Expr:
        return (seconds / divisor).floor().cast(pl.Int64)

    return (
        pl.when(whole(60) < 1)
        .then(pl.lit("under a minute"))
        .when(whole(60) < 60)
        .then(pl.concat_str(whole(60).cast(STR), pl.lit(" min")))
        .when(whole(3600) < 48)
        .then(pl.concat_str(whole(3600).cast(STR), pl.lit(" h")))
        .otherwise(pl.concat_str(whole(86400).cast(STR), pl.lit(" days")))
    )


def json_str(e: pl.Expr) -> pl.Expr:
    """JSON string literal of ``e`` (same escaping as ``json.dumps(ensure_ascii=False)``); null stays null."""
    encoded = pl.struct(e.alias("v")).struct.json_encode()
    return pl.when(e.is_not_null()).then(encoded.str.strip_prefix('{"v":').str.strip_suffix("}"))


def ui_has(words: str) -> pl.Expr:
    return pl.col("ui_state").str.to_lowercase().str.contains(words).fill_null(False)


def masked_shift(column: str, k: int, by: str) -> pl.Expr:
    """``column`` k rows back within the same ``by`` group (frame sorted by group)."""
    return pl.when(pl.col(by).shift(k) == pl.col(by)).then(pl.col(column).shift(k))


def last_n_lines(column: str, n: int, by: str) -> pl.Expr:
    """This row's line and up to n-1 before it, newest first, joined by newlines."""
    if n <= 0:
        return pl.lit(None, dtype=STR)
    parts = [pl.col(column)] + [masked_shift(column, k, by) for k in range(1, n)]
    return pl.concat_str(parts, separator="\n", ignore_nulls=True)


# --- catalog texts ---------------------------------------------------------------------


def card_texts(items: pl.LazyFrame) -> pl.LazyFrame:
    """Per item: the feed-card body ``title | id | price | top category`` (twin of ``render.card_line``)."""
    card = pl.concat_str(
        text_or(pl.col("title"), UNKNOWN_ITEM),
        pl.lit(" | id "),
        pl.col("item_id"),
        pl.lit(" | "),
        fmt_price(pl.col("price")),
        pl.lit(" | "),
        text_or(pl.col("category_l1"), "n/a"),
    )
    return items.select("item_id", pl.col("title").alias("_item_title"), card.alias("_card"))


def page_texts(items: pl.LazyFrame, settings: PromptSettings) -> pl.LazyFrame:
    """Per item: detail-page fields, parameters and aliased reviews (list open / page block)."""
    n = settings.review_chars
    review = clean(pl.element().fill_null(""))
    review = pl.when(review.str.len_chars() > n).then(review.str.slice(0, n) + "…").otherwise(review)
    alias = pl.concat_str(pl.lit("C"), (pl.int_range(pl.len()) + 1).cast(STR), pl.lit(": "), review)
    param = pl.concat_str(
        clean(pl.element().struct.field("label").fill_null("")),
        pl.lit(": "),
        clean(pl.element().struct.field("value").fill_null("")),
    )
    reviews = pl.col("reviews").fill_null(pl.lit([], dtype=pl.List(STR)))
    return items.select(
        "item_id",
        fmt_price(pl.col("price")).alias("_price"),
        text_or(pl.col("category"), "n/a").alias("_category"),
        pl.col("params").list.eval(param).list.join("; ").fill_null("").alias("_params"),
        reviews.list.head(settings.max_reviews).list.eval(alias).list.join("\n").alias("_reviews_list"),
        reviews.list.head(settings.inline_reviews).list.eval(alias).list.join("\n").alias("_reviews_inline"),
        reviews.list.len().alias("_n_reviews"),
    )


def item_texts(items: pl.LazyFrame, settings: PromptSettings) -> pl.LazyFrame:
    """Card and detail-page texts of every item in ``items`` (what ``build_records`` joins)."""
    return card_texts(items).join(page_texts(items, settings), on="item_id", how="left")


# --- per-step columns ----------------------------------------------------------------


def gold_action_json() -> pl.Expr:
    """Twin of ``render.gold_action`` + ``to_json`` (absent arguments omitted)."""
    action = pl.col("action")

    def field(name: str, value: pl.Expr) -> pl.Expr:
        return pl.concat_str(pl.lit(f',"{name}":'), value)

    target = (
        pl.when(action == "click")
        .then(json_str(clean(pl.col("_target_title"))))
        .when(action == "ipv_click_comment")
        .then(json_str(pl.col("review_alias")))
    )
    item = pl.when(action == "click").then(json_str(pl.col("target_item_id")))
    distance = pl.when(action.is_in(SCROLL_ACTIONS)).then(pl.col("distance").cast(STR))
    return pl.concat_str(
        pl.lit('{"type":'),
        json_str(action),
        field("target", target),
        field("target_item_id", item),
        field("distance", distance),
        pl.lit("}"),
        ignore_nulls=True,
    )


def visit_done_counts() -> list[pl.Expr]:
    """Per ipv action: how often it was done earlier in this detail-page visit."""
    visit = ["session_id", "_visit"]
    return [
        ((pl.col("action") == name).cast(pl.Int32).cum_sum().over(visit) - (pl.col("action") == name)).alias(
            f"_done_{name}"
        )
        for name in DONE_ACTIONS
    ]


def done_text() -> pl.Expr:
    parts = [
        pl.when(pl.col(f"_done_{name}") > 0).then(
            pl.concat_str(pl.lit(f"{name} x"), pl.col(f"_done_{name}").cast(STR))
        )
        for name in DONE_ACTIONS
    ]
    joined = pl.concat_str(parts, separator=", ", ignore_nulls=True)
    return pl.when(joined == "").then(pl.lit("nothing yet")).otherwise(joined)


def legality() -> list[pl.Expr]:
    """Boolean ``_ok_<action>`` per action: ``render.legal_actions`` as expressions."""
    feed, ipv = pl.col("screen") == "feed", pl.col("screen") == "ipv"
    top, top_max, page = pl.col("scroll_top"), pl.col("_max_scroll"), pl.col("ipv_scroll")
    feed_ok = {
        "scroll_down": top.is_null() | top_max.is_null() | (top < top_max),
        "scroll_up": top.is_null() | (top > 0),
        "click": pl.col("_n_visible") > 0,
    }
    ipv_ok = {
        "ipv_scroll_up": page.is_null() | (page > 0),
        "ipv_click_comment": pl.col("_n_shown") > 0,
    }
    out = [(feed & cond).fill_null(False).alias(f"_ok_{name}") for name, cond in feed_ok.items()]
    out += [(ipv & cond).fill_null(False).alias(f"_ok_{name}") for name, cond in ipv_ok.items()]
    always_ipv = ["ipv_scroll_down", "ipv_swipe_pic", "ipv_click_param", "ipv_enter_comment"]
    always_ipv += ["ipv_cart", "ipv_buy", "back_home"]
    out += [ipv.alias(f"_ok_{name}") for name in always_ipv]
    out.append(pl.lit(True).alias("_ok_end"))
    return out


def actions_text(settings: PromptSettings) -> pl.Expr:
    signatures = action_signatures(settings.geometry)
    order = [*signatures]  # feed actions, then ipv actions (render.legal_actions order per screen)
    feed_order = ["scroll_down", "scroll_up", "click", "end"]
    ipv_order = [a for a in order if a not in ("scroll_down", "scroll_up", "click", "end")] + ["end"]

    def signature(name: str) -> pl.Expr:
        if name == "click" and settings.click_ids:  # twin of render.click_ids_signature
            listed = pl.col("visible_items").list.eval(json_str(pl.element())).list.join(", ")
            return pl.concat_str(pl.lit('- click {"target_item_id": one of '), listed, pl.lit("}"))
        return pl.lit(f"- {signatures[name]}")

    def listing(names: list[str]) -> pl.Expr:
        lines = [pl.when(pl.col(f"_ok_{n}")).then(signature(n)) for n in names]
        return pl.concat_str(lines, separator="\n", ignore_nulls=True)

    return pl.when(pl.col("screen") == "feed").then(listing(feed_order)).otherwise(listing(ipv_order))


def summary_text() -> pl.Expr:
    """Twin of ``render.summarize``."""
    feed = pl.concat_str(
        pl.lit("feed at "),
        fmt_px(pl.col("scroll_top")),
        pl.lit(", "),
        pl.col("_n_visible").cast(STR),
        pl.lit(" items in view"),
    )
    ipv = pl.concat_str(
        pl.lit("detail page of "),
        text_or(pl.col("_ipv_title"), UNKNOWN_ITEM),
        pl.lit(" at "),
        fmt_px(pl.col("ipv_scroll")),
        pl.lit(", panel "),
        text_or(pl.col("ui_state"), "main"),
    )
    return pl.when(pl.col("screen") == "feed").then(feed).otherwise(ipv)


def window_line(mode: Mode) -> pl.Expr:
    """Twin of ``render.window_line``."""
    thought = pl.when(pl.col("rationale").is_not_null() & (pl.col("rationale") != "")).then(
        pl.concat_str(pl.lit(" | thought: "), clean(pl.col("rationale")))
    )
    step = pl.col("step").cast(STR)
    if mode == "cross":
        session = pl.col("ordinal").cast(STR)
        label = pl.concat_str(pl.lit("session "), session, pl.lit(" step "), step)
        head = pl.when(pl.col("_gap_s").is_not_null()).then(
            pl.concat_str(
                pl.lit("-- session "),
                session,
                pl.lit(" started "),
                fmt_gap(pl.col("_gap_s")),
                pl.lit(" after the previous one --\n"),
            )
        )
    else:
        label, head = pl.concat_str(pl.lit("step "), step), pl.lit(None, dtype=STR)
    return pl.concat_str(
        head,
        label,
        pl.lit(": "),
        pl.col("_summary"),
        thought,
        pl.lit(" | action: "),
        pl.col("action_json"),
        ignore_nulls=True,
    )


def window_text(size: int, by: str) -> pl.Expr:
    """Lines of the ``size`` previous steps of the trajectory, oldest first."""
    parts = [masked_shift("_line", k, by) for k in range(size, 0, -1)]
    if not parts:
        return pl.lit("(none yet)")
    joined = pl.concat_str(parts, separator="\n", ignore_nulls=True)
    return pl.when(joined == "").then(pl.lit("(none yet)")).otherwise(joined)


def observation_text(settings: PromptSettings) -> pl.Expr:
    """Twin of ``render.observation_text``."""
    feed_head = pl.concat_str(
        pl.lit("Screen: feed\nScroll position: "),
        fmt_px(pl.col("scroll_top")),
        pl.lit(" of max "),
        fmt_px(pl.col("_max_scroll")),
    )
    cards = pl.concat_str(
        pl.lit("\nItems in view ("), pl.col("_n_visible").cast(STR), pl.lit("):\n"), pl.col("_cards")
    )
    feed = pl.concat_str(
        feed_head, pl.when(pl.col("_n_visible") > 0).then(cards).otherwise(pl.lit("\nItems in view: none"))
    )
    params = pl.when(ui_has("param|spec")).then(
        pl.concat_str(
            pl.lit("\nParameters: "),
            pl.when(pl.col("_params").fill_null("") == "").then(pl.lit("none")).otherwise(pl.col("_params")),
        )
    )
    reviews = (
        pl.when(pl.col("_n_shown") > 0)
        .then(pl.concat_str(pl.lit("\nReviews (open one by its alias):\n"), pl.col("_reviews")))
        .when(ui_has("comment|review"))
        .then(pl.lit("\nReviews: none"))
    )
    ipv = pl.concat_str(
        pl.lit("Screen: detail page\nItem: "),
        text_or(pl.col("_ipv_title"), UNKNOWN_ITEM),
        pl.lit("\nPrice: "),
        pl.col("_price").fill_null("n/a"),
        pl.lit("\nCategory: "),
        pl.col("_category").fill_null("n/a"),
        pl.lit("\nPage position: "),
        fmt_px(pl.col("ipv_scroll")),
        pl.lit("\nOpen panel: "),
        text_or(pl.col("ui_state"), "main"),
        params,
        reviews,
        pl.lit("\nAlready done on this item: "),
        done_text(),
        ignore_nulls=True,
    )
    return pl.when(pl.col("screen") == "feed").then(feed).otherwise(ipv)


def profile_text() -> pl.Expr:
    parts = []
    for name in PROFILE_FIELDS:
        parts += [pl.lit(f"{name}: "), text_or(pl.col("profile").struct.field(name), "unknown")]
        parts.append(pl.lit("; "))
    extra = pl.col("profile_extra")
    other = pl.when(extra.is_not_null() & (extra != "") & (extra != "{}")).then(
        pl.concat_str(pl.lit("; other: "), clean(extra))
    )
    return pl.concat_str([*parts[:-1], other], ignore_nulls=True)


# --- recent clicks and purchases ------------------------------------------------------


def recent_blocks(
    steps: pl.DataFrame,
    order: pl.DataFrame,
    history: pl.DataFrame | None,
    mode: Mode,
    settings: PromptSettings,
) -> pl.DataFrame:
    """Per session: the recent purchase and click blocks (events strictly before its start)."""
    events = []
    if history is not None:
        events.append(history.select("user_id", "ts", "kind", "title"))
    if mode == "cross":
        events.append(
            steps.filter(pl.col("action").is_in(["click", "ipv_buy"])).select(
                "user_id",
                "ts",
                pl.when(pl.col("action") == "click")
                .then(pl.lit("click"))
                .otherwise(pl.lit("buy"))
                .alias("kind"),
                pl.when(pl.col("action") == "click")
                .then(pl.col("_target_title"))
                .otherwise(pl.col("_ipv_title"))
                .alias("title"),
            )
        )
    starts = order.select("session_id", "user_id", "start_ts").sort("start_ts")
    out = starts.select("session_id")
    for kind, limit, name in (
        ("buy", settings.recent_buys, "_buys"),
        ("click", settings.recent_clicks, "_clicks"),
    ):
        block = _latest_titles(events, kind, limit)
        joined = starts.join_asof(
            block,
            left_on="start_ts",
            right_on="ts",
            by="user_id",
            strategy="backward",
            allow_exact_matches=False,
            check_sortedness=False,  # both sides are sorted by time; users are the by-groups
        )
        out = out.join(joined.select("session_id", pl.col("_block").alias(name)), on="session_id", how="left")
    return out.with_columns(pl.col("_buys", "_clicks").fill_null("(none)"))


def _latest_titles(events: list[pl.DataFrame], kind: str, limit: int) -> pl.DataFrame:
    """As of each event: the ``limit`` latest titles of ``kind`` (newest first), one row per (user, ts)."""
    schema = {"user_id": STR, "ts": pl.Datetime("ms", "UTC"), "kind": STR, "title": STR}
    frames = [e.cast(schema) for e in events] or [pl.DataFrame(schema=schema)]
    rows = (
        pl.concat(frames)
        .filter(pl.col("kind") == kind)
        .with_columns(pl.col("title").fill_null("").alias("_key"))
        .sort("user_id", "ts", "_key")
        .with_columns(pl.concat_str(pl.lit("- "), text_or(pl.col("title"), UNKNOWN_ITEM)).alias("_entry"))
        .with_columns(last_n_lines("_entry", limit, "user_id").alias("_block"))
        .unique(["user_id", "ts"], keep="last", maintain_order=True)
    )
    return rows.select("user_id", "ts", "_block").sort("ts")


# --- assembly ----------------------------------------------------------------------------


def _cards(steps: pl.DataFrame, items: pl.DataFrame) -> pl.DataFrame:
    """Numbered card lines of the feed cards in view, per step row ``_row``."""
    lines = (
        steps.filter(pl.col("_n_visible") > 0)
        .select("_row", pl.col("visible_items").alias("item_id"))
        .with_columns(pl.int_ranges(1, pl.col("item_id").list.len() + 1).alias("_pos"))
        .explode("item_id", "_pos")
        .join(items.select("item_id", "_card"), on="item_id", how="left", maintain_order="left")
        .with_columns(
            pl.concat_str(
                pl.col("_pos").cast(STR),
                pl.lit(". "),
                pl.col("_card").fill_null(
                    pl.concat_str(pl.lit(f"{UNKNOWN_ITEM} | id "), pl.col("item_id"), pl.lit(" | n/a | n/a"))
                ),
            ).alias("_line")
        )
    )
    return lines.group_by("_row", maintain_order=True).agg(pl.col("_line").str.join("\n").alias("_cards"))


def prepare_steps(
    steps: pl.DataFrame, order: pl.DataFrame, items: pl.DataFrame, settings: PromptSettings
) -> pl.DataFrame:
    """Steps in chain order with the columns every text part needs."""
    ipv_items = items.select(
        pl.col("item_id").alias("ipv_item_id"),
        "_item_title",
        "_price",
        "_category",
        "_params",
        "_reviews_list",
        "_reviews_inline",
        "_n_reviews",
    )
    targets = items.select(pl.col("item_id").alias("target_item_id"), pl.col("_item_title").alias("_t_title"))
    viewport = settings.geometry.feed_viewport
    first_step = pl.col("step") == pl.col("step").min().over("session_id")
    frame = (
        steps.join(order.select("session_id", "ordinal", "gap_s", "feed_height"), on="session_id", how="left")
        .sort("user_id", "ordinal", "step")
        .join(ipv_items, on="ipv_item_id", how="left", maintain_order="left")
        .join(targets, on="target_item_id", how="left", maintain_order="left")
        .with_row_index("_row")
        .with_columns(
            pl.coalesce("_item_title", "ipv_item_title").alias("_ipv_title"),
            pl.coalesce("_t_title", "target_title").alias("_target_title"),
            pl.col("visible_items").list.len().fill_null(0).alias("_n_visible"),
            pl.col("_n_reviews").fill_null(0),
            pl.max_horizontal(pl.col("feed_height") - viewport, pl.lit(0)).alias("_max_scroll"),
            pl.when(first_step & (pl.col("ordinal") > 1)).then(pl.col("gap_s")).alias("_gap_s"),
            (
                (pl.col("action") == "click").cast(pl.Int32).cum_sum().over("session_id")
                - (pl.col("action") == "click")
            ).alias("_visit"),
        )
    )
    opened = ui_has("comment|review")  # the review list is open: it shows more than the page's block
    limit = pl.when(opened).then(settings.max_reviews).otherwise(settings.inline_reviews)
    frame = frame.with_columns(
        pl.when(pl.col("feed_height").is_null())
        .then(None)
        .otherwise(pl.col("_max_scroll"))
        .alias("_max_scroll"),
        pl.min_horizontal(pl.col("_n_reviews"), limit).alias("_n_shown"),
        pl.when(opened).then(pl.col("_reviews_list")).otherwise(pl.col("_reviews_inline")).alias("_reviews"),
    )
    cards = _cards(frame, items)
    return frame.join(cards, on="_row", how="left", maintain_order="left").with_columns(visit_done_counts())


def prompt_text(mode: Mode, settings: PromptSettings) -> pl.Expr:
    """Twin of ``render.render_prompt``: the user message."""
    return pl.concat_str(
        pl.lit("## Shopper profile\n"),
        profile_text(),
        pl.lit("\n\n## Recent purchases (newest first)\n"),
        pl.col("_buys"),
        pl.lit("\n\n## Recent clicks (newest first)\n"),
        pl.col("_clicks"),
        pl.lit(f"\n\n{window_header(mode, settings.window(mode))}\n"),
        pl.col("_window"),
        pl.lit("\n\n## Current observation\n"),
        observation_text(settings),
        pl.lit("\n\n## Executable actions\n"),
        actions_text(settings),
        pl.lit(f"\n\n{CLOSING}"),
    )


def blank_as_null(e: pl.Expr) -> pl.Expr:
    """A rationale of only whitespace is no rationale."""
    return pl.when(e.str.strip_chars() != "").then(e)


def gold_missing(quarantined: pl.Expr) -> pl.Expr:
    """Why a state has no gold response (see ``transforms.schemas.GOLD_MISSING``); null when it has one.

    ``quarantined`` is true where extraction rejected every answer for the state's rationale.
    """
    return (
        pl.when(pl.col("rationale").is_not_null())
        .then(pl.lit(None, dtype=STR))
        .when(quarantined.fill_null(False))
        .then(pl.lit("rationale_quarantined"))
        .otherwise(pl.lit("rationale_missing"))
    )


def response_text(settings: PromptSettings) -> pl.Expr:
    """Twin of ``render.response_json``: ``{"rationale": ..., "action": {...}}`` in the settings' key
    order, null without a gold rationale: an empty rationale is never a target."""
    action = pl.col("action_json")
    if settings.click_by == "id":
        by_id = pl.concat_str(
            pl.lit('{"type":"click","target_item_id":'), json_str(pl.col("target_item_id")), pl.lit("}")
        )
        named = (pl.col("action") == "click") & pl.col("target_item_id").is_not_null()
        action = pl.when(named).then(by_id).otherwise(action)
    reason = json_str(pl.col("rationale"))
    if settings.response_order == "action_first":
        parts = [pl.lit('{"action":'), action, pl.lit(',"rationale":'), reason, pl.lit("}")]
    else:
        parts = [pl.lit('{"rationale":'), reason, pl.lit(',"action":'), action, pl.lit("}")]
    response = pl.concat_str(parts)
    return pl.when(pl.col("gold_missing").is_null()).then(response)


def token_estimate(system_bytes: pl.Expr) -> pl.Expr:
    """ceil(bytes of system + prompt + response / 3); a missing response adds nothing."""
    text_bytes = pl.col("prompt").str.len_bytes() + pl.col("response").str.len_bytes().fill_null(0)
    return ((text_bytes + system_bytes + 2) // 3).cast(pl.Int32)


def gold_executable(settings: PromptSettings) -> pl.Expr:
    """Is the recorded action executable as shown? (diagnostic, never used to filter)."""
    action = pl.col("action")
    ok = pl.lit(False)
    for name in ("scroll_down", "scroll_up", "click", "end", *DONE_ACTIONS, "back_home"):
        ok = pl.when(action == name).then(pl.col(f"_ok_{name}")).otherwise(ok)
    alias_n = pl.col("review_alias").str.strip_prefix("C").cast(pl.Int64, strict=False)
    feed_max, ipv_max = settings.geometry.max_feed_scroll, settings.geometry.max_ipv_scroll
    dist = pl.col("distance")
    argument_ok = (
        pl.when(action == "click")
        .then(pl.col("visible_items").list.contains(pl.col("target_item_id")))
        .when(action == "ipv_click_comment")
        .then((alias_n >= 1) & (alias_n <= pl.col("_n_shown")))
        .when(action.is_in(["scroll_down", "scroll_up"]))
        .then((dist >= 1) & (dist <= feed_max))
        .when(action.is_in(["ipv_scroll_down", "ipv_scroll_up"]))
        .then((dist >= 1) & (dist <= ipv_max))
        .otherwise(pl.lit(True))
    )
    return (ok & argument_ok).fill_null(False)


def build_records(
    steps: pl.DataFrame,
    sessions: pl.DataFrame,
    items: pl.DataFrame,
    *,
    mode: Mode = "single",
    history: pl.DataFrame | None = None,
    rationales: pl.DataFrame | None = None,
    quarantined: pl.DataFrame | None = None,
    intents: pl.DataFrame | None = None,
    settings: PromptSettings | None = None,
) -> pl.DataFrame:
    """Records of ``steps`` (whole users) in ``mode``: RECORDS columns plus ``_executable``.

    ``items`` is ``item_texts(...)`` output; ``rationales`` has (session_id, step,
    rationale); ``quarantined`` has (session_id, step) of rationales extraction rejected;
    ``intents`` has (trajectory_id, intent) and reaches train rows only.
    """
    s = settings or PromptSettings()
    order = session_order(sessions.lazy()).collect()
    if mode == "cross":
        crossing = order.filter(pl.col("ordinal") == 2).select("user_id")
        order = order.join(crossing, on="user_id", how="semi")
        steps = steps.join(crossing, on="user_id", how="semi")
    trajectory = "user_id" if mode == "cross" else "session_id"
    frame = prepare_steps(steps, order, items, s)
    if rationales is not None:
        frame = frame.join(
            rationales.select("session_id", "step", "rationale"),
            on=["session_id", "step"],
            how="left",
            maintain_order="left",
        )
    else:
        frame = frame.with_columns(pl.lit(None, dtype=STR).alias("rationale"))
    frame = mark_quarantined(frame, quarantined).with_columns(
        blank_as_null(pl.col("rationale")).alias("rationale")
    )
    frame = frame.with_columns(
        gold_missing(pl.col("_quarantined")).alias("gold_missing"),
        gold_action_json().alias("action_json"),
        summary_text().alias("_summary"),
        *legality(),
    )
    frame = frame.with_columns(window_line(mode).alias("_line")).with_columns(
        window_text(s.window(mode), trajectory).alias("_window")
    )
    frame = frame.join(
        recent_blocks(frame, order, history, mode, s), on="session_id", how="left", maintain_order="left"
    )
    system = system_prompt(mode, s.geometry, s.system, s.response_order)
    frame = frame.with_columns(
        pl.concat_str(pl.col("session_id"), pl.lit(":"), pl.col("step").cast(STR)).alias("record_id"),
        pl.col(trajectory).alias("trajectory_id"),
        pl.lit(mode).alias("mode"),
        pl.lit(system).alias("system"),
        prompt_text(mode, s).alias("prompt"),
        response_text(s).alias("response"),
        gold_executable(s).alias("_executable"),
    )
    if intents is not None:
        frame = frame.join(
            intents.select("trajectory_id", "intent"), on="trajectory_id", how="left", maintain_order="left"
        )
    else:
        frame = frame.with_columns(pl.lit(None, dtype=STR).alias("intent"))
    return frame.with_columns(
        pl.when(pl.col("split") == "train").then(pl.col("intent")).alias("intent"),
        token_estimate(pl.lit(len(system.encode("utf-8")))).alias("token_estimate"),
    ).select([f.name for f in RECORDS] + ["_executable"])


def mark_quarantined(frame: pl.DataFrame, quarantined: pl.DataFrame | None) -> pl.DataFrame:
    """``_quarantined``: the row's (session_id, step) is among the ``quarantined`` rationales."""
    if quarantined is None:
        return frame.with_columns(pl.lit(False).alias("_quarantined"))
    keys = quarantined.select("session_id", pl.col("step").cast(frame.schema["step"])).unique()
    marked = keys.with_columns(pl.lit(True).alias("_quarantined"))
    return frame.join(marked, on=["session_id", "step"], how="left", maintain_order="left")


# --- the lake: chunked writing and export --------------------------------------------------


def recorded_prompt_settings(lake: str | Path) -> PromptSettings:
    """The prompt settings the lake's records were rendered with, so the evaluation shows a trained
    simulator the prompts it was trained on (window sizes, recent lists); the geometry is always the
    ingest's. Defaults for a lake whose records stage recorded none."""
    manifest = read_manifest(lake, "records")
    settings = PromptSettings(**((manifest and manifest.settings) or {}))
    return settings.model_copy(update={"geometry": recorded_settings(lake).geometry})


class RecordsSummary(BaseModel):
    """What a records run produced; written to the run manifest."""

    prompt_version: str = PROMPT_VERSION
    modes: list[str] = []
    records: int = 0
    by_mode_split: dict[str, int] = {}
    gold_not_executable: dict[str, int] = {}  # "<mode>/<action>": recorded action not executable as shown
    token_estimate_max: int = 0
    token_estimate_mean: float = 0.0
    chunks: int = 0
    with_rationale: int = 0
    with_intent: int = 0
    gold_missing: dict[str, int] = {}  # states without a gold response, by reason (GOLD_MISSING)
    settings: dict[str, Any] = {}
    # per user, mode and action: the not-executable states behind ``gold_not_executable``
    _not_executable: list[pl.DataFrame] = PrivateAttr(default_factory=list)
    _token_estimate_sum: int = PrivateAttr(default=0)  # the mean's exact numerator, so parts merge exactly

    @classmethod
    def merged(
        cls, parts: list[RecordsSummary], modes: list[str], settings: dict[str, Any]
    ) -> RecordsSummary:
        """One summary of several renderings' parts (a bucket each): totals added, the mean of the
        token estimates over all their records."""
        whole = cls(modes=modes, settings=settings)
        for part in parts:
            whole.records += part.records
            whole.chunks += part.chunks
            whole.with_rationale += part.with_rationale
            whole.with_intent += part.with_intent
            whole.token_estimate_max = max(whole.token_estimate_max, part.token_estimate_max)
            whole._token_estimate_sum += part._token_estimate_sum
            whole.by_mode_split = _added(whole.by_mode_split, part.by_mode_split)
            whole.gold_missing = _added(whole.gold_missing, part.gold_missing)
            whole.gold_not_executable = _added(whole.gold_not_executable, part.gold_not_executable)
            whole._not_executable.extend(part._not_executable)
        if whole.records:
            whole.token_estimate_mean = round(whole._token_estimate_sum / whole.records, 1)
        return whole

    def add(self, frame: pl.DataFrame) -> None:
        """Fold one chunk of built records into the totals."""
        self._count(frame)
        bad = frame.filter(~pl.col("_executable")).group_by("user_id", "mode", "action").len("n")
        self._add_not_executable(bad)

    def add_kept(self, frame: pl.DataFrame, not_executable: pl.DataFrame) -> None:
        """Fold in records kept from an earlier rendering, with their users' not-executable counts."""
        self._count(frame)
        self._add_not_executable(not_executable)

    def not_executable_by_user(self) -> pl.DataFrame:
        return pl.concat([empty_not_executable(), *self._not_executable], how="vertical_relaxed")

    def _add_not_executable(self, bad: pl.DataFrame) -> None:
        bad = bad.select(empty_not_executable().columns).cast(dict(empty_not_executable().schema))
        self._not_executable.append(bad)
        for mode, action, n in bad.group_by("mode", "action").agg(pl.col("n").sum()).iter_rows():
            key = f"{mode}/{action}"
            self.gold_not_executable[key] = self.gold_not_executable.get(key, 0) + n
        self.gold_not_executable = dict(sorted(self.gold_not_executable.items()))

    def _count(self, frame: pl.DataFrame) -> None:
        total = self.records + frame.height
        if frame.height:
            self._token_estimate_sum += int(frame["token_estimate"].sum())
            self.token_estimate_mean = round(self._token_estimate_sum / total, 1)
            self.token_estimate_max = max(self.token_estimate_max, int(frame["token_estimate"].max()))  # type: ignore[arg-type]
        self.records, self.chunks = total, self.chunks + 1
        self.with_rationale += int(frame["rationale"].is_not_null().sum())
        self.with_intent += int(frame["intent"].is_not_null().sum())
        for reason, n in frame.drop_nulls("gold_missing").group_by("gold_missing").len().iter_rows():
            self.gold_missing[reason] = self.gold_missing.get(reason, 0) + n
        for mode, split, n in frame.group_by("mode", "split").len().iter_rows():
            key = f"{mode}/{split}"
            self.by_mode_split[key] = self.by_mode_split.get(key, 0) + n
        self.by_mode_split = dict(sorted(self.by_mode_split.items()))


def _added(mine: dict[str, int], theirs: dict[str, int]) -> dict[str, int]:
    keys = sorted({*mine, *theirs})
    return {key: mine.get(key, 0) + theirs.get(key, 0) for key in keys}


def user_chunks(steps: pl.DataFrame, max_states: int) -> Iterator[pl.Series]:
    """Whole users (sorted ids) in groups of about ``max_states`` steps: bounds memory per chunk."""
    counts = steps.group_by("user_id").len("n").sort("user_id")
    chunked = counts.with_columns(
        ((pl.col("n").cum_sum() - pl.col("n")) // max(max_states, 1)).alias("_chunk")
    )
    for _, part in chunked.group_by("_chunk", maintain_order=True):
        yield part["user_id"]


def needed_items(lake: str | Path, settings: PromptSettings) -> pl.DataFrame:
    """``item_texts`` of the items some step of ``lake`` shows (``items_shown``)."""
    return items_shown(scan_table(lake, "steps"), scan_table(lake, "items"), settings)


def items_shown(steps: pl.LazyFrame, items: pl.LazyFrame, settings: PromptSettings) -> pl.DataFrame:
    """``item_texts`` of the items ``steps`` show: cards for those in view or clicked, detail-page
    texts only for those opened (the catalog can be far larger than what was seen)."""
    seen = steps.select(
        pl.concat([pl.col("visible_items").explode(), pl.col("target_item_id"), pl.col("ipv_item_id")])
        .drop_nulls()
        .unique()
        .alias("item_id")
    )
    opened = steps.select(pl.col("ipv_item_id").drop_nulls().unique().alias("item_id"))
    shown = items.join(seen, on="item_id", how="semi").collect()
    pages = page_texts(shown.lazy().join(opened, on="item_id", how="semi"), settings)
    return card_texts(shown.lazy()).join(pages, on="item_id", how="left").collect()


def quarantined_rationales(lake: str | Path) -> pl.DataFrame | None:
    """(session_id, step) of every state whose rationale extraction quarantined, else None.

    Extraction's quarantine rows name their state by ``record_id`` in the payload.
    """
    folder = table_dir(lake, "quarantine") / f"stage={EXTRACT_STAGE}"
    files = sorted(folder.glob("*.parquet")) if folder.is_dir() else []
    if not files:
        return None
    record_id = pl.col("payload").str.json_path_match("$.record_id")
    parts = record_id.str.extract_groups(r"^(?<session_id>.*):(?<step>\d+)$")
    return (
        pl.scan_parquet(files, hive_partitioning=False)
        .select(parts.alias("_key"))
        .unnest("_key")
        .drop_nulls()
        .select("session_id", pl.col("step").cast(pl.Int32))
        .unique()
        .collect()
    )


def optional_table(lake: str | Path, name: str, columns: list[str], where: pl.Expr) -> pl.DataFrame | None:
    """The rows ``where`` selects of an extraction output (``rationales``, ``intents``) when that stage
    has run, else None.

    Both hold accepted rows only: rejected answers go to quarantine.
    """
    return scan_table(lake, name, columns).filter(where).collect() if table_files(lake, name) else None


def _write_part(frame: pl.DataFrame, root: Path, name: str, zstd_level: int) -> None:
    path = root / f"bucket={frame['bucket'][0]}" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    # small row groups: a record is a few KB of text, readers stream them
    pq.write_table(
        conform(frame, RECORDS), path, compression="zstd", compression_level=zstd_level, row_group_size=8192
    )


def write_records(
    lake: str | Path,
    *,
    modes: list[str] | tuple[str, ...] = MODES,
    settings: PromptSettings | None = None,
    chunk_states: int = 100_000,
    zstd_level: int = 3,
    out: str | Path | None = None,
    with_extraction: bool = True,
    only_users: pl.Series | None = None,
    keep: KeptRendering | None = None,
) -> RecordsSummary:
    """(Re)write the ``records`` table from the lake, bucket by bucket and whole users at a time,
    atomically; into the lake-shaped folder ``out`` instead when given (a stage's staging folder).
    ``with_extraction`` False renders the states as before any extraction (no rationales, responses
    or intents, whatever the lake holds): the prompts extraction shows an LLM, the same on every run.

    ``only_users`` renders those users alone; with ``keep`` (an earlier rendering made with the same
    settings) every other user's records are kept from it, so the table is the one a full rendering
    of the lake would write. The buckets here render one after another; ``flows.buckets`` spreads the
    same ``render_bucket`` calls over a task runner."""
    rendering = RecordsRendering(
        lake=str(lake), staged=str(records_staging(Path(out) if out is not None else Path(lake))),
        modes=list(modes), settings=settings or PromptSettings(), chunk_states=chunk_states,
        zstd_level=zstd_level, with_extraction=with_extraction, only_users=only_users,
    )  # fmt: skip
    try:
        parts = [render_bucket(files, rendering) for files in bucket_files(lake, "steps")]
        return finish_records(rendering, parts, keep)
    finally:
        shutil.rmtree(rendering.staged, ignore_errors=True)


@dataclass(frozen=True)
class RecordsRendering:
    """What every bucket of one rendering shares: the lake it reads, the staging folder its buckets
    write into (``bucket=K/`` each), and the settings. Paths and small values only: it travels to
    whichever process renders a bucket."""

    lake: str
    staged: str
    modes: list[str]
    settings: PromptSettings
    chunk_states: int = 100_000
    zstd_level: int = 3
    with_extraction: bool = True
    only_users: pl.Series | None = None


def records_staging(target: Path) -> Path:
    return target / STAGING / f"records-{uuid.uuid4().hex[:8]}"


def render_bucket(bucket: Sequence[str | Path], rendering: RecordsRendering) -> RecordsSummary:
    """Render the users of one bucket (its ``steps`` files) into ``rendering.staged``, whole users at
    a time; every other table is read for those users alone."""
    r, lake = rendering, rendering.lake
    summary = RecordsSummary(modes=r.modes, settings=r.settings.model_dump())
    steps = pl.read_parquet(list(bucket), hive_partitioning=False)
    if r.only_users is not None:
        steps = steps.filter(pl.col("user_id").is_in(r.only_users.implode()))
    if steps.height == 0:
        return summary
    users = steps["user_id"].unique().implode()
    items = items_shown(steps.lazy(), scan_table(lake, "items"), r.settings)
    sessions = scan_table(lake, "sessions").filter(pl.col("user_id").is_in(users)).collect()
    history = None
    if table_files(lake, "history"):
        history = scan_table(lake, "history").filter(pl.col("user_id").is_in(users)).collect()
    rationales = intents = quarantined = None
    if r.with_extraction:
        session_ids = sessions["session_id"].implode()
        rationales = optional_table(
            lake, "rationales", ["session_id", "step", "rationale"], pl.col("session_id").is_in(session_ids)
        )
        # a trajectory is a session (single mode) or a user (cross mode)
        ours = pl.col("trajectory_id").is_in(session_ids) | pl.col("trajectory_id").is_in(users)
        intents = optional_table(lake, "intents", ["trajectory_id", "mode", "intent_text"], ours)
        quarantined = quarantined_rationales(lake) if rationales is not None else None
    for chunk_no, chunk_users in enumerate(user_chunks(steps, r.chunk_states)):
        mine = pl.col("user_id").is_in(chunk_users.implode())
        chunk = steps.filter(mine)
        for mode in r.modes:
            built = build_records(
                chunk,
                sessions.filter(mine),
                items,
                mode=mode,  # type: ignore[arg-type]
                history=None if history is None else history.filter(mine),
                rationales=rationales,
                quarantined=quarantined,
                intents=_for_mode(intents, mode),
                settings=r.settings,
            )
            summary.add(built)
            if built.height:
                _write_part(built, Path(r.staged), f"part-{chunk_no}-{mode}.parquet", r.zstd_level)
    return summary


def finish_records(
    rendering: RecordsRendering, parts: list[RecordsSummary], keep: KeptRendering | None = None
) -> RecordsSummary:
    """The reduce of a rendering: the buckets' summaries as one, the kept users' files beside the
    rendered ones (``keep``), and the staged table swapped in as ``records`` of the target folder
    (the parent of the staging folder's ``.staging``)."""
    staged = Path(rendering.staged)
    target = staged.parent.parent
    summary = RecordsSummary.merged(parts, rendering.modes, rendering.settings.model_dump())
    if keep is not None and rendering.only_users is not None:
        keep.copy_into(staged, rendering.only_users, summary, rendering.zstd_level)
    if summary.records == 0:
        write_table(target, "records", polars_schema(RECORDS).to_frame())
        shutil.rmtree(staged, ignore_errors=True)
    else:
        swap_into_place(staged, table_dir(target, "records"))
    return summary


#: the records columns a summary counts
SUMMARY_COLUMNS = ("user_id", "mode", "split", "token_estimate", "rationale", "intent", "gold_missing")


@dataclass(frozen=True)
class KeptRendering:
    """An earlier rendering's records table and its per-user not-executable counts: the rows of users
    not rendered again are taken from it."""

    table: Path
    not_executable: pl.DataFrame

    def copy_into(self, staged: Path, replaced: pl.Series, summary: RecordsSummary, zstd_level: int) -> None:
        """Kept files are linked (or copied) into ``staged`` under their bucket, a file with replaced
        users rewritten without their rows."""
        for path, rows in files_without_users(self.table, replaced):
            target = staged / path.relative_to(self.table).with_name(f"kept-{path.name}")
            target.parent.mkdir(parents=True, exist_ok=True)
            if rows is None:
                _link_or_copy(path, target)
                rows = pl.read_parquet(path, columns=list(SUMMARY_COLUMNS), hive_partitioning=False)
            elif rows.height:
                _write_part(rows, staged, target.name, zstd_level)
            else:
                continue
            users = rows["user_id"].unique().implode()
            summary.add_kept(rows, self.not_executable.filter(pl.col("user_id").is_in(users)))


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:  # another filesystem, or one without hard links
        shutil.copy2(source, target)


def _for_mode(intents: pl.DataFrame | None, mode: str) -> pl.DataFrame | None:
    if intents is None:
        return None
    return intents.filter(pl.col("mode") == mode).select(
        "trajectory_id", pl.col("intent_text").alias("intent")
    )


def chat_lines(records: pl.LazyFrame) -> pl.LazyFrame:
    """One JSON object per record in the conversational prompt-completion form, ``{"record_id": ...,
    "prompt": [system, user], "completion": [assistant]}``: TRL's ``SFTTrainer`` then trains on the
    completion only (its default for that form), where a ``messages`` line would teach the prompt too
    unless the model's chat template marks the assistant's turn; the id traces a line to its state."""

    def message(role: str, content: str) -> pl.Expr:
        return pl.struct(pl.lit(role).alias("role"), pl.col(content).alias("content"))

    prompt = pl.concat_list([message("system", "system"), message("user", "prompt")])
    completion = pl.concat_list([message("assistant", "response")])
    line = pl.struct(
        pl.col("record_id"), prompt.alias("prompt"), completion.alias("completion")
    ).struct.json_encode()
    return records.select(line.alias("line"), pl.col("token_estimate"))


class ExportSummary(BaseModel):
    """What a chat-JSONL export wrote, and what it left out for want of a gold response."""

    path: str
    lines: int = 0
    left_out: dict[str, int] = {}  # by GOLD_MISSING reason
    # a trainer's sequence limit below this cuts the answer off the longest lines (TRL's default: 1024)
    longest_token_estimate: int = 0

    def describe_left_out(self) -> str:
        reasons = ", ".join(f"{n:,} {reason}" for reason, n in sorted(self.left_out.items()))
        return f"left out {sum(self.left_out.values()):,} states without a gold rationale: {reasons}"


class NothingToTrainOn(ValueError):
    """The export found no state with a gold response: nothing was written."""

    def __init__(self, message: str, summary: ExportSummary) -> None:
        super().__init__(message)
        self.summary = summary


def export_chat_jsonl(
    lake: str | Path,
    path: str | Path,
    *,
    splits: list[str] | None = None,
    modes: list[str] | None = None,
) -> ExportSummary:
    """Write the records that have a gold response as chat JSONL (one part file at a time; atomic
    rename); states without one are left out and counted by reason.

    Raises ``NothingToTrainOn`` (writing nothing) when no selected state has a gold response,
    e.g. before extraction. The privileged intent is never exported: it is teacher-only context.
    """
    target = Path(path)
    summary = ExportSummary(path=str(target))
    with atomic_file(target) as temporary:
        with temporary.open("w", encoding="utf-8") as out:
            for part in table_files(lake, "records"):
                frame = _selected(_records_part(part), splits, modes)
                _count_left_out(frame, summary.left_out)
                chosen = chat_lines(frame.filter(pl.col("gold_missing").is_null())).collect()
                for line in chosen["line"]:
                    out.write(line)
                    out.write("\n")
                summary.lines += chosen.height
                longest = chosen["token_estimate"].max()
                summary.longest_token_estimate = max(summary.longest_token_estimate, int(longest or 0))
        if summary.lines == 0:
            raise NothingToTrainOn(_nothing_to_train_on(summary, splits, modes), summary)
    return summary


def _records_part(path: Path) -> pl.LazyFrame:
    frame = pl.scan_parquet(path, hive_partitioning=False)
    if "gold_missing" not in frame.collect_schema():
        # without the column an empty rationale could not be told from a gold one
        raise ValueError(f"{path} predates records' gold_missing column: re-run `trajforge records` first")
    return frame


def _selected(frame: pl.LazyFrame, splits: list[str] | None, modes: list[str] | None) -> pl.LazyFrame:
    if splits:
        frame = frame.filter(pl.col("split").is_in(splits))
    if modes:
        frame = frame.filter(pl.col("mode").is_in(modes))
    return frame


def _count_left_out(frame: pl.LazyFrame, counts: dict[str, int]) -> None:
    missing = frame.drop_nulls("gold_missing").group_by("gold_missing").len().collect()
    for reason, n in missing.iter_rows():
        counts[reason] = counts.get(reason, 0) + n


def _nothing_to_train_on(summary: ExportSummary, splits: list[str] | None, modes: list[str] | None) -> str:
    chosen = f"split {','.join(splits) if splits else 'all'}, mode {','.join(modes) if modes else 'all'}"
    unwritten = f"{summary.path} was not written"
    if not summary.left_out:
        return f"nothing to train on: the lake has no records for {chosen}; {unwritten}"
    hint = (
        "run `trajforge extract` first"
        if "rationale_missing" in summary.left_out
        else "the quarantine (stage extract) says why every answer was rejected"
    )
    return (
        f"nothing to train on yet: no state of {chosen} has a gold rationale; "
        f"{summary.describe_left_out()}; {hint}; {unwritten}"
    )
