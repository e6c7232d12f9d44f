"""Declared Arrow schemas: the single source of truth for every table.

Readers cast to the raw schemas, writers write the lake schemas, validation
suites and docs are generated from them. Timestamps are UTC milliseconds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:
    import polars as pl

# --- the behavioural vocabulary (PROTOCOL.md §1) ---------------------------

FEED_ACTIONS: tuple[str, ...] = ("scroll_down", "scroll_up", "click", "end")
IPV_ACTIONS: tuple[str, ...] = (
    "ipv_scroll_down",
    "ipv_scroll_up",
    "ipv_swipe_pic",
    "ipv_click_param",
    "ipv_enter_comment",
    "ipv_click_comment",
    "ipv_cart",
    "ipv_buy",
    "back_home",
    "end",
)
ACTIONS: tuple[str, ...] = (
    "scroll_down",
    "scroll_up",
    "click",
    "end",
    "ipv_scroll_down",
    "ipv_scroll_up",
    "ipv_swipe_pic",
    "ipv_click_param",
    "ipv_enter_comment",
    "ipv_click_comment",
    "ipv_cart",
    "ipv_buy",
    "back_home",
)
SCREENS: tuple[str, ...] = ("feed", "ipv")
SCROLL_ACTIONS: tuple[str, ...] = ("scroll_down", "scroll_up", "ipv_scroll_down", "ipv_scroll_up")
TERMINAL_STATES: tuple[str, ...] = ("purchase", "truncated", "cart_only", "browse_only")
SPLITS: tuple[str, ...] = ("train", "val", "test")
PROFILE_FIELDS: tuple[str, ...] = (
    "age_band",
    "gender",
    "city_tier",
    "purchase_power",
    "member_level",
    "lifecycle",
)
ACTION_GROUPS: dict[str, str] = {
    "scroll_down": "feed_navigation",
    "scroll_up": "feed_navigation",
    "click": "feed_click",
    "end": "termination",
    "back_home": "transition",
    "ipv_scroll_down": "ipv_browse",
    "ipv_scroll_up": "ipv_browse",
    "ipv_swipe_pic": "ipv_media",
    "ipv_click_param": "ipv_information",
    "ipv_enter_comment": "ipv_information",
    "ipv_click_comment": "ipv_information",
    "ipv_cart": "conversion",
    "ipv_buy": "conversion",
}

TS = pa.timestamp("ms", tz="UTC")
PARAM = pa.struct([("label", pa.string()), ("value", pa.string())])

# --- raw log bundle (DATA.md "Input") --------------------------------------
# Required columns must be present in every part file; optional ones may be
# absent and are then filled with nulls. Extra columns are kept only where a
# table says so (profiles keeps extra attribute columns).

RAW_PROFILES = pa.schema([("user_id", pa.string())] + [(name, pa.string()) for name in PROFILE_FIELDS])
RAW_ITEMS = pa.schema(
    [
        ("item_id", pa.string()),
        ("title", pa.string()),
        ("price", pa.float64()),
        ("category", pa.string()),  # "L1-L2-L3"
        ("params", pa.list_(PARAM)),
        ("reviews", pa.list_(pa.string())),
        ("image", pa.string()),
    ]
)
RAW_FEEDS = pa.schema(
    [
        ("page_view_id", pa.string()),
        ("item_id", pa.string()),
        ("x", pa.float64()),  # CSS px, often fractional; optional
        ("y", pa.float64()),
        ("width", pa.float64()),  # optional: Geometry.default_card_width when absent
        ("height", pa.float64()),  # optional: Geometry.default_card_height when absent
        ("feed_height", pa.float64()),
    ]
)
RAW_EVENTS = pa.schema(
    [
        ("event_id", pa.string()),
        ("user_id", pa.string()),
        ("page_view_id", pa.string()),
        ("ts", TS),
        ("screen", pa.string()),  # feed | ipv
        ("action", pa.string()),
        ("item_id", pa.string()),  # clicked card on feed, open item on ipv
        ("scroll_top", pa.float64()),  # feed offset before the action, CSS px
        ("scroll_delta", pa.float64()),  # px moved by a scroll (feed or ipv)
        ("ipv_scroll", pa.float64()),  # detail-page offset before the action
        ("review_index", pa.int32()),  # 0-based review opened by ipv_click_comment
        ("ui_state", pa.string()),  # detail-page panels, e.g. "main", "params", "comments"
        ("image", pa.string()),
        ("visible_items", pa.list_(pa.string())),  # optional: logged viewport content
    ]
)
RAW_HISTORY = pa.schema(
    [
        ("user_id", pa.string()),
        ("ts", TS),
        ("kind", pa.string()),  # click | buy
        ("title", pa.string()),
        ("category", pa.string()),
    ]
)

RAW_TABLES: dict[str, pa.Schema] = {
    "profiles": RAW_PROFILES,
    "items": RAW_ITEMS,
    "feeds": RAW_FEEDS,
    "events": RAW_EVENTS,
    "history": RAW_HISTORY,
}
RAW_REQUIRED: dict[str, tuple[str, ...]] = {
    "profiles": ("user_id",),
    "items": ("item_id", "title", "price", "category"),
    "feeds": ("page_view_id", "item_id", "y", "feed_height"),  # x, width, height: see align.check_feeds
    "events": ("event_id", "user_id", "page_view_id", "ts", "screen", "action"),
    "history": ("user_id", "ts", "kind", "title"),
}
OPTIONAL_TABLES: tuple[str, ...] = ("history",)

# --- the lake (DATA.md "Outputs") ------------------------------------------

PROFILE = pa.struct([(name, pa.string()) for name in PROFILE_FIELDS])

STEPS = pa.schema(
    [
        ("session_id", pa.string()),
        ("user_id", pa.string()),
        ("step", pa.int32()),
        ("ts", TS),
        ("screen", pa.string()),
        ("action", pa.string()),
        ("action_group", pa.string()),
        ("target_item_id", pa.string()),  # click: the opened card
        ("target_title", pa.string()),
        ("review_alias", pa.string()),  # ipv_click_comment: "C1", "C2", ...
        ("distance", pa.int32()),  # scrolls: px moved, positive, rounded (align.scroll_distance)
        ("scroll_top", pa.float64()),  # feed offset before the action, exact CSS px
        ("visible_items", pa.list_(pa.string())),  # feed cards in view, in reading order
        ("visible_source", pa.string()),  # "logged" | "layout"
        ("ipv_item_id", pa.string()),  # detail page open on ipv steps
        ("ipv_item_title", pa.string()),
        ("ipv_scroll", pa.float64()),
        ("ui_state", pa.string()),
        ("profile", PROFILE),
        ("profile_extra", pa.string()),  # JSON object of extra profile columns
        ("profile_missing", pa.bool_()),
        ("image", pa.string()),
        ("split", pa.string()),
        ("bucket", pa.int32()),
    ]
)
SESSIONS = pa.schema(
    [
        ("session_id", pa.string()),
        ("user_id", pa.string()),
        ("start_ts", TS),
        ("end_ts", TS),
        ("length", pa.int32()),
        ("clicks", pa.int32()),
        ("carts", pa.int32()),
        ("buys", pa.int32()),
        ("feed_steps", pa.int32()),
        ("ended", pa.bool_()),
        ("terminal", pa.string()),
        ("cut_reason", pa.string()),  # reject reason of the event the session was cut at; null: not cut
        ("categories", pa.list_(pa.string())),  # top categories of clicked items, first-seen order
        ("top_category", pa.string()),  # most clicked top category, else most shown in the first 10 cards
        ("feed_items", pa.int32()),
        ("feed_height", pa.float64()),
        ("profile_missing", pa.bool_()),
        ("split", pa.string()),
        ("bucket", pa.int32()),
    ]
)
FEED_LAYOUTS = pa.schema(
    [
        ("session_id", pa.string()),
        ("item_id", pa.string()),
        ("rank", pa.int32()),  # reading order: by y then x
        ("x", pa.float64()),  # CSS px; null when the log gave no x
        ("y", pa.float64()),
        ("width", pa.float64()),
        ("height", pa.float64()),
        ("feed_height", pa.float64()),
        ("bucket", pa.int32()),
    ]
)
ITEMS = pa.schema(
    [
        ("item_id", pa.string()),
        ("title", pa.string()),
        ("price", pa.float64()),
        ("category", pa.string()),
        ("category_l1", pa.string()),
        ("category_l2", pa.string()),
        ("category_l3", pa.string()),
        ("params", pa.list_(PARAM)),
        ("reviews", pa.list_(pa.string())),
        ("image", pa.string()),
    ]
)
PROFILES = pa.schema(
    [
        ("user_id", pa.string()),
        ("profile", PROFILE),
        ("profile_extra", pa.string()),
        ("split", pa.string()),
    ]
)
HISTORY = pa.schema(
    [
        ("user_id", pa.string()),
        ("ts", TS),
        ("kind", pa.string()),
        ("title", pa.string()),
        ("category", pa.string()),
        ("split", pa.string()),  # the user's split, as on every other table
    ]
)
QUARANTINE = pa.schema(
    [
        ("stage", pa.string()),
        ("table_name", pa.string()),  # the input table the row came from
        ("source_file", pa.string()),  # relative to the bundle root
        ("source_row", pa.int64()),  # 0-based row (or line) within source_file
        ("reason", pa.string()),
        ("detail", pa.string()),
        ("payload", pa.string()),  # the row as JSON, identifiers re-keyed
        ("kept", pa.bool_()),  # true: only flagged (row kept downstream); false: rejected
    ]
)

#: why a state has no gold response (``records.gold_missing``; its ``response`` is then null):
#: ``rationale_missing``: no rationale for the state yet (extraction has not run, or stopped before
#: it: a re-run fills it); ``rationale_quarantined``: extraction rejected every answer (see quarantine)
GOLD_MISSING: tuple[str, ...] = ("rationale_missing", "rationale_quarantined")
RECORDS = pa.schema(
    [
        ("record_id", pa.string()),  # "<session_id>:<step>"
        ("session_id", pa.string()),
        ("user_id", pa.string()),
        ("step", pa.int32()),
        ("trajectory_id", pa.string()),  # session_id (single mode) or user_id (cross mode)
        ("mode", pa.string()),  # single | cross
        ("system", pa.string()),  # system message: role, action space, response format
        ("prompt", pa.string()),  # user message: profile, history, window, observation, actions
        ("action", pa.string()),  # gold action label (one of the 13)
        ("action_json", pa.string()),  # gold action object, e.g. {"type":"click","target":"..."}
        ("rationale", pa.string()),  # first-person reason; null until extraction fills it
        # gold response JSON {"rationale": ..., "action": {...}}; null when the state has no gold
        # rationale yet, and then gold_missing says why (a trainer keeps rows where it is null)
        ("response", pa.string()),
        ("gold_missing", pa.string()),  # null | rationale_missing | rationale_quarantined
        ("intent", pa.string()),  # privileged trajectory intent text: train split only, once extracted
        ("split", pa.string()),
        ("token_estimate", pa.int32()),
        ("bucket", pa.int32()),
    ]
)

HISTORIES = pa.schema(
    [
        ("user_id", pa.string()),
        ("session_ids", pa.list_(pa.string())),  # by start_ts, ties by session_id
        ("start_ts", pa.list_(TS)),
        ("gaps_s", pa.list_(pa.float64())),  # n-1: next start - previous end, s, overlaps -> 0
        ("continues", pa.list_(pa.bool_())),  # n-1: same top_category as the previous session
        ("top_categories", pa.list_(pa.string())),  # sessions.top_category, per session
        ("lengths", pa.list_(pa.int32())),  # actions per session
        ("n_sessions", pa.int32()),
        ("n_actions", pa.int32()),
        ("n_clicks", pa.int32()),
        ("n_carts", pa.int32()),
        ("n_buys", pa.int32()),
        ("n_continuations", pa.int32()),
        ("n_overlaps", pa.int32()),  # adjacent pairs whose page views overlap in time
        ("first_ts", TS),
        ("last_ts", TS),
        ("cross_session", pa.bool_()),  # n_sessions >= 2: the cross-session setting
        ("split", pa.string()),
        ("bucket", pa.int32()),
    ]
)

INTENT_ANCHOR = pa.struct([("type", pa.string()), ("text", pa.string()), ("confidence", pa.float64())])
INTENTS = pa.schema(
    [
        ("trajectory_id", pa.string()),  # session_id (single mode) or user_id (cross mode)
        ("mode", pa.string()),  # single | cross
        ("user_id", pa.string()),
        ("session_ids", pa.list_(pa.string())),  # the trajectory's sessions, in order
        ("split", pa.string()),  # always "train": intents are extracted from the training split only
        ("anchors", pa.list_(INTENT_ANCHOR)),  # typed anchors (EXTRACTION.md)
        ("intent_text", pa.string()),  # rendered text the teacher sees (records.intent)
        ("backend", pa.string()),  # openai | heuristic
        ("model", pa.string()),  # served model name, or "rules" for the heuristic backend
        ("prompt_version", pa.string()),
        ("prompt_hash", pa.string()),
        ("request_key", pa.string()),  # cache key of the accepted answer (null for the heuristic)
        ("tokens_in", pa.int64()),
        ("tokens_out", pa.int64()),
        ("attempts", pa.int32()),  # answers asked for: 1 + re-asks
        ("cached", pa.bool_()),  # every answer came from the response cache
        ("leakage_verdict", pa.string()),  # "clean": the kept answer passed the checker (rejects: quarantine)
        ("violations", pa.list_(pa.string())),  # codes found in rejected earlier answers
        ("bucket", pa.int32()),
    ]
)
RATIONALES = pa.schema(
    [
        ("record_id", pa.string()),  # "<session_id>:<step>"
        ("session_id", pa.string()),
        ("user_id", pa.string()),
        ("step", pa.int32()),
        ("action", pa.string()),
        ("rationale", pa.string()),
        ("split", pa.string()),
        ("backend", pa.string()),
        ("model", pa.string()),
        ("prompt_version", pa.string()),
        ("prompt_hash", pa.string()),
        ("request_key", pa.string()),
        ("tokens_in", pa.int64()),
        ("tokens_out", pa.int64()),
        ("attempts", pa.int32()),
        ("cached", pa.bool_()),
        ("checks_passed", pa.list_(pa.string())),  # names of the checks the text passed
        ("violations", pa.list_(pa.string())),  # codes found in rejected earlier answers
        ("bucket", pa.int32()),
    ]
)

LAKE_TABLES: dict[str, pa.Schema] = {
    "steps": STEPS,
    "sessions": SESSIONS,
    "feed_layouts": FEED_LAYOUTS,
    "items": ITEMS,
    "profiles": PROFILES,
    "history": HISTORY,
    "quarantine": QUARANTINE,
    "records": RECORDS,
    "histories": HISTORIES,
    "intents": INTENTS,
    "rationales": RATIONALES,
}
#: per lake table, per column: the function that gives the column its values (module paths under
#: ``transforms`` unless they name ``extractors``). "as logged" columns are the raw field, typed by
#: ``readers.coerce``; ids are re-keyed by ``ingest.keying.key_part`` (``pseudonyms`` for the small
#: tables); ``split`` and ``bucket`` derive from the user's pseudonym alone.
_SESSION_AND_USER = {"session_id": "align.build_steps (page_view_id)", "user_id": "as logged"}
_PLACEMENT = {"split": "rekey.split_of", "bucket": "rekey.bucket_of"}
_PROVENANCE = dict.fromkeys(
    ("backend", "model", "prompt_version", "prompt_hash", "request_key", "tokens_in", "tokens_out"),
    "extractors.pipeline._provenance",
) | dict.fromkeys(("attempts", "cached"), "extractors.pipeline._provenance")
BORN_IN: dict[str, dict[str, str]] = {
    "steps": {
        **_SESSION_AND_USER,
        "step": "align.build_steps",
        "ts": "as logged",
        "screen": "as logged",
        "action": "align.map_actions (as logged, through action_map)",
        "action_group": "align.build_steps",
        "target_item_id": "align.build_steps",
        "target_title": "align.build_steps",
        "review_alias": "align.build_steps",
        "distance": "align.scroll_distance (in align._feed_legality)",
        "scroll_top": "as logged (detail-page steps: align._detail_page_legality)",
        "visible_items": "align.visible_cards (or as logged: align.screen_checks)",
        "visible_source": "align.screen_checks",
        "ipv_item_id": "align.build_steps",
        "ipv_item_title": "align.build_steps",
        "ipv_scroll": "align.build_steps",
        "ui_state": "align.build_steps",
        "profile": "align.profile_columns",
        "profile_extra": "align.profile_columns",
        "profile_missing": "align.profile_context",
        "image": "as logged",
        **_PLACEMENT,
    },
    "sessions": {
        **_SESSION_AND_USER,
        **dict.fromkeys(
            ("start_ts", "end_ts", "length", "clicks", "carts", "buys", "feed_steps", "ended", "terminal"),
            "align.build_sessions",
        ),
        "cut_reason": "align.cut_sessions",
        **dict.fromkeys(("categories", "top_category", "feed_items"), "align.build_sessions"),
        "feed_height": "align.layouts",
        "profile_missing": "align.profile_context",
        **_PLACEMENT,
    },
    "feed_layouts": {
        "session_id": "ingest.alignment.align_part (page_view_id)",
        "item_id": "as logged",
        "rank": "align.layouts",
        **dict.fromkeys(("x", "y", "width", "height"), "as logged (defaults: readers.coerce)"),
        "feed_height": "align.layouts",
        "bucket": "rekey.bucket_of",
    },
    "items": {
        **dict.fromkeys(ITEMS.names, "align.build_items"),
    },
    "profiles": {
        "user_id": "as logged",
        "profile": "align.profile_columns",
        "profile_extra": "align.profile_columns",
        "split": "rekey.split_of",
    },
    "history": {
        **dict.fromkeys(("user_id", "ts", "kind", "title", "category"), "as logged"),
        "split": "rekey.split_of",
    },
    "quarantine": {
        "stage": "lake.write_quarantine",
        **dict.fromkeys(
            ("table_name", "source_file", "source_row", "reason", "detail", "payload"), "readers.reject_rows"
        ),
        "kept": "ingest.accounting.ingest_quarantine",
    },
    "records": {
        **dict.fromkeys(RECORDS.names, "records.build_records"),
        **_PLACEMENT,
    },
    "histories": {
        **dict.fromkeys(HISTORIES.names, "chain.chain"),
        "continues": "chain.continuation",
        **_PLACEMENT,
    },
    "intents": {
        **dict.fromkeys(INTENTS.names, "extractors.pipeline.intents_frame"),
        **_PROVENANCE,
        "bucket": "rekey.bucket_of",
    },
    "rationales": {
        **dict.fromkeys(RATIONALES.names, "extractors.pipeline.rationales_frame"),
        **_PROVENANCE,
        "bucket": "rekey.bucket_of",
    },
}
# Tables partitioned by user bucket (hive layout bucket=K/); the rest are single files.
PARTITIONED: tuple[str, ...] = ("steps", "sessions", "feed_layouts", "records")


def polars_schema(schema: pa.Schema) -> pl.Schema:
    """The Polars form of a declared Arrow schema (straight from the schema: no table, no pandas)."""
    import polars as pl  # here, not at the top: the rollout path imports these names without polars

    return pl.Schema(schema)
