"""Supplementary figures beside the headline metrics: the action mix, the funnel, RecVerse's
behavioural statistics and hierarchical category overlap (seed 002), and SalesSim-style decision
alignment (seed 004).

RecVerse reports ATL, CTR, IPVR, ACR and CVR as percentages (ATL in actions) to be read beside the real
values, not minimised; its summary gives the values but not the formulas, so they are read here as count
rates over executed actions: CTR = clicks / feed actions, IPVR = detail-page actions / all actions,
ACR = carts / clicks, CVR = buys / clicks. HCO is the harmonic mean of category precision CP and category
recall CR (the summary's HCO 32.64 = 2 * 34.51 * 30.95 / (34.51 + 30.95)), where an item scores its
best level-by-level category match r = max_y (1/L) sum_l [c_l(x) = c_l(y)] against the other side's
items of the same session.
"""

from __future__ import annotations

import polars as pl

from evaluation.metrics import Side, counts_over, jsd, rate, step_counts
from transforms.schemas import ACTIONS

CATEGORY_LEVELS = 3  # category paths are "L1-L2-L3"
PURCHASE_ACTIONS = ("ipv_cart", "ipv_buy")  # taking the item of the page


def action_jsd(real_steps: pl.DataFrame, sim_steps: pl.DataFrame) -> float:
    """JSD of the pooled executed actions over the 13 actions."""
    return jsd(counts_over(real_steps["action"], ACTIONS), counts_over(sim_steps["action"], ACTIONS))


def funnel(steps: pl.DataFrame, sessions: pl.DataFrame) -> dict[str, float]:
    """Session funnel (share of sessions that click, open a detail page, cart, buy) and its counts."""
    per_session = steps.group_by("session_id").agg(
        (pl.col("action") == "click").any().alias("clicked"),
        (pl.col("screen") == "ipv").any().alias("viewed"),
    )
    flags = sessions.join(per_session, on="session_id", how="left").with_columns(
        pl.col("clicked", "viewed").fill_null(False)
    )
    total = sessions.height
    counts = step_counts(steps)
    return {
        "sessions": total,
        "click_share": rate(float(flags["clicked"].sum()), total),
        "detail_page_share": rate(float(flags["viewed"].sum()), total),
        "cart_share": rate(float(flags["carted"].sum()), total),
        "buy_share": rate(float(flags["bought"].sum()), total),
        "visits": int(sessions["visits"].sum()),
        **{name: counts[name] for name in ("feed_actions", "clicks", "carts", "buys")},
    }


def recverse_statistics(steps: pl.DataFrame, sessions: pl.DataFrame) -> dict[str, float]:
    """ATL (mean executed actions per session) and CTR, IPVR, ACR, CVR as percentages."""
    counts = step_counts(steps)
    return {
        "ATL": rate(counts["actions"], sessions.height),
        "CTR": 100 * rate(counts["clicks"], counts["feed_actions"]),
        "IPVR": 100 * rate(counts["detail_page_actions"], counts["actions"]),
        "ACR": 100 * rate(counts["carts"], counts["clicks"]),
        "CVR": 100 * rate(counts["buys"], counts["clicks"]),
    }


def _clicked_categories(steps: pl.DataFrame) -> pl.DataFrame:
    return steps.filter(pl.col("action") == "click").select(
        "session_id",
        pl.col("step").alias("item"),
        pl.col("item_category").str.split("-").alias("levels"),
    )


def _best_match(items: pl.DataFrame, others: pl.DataFrame) -> pl.Series:
    """For each item, its best hierarchical match among the other side's items of the same session
    (0 when that side clicked nothing in the session)."""
    pairs = items.join(others, on="session_id", how="left", suffix="_other")
    level_hits = [
        (
            pl.col("levels").list.get(level, null_on_oob=True)
            == pl.col("levels_other").list.get(level, null_on_oob=True)
        )
        .fill_null(False)
        .cast(pl.Float64)
        for level in range(CATEGORY_LEVELS)
    ]
    matched = pairs.with_columns((pl.sum_horizontal(level_hits) / CATEGORY_LEVELS).alias("match"))
    return matched.group_by("session_id", "item").agg(pl.col("match").max())["match"]


def hierarchical_category_overlap(real: Side, sim: Side) -> dict[str, float]:
    """HCO, CP and CR in percent from the clicked items, over the sessions present on both sides (a
    simulated session that clicked nothing scores 0 on every real click of it)."""
    shared = real.sessions.select("session_id").join(sim.sessions.select("session_id"), on="session_id")
    real_items = _clicked_categories(real.steps.join(shared, on="session_id", how="semi"))
    sim_items = _clicked_categories(sim.steps.join(shared, on="session_id", how="semi"))
    precision = float(_best_match(sim_items, real_items).mean() or 0.0)
    recall = float(_best_match(real_items, sim_items).mean() or 0.0)
    overlap = rate(2 * precision * recall, precision + recall)
    return {"HCO": 100 * overlap, "CP": 100 * precision, "CR": 100 * recall}


def decision_alignment(sim: Side, acceptable_shown: pl.DataFrame) -> dict[str, float | int]:
    """SalesSim decision alignment against the shopper's ground-truth utility.

    ``acceptable_shown`` lists (session_id, item_id) for every item shown in a session that the shopper's
    utility finds acceptable (the world knows it; traces do not). A purchase is taking an item on its
    page, ``ipv_cart`` or ``ipv_buy`` (SalesSim's accepting action is add_to_cart). A session with
    purchases is aligned when every item it took is acceptable; a session without one is aligned when
    nothing acceptable was shown. Returns the aligned share overall and on each kind of session, and how
    many of each kind there were (a share of no sessions is 0).
    """
    visit_item = pl.col("target_item_id").drop_nulls().first().over("visit")
    acceptable = (
        acceptable_shown.select("session_id", "item_id").unique().with_columns(acceptable=pl.lit(True))
    )
    purchases = (
        sim.steps.with_columns(pl.coalesce(pl.col("target_item_id"), visit_item).alias("item_id"))
        .filter(pl.col("action").is_in(PURCHASE_ACTIONS))
        .select("session_id", "item_id")
        .join(acceptable, on=["session_id", "item_id"], how="left")
        .group_by("session_id")
        .agg(pl.col("acceptable").fill_null(False).all().alias("aligned"))
    )
    shown_any = acceptable.select("session_id").unique().with_columns(shown=pl.lit(True))
    idle = (
        sim.sessions.select("session_id")
        .join(purchases, on="session_id", how="anti")
        .join(shown_any, on="session_id", how="left")
        .select("session_id", pl.col("shown").is_null().alias("aligned"))
    )
    aligned_purchases, aligned_idle = float(purchases["aligned"].sum()), float(idle["aligned"].sum())
    return {
        "decision_alignment": rate(aligned_purchases + aligned_idle, purchases.height + idle.height),
        "purchase_alignment": rate(aligned_purchases, purchases.height),
        "no_purchase_alignment": rate(aligned_idle, idle.height),
        "purchase_sessions": purchases.height,
        "no_purchase_sessions": idle.height,
    }


def supplementary_figures(real: Side, sim: Side) -> dict[str, object]:
    """The supplementary figures of ``trajforge score``, by name."""
    return {
        "action_JSD": action_jsd(real.steps, sim.steps),
        "funnel": {"real": funnel(real.steps, real.sessions), "sim": funnel(sim.steps, sim.sessions)},
        "RecVerse": {
            "real": recverse_statistics(real.steps, real.sessions),
            "sim": recverse_statistics(sim.steps, sim.sessions),
        },
        "HCO": hierarchical_category_overlap(real, sim),
    }
