"""Expectation suites per table, declared as data next to the table schemas.

One :class:`TableSuite` per table: the declared Arrow schema it checks (from
``transforms.schemas``, the single source of truth), its keys, the Polars
helper columns it needs and its checks. A :class:`Check` names one Great
Expectations 1.x expectation class with its arguments, plus our gate semantics:

* ``severity``: ``error`` stops the flow (nothing is rewritten or quarantined);
  ``warn`` lets it go on and reports.
* ``level``: ``row`` means a failing row is bad on its own: a failing ``warn``
  check moves the row to quarantine (reason ``expectation:<check name>``);
  ``table`` means the failure says something about the table as a whole and is
  only reported (or stops the flow). Steps, sessions, items and feed layouts
  are never routed row by row: a step removed from its session would break the
  session's contiguity, so their checks are errors: ingest quarantines bad
  events before they become steps, and a failing check there means a bug.

Great Expectations has no Polars or DuckDB engine: the gate validates
Arrow-backed pandas frames (``pd.ArrowDtype``) in batches. What a built-in
expectation cannot say over one pandas batch (uniqueness across batches,
contiguous steps, a click target among the visible items, timestamps ordered
within a session) is computed first over the whole table as a boolean Polars
helper column, which a check then expects to be ``True``.

Every lake table also gets a generated ``<table>.schema`` suite: one row per
column (declared type, observed Parquet type), checked for missing, extra and
mistyped columns before any data is loaded. GE's own type checks on pandas see
only the Python scalar type of an Arrow column (``int`` for int32 and int64),
so exact Arrow types are compared this way.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any, Literal

import polars as pl
import pyarrow as pa

from transforms import schemas as S
from transforms.config import IngestSettings
from transforms.readers import MAX_FIELD_CHARS

#: Bump when a check changes meaning; the suite version also carries a hash of the spec.
SUITES_VERSION = "1"

Severity = Literal["error", "warn"]
Level = Literal["row", "table"]
#: A row condition term: (column, op, value); op in == != > >= < <= in not_in null not_null.
Cond = tuple[str, str, Any]

MAX_SESSION_LENGTH = 200  # longer sessions look like a stuck logger or a bot, not a shopper
PROFILE_COVERAGE = 0.99  # DATA.md: six profile fields with 99.0-99.9 % coverage
SPLIT_TOLERANCE = 0.05  # absolute; a few hundred users already fall within it
RATIONALE_CHARS = (8, 400)  # EXTRACTION.md: a short reason, target <= 40 words
EARLIEST_TS = datetime(2000, 1, 1, tzinfo=UTC)
HISTORY_KINDS = ("click", "buy")
RECORD_MODES = ("single", "cross")
VISIBLE_SOURCES = ("logged", "layout")


@dataclass(frozen=True)
class Check:
    """One expectation with gate semantics."""

    name: str  # unique within its suite; quarantine reason is "expectation:<name>"
    expectation: str  # Great Expectations 1.x class in great_expectations.expectations
    kwargs: Mapping[str, Any]
    doc: str
    severity: Severity = "error"
    level: Level = "table"
    when: tuple[Cond, ...] = ()  # row condition (terms ANDed)

    def columns(self) -> list[str]:
        cols = [self.kwargs[k] for k in ("column", "column_A", "column_B") if k in self.kwargs]
        cols += list(self.kwargs.get("column_list", ()))
        return cols + [c for c, _, _ in self.when]


@dataclass(frozen=True)
class Helper:
    """A boolean (or flattened) column computed with Polars over one frame of a table: a partitioned
    table's user bucket, so an expression over a session sees the whole session."""

    name: str
    build: Callable[[], pl.Expr]
    doc: str


@dataclass(frozen=True)
class TableSuite:
    name: str  # GE suite name: the table, or "raw.<table>"
    table: str
    schema: pa.Schema
    keys: tuple[str, ...]
    checks: tuple[Check, ...]
    helpers: tuple[Helper, ...] = ()
    raw: bool = False
    doc: str = ""
    shown: tuple[str, ...] = ()  # columns every failing example shows, besides keys and checked ones
    # a helper looks across the rows of a session: the gate reads the table in frames of whole sessions
    whole_sessions: bool = False
    version: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "version", f"{SUITES_VERSION}+{spec_hash(self)}")

    def columns(self) -> list[str]:
        """Columns the checks read (helpers included), in first-use order."""
        return list(dict.fromkeys(c for check in self.checks for c in check.columns()))

    def check(self, name: str) -> Check:
        return next(c for c in self.checks if c.name == name)


def spec_hash(suite: TableSuite) -> str:
    spec = {
        "schema": str(suite.schema),
        "keys": suite.keys,
        "checks": [
            [c.name, c.expectation, dict(c.kwargs), c.severity, c.level, c.when] for c in suite.checks
        ],
        "helpers": [h.name for h in suite.helpers],
    }
    return hashlib.sha256(json.dumps(spec, default=str, sort_keys=True).encode()).hexdigest()[:8]


# --- check constructors -------------------------------------------------------


def check(name: str, expectation: str, doc: str, **kw: Any) -> Check:
    gate = {k: kw.pop(k) for k in ("severity", "level", "when") if k in kw}
    if "when" in gate:
        gate["when"] = tuple(gate["when"])
    return Check(name, expectation, kw, doc, **gate)


def not_null(column: str, **kw: Any) -> Check:
    doc = kw.pop("doc", f"{column} is always present")
    return check(f"{column}_not_null", "ExpectColumnValuesToNotBeNull", doc, column=column, **kw)


def in_set(name: str, column: str, values: tuple | list, doc: str, **kw: Any) -> Check:
    return check(name, "ExpectColumnValuesToBeInSet", doc, column=column, value_set=list(values), **kw)


def between(name: str, column: str, doc: str, lo: Any = None, hi: Any = None, **kw: Any) -> Check:
    return check(name, "ExpectColumnValuesToBeBetween", doc, column=column, min_value=lo, max_value=hi, **kw)


def helper_true(helper: str, doc: str, **kw: Any) -> Check:
    """The helper column ``_<name>`` must be True on every row (check named ``<name>``)."""
    return in_set(helper.removeprefix("_"), helper, [True], doc, **kw)


def a_ge_b(name: str, a: str, b: str, doc: str, **kw: Any) -> Check:
    return check(
        name, "ExpectColumnPairValuesAToBeGreaterThanB", doc, column_A=a, column_B=b, or_equal=True, **kw
    )


# --- helpers: Polars expressions over the whole table ------------------------


def key_unique(keys: tuple[str, ...]) -> Helper:
    return Helper(
        "_key_unique",
        lambda: ~pl.struct(list(keys)).is_duplicated(),
        f"({', '.join(keys)}) occurs once in the whole table (GE batches cannot see across each other)",
    )


def ts_plausible(column: str = "ts") -> Helper:
    def build() -> pl.Expr:
        # evaluated at gate time: "the future" moves with the clock
        latest = datetime.now(UTC) + timedelta(days=1)
        ts = pl.col(column)
        return ts.is_between(pl.lit(EARLIEST_TS), pl.lit(latest)).fill_null(True)

    return Helper(
        "_ts_plausible",
        build,
        f"{column} is between {EARLIEST_TS:%Y-%m-%d} and tomorrow (catches s read as ms, and the future)",
    )


def _session_order(expr: pl.Expr) -> pl.Expr:
    return expr.over("session_id", order_by="step")


STEP_HELPERS: tuple[Helper, ...] = (
    key_unique(("session_id", "step")),
    Helper(
        "_step_contiguous",
        lambda: (
            pl.col("step") == pl.col("step").rank("ordinal").over("session_id").cast(pl.Int64) - 1
        ).fill_null(False),
        "steps of a session are exactly 0, 1, ..., n-1",
    ),
    Helper(
        "_ts_ordered",
        lambda: (pl.col("ts") >= _session_order(pl.col("ts").shift(1))).fill_null(True),
        "time never goes backwards within a session (ordered by step)",
    ),
    Helper(
        "_end_is_last",
        lambda: (
            (pl.col("action") != "end") | (pl.col("step") == pl.col("step").max().over("session_id"))
        ).fill_null(False),
        "an 'end' is the last step of its session: nothing happens after it",
    ),
    Helper(
        "_click_target_visible",
        lambda: (
            (pl.col("action") != "click") | pl.col("visible_items").list.contains(pl.col("target_item_id"))
        ).fill_null(False),
        "a click opens a card that was among the visible items",
    ),
    Helper(
        "_action_group_matches",
        # GE's ExpectColumnPairValuesToBeInSet iterates pandas rows in Python (~35 s per 578k rows)
        lambda: (
            pl.col("action_group") == pl.col("action").replace_strict(S.ACTION_GROUPS, default=None)
        ).fill_null(False),
        "action_group is ACTION_GROUPS[action]",
    ),
    ts_plausible(),
)


def _profile_field(name: str) -> Helper:
    return Helper(
        f"profile__{name}", lambda: pl.col("profile").struct.field(name), f"profile attribute {name}"
    )


# --- lake suites --------------------------------------------------------------


def _required(columns: tuple[str, ...]) -> list[Check]:
    return [not_null(c) for c in columns]


def _keyed(keys: tuple[str, ...]) -> list[Check]:
    return [helper_true("_key_unique", f"({', '.join(keys)}) is unique")] if keys else []


def _split_known(**kw: Any) -> Check:
    return in_set("split_known", "split", S.SPLITS, "split is train, val or test", **kw)


def steps_suite(settings: IngestSettings) -> TableSuite:
    geo = settings.geometry
    keys = ("session_id", "step")
    required = ("session_id", "user_id", "step", "ts", "screen", "action", "action_group", "split", "bucket")
    feed_scrolls = [a for a in S.SCROLL_ACTIONS if not a.startswith("ipv_")]
    ipv_scrolls = [a for a in S.SCROLL_ACTIONS if a.startswith("ipv_")]
    checks = [
        *_required(required),
        *_keyed(keys),
        in_set("action_known", "action", S.ACTIONS, "one of the 13 actions"),
        in_set("screen_known", "screen", S.SCREENS, "feed or ipv"),
        helper_true("_action_group_matches", "action_group is the report group of the action"),
        in_set(
            "feed_action_legal",
            "action",
            S.FEED_ACTIONS,
            "a feed step takes a feed action",
            when=[("screen", "==", "feed")],
        ),
        in_set(
            "ipv_action_legal",
            "action",
            S.IPV_ACTIONS,
            "a detail-page step takes a detail-page action",
            when=[("screen", "==", "ipv")],
        ),
        helper_true("_step_contiguous", "steps are contiguous from 0 within each session"),
        helper_true("_ts_ordered", "timestamps never decrease within a session"),
        helper_true("_end_is_last", "no step follows an 'end'"),
        helper_true("_click_target_visible", "a clicked card is among the visible items"),
        helper_true("_ts_plausible", "timestamps are after 2000 and not in the future"),
        not_null("ipv_item_id", doc="a detail-page step has its open item", when=[("screen", "==", "ipv")]),
        between(
            "feed_scroll_distance",
            "distance",
            f"a feed scroll moves 1..{geo.max_feed_scroll} px",
            1,
            geo.max_feed_scroll,
            when=[("action", "in", feed_scrolls)],
        ),
        between(
            "ipv_scroll_distance",
            "distance",
            f"a detail-page scroll moves 1..{geo.max_ipv_scroll} px",
            1,
            geo.max_ipv_scroll,
            when=[("action", "in", ipv_scrolls)],
        ),
        between("scroll_top_non_negative", "scroll_top", "feed offsets are never negative", 0),
        between("ipv_scroll_non_negative", "ipv_scroll", "detail-page offsets are never negative", 0),
        check(
            "review_alias_format",
            "ExpectColumnValuesToMatchRegex",
            "a review alias is C1, C2, ...",
            column="review_alias",
            regex=r"^C[1-9][0-9]*$",
        ),
        in_set("visible_source_known", "visible_source", VISIBLE_SOURCES, "logged or computed from layout"),
        _split_known(),
        between("bucket_non_negative", "bucket", "user buckets count from 0", 0),
    ]
    return TableSuite(
        "steps",
        "steps",
        S.STEPS,
        keys,
        tuple(checks),
        STEP_HELPERS,
        doc="one recorded action",
        whole_sessions=True,
    )


def sessions_suite(settings: IngestSettings) -> TableSuite:
    keys = ("session_id",)
    required = ("session_id", "user_id", "start_ts", "end_ts", "length", "terminal", "split", "bucket")
    counts = ("clicks", "carts", "buys", "feed_steps")
    checks = [
        *_required(required),
        *_keyed(keys),
        in_set("terminal_known", "terminal", S.TERMINAL_STATES, "a terminal state of PROTOCOL.md §4"),
        between("length_positive", "length", "a session has at least one action", 1),
        between(
            "length_bound",
            "length",
            f"sessions are at most {MAX_SESSION_LENGTH} actions long",
            hi=MAX_SESSION_LENGTH,
            severity="warn",
        ),
        a_ge_b("end_after_start", "end_ts", "start_ts", "a session ends no earlier than it starts"),
        *[between(f"{c}_non_negative", c, f"{c} is a count", 0) for c in counts],
        *[a_ge_b(f"{c}_within_length", "length", c, f"{c} never exceed the session length") for c in counts],
        between(
            "purchase_has_buy",
            "buys",
            "a purchase session has a buy",
            1,
            when=[("terminal", "==", "purchase")],
        ),
        in_set(
            "buy_means_purchase",
            "terminal",
            ["purchase"],
            "a session with a buy ends as purchase (unless ingest cut it)",
            when=[("buys", ">", 0), ("cut_reason", "null", None)],
        ),
        in_set(
            "cut_is_truncated",
            "terminal",
            ["truncated"],
            "a session cut at a rejected event ends truncated",
            when=[("cut_reason", "not_null", None)],
        ),
        between(
            "cart_only_has_cart",
            "carts",
            "a cart_only session has a cart",
            1,
            when=[("terminal", "==", "cart_only")],
        ),
        _split_known(),
    ]
    return TableSuite(
        "sessions", "sessions", S.SESSIONS, keys, tuple(checks), (key_unique(keys),), doc="one page view"
    )


def feed_layouts_suite(settings: IngestSettings) -> TableSuite:
    keys = ("session_id", "item_id")
    # x may be unknown: logged boxes need only y and height (align.check_feeds)
    required = ("session_id", "item_id", "rank", "y", "width", "height", "feed_height", "bucket")
    inside = Helper(
        "_card_inside_feed",
        lambda: (pl.col("y") + pl.col("height") <= pl.col("feed_height")).fill_null(False),
        "a card ends above the bottom of its feed",
    )
    checks = [
        *_required(required),
        *_keyed(keys),
        *[between(f"{c}_non_negative", c, f"card {c} is never negative", 0) for c in ("x", "y", "rank")],
        *[
            between(f"{c}_positive", c, f"{c} is at least 1 px", 1)
            for c in ("width", "height", "feed_height")
        ],
        helper_true("_card_inside_feed", "every card lies inside its feed"),
    ]
    return TableSuite(
        "feed_layouts",
        "feed_layouts",
        S.FEED_LAYOUTS,
        keys,
        tuple(checks),
        (key_unique(keys), inside),
        doc="card geometry per (session, item)",
    )


def items_suite(settings: IngestSettings) -> TableSuite:
    keys = ("item_id",)
    checks = [
        *_required(("item_id", "title", "price", "category", "category_l1")),
        *_keyed(keys),
        between("price_positive", "price", "prices are finite and > 0", 0, strict_min=True),
        check(
            "title_length",
            "ExpectColumnValueLengthsToBeBetween",
            f"titles are 1..{MAX_FIELD_CHARS} characters",
            column="title",
            min_value=1,
            max_value=MAX_FIELD_CHARS,
        ),
    ]
    return TableSuite("items", "items", S.ITEMS, keys, tuple(checks), (key_unique(keys),), doc="the catalog")


def split_share_checks(ratios: tuple[float, float, float], column: str = "split") -> list[Check]:
    """Each split's share within +-SPLIT_TOLERANCE, as two 'mostly' bounds per split.

    share(s) >= r - t  <=>  values in {s} at least (r - t) of the time;
    share(s) <= r + t  <=>  values in the other splits at least 1 - (r + t) of the time.
    """
    out = []
    for split, ratio in zip(S.SPLITS, ratios, strict=True):
        lo, hi = max(ratio - SPLIT_TOLERANCE, 0.0), min(ratio + SPLIT_TOLERANCE, 1.0)
        others = [s for s in S.SPLITS if s != split]
        out += [
            in_set(
                f"{split}_share_min",
                column,
                [split],
                f"at least {lo:.0%} of users are {split}",
                mostly=round(lo, 6),
                severity="warn",
            ),
            in_set(
                f"{split}_share_max",
                column,
                others,
                f"at most {hi:.0%} of users are {split}",
                mostly=round(1 - hi, 6),
                severity="warn",
            ),
        ]
    return out


def profiles_suite(settings: IngestSettings) -> TableSuite:
    keys = ("user_id",)
    coverage = [
        not_null(
            f"profile__{f}",
            mostly=PROFILE_COVERAGE,
            severity="warn",
            doc=f"profile attribute {f} is known for >= {PROFILE_COVERAGE:.0%} of users",
        )
        for f in S.PROFILE_FIELDS
    ]
    checks = [
        *_required(("user_id", "split")),
        *_keyed(keys),
        _split_known(),
        *coverage,
        *split_share_checks(settings.split_ratios),
    ]
    helpers = (key_unique(keys), *[_profile_field(f) for f in S.PROFILE_FIELDS])
    return TableSuite("profiles", "profiles", S.PROFILES, keys, tuple(checks), helpers, doc="one user")


def history_suite(settings: IngestSettings) -> TableSuite:
    # pre-window history is leaf data: a bad row can leave on its own
    row = {"severity": "warn", "level": "row"}
    checks = [
        not_null("user_id"),
        in_set("kind_known", "kind", HISTORY_KINDS, "history rows are clicks or buys", **row),
        not_null("title", doc="a history row names its item", **row),
        not_null("split", doc="a history row carries its user's split"),
        _split_known(),
        helper_true("_ts_plausible", "timestamps are after 2000 and not in the future", **row),
    ]
    return TableSuite("history", "history", S.HISTORY, (), tuple(checks), (ts_plausible(),), doc="pre-window")


def quarantine_suite(settings: IngestSettings) -> TableSuite:
    checks = _required(("stage", "table_name", "reason"))
    return TableSuite("quarantine", "quarantine", S.QUARANTINE, (), tuple(checks), doc="rejected rows")


def records_suite(settings: IngestSettings) -> TableSuite:
    keys = ("record_id", "mode")  # a state appears once per mode (single and cross)
    required = (
        "record_id",
        "session_id",
        "user_id",
        "step",
        "trajectory_id",
        "mode",
        "system",
        "prompt",
        "action",
        "action_json",
        "split",
    )
    lo, hi = RATIONALE_CHARS
    checks = [
        *_required(required),
        *_keyed(keys),
        in_set("action_known", "action", S.ACTIONS, "the gold action is one of the 13"),
        in_set("mode_known", "mode", RECORD_MODES, "single- or cross-session"),
        _split_known(),
        check(
            "intent_train_only",
            "ExpectColumnValuesToBeNull",
            "the privileged intent never reaches evaluation states",
            column="intent",
            when=[("split", "!=", "train")],
        ),
        not_null(
            "response",
            doc="a state has a gold response unless gold_missing says why not",
            when=[("gold_missing", "null", None)],
        ),
        check(
            "response_null_when_gold_missing",
            "ExpectColumnValuesToBeNull",
            "a state without a gold rationale never carries a gold response",
            column="response",
            when=[("gold_missing", "not_null", None)],
        ),
        in_set("gold_missing_known", "gold_missing", S.GOLD_MISSING, "why a state has no gold response"),
        check(
            "response_is_json",
            "ExpectColumnValuesToBeJsonParseable",
            "gold response is JSON",
            column="response",
        ),
        check(
            "action_json_is_json",
            "ExpectColumnValuesToBeJsonParseable",
            "gold action is JSON",
            column="action_json",
        ),
        between("token_estimate_positive", "token_estimate", "a prompt has tokens", 1),
        check(
            "rationale_length",
            "ExpectColumnValueLengthsToBeBetween",
            f"rationales are {lo}..{hi} chars",
            column="rationale",
            min_value=lo,
            max_value=hi,
            severity="warn",
        ),
    ]
    return TableSuite(
        "records",
        "records",
        S.RECORDS,
        keys,
        tuple(checks),
        (key_unique(keys),),
        doc="one training/eval state",
    )


# Tables whose schemas later issues append to transforms.schemas.LAKE_TABLES; the
# column names below are this suite's expectations of those schemas, and
# tests/validation/test_suites.py fails loudly when a declared schema disagrees.


def histories_suite(settings: IngestSettings, schema: pa.Schema) -> TableSuite:
    keys = ("user_id",)
    required = (
        "user_id",
        "n_sessions",
        "n_actions",
        "first_ts",
        "last_ts",
        "cross_session",
        "split",
        "bucket",
    )
    checks = [
        *_required(required),
        *_keyed(keys),
        between("n_sessions_positive", "n_sessions", "a history holds at least one session", 1),
        a_ge_b("actions_cover_sessions", "n_actions", "n_sessions", "every session has an action"),
        a_ge_b("last_after_first", "last_ts", "first_ts", "a history ends no earlier than it starts"),
        in_set(
            "cross_session_flag",
            "cross_session",
            [True],
            "two or more sessions are cross-session",
            when=[("n_sessions", ">=", 2)],
        ),
        in_set(
            "single_session_flag",
            "cross_session",
            [False],
            "one session is not cross-session",
            when=[("n_sessions", "<", 2)],
        ),
        _split_known(),
    ]
    return TableSuite(
        "histories",
        "histories",
        schema,
        keys,
        tuple(checks),
        (key_unique(keys),),
        doc="one user's chained sessions",
    )


def intents_suite(settings: IngestSettings, schema: pa.Schema) -> TableSuite:
    keys = ("trajectory_id",)
    checks = [
        *_required(("trajectory_id", "leakage_verdict")),
        *_keyed(keys),
        in_set(
            "leakage_clean",
            "leakage_verdict",
            ["clean"],
            "an intent never leaks the answer",
            severity="warn",
            level="row",
        ),
        in_set("intent_train_only", "split", ["train"], "intents are extracted from train only"),
    ]
    return TableSuite(
        "intents", "intents", schema, keys, tuple(checks), (key_unique(keys),), doc="one training trajectory"
    )


def rationales_suite(settings: IngestSettings, schema: pa.Schema) -> TableSuite:
    keys = ("session_id", "step")
    lo, hi = RATIONALE_CHARS
    checks = [
        *_required(("session_id", "step", "rationale")),
        *_keyed(keys),
        check(
            "rationale_length",
            "ExpectColumnValueLengthsToBeBetween",
            f"rationales are {lo}..{hi} chars",
            column="rationale",
            min_value=lo,
            max_value=hi,
            severity="warn",
            level="row",
        ),
    ]
    return TableSuite(
        "rationales",
        "rationales",
        schema,
        keys,
        tuple(checks),
        (key_unique(keys),),
        doc="one recorded action's rationale",
    )


LAKE_BUILDERS: dict[str, Callable[[IngestSettings], TableSuite]] = {
    "steps": steps_suite,
    "sessions": sessions_suite,
    "feed_layouts": feed_layouts_suite,
    "items": items_suite,
    "profiles": profiles_suite,
    "history": history_suite,
    "records": records_suite,
    "quarantine": quarantine_suite,
}
PENDING_BUILDERS: dict[str, Callable[[IngestSettings, pa.Schema], TableSuite]] = {
    "histories": histories_suite,
    "intents": intents_suite,
    "rationales": rationales_suite,
}


# --- raw input suites: report-only ---------------------------------------------
# Ingest routes bad raw rows itself, under its own reason codes; these suites
# describe the input (share of rows passing each rule) and never route or stop.


def _raw(**kw: Any) -> dict[str, Any]:
    return {"severity": "warn", **kw}


#: Raw ids never reach GE (its results and Data Docs live in the lake, which holds no raw id).
RAW_ID_COLUMNS = ("event_id", "user_id", "page_view_id", "item_id")
CLICK_NAMES_ITEM = Helper(
    "_click_names_item",
    lambda: ((pl.col("action") != "click") | pl.col("item_id").is_not_null()).fill_null(True),
    "a click event names the card it opened",
)


def raw_suites(settings: IngestSettings) -> dict[str, TableSuite]:
    known = sorted(set(S.ACTIONS) | set(settings.action_map))
    w = _raw()
    events = [
        helper_true("_key_unique", "event_id is unique", **w),
        in_set("action_known", "action", known, "one of the 13 actions or a mapped platform name", **w),
        in_set("screen_known", "screen", S.SCREENS, "feed or ipv", **w),
        in_set(
            "feed_action_legal",
            "action",
            S.FEED_ACTIONS,
            "feed actions on the feed",
            when=[("screen", "==", "feed"), ("action", "in", list(S.ACTIONS))],
            **w,
        ),
        in_set(
            "ipv_action_legal",
            "action",
            S.IPV_ACTIONS,
            "detail-page actions on the detail page",
            when=[("screen", "==", "ipv"), ("action", "in", list(S.ACTIONS))],
            **w,
        ),
        helper_true("_click_names_item", "a click names its card", **w),
        between("scroll_top_non_negative", "scroll_top", "feed offsets are never negative", 0, **w),
        helper_true("_ts_plausible", "timestamps are after 2000 and not in the future", **w),
    ]
    items = [
        helper_true("_key_unique", "item_id is unique", **w),
        between("price_positive", "price", "prices are finite and > 0", 0, strict_min=True, **w),
    ]
    feeds = [
        helper_true("_key_unique", "(page_view_id, item_id) is unique", **w),
        *[between(f"{c}_positive", c, f"{c} is at least 1 px", 1, **w) for c in ("width", "height")],
        *[between(f"{c}_non_negative", c, f"{c} is never negative", 0, **w) for c in ("x", "y")],
    ]
    profiles = [
        helper_true("_key_unique", "user_id is unique", **w),
        *[
            not_null(f, mostly=PROFILE_COVERAGE, doc=f"{f} known for >= 99 % of users", **w)
            for f in S.PROFILE_FIELDS
        ],
    ]
    history = [
        in_set("kind_known", "kind", HISTORY_KINDS, "clicks or buys", **w),
        helper_true("_ts_plausible", "timestamps are after 2000 and not in the future", **w),
    ]
    spec = {
        "events": (("event_id",), events, (ts_plausible(), CLICK_NAMES_ITEM)),
        "items": (("item_id",), items, ()),
        "feeds": (("page_view_id", "item_id"), feeds, ()),
        "profiles": (("user_id",), profiles, ()),
        "history": ((), history, (ts_plausible(),)),
    }
    return {
        f"raw.{t}": TableSuite(
            f"raw.{t}",
            t,
            S.RAW_TABLES[t],
            keys,
            tuple(checks),
            ((key_unique(keys),) if keys else ()) + extra,
            raw=True,
            doc=f"raw input table {t}",
        )
        for t, (keys, checks, extra) in spec.items()
    }


def lake_suites(settings: IngestSettings) -> dict[str, TableSuite]:
    """Suites of every lake table declared in ``transforms.schemas.LAKE_TABLES``."""
    suites = {name: build(settings) for name, build in LAKE_BUILDERS.items() if name in S.LAKE_TABLES}
    for name, build in PENDING_BUILDERS.items():
        if name in S.LAKE_TABLES:
            suites[name] = build(settings, S.LAKE_TABLES[name])
    return suites


@cache
def _default_suites() -> dict[str, TableSuite]:
    settings = IngestSettings()
    return {**lake_suites(settings), **raw_suites(settings)}


def all_suites(settings: IngestSettings | None = None) -> dict[str, TableSuite]:
    """Every suite by name: lake tables by their name, raw inputs as ``raw.<table>``."""
    if settings is None:
        return _default_suites()
    return {**lake_suites(settings), **raw_suites(settings)}


#: Frame the generated schema suites check: one row per column, declared vs observed.
SCHEMA_FRAME = pa.schema(
    [("column", pa.string()), ("declared_type", pa.string()), ("observed_type", pa.string())]
)


def schema_suite(suite: TableSuite) -> TableSuite:
    """``<table>.schema``: every declared column present with its declared Arrow type, no extras."""
    checks = (
        not_null("declared_type", doc="every stored column is declared"),
        not_null("observed_type", doc="every declared column is stored"),
        check(
            "column_type",
            "ExpectColumnPairValuesToBeEqual",
            "stored types are the declared types",
            column_A="declared_type",
            column_B="observed_type",
            ignore_row_if="either_value_is_missing",
        ),
    )
    return TableSuite(
        f"{suite.table}.schema",
        suite.table,
        SCHEMA_FRAME,
        ("column",),
        checks,
        doc=f"columns and Arrow types of {suite.table}",
        shown=("declared_type", "observed_type"),
    )
