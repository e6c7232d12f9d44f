"""Trace files as Polars frames, for scoring: both formats (ours and the reference's) in the same columns.

The scoring half of :mod:`evaluation.traces` (whose records write and read small files with pydantic
alone): DuckDB reads the JSONL with a declared schema, Polars shapes it. Every name here is also
reachable as ``evaluation.traces.NAME``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import duckdb
import polars as pl

from evaluation.traces import (
    OUR_REPLAY_KEYS,
    OUR_ROLLOUT_KEYS,
    REJECT_REASONS,
    KeyLevel,
    TraceFormat,
    TraceFormatError,
    first_unknown_key,
)
from transforms.schemas import ACTIONS, IPV_ACTIONS, SCREENS

# --- frames -------------------------------------------------------------------------------------

SESSION_SCHEMA = pl.Schema(
    {
        "session_id": pl.String,
        "user_id": pl.String,
        "terminated": pl.Boolean,
        "truncated": pl.Boolean,
        "termination_reason": pl.String,
        "prior_clicks": pl.Int64,
        "prior_buys": pl.Int64,
        "recent_click_categories": pl.List(pl.String),
    }
)
STEP_SCHEMA = pl.Schema(
    {
        "session_id": pl.String,
        "step": pl.Int64,
        "screen": pl.String,
        "action": pl.String,
        "target_item_id": pl.String,
        "review_alias": pl.String,
        "accepted": pl.Boolean,
        "reject_reason": pl.String,
        "item_category": pl.String,
        "item_price": pl.Float64,
    }
)
REPLAY_SCHEMA = pl.Schema(
    {
        "session_id": pl.String,
        "step_index": pl.Int64,
        "screen": pl.String,
        "gt_action": pl.String,
        "gt_target_item_id": pl.String,
        "gt_target_title": pl.String,
        "gt_review_alias": pl.String,
        "pred_action": pl.String,
        "pred_target_item_id": pl.String,
        "pred_target_title": pl.String,
        "pred_review_alias": pl.String,
        "accepted": pl.Boolean,
        "reject_reason": pl.String,
        "unscored_reason": pl.String,
    }
)
REPLAY_TARGETS: tuple[str, ...] = (
    "gt_target_item_id",
    "gt_target_title",
    "gt_review_alias",
    "pred_target_item_id",
    "pred_target_title",
    "pred_review_alias",
)


@dataclass(frozen=True)
class TraceFrames:
    """Rollout traces as two frames: one row per session (file order kept) and one per step."""

    sessions: pl.DataFrame  # SESSION_SCHEMA
    steps: pl.DataFrame  # STEP_SCHEMA, ordered by session then step


def _first_record(path: Path) -> dict | None:
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                return json.loads(line)
    return None


def detect_rollout_format(record: dict) -> TraceFormat:
    """Ours carries ``user_id``; the reference's episodes carry ``visitor_id`` or ``kind: rollout``."""
    if "user_id" in record:
        return "ours"
    if "visitor_id" in record or record.get("kind") == "rollout":
        return "reference"
    raise TraceFormatError(
        "not a rollout trace: a line has neither user_id (ours) nor visitor_id (reference); "
        f"keys {sorted(record)}"
    )


def detect_replay_format(record: dict) -> TraceFormat:
    """Ours carries ``accepted`` and ``screen``; the reference's carries ``layer`` and the check flags."""
    if "accepted" in record and "gt_action" in record:
        return "ours"
    if "gt_action" in record:
        return "reference"
    raise TraceFormatError(f"not a replay trace: a line has no gt_action; keys {sorted(record)}")


def duckdb_type(dtype: pl.DataType) -> str:
    """The DuckDB spelling of a (nested) Polars type, for reading JSON with a declared schema."""
    if isinstance(dtype, pl.List):
        return f"{duckdb_type(dtype.inner)}[]"
    if isinstance(dtype, pl.Struct):
        return "STRUCT(" + ", ".join(f'"{f.name}" {duckdb_type(f.dtype)}' for f in dtype.fields) + ")"
    names = {pl.String: "VARCHAR", pl.Int64: "BIGINT", pl.Boolean: "BOOLEAN", pl.Float64: "DOUBLE"}
    return names[dtype.base_type()]


def read_jsonl(path: Path, schema: pl.Schema) -> pl.DataFrame:
    """JSONL into a frame of exactly ``schema``: keys outside it are ignored, missing ones are null.

    DuckDB's reader parses nested JSON on every core, several times faster than the alternatives here.
    """
    columns = "{" + ", ".join(f"'{name}': '{duckdb_type(dtype)}'" for name, dtype in schema.items()) + "}"
    source = str(path).replace("'", "''")
    query = f"SELECT * FROM read_json('{source}', format = 'newline_delimited', columns = {columns})"
    try:
        frame = duckdb.connect().sql(query).pl()
    except duckdb.Error as err:
        raise TraceFormatError(f"{path}: {err}") from err
    return frame.cast(dict(schema))


def _keys_sql(level: KeyLevel) -> str:
    """The keys of a line's objects of ``level`` as one DuckDB list (of every element's, for a list)."""
    keys = f"json_keys(json, '{level.json_path}')"
    return f"flatten({keys})" if level.many else keys


def unknown_key_counts(path: Path, levels: tuple[KeyLevel, ...]) -> dict[str, int]:
    """How many objects hold each key their level does not declare, by the key's place in a line
    (``{'profile.clicks': 12}``). DuckDB lists the keys on every core: checking a file takes about as
    long as reading it into frames."""
    source = str(path).replace("'", "''")
    per_level = " UNION ALL ".join(
        f"SELECT {index} AS level, key, count(*) FROM (SELECT unnest({_keys_sql(level)}) AS key FROM lines) "
        "GROUP BY ALL"
        for index, level in enumerate(levels)
    )
    query = f"WITH lines AS (SELECT json FROM read_ndjson_objects('{source}')) {per_level} ORDER BY ALL"
    try:
        rows = duckdb.connect().sql(query).fetchall()
    except duckdb.Error as err:
        raise TraceFormatError(f"{path}: {err}") from err
    return {levels[index].path_of(key): n for index, key, n in rows if key not in levels[index].keys}


def named_counts(counts: dict[str, int]) -> str:
    """``profile.clicks (12), steps[].foo (3)``: keys with how many objects hold them."""
    return ", ".join(f"{name} ({n})" for name, n in counts.items())


def refuse_unknown_keys(path: Path, levels: tuple[KeyLevel, ...]) -> None:
    """Stop on the first line holding a key its format does not declare, naming the line, the key and
    the nearest declared one (and every other such key of the file, so that one run lists them all)."""
    unknown = unknown_key_counts(path, levels)
    if not unknown:
        return
    first = first_unknown_key(path, levels) or f"{path}: unknown keys"
    in_all = named_counts(unknown)
    raise TraceFormatError(f"{first}; unknown keys in the file: {in_all}" if len(unknown) > 1 else first)


def price_from_text(text: pl.Expr) -> pl.Expr:
    """First number in a price as logged ('129', '129.9', '¥129.9'); None when there is none."""
    return text.str.extract(r"(\d+(?:\.\d+)?)", 1).cast(pl.Float64)


def _empty_to_null(column: pl.Expr) -> pl.Expr:
    return pl.when(column.str.strip_chars() == "").then(None).otherwise(column)


def _explode_steps(raw: pl.DataFrame) -> pl.DataFrame:
    return (
        raw.select("session_id", pl.col("steps"))
        .explode("steps")
        .filter(pl.col("steps").is_not_null())
        .unnest("steps")
        .with_columns(pl.int_range(pl.len()).over("session_id").alias("step"))
    )


def _screen_of(action: pl.Expr) -> pl.Expr:
    """Screen of an action when a file leaves it out (``end`` is taken to be on the feed)."""
    ipv_only = [a for a in IPV_ACTIONS if a != "end"]
    return pl.when(action.is_in(ipv_only)).then(pl.lit("ipv")).otherwise(pl.lit("feed"))


# a step as written: the frame's columns less the keys, with the price read as text (see price_from_text)
_OUR_STEP = pl.Struct(
    {
        name: pl.String if name == "item_price" else dtype
        for name, dtype in STEP_SCHEMA.items()
        if name not in ("session_id", "step")
    }
)
_OUR_ROLLOUT = pl.Schema(
    {
        "session_id": pl.String,
        "user_id": pl.String,
        "terminated": pl.Boolean,
        "truncated": pl.Boolean,
        "termination_reason": pl.String,
        "profile": pl.Struct(
            {"prior_clicks": pl.Int64, "prior_buys": pl.Int64, "recent_click_categories": pl.List(pl.String)}
        ),
        "steps": pl.List(_OUR_STEP),
    }
)
_REF_STEP = pl.Struct(
    {
        "layer": pl.String,
        "action": pl.String,
        "executed": pl.Boolean,
        "parse_ok": pl.Boolean,
        "legal": pl.Boolean,
        "target_resolved": pl.Boolean,
        "reject_reason": pl.String,
        "target_item_id": pl.String,
        "target_alias": pl.String,
        "item_price": pl.String,
        "item_cate": pl.String,
    }
)
_REF_ROLLOUT = pl.Schema(
    {
        "session_id": pl.String,
        "visitor_id": pl.String,
        "terminated": pl.Boolean,
        "truncated": pl.Boolean,
        "termination_reason": pl.String,
        "profile": pl.Struct(
            {
                "visitor_id": pl.String,
                "click_history": pl.Int64,
                "buy_history": pl.Int64,
                "history_categories": pl.List(pl.String),
            }
        ),
        "steps": pl.List(_REF_STEP),
    }
)
# the keys PROTOCOL.md §5 gives the reference's lines beyond those read above: written for its own use
# and left unread (what is inside attributes, environment_state and usage is its own, not checked)
_REF_UNREAD_SESSION = {"kind", "source", "max_steps", "model", "error"}
_REF_UNREAD_PROFILE = {"history_price_mean", "attributes"}
_REF_UNREAD_STEP = {"index", "screen_type", "target_title", "raw_output", "available_actions",
                    "visible_item_ids", "environment_state", "usage"}  # fmt: skip
_REF_ROLLOUT_KEYS = (
    KeyLevel("session", frozenset(_REF_ROLLOUT) | _REF_UNREAD_SESSION),
    KeyLevel(
        "profile", frozenset(_REF_ROLLOUT["profile"].to_schema()) | _REF_UNREAD_PROFILE, under="profile"
    ),
    KeyLevel("step", frozenset(_REF_STEP.to_schema()) | _REF_UNREAD_STEP, under="steps", many=True),
)
ROLLOUT_KEYS: dict[TraceFormat, tuple[KeyLevel, ...]] = {
    "ours": OUR_ROLLOUT_KEYS,
    "reference": _REF_ROLLOUT_KEYS,
}


def _our_rollout(raw: pl.DataFrame) -> TraceFrames:
    sessions = raw.select(
        "session_id",
        "user_id",
        pl.col("terminated").fill_null(False),
        pl.col("truncated").fill_null(False),
        "termination_reason",
        pl.col("profile").struct.field("prior_clicks").fill_null(0),
        pl.col("profile").struct.field("prior_buys").fill_null(0),
        pl.col("profile").struct.field("recent_click_categories").fill_null([]),
    )
    steps = _explode_steps(raw).with_columns(
        pl.col("accepted").fill_null(True),
        price_from_text(pl.col("item_price")).alias("item_price"),
    )
    return TraceFrames(sessions.cast(dict(SESSION_SCHEMA)), steps.select(STEP_SCHEMA.names()))


def _reference_reject_reason(action: pl.Expr, executed: pl.Expr) -> pl.Expr:
    """Our reason code for a step the reference did not execute: the first failed check flag in
    PROTOCOL §2 order, else its reason text read as a code (it writes prose such as "action is not
    available on Feed" or "cannot resolve click target"), else ``not_executed``."""
    passed = lambda name: pl.col(name).fill_null(True)  # noqa: E731 - a missing check flag means it passed
    text = _empty_to_null(pl.col("reject_reason"))
    lowered = text.str.to_lowercase()
    from_text = (
        pl.when(text.is_in(REJECT_REASONS))
        .then(text)
        .when(lowered.str.contains("not available"))
        .then(pl.lit("illegal_in_state"))
        .when(lowered.str.contains("cannot resolve"))
        .then(pl.lit("target_unresolved"))
        .otherwise(text)
    )
    return (
        pl.when(~passed("parse_ok"))
        .then(pl.lit("parse_failure"))
        .when(~action.is_in(ACTIONS) | action.is_null())
        .then(pl.lit("unknown_action"))
        .when(~passed("legal"))
        .then(pl.lit("illegal_in_state"))
        .when(~passed("target_resolved"))
        .then(pl.lit("target_unresolved"))
        .when(text.is_not_null())
        .then(from_text)
        .when(~executed.fill_null(True))
        .then(pl.lit("not_executed"))
    )


# the reference's termination reasons where they name the same thing by another word
REFERENCE_TERMINATION = {
    "invalid_action_retry_exhausted": "invalid_retry_exhausted",
    "evaluation_error": "error",
}


def _reference_rollout(raw: pl.DataFrame) -> TraceFrames:
    profile = pl.col("profile")
    sessions = raw.select(
        "session_id",
        pl.coalesce(
            _empty_to_null(pl.col("visitor_id")),
            _empty_to_null(profile.struct.field("visitor_id")),
            pl.col("session_id"),
        ).alias("user_id"),
        pl.col("terminated").fill_null(False),
        pl.col("truncated").fill_null(False),
        _empty_to_null(pl.col("termination_reason"))
        .replace(REFERENCE_TERMINATION)
        .alias("termination_reason"),
        profile.struct.field("click_history").fill_null(0).alias("prior_clicks"),
        profile.struct.field("buy_history").fill_null(0).alias("prior_buys"),
        profile.struct.field("history_categories").fill_null([]).alias("recent_click_categories"),
    )
    accepted = (
        pl.all_horizontal(
            pl.col(c).fill_null(True) for c in ("executed", "parse_ok", "legal", "target_resolved")
        )
        & pl.col("action").is_in(ACTIONS)
        & (pl.col("reject_reason").fill_null("") == "")
    )
    steps = _explode_steps(raw).with_columns(
        pl.coalesce(_empty_to_null(pl.col("layer")), _screen_of(pl.col("action"))).alias("screen"),
        accepted.alias("accepted"),
        pl.when(accepted)
        .then(None)
        .otherwise(_reference_reject_reason(pl.col("action"), pl.col("executed")))
        .alias("reject_reason"),
        _empty_to_null(pl.col("target_alias")).alias("review_alias"),
        _empty_to_null(pl.col("item_cate")).alias("item_category"),
        _empty_to_null(pl.col("target_item_id")).alias("target_item_id"),
        price_from_text(pl.col("item_price")).alias("item_price"),
    )
    return TraceFrames(sessions.cast(dict(SESSION_SCHEMA)), steps.select(STEP_SCHEMA.names()))


def load_traces(path: str | Path, strict: bool = True) -> TraceFrames:
    """Rollout traces (ours or the reference's, detected from the first line) as frames.

    ``strict``: a key the format does not declare stops the read (see :func:`refuse_unknown_keys`);
    otherwise such keys are left unread, and :func:`dropped_keys` counts them."""
    path = Path(path)
    first = _first_record(path)
    if first is None:
        return TraceFrames(pl.DataFrame(schema=SESSION_SCHEMA), pl.DataFrame(schema=STEP_SCHEMA))
    trace_format = detect_rollout_format(first)
    if strict:
        refuse_unknown_keys(path, ROLLOUT_KEYS[trace_format])
    if trace_format == "ours":
        frames = _our_rollout(read_jsonl(path, _OUR_ROLLOUT))
    else:
        frames = _reference_rollout(read_jsonl(path, _REF_ROLLOUT))
    _refuse(path, frames.sessions, ~pl.col("session_id").is_unique() | pl.col("session_id").is_null(),
            "sessions without a session_id, or sharing one")  # fmt: skip
    _refuse(path, frames.steps, pl.col("accepted") & ~pl.col("screen").is_in(SCREENS),
            "accepted steps on no known screen (feed or ipv)")  # fmt: skip
    _refuse(path, frames.steps, pl.col("accepted") & ~pl.col("action").is_in(ACTIONS),
            "accepted steps with an action outside the 13")  # fmt: skip
    return frames


def _refuse(path: Path, frame: pl.DataFrame, bad: pl.Expr, what: str) -> None:
    """Stop on rows that no metric could place, naming how many and the first one's session."""
    rows = frame.filter(bad.fill_null(True))
    if rows.height:
        raise TraceFormatError(f"{path}: {rows.height} {what} (first in session {rows['session_id'][0]!r})")


_REF_REPLAY = pl.Schema(
    {
        "session_id": pl.String,
        "step_index": pl.Int64,
        "layer": pl.String,
        "gt_action": pl.String,
        "pred_action": pl.String,
        "gt_target_item_id": pl.String,
        "pred_target_item_id": pl.String,
        "gt_target_title": pl.String,
        "pred_target_title": pl.String,
        "gt_target_alias": pl.String,
        "pred_target_alias": pl.String,
        "parse_ok": pl.Boolean,
        "legal": pl.Boolean,
        "target_resolved": pl.Boolean,
        "reject_reason": pl.String,
        "prediction_present": pl.Boolean,
    }
)
_REF_REPLAY_KEYS = (KeyLevel("replay step", frozenset(_REF_REPLAY) | {"raw_output", "model"}),)
REPLAY_KEYS: dict[TraceFormat, tuple[KeyLevel, ...]] = {
    "ours": OUR_REPLAY_KEYS,
    "reference": _REF_REPLAY_KEYS,
}


def _reference_replay(raw: pl.DataFrame) -> pl.DataFrame:
    accepted = (
        pl.all_horizontal(
            pl.col(c).fill_null(True) for c in ("prediction_present", "parse_ok", "legal", "target_resolved")
        )
        & pl.col("pred_action").is_in(ACTIONS)
        & (pl.col("reject_reason").fill_null("") == "")
    )
    missing = ~pl.col("prediction_present").fill_null(True)
    reason = (
        pl.when(missing)
        .then(pl.lit("missing_prediction"))
        .otherwise(_reference_reject_reason(pl.col("pred_action"), pl.lit(True)))
    )
    return raw.with_columns(
        pl.coalesce(_empty_to_null(pl.col("layer")), _screen_of(pl.col("gt_action"))).alias("screen"),
        pl.col("gt_target_alias").alias("gt_review_alias"),
        pl.col("pred_target_alias").alias("pred_review_alias"),
        accepted.alias("accepted"),
        pl.when(accepted).then(None).otherwise(reason).alias("reject_reason"),
        pl.lit(None, pl.String).alias("unscored_reason"),
    ).select(REPLAY_SCHEMA.names())


def load_replay(path: str | Path, strict: bool = True) -> pl.DataFrame:
    """Replay steps (ours or the reference's, detected from the first line) as one frame; ``strict`` as
    for :func:`load_traces`."""
    path = Path(path)
    first = _first_record(path)
    if first is None:
        return pl.DataFrame(schema=REPLAY_SCHEMA)
    trace_format = detect_replay_format(first)
    if strict:
        refuse_unknown_keys(path, REPLAY_KEYS[trace_format])
    if trace_format == "ours":
        frame = read_jsonl(path, REPLAY_SCHEMA).with_columns(pl.col("accepted").fill_null(False))
    else:
        frame = _reference_replay(read_jsonl(path, _REF_REPLAY))
    _refuse(
        path,
        frame,
        ~pl.col("gt_action").is_in(ACTIONS),
        "replay rows whose recorded action is not one of the 13",
    )
    _refuse(path, frame, ~pl.col("screen").is_in(SCREENS), "replay rows on no known screen (feed or ipv)")
    # an empty target is no target: it must not match another empty one
    return frame.with_columns(_empty_to_null(pl.col(name)).alias(name) for name in REPLAY_TARGETS)


def dropped_keys(path: str | Path, kind: Literal["rollout", "replay"]) -> dict[str, int]:
    """What a lenient read (``strict=False``) of a rollout or replay file leaves unread: how many objects
    hold each undeclared key, by its place in a line; {} for a file that reads strictly."""
    path = Path(path)
    first = _first_record(path)
    if first is None:
        return {}
    if kind == "rollout":
        return unknown_key_counts(path, ROLLOUT_KEYS[detect_rollout_format(first)])
    return unknown_key_counts(path, REPLAY_KEYS[detect_replay_format(first)])


# --- real traces from the lake ------------------------------------------------------------------

RECENT_CLICKS = 20  # recent click categories kept in a profile, as the prompt's recent clicks


def _prior_events(steps: pl.DataFrame, items: pl.DataFrame, history: pl.DataFrame | None) -> pl.DataFrame:
    """Every click and purchase of every user with its time and category: the pre-window history and
    the lake's own steps, sorted by user then time."""
    category = items.select("item_id", "category")
    logged = steps.filter(pl.col("action").is_in(["click", "ipv_buy"])).select(
        "user_id",
        "ts",
        pl.when(pl.col("action") == "click").then(pl.lit("click")).otherwise(pl.lit("buy")).alias("kind"),
        pl.coalesce("target_item_id", "ipv_item_id").alias("item_id"),
    )
    events = [logged.join(category, on="item_id", how="left").drop("item_id")]
    if history is not None:
        events.append(
            history.filter(pl.col("kind").is_in(["click", "buy"])).select("user_id", "ts", "kind", "category")
        )
    return pl.concat(events, how="vertical_relaxed").sort("user_id", "ts")


def _profiles(steps: pl.DataFrame, items: pl.DataFrame, history: pl.DataFrame | None) -> pl.DataFrame:
    """Per session: clicks and purchases strictly before its first step, and the categories of the
    RECENT_CLICKS latest of those clicks, newest first."""
    events = _prior_events(steps, items, history).with_columns(
        (pl.col("kind") == "click").cast(pl.Int64).cum_sum().over("user_id").alias("clicks_before"),
        (pl.col("kind") == "buy").cast(pl.Int64).cum_sum().over("user_id").alias("buys_before"),
    )
    click_categories = (
        events.filter(pl.col("kind") == "click")
        .group_by("user_id")
        .agg(pl.col("category").alias("all_clicks"))
    )
    starts = steps.group_by("session_id").agg(pl.col("user_id").first(), pl.col("ts").min().alias("start"))
    counted = starts.sort("start").join_asof(
        events.select("user_id", "ts", "clicks_before", "buys_before").sort("ts"),
        left_on="start",
        right_on="ts",
        by="user_id",
        strategy="backward",
        allow_exact_matches=False,
        check_sortedness=False,  # both sides are sorted by time; users are the by-groups
    )
    prior_clicks = pl.col("clicks_before").fill_null(0)
    window_start = pl.max_horizontal(prior_clicks - RECENT_CLICKS, pl.lit(0))
    recent = (
        pl.col("all_clicks")
        .list.slice(window_start, prior_clicks - window_start)
        .list.reverse()
        .list.drop_nulls()
        .fill_null([])
    )
    return counted.join(click_categories, on="user_id", how="left").select(
        "session_id",
        "user_id",
        "start",
        pl.struct(
            prior_clicks.alias("prior_clicks"),
            pl.col("buys_before").fill_null(0).alias("prior_buys"),
            recent.alias("recent_click_categories"),
        ).alias("profile"),
    )


def real_trace_frame(
    steps: pl.DataFrame,
    items: pl.DataFrame,
    history: pl.DataFrame | None = None,
    sessions: pl.DataFrame | None = None,
) -> tuple[pl.DataFrame, dict[str, int]]:
    """The lake's sessions as real traces (one row per session, the :class:`Trace` shape, by start time),
    and how many sessions were left out because ingest cut them, by cut reason.

    ``steps`` needs session_id, user_id, step, ts, screen, action, target_item_id, review_alias and
    ipv_item_id; ``sessions`` (optional) its ``cut_reason`` where ingest cut a session after a bad event.
    A cut session is no reference for a whole rollout, so it is left out and counted.
    """
    left_out: dict[str, int] = {}
    if sessions is not None and "cut_reason" in sessions.columns:
        cut = sessions.filter(pl.col("cut_reason").is_not_null())
        left_out = dict(cut.group_by("cut_reason").len().sort("cut_reason").iter_rows())
        steps = steps.join(cut.select("session_id"), on="session_id", how="anti")
    item_facts = items.select(
        "item_id", pl.col("category").alias("item_category"), pl.col("price").alias("item_price")
    )
    step_rows = (
        steps.sort("session_id", "step")
        .with_columns(
            pl.when(pl.col("action") == "click")
            .then(pl.col("target_item_id"))
            .when(pl.col("screen") == "ipv")
            .then(pl.col("ipv_item_id"))
            .alias("item_id")
        )
        .join(item_facts, on="item_id", how="left", maintain_order="left")
        .group_by("session_id", maintain_order=True)
        .agg(
            pl.struct(
                "screen",
                "action",
                pl.col("item_id").alias("target_item_id"),
                "review_alias",
                pl.lit(True).alias("accepted"),
                pl.lit(None, pl.String).alias("reject_reason"),
                "item_category",
                "item_price",
                pl.lit(None, pl.String).alias("raw_output"),
            ).alias("steps"),
            pl.col("action").last().alias("last_action"),
        )
    )
    traces = (
        _profiles(steps, items, history)
        .join(step_rows, on="session_id")
        .sort("start", "session_id")
        .select(
            "session_id",
            "user_id",
            pl.lit("real").alias("source"),
            pl.lit(True).alias("terminated"),  # real sessions are never truncated
            pl.lit(False).alias("truncated"),
            pl.when(pl.col("last_action") == "end").then(pl.lit("end")).alias("termination_reason"),
            "profile",
            "steps",
        )
    )
    return traces, left_out


# --- why requests went unanswered ---------------------------------------------------------------

_UNANSWERED_COLUMNS: dict[str, tuple[str, str]] = {
    "rollout": ("termination_reason", "error"),  # an episode ended by its unanswered request
    "replay": ("reject_reason", "error"),  # a replayed step without a prediction
}
NO_ERROR_TEXT = "(no error text)"


def unanswered_errors(path: str | Path, kind: Literal["rollout", "replay"]) -> dict[str, int]:
    """What the unanswered requests of one of our trace files failed with: each error text with how
    many failed so, the most common first."""
    path = Path(path)
    if _first_record(path) is None:
        return {}
    reason, error = _UNANSWERED_COLUMNS[kind]
    frame = read_jsonl(path, pl.Schema({reason: pl.String, error: pl.String}))
    texts = frame.filter(pl.col(reason) == "error")[error].fill_null(NO_ERROR_TEXT)
    counts = texts.value_counts(sort=True, name="n").sort(["n", error], descending=[True, False])
    return dict(counts.iter_rows())
