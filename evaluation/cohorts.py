"""L3 personalised population fidelity (PROTOCOL.md §4): cohort schemes fitted on real profiles and
eight block distances between the real and simulated sessions of each cohort."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import polars as pl

from evaluation.metrics import (
    Side,
    bin_label,
    bin_support,
    counts_over,
    jsd,
    mean_or_zero,
    quantile_edges,
    top_category,
)
from transforms.schemas import ACTIONS

SCHEMES: dict[str, tuple[str, ...]] = {
    "activity": ("low", "medium", "high"),
    "purchase_propensity": ("non_buyer", "occasional", "frequent"),
    "category_breadth": ("narrow", "medium", "wide"),
}
MIN_COHORT_SESSIONS = 30
BREADTH_WINDOW = 20  # the most recent clicks whose top categories count towards breadth
TOP_CATEGORIES = 10
DEPTH_BINS = 4
PRICE_BINS = 5


def category_breadth(recent_click_categories: pl.Expr) -> pl.Expr:
    """Distinct top categories over the most recent clicks (the list is newest first)."""
    return (
        recent_click_categories.list.head(BREADTH_WINDOW)
        .list.eval(pl.element().str.split("-").list.first().str.strip_chars())
        .list.eval(pl.element().filter(pl.element().is_not_null() & (pl.element() != "")))
        .list.n_unique()
    )


def tertile_edges(values: pl.Series) -> list[float]:
    return quantile_edges(values, 3)


@dataclass(frozen=True)
class CohortEdges:
    """Scheme edges fitted on one profile per real user (its first session)."""

    activity: list[float]
    buyer_median: float | None
    breadth: list[float]

    @classmethod
    def fit(cls, real_sessions: pl.DataFrame) -> CohortEdges:
        users = real_sessions.unique("user_id", keep="first", maintain_order=True).with_columns(
            category_breadth(pl.col("recent_click_categories")).alias("breadth")
        )
        buyers = users.filter(pl.col("prior_buys") > 0)["prior_buys"]
        return cls(
            activity=tertile_edges(users["prior_clicks"]),
            buyer_median=float(np.quantile(buyers.to_numpy(), 0.5)) if buyers.len() else None,
            breadth=tertile_edges(users["breadth"]),
        )

    def labels(self, sessions: pl.DataFrame) -> pl.DataFrame:
        """``sessions`` with one cohort column per scheme, from each session's own profile."""
        frequent = (
            pl.col("prior_buys") > self.buyer_median if self.buyer_median is not None else pl.lit(False)
        )
        propensity = (
            pl.when(pl.col("prior_buys") <= 0)
            .then(pl.lit("non_buyer"))
            .when(frequent)
            .then(pl.lit("frequent"))
            .otherwise(pl.lit("occasional"))
        )
        return sessions.with_columns(
            _tertile(pl.col("prior_clicks"), self.activity, SCHEMES["activity"]).alias("activity"),
            propensity.alias("purchase_propensity"),
            _tertile(
                category_breadth(pl.col("recent_click_categories")), self.breadth, SCHEMES["category_breadth"]
            ).alias("category_breadth"),
        )


def _tertile(value: pl.Expr, edges: list[float], names: tuple[str, ...]) -> pl.Expr:
    position = pl.sum_horizontal([(value > edge).cast(pl.Int32) for edge in edges]) if edges else pl.lit(0)
    return position.clip(0, len(names) - 1).replace_strict(dict(enumerate(names)), return_dtype=pl.String)


@dataclass(frozen=True)
class Scales:
    """Distances' scales, fitted once on all real sessions."""

    length: float
    depth_edges: list[float]
    price_edges: list[float]
    categories: list[str]

    @property
    def category_support(self) -> list[str]:
        return [*self.categories, "other", "unknown"]

    @classmethod
    def fit(cls, sessions: pl.DataFrame, item_steps: pl.DataFrame, visit_rows: pl.DataFrame) -> Scales:
        lengths = sessions["length"].cast(pl.Float64)
        spread = float(lengths.std(ddof=0)) if lengths.len() else 0.0
        middle = float(lengths.mean()) if lengths.len() else 0.0
        ranked = (
            item_steps.filter(pl.col("top_category") != "unknown")
            .group_by("top_category")
            .len()
            .sort(["len", "top_category"], descending=[True, False])
        )
        return cls(
            length=spread or middle or 1.0,
            depth_edges=quantile_edges(visit_rows["depth"], DEPTH_BINS),
            price_edges=quantile_edges(item_steps["item_price"].drop_nulls(), PRICE_BINS),
            categories=ranked["top_category"].head(TOP_CATEGORIES).to_list(),
        )


@dataclass(frozen=True)
class CohortSide:
    """One side's sessions, item-carrying steps (with their top category), visits and executed actions."""

    sessions: pl.DataFrame
    item_steps: pl.DataFrame
    visits: pl.DataFrame
    actions: pl.DataFrame

    @classmethod
    def of(cls, side: Side, edges: CohortEdges) -> CohortSide:
        """``side`` with every session's cohort under each scheme."""
        # a step carries an item when it is a feed click or any detail-page step
        carries = (pl.col("action") == "click") | (pl.col("screen") == "ipv")
        item_steps = side.steps.filter(carries).select(
            "session_id", "item_price", top_category(pl.col("item_category")).alias("top_category")
        )
        actions = side.steps.select("session_id", "action")
        return cls(edges.labels(side.sessions), item_steps, side.visits, actions)


def _labelled(side: CohortSide, scheme: str) -> tuple[pl.DataFrame, ...]:
    """Sessions, item steps, visits and executed actions of one side, each with the scheme's cohort."""
    cohorts = side.sessions.select("session_id", pl.col(scheme).alias("cohort"))
    return tuple(
        frame.join(cohorts, on="session_id")
        for frame in (side.sessions, side.item_steps, side.visits, side.actions)
    )


def _cohort_counts(frame: pl.DataFrame, column: str, support: list[str]) -> dict[str, np.ndarray]:
    return {cohort: counts_over(group[column], support) for (cohort,), group in frame.group_by("cohort")}


def _signatures(side: CohortSide, scheme: str, scales: Scales) -> dict:
    """Per cohort of ``scheme``: session count, the scalar features and the four distributions' counts."""
    sessions, item_steps, visit_rows, action_rows = _labelled(side, scheme)
    per_cohort = sessions.group_by("cohort").agg(
        pl.len().alias("sessions"),
        pl.col("length").mean().alias("mean_length"),
        (pl.col("visits") > 0).mean().alias("visit_share"),
        (pl.col("returns") / pl.col("visits")).filter(pl.col("visits") > 0).mean().alias("return_proportion"),
        pl.col("carted").mean().alias("cart_rate"),
        pl.col("bought").mean().alias("buy_rate"),
    )
    category = pl.col("top_category")
    item_steps = item_steps.with_columns(
        pl.when(category.is_in(scales.categories) | (category == "unknown"))
        .then(category)
        .otherwise(pl.lit("other"))
        .alias("category_label"),
        bin_label(pl.col("item_price"), scales.price_edges).alias("price_label"),
    )
    visit_rows = visit_rows.with_columns(bin_label(pl.col("depth"), scales.depth_edges).alias("depth_label"))
    distributions = {
        "action": _cohort_counts(action_rows, "action", list(ACTIONS)),
        "information_depth": _cohort_counts(visit_rows, "depth_label", bin_support(scales.depth_edges)),
        "category": _cohort_counts(item_steps, "category_label", scales.category_support),
        "price": _cohort_counts(item_steps, "price_label", bin_support(scales.price_edges)),
    }
    return {
        row["cohort"]: {**row, **{name: counts.get(row["cohort"]) for name, counts in distributions.items()}}
        for row in per_cohort.iter_rows(named=True)
    }


def block_distances(real: dict, sim: dict, length_scale: float) -> dict[str, float]:
    """The eight distances between a real and a simulated cohort signature."""
    empty = np.zeros(1)
    return {
        "session_length": min(1.0, abs(real["mean_length"] - sim["mean_length"]) / length_scale),
        "action": jsd(_or(real["action"], empty), _or(sim["action"], empty)),
        "information_depth": jsd(_or(real["information_depth"], empty), _or(sim["information_depth"], empty)),
        "visit_share": abs(real["visit_share"] - sim["visit_share"]),
        "return_proportion": abs((real["return_proportion"] or 0.0) - (sim["return_proportion"] or 0.0)),
        "conversion": 0.5
        * (abs(real["cart_rate"] - sim["cart_rate"]) + abs(real["buy_rate"] - sim["buy_rate"])),
        "category": jsd(_or(real["category"], empty), _or(sim["category"], empty)),
        "price": jsd(_or(real["price"], empty), _or(sim["price"], empty)),
    }


def _or(counts: np.ndarray | None, empty: np.ndarray) -> np.ndarray:
    """A cohort with no rows of a kind (no visits, no item steps) has an empty distribution."""
    return counts if counts is not None else empty


def scheme_fidelity(real: dict, sim: dict, labels: tuple[str, ...], length_scale: float) -> dict:
    """Per-cohort fidelity (1 - mean block distance) and the scheme's mean over qualifying cohorts."""
    cohorts: dict[str, dict] = {}
    for label in labels:
        real_n = real.get(label, {}).get("sessions", 0)
        sim_n = sim.get(label, {}).get("sessions", 0)
        entry: dict[str, object] = {"real_sessions": real_n, "sim_sessions": sim_n}
        if real_n and sim_n:
            distances = block_distances(real[label], sim[label], length_scale)
            entry["fidelity"] = 1.0 - mean_or_zero(list(distances.values()))
            entry["blocks"] = distances
            entry["counted"] = real_n >= MIN_COHORT_SESSIONS and sim_n >= MIN_COHORT_SESSIONS
        cohorts[label] = entry
    counted = [entry["fidelity"] for entry in cohorts.values() if entry.get("counted")]
    return {"fidelity": mean_or_zero(counted), "counted_cohorts": len(counted), "cohorts": cohorts}


PROFILE_COLUMNS: tuple[str, ...] = ("prior_clicks", "prior_buys", "recent_click_categories")


def with_real_profiles(sim_sessions: pl.DataFrame, real_sessions: pl.DataFrame) -> pl.DataFrame:
    """A simulated session rolled out from a real one is that shopper's: it takes the real session's
    profile (a simulator's trace may not repeat it); one with no real counterpart keeps its own."""
    real = real_sessions.select("session_id", *(pl.col(c).alias(f"real_{c}") for c in PROFILE_COLUMNS))
    return sim_sessions.join(real, on="session_id", how="left", maintain_order="left").select(
        *(c for c in sim_sessions.columns if c not in PROFILE_COLUMNS),
        *(
            pl.when(pl.col("real_prior_clicks").is_not_null())
            .then(pl.col(f"real_{c}"))
            .otherwise(pl.col(c))
            .alias(c)
            for c in PROFILE_COLUMNS
        ),
    )


def population_fidelity(real: Side, sim: Side) -> dict[str, object]:
    """PF: mean over schemes with at least two qualifying cohorts of their cohort fidelity."""
    edges = CohortEdges.fit(real.sessions)
    sim = replace(sim, sessions=with_real_profiles(sim.sessions, real.sessions))
    real_side, sim_side = CohortSide.of(real, edges), CohortSide.of(sim, edges)
    scales = Scales.fit(real_side.sessions, real_side.item_steps, real_side.visits)
    schemes = {
        scheme: scheme_fidelity(
            _signatures(real_side, scheme, scales),
            _signatures(sim_side, scheme, scales),
            labels,
            scales.length,
        )
        for scheme, labels in SCHEMES.items()
    }
    counted = [entry["fidelity"] for entry in schemes.values() if entry["counted_cohorts"] >= 2]
    return {"PF": mean_or_zero(counted), "schemes": schemes}
