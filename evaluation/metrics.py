"""The UserArena metrics L0, L1, L2 and L4 (PROTOCOL.md §4) over trace frames, and the shared rules
(JSD, quantile bins, detail-page visits) that L3 (:mod:`evaluation.cohorts`) and the supplementary
figures use too.

Everything is a Polars expression over all steps at once; Python only loops over the handful of labels
of a fixed support. Frames come from :mod:`evaluation.traces` (either trace format).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl

from evaluation.traces import TraceFrames
from transforms.schemas import ACTIONS, SCROLL_ACTIONS

DECISIONS: tuple[str, ...] = ("return", "cart", "buy", "end", "open")
DECISION_OF_ACTION: dict[str, str] = {
    "back_home": "return",
    "ipv_cart": "cart",
    "ipv_buy": "buy",
    "end": "end",
}
INFORMATION_ACTIONS: tuple[str, ...] = (
    "ipv_swipe_pic",
    "ipv_click_param",
    "ipv_enter_comment",
    "ipv_click_comment",
)
TERMINAL_OUTCOMES: tuple[str, ...] = ("purchase", "truncated", "cart_only", "browse_only")


# --- shared rules -------------------------------------------------------------------------------


def jsd(left: Sequence[float] | np.ndarray, right: Sequence[float] | np.ndarray) -> float:
    """Base-2 Jensen-Shannon divergence of two count (or mass) vectors over the same fixed support.

    Each side is normalised first; zero-probability terms are skipped; both sides empty -> 0, one side
    empty -> 1; the result is clamped to [0, 1].
    """
    p, q = np.clip(np.asarray(left, float), 0, None), np.clip(np.asarray(right, float), 0, None)
    p_total, q_total = p.sum(), q.sum()
    if p_total <= 0 and q_total <= 0:
        return 0.0
    if p_total <= 0 or q_total <= 0:
        return 1.0
    p, q = p / p_total, q / q_total
    m = (p + q) / 2

    def half(side: np.ndarray) -> float:
        kept = side > 0
        return float(0.5 * np.sum(side[kept] * np.log2(side[kept] / m[kept])))

    return min(1.0, max(0.0, half(p) + half(q)))


def counts_over(values: pl.Series, support: Sequence[str]) -> np.ndarray:
    """How often each support label occurs in ``values`` (labels outside the support are not counted)."""
    counted = values.value_counts(name="n")
    lookup = dict(zip(counted[values.name].to_list(), counted["n"].to_list(), strict=True))
    return np.array([lookup.get(label, 0) for label in support], dtype=float)


def rate(numerator: float, denominator: float) -> float:
    """A ratio whose zero denominator means 0."""
    return numerator / denominator if denominator else 0.0


def mean_or_zero(values: Sequence[float]) -> float:
    """Mean skipping None; the mean of an empty list is 0."""
    kept = [v for v in values if v is not None]
    return sum(kept) / len(kept) if kept else 0.0


def quantile_edges(values: pl.Series | np.ndarray, bins: int) -> list[float]:
    """Inner bin edges at the 1/bins .. (bins-1)/bins quantiles (linear interpolation), duplicates dropped."""
    data = np.asarray(values, dtype=float)
    data = data[~np.isnan(data)]
    if data.size == 0 or bins < 2:
        return []
    edges: list[float] = []
    for edge in np.quantile(data, [i / bins for i in range(1, bins)]):
        if not edges or edge > edges[-1]:
            edges.append(float(edge))
    return edges


def bin_support(edges: Sequence[float]) -> list[str]:
    """Labels of the bins cut by ``edges``, and ``unknown`` for missing values."""
    return [f"b{i}" for i in range(len(edges) + 1)] + ["unknown"]


def bin_label(value: pl.Expr, edges: Sequence[float]) -> pl.Expr:
    """``b<k>`` with k = the number of edges strictly below the value (a value on an edge goes lower)."""
    below = pl.sum_horizontal([(value > edge).cast(pl.Int32) for edge in edges]) if edges else pl.lit(0)
    return pl.when(value.is_null()).then(pl.lit("unknown")).otherwise(pl.format("b{}", below))


def top_category(category: pl.Expr) -> pl.Expr:
    """The text before the first '-' of a category path, stripped; missing or empty -> ``unknown``."""
    top = category.str.split("-").list.first().str.strip_chars()
    return pl.when(top.is_null() | (top == "")).then(pl.lit("unknown")).otherwise(top)


# --- executed steps, visits and sessions --------------------------------------------------------


def executed_steps(frames: TraceFrames) -> pl.DataFrame:
    """Accepted steps with a known action, in session order."""
    return frames.steps.filter(pl.col("accepted") & pl.col("action").is_in(ACTIONS))


def with_visits(steps: pl.DataFrame) -> pl.DataFrame:
    """Executed steps (in session order) with ``visit`` (an id, unique in the frame, of the detail-page
    visit each step belongs to; None outside visits) and ``decisions_before`` (decision actions earlier
    in the same visit).

    A feed click opens a visit, a feed step closes it, and a detail-page step with no open visit (first
    step, after a feed step that was not a click, or after back_home) opens one.
    """
    on_ipv = pl.col("screen") == "ipv"
    is_click = (pl.col("screen") == "feed") & (pl.col("action") == "click")
    # rows are in session order, so the previous row is the previous step when the session is the same
    same_session = pl.col("session_id").shift(1) == pl.col("session_id")
    screen_before, action_before = pl.col("screen").shift(1), pl.col("action").shift(1)
    continues = same_session & (
        (screen_before.eq("feed") & action_before.eq("click"))
        | (screen_before.eq("ipv") & action_before.ne("back_home"))
    )
    opens = is_click | (on_ipv & ~continues.fill_null(False))
    is_decision = on_ipv & pl.col("action").is_in(list(DECISION_OF_ACTION))
    tagged = steps.with_columns(
        pl.when(is_click | on_ipv).then(opens.cast(pl.Int64).cum_sum()).alias("visit"),
        is_decision.alias("is_decision"),
    )
    earlier = pl.col("is_decision").cast(pl.Int32).cum_sum() - pl.col("is_decision").cast(pl.Int32)
    return tagged.with_columns(
        pl.when(pl.col("visit").is_not_null())
        .then(earlier.over("visit"))
        .otherwise(0)
        .alias("decisions_before")
    )


def visits(steps_with_visits: pl.DataFrame) -> pl.DataFrame:
    """One row per visit: session, decision (first decision on its detail page, else ``open``),
    information depth (information actions before the decision) and the visit's item."""
    undecided = pl.col("decisions_before") == 0
    first_decision = pl.col("action").filter(pl.col("is_decision") & undecided).first()
    return (
        steps_with_visits.filter(pl.col("visit").is_not_null())
        .group_by("visit", maintain_order=True)
        .agg(
            pl.col("session_id").first(),
            first_decision.replace_strict(DECISION_OF_ACTION, default="open")
            .fill_null("open")
            .alias("decision"),
            (pl.col("action").is_in(INFORMATION_ACTIONS) & undecided).sum().alias("depth"),
            pl.col("target_item_id").drop_nulls().first().alias("item_id"),
        )
    )


def session_table(sessions: pl.DataFrame, steps_with_visits: pl.DataFrame) -> pl.DataFrame:
    """One row per session (file order): length (executed actions), visits, back_home count, cart/buy
    flags, and terminal outcome (purchase > truncated > cart_only > browse_only)."""
    per_session = steps_with_visits.group_by("session_id").agg(
        pl.len().alias("length"),
        pl.col("visit").drop_nulls().n_unique().alias("visits"),
        (pl.col("action") == "back_home").sum().alias("returns"),
        (pl.col("action") == "ipv_cart").any().alias("carted"),
        (pl.col("action") == "ipv_buy").any().alias("bought"),
    )
    table = sessions.join(per_session, on="session_id", how="left", maintain_order="left").with_columns(
        pl.col("length", "visits", "returns").fill_null(0),
        pl.col("carted", "bought").fill_null(False),
    )
    outcome = (
        pl.when(pl.col("bought"))
        .then(pl.lit("purchase"))
        .when(pl.col("truncated") & ~pl.col("terminated"))
        .then(pl.lit("truncated"))
        .when(pl.col("carted"))
        .then(pl.lit("cart_only"))
        .otherwise(pl.lit("browse_only"))
    )
    return table.with_columns(outcome.alias("outcome"))


@dataclass(frozen=True)
class Side:
    """One side's traces, worked out once for every metric: executed steps with their visits, one row
    per session and one per visit."""

    frames: TraceFrames
    steps: pl.DataFrame
    sessions: pl.DataFrame
    visits: pl.DataFrame

    @classmethod
    def of(cls, frames: TraceFrames) -> Side:
        steps = with_visits(executed_steps(frames))
        return cls(frames, steps, session_table(frames.sessions, steps), visits(steps))


# --- L0 and L1 ----------------------------------------------------------------------------------


def output_validity(steps: pl.DataFrame) -> float:
    """Share of outputs accepted (RVA over replay rows, OVA over rollout steps)."""
    return rate(float(steps["accepted"].sum()), steps.height)


def _predicted_label(replay: pl.DataFrame) -> pl.Series:
    return replay.select(
        pl.when(pl.col("accepted"))
        .then(pl.col("pred_action").fill_null(""))
        .otherwise(pl.lit(""))
        .alias("pred")
    ).to_series()


def macro_f1(replay: pl.DataFrame) -> float:
    """Unweighted mean per-class F1 over ground-truth classes and non-empty accepted predictions."""
    pairs = pl.DataFrame({"gt": replay["gt_action"], "pred": _predicted_label(replay)})
    classes = sorted(set(pairs["gt"].to_list()) | (set(pairs["pred"].to_list()) - {""}))
    if not classes:
        return 0.0
    truth = counts_over(pairs["gt"], classes)
    predicted = counts_over(pairs["pred"], classes)
    hits = counts_over(pairs.filter(pl.col("gt") == pl.col("pred"))["gt"], classes)
    # F1 = 2PR/(P+R) = 2tp / (2tp + fp + fn), with fp + tp = predicted and fn + tp = truth
    denominator = truth + predicted
    f1 = np.divide(2 * hits, denominator, out=np.zeros_like(hits), where=denominator > 0)
    return float(f1.mean())


def _same_text(left: pl.Expr, right: pl.Expr) -> pl.Expr:
    return left.str.strip_chars() == right.str.strip_chars()


def exact_hit(replay: pl.DataFrame) -> pl.Series:
    """Whether each accepted prediction matches the recorded action exactly (type, and for a click its
    item by id, else by stripped title; for a review click its alias)."""
    both_ids = pl.col("gt_target_item_id").is_not_null() & pl.col("pred_target_item_id").is_not_null()
    both_titles = _empty_nonnull("gt_target_title") & _empty_nonnull("pred_target_title")
    click_hit = (
        pl.when(both_ids)
        .then(pl.col("gt_target_item_id") == pl.col("pred_target_item_id"))
        .when(both_titles)
        .then(_same_text(pl.col("gt_target_title"), pl.col("pred_target_title")))
        .otherwise(False)
    )
    alias_hit = (pl.col("gt_review_alias") == pl.col("pred_review_alias")).fill_null(False)
    target_hit = (
        pl.when(pl.col("gt_action") == "click")
        .then(click_hit)
        .when(pl.col("gt_action") == "ipv_click_comment")
        .then(alias_hit)
        .otherwise(True)
    )
    return replay.select(
        (pl.col("accepted") & (pl.col("pred_action") == pl.col("gt_action")) & target_hit).fill_null(False)
    ).to_series()


def _empty_nonnull(name: str) -> pl.Expr:
    return pl.col(name).is_not_null() & (pl.col(name).str.strip_chars() != "")


def non_scroll_accuracy(replay: pl.DataFrame) -> float:
    """Mean over ground-truth classes (the four scroll actions excluded) of exact hits / support."""
    per_class = (
        replay.with_columns(exact_hit(replay).alias("hit"))
        .filter(~pl.col("gt_action").is_in(SCROLL_ACTIONS))
        .group_by("gt_action")
        .agg(pl.col("hit").mean())
    )
    return mean_or_zero(per_class["hit"].to_list())


# --- L2 and L4 ----------------------------------------------------------------------------------


def decision_mix_jsd(real_visits: pl.DataFrame, sim_visits: pl.DataFrame) -> float:
    """JSD of the pooled visit decisions over (return, cart, buy, end, open)."""
    return jsd(
        counts_over(real_visits["decision"], DECISIONS), counts_over(sim_visits["decision"], DECISIONS)
    )


def trajectory_error(real_sessions: pl.DataFrame, sim_sessions: pl.DataFrame) -> float:
    """|mean real session length - mean simulated session length| in executed actions."""
    real_mean = real_sessions["length"].mean() if real_sessions.height else 0.0
    sim_mean = sim_sessions["length"].mean() if sim_sessions.height else 0.0
    return abs(float(real_mean) - float(sim_mean))


def step_counts(steps: pl.DataFrame) -> dict[str, int]:
    """Executed actions in all, on each screen, and of the funnel's kinds."""
    return steps.select(
        pl.len().alias("actions"),
        (pl.col("screen") == "feed").sum().alias("feed_actions"),
        (pl.col("screen") == "ipv").sum().alias("detail_page_actions"),
        (pl.col("action") == "click").sum().alias("clicks"),
        (pl.col("action") == "ipv_cart").sum().alias("carts"),
        (pl.col("action") == "ipv_buy").sum().alias("buys"),
    ).row(0, named=True)


def outcome_rates(steps: pl.DataFrame) -> dict[str, float]:
    """Pooled CTR (clicks / feed steps) and ACR (carts / clicks) over executed steps."""
    counts = step_counts(steps)
    return {
        "CTR": rate(counts["clicks"], counts["feed_actions"]),
        "ACR": rate(counts["carts"], counts["clicks"]),
    }


def terminal_jsd(real_sessions: pl.DataFrame, sim_sessions: pl.DataFrame) -> float:
    """JSD of terminal outcomes over (purchase, truncated, cart_only, browse_only)."""
    return jsd(
        counts_over(real_sessions["outcome"], TERMINAL_OUTCOMES),
        counts_over(sim_sessions["outcome"], TERMINAL_OUTCOMES),
    )
