"""L3 population fidelity: cohort edges, assignment and the eight block distances, worked by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from evaluation.cohorts import CohortEdges, block_distances, population_fidelity
from evaluation.metrics import Side
from tests.evaluation.tiny import frames, steps, trace


def reference_jsd(p: list[float], q: list[float]) -> float:
    """Textbook base-2 JSD of two distributions, written independently of the code under test."""
    m = [(a + b) / 2 for a, b in zip(p, q, strict=True)]
    kl = lambda x: sum(a * math.log2(a / c) for a, c in zip(x, m, strict=True) if a > 0)  # noqa: E731
    return (kl(p) + kl(q)) / 2


def test_edges_use_one_profile_per_user_and_equal_values_go_lower(tmp_path):
    real = frames(
        tmp_path,
        "r",
        [
            trace("a1", steps("end"), user_id="a", prior_clicks=0, prior_buys=0),
            trace(
                "a2", steps("end"), user_id="a", prior_clicks=90, prior_buys=9
            ),  # later session: not fitted
            trace("b", steps("end"), user_id="b", prior_clicks=3, prior_buys=1),
            trace("c", steps("end"), user_id="c", prior_clicks=6, prior_buys=2),
            trace("d", steps("end"), user_id="d", prior_clicks=9, prior_buys=5),
        ],
    )
    edges = CohortEdges.fit(real.sessions)
    # clicks (0, 3, 6, 9): tertile positions 1 and 2 -> edges 3 and 6
    assert edges.activity == [3.0, 6.0]
    # buyers' prior buys (1, 2, 5) -> median 2
    assert edges.buyer_median == 2.0
    labelled = edges.labels(real.sessions)
    # a2's own profile labels its session: 90 clicks -> high, 9 buys -> frequent
    assert labelled["activity"].to_list() == ["low", "high", "low", "medium", "high"]
    assert labelled["purchase_propensity"].to_list() == [
        "non_buyer",
        "frequent",
        "occasional",
        "occasional",
        "frequent",
    ]


def test_category_breadth_counts_top_categories_of_the_20_newest_clicks(tmp_path):
    newest = ["A-x-y", "A-z-w", "B-x-y"] + ["C-q-r"] * 17  # 20 newest: tops A, B, C
    older = ["D-x-y", "E-x-y"]  # beyond the window
    real = frames(
        tmp_path,
        "r",
        [
            trace("a", steps("end"), categories=newest + older),
            trace("b", steps("end"), categories=["A-x-y"]),
            trace("c", steps("end"), categories=[]),
        ],
    )
    edges = CohortEdges.fit(real.sessions)
    # breadths (3, 1, 0): tertile positions 2/3 and 4/3 -> 0 + 2/3 * 1 and 1 + 1/3 * 2
    assert edges.breadth == pytest.approx([2 / 3, 5 / 3])
    assert edges.labels(real.sessions)["category_breadth"].to_list() == ["wide", "medium", "narrow"]


def signature(**values):
    base = {
        "mean_length": 4.0,
        "action": None,
        "information_depth": None,
        "visit_share": 0.5,
        "return_proportion": 0.5,
        "cart_rate": 0.2,
        "buy_rate": 0.1,
        "category": None,
        "price": None,
    }
    return {**base, **values}


def test_block_distances():
    real = signature(action=np.array([1.0, 1.0]), price=np.array([2.0, 0.0]))
    sim = signature(
        mean_length=7.0,
        action=np.array([1.0, 1.0]),
        visit_share=0.25,
        return_proportion=None,  # no simulated session had a visit: mean of nothing = 0
        cart_rate=0.4,
        buy_rate=0.0,
        price=np.array([0.0, 3.0]),
    )
    distances = block_distances(real, sim, length_scale=2.0)
    assert distances == pytest.approx(
        {
            "session_length": 1.0,  # |4 - 7| / 2 = 1.5, capped at 1
            "action": 0.0,  # same mix
            "information_depth": 0.0,  # both sides without visits
            "visit_share": 0.25,
            "return_proportion": 0.5,
            "conversion": 0.15,  # (|0.2 - 0.4| + |0.1 - 0|) / 2
            "category": 0.0,  # both empty
            "price": 1.0,  # disjoint bins
        }
    )


def cohort_population(tmp_path, sim_high_steps):
    """90 users, one session each: prior clicks 0..89 (activity tertiles of 30), prior buys 0 for the first
    30 and 1, 2 alternating after (buyers' median 1.5: 30 occasional, 30 frequent); no click history, so
    every breadth is 0 and that scheme has a single cohort. Real sessions are all scroll_down, end; the
    simulated ones too except the high-activity users', which are ``sim_high_steps``."""
    real, sim = [], []
    for user in range(90):
        buys = 0 if user < 30 else 1 + user % 2
        profile = {"user_id": f"u{user}", "prior_clicks": user, "prior_buys": buys}
        real.append(trace(f"r{user}", steps("scroll_down", "end"), **profile))
        walk = sim_high_steps if user >= 60 else ("scroll_down", "end")
        sim.append(trace(f"r{user}", steps(*walk), **profile, source="sim"))
    return Side.of(frames(tmp_path, "r", real)), Side.of(frames(tmp_path, "s", sim))


def test_identical_population_has_full_fidelity(tmp_path):
    real, sim = cohort_population(tmp_path, ("scroll_down", "end"))
    result = population_fidelity(real, sim)
    assert result["PF"] == 1.0
    assert result["schemes"]["category_breadth"]["counted_cohorts"] == 1  # one breadth cohort: not counted
    assert [result["schemes"][s]["counted_cohorts"] for s in ("activity", "purchase_propensity")] == [
        3,
        2 + 1,
    ]


def test_population_fidelity_worked_example(tmp_path):
    real, sim = cohort_population(tmp_path, ("scroll_down", "scroll_down", "scroll_down", "end"))
    result = population_fidelity(real, sim)
    # every real length is 2: stdev 0 -> the scale falls back to the mean, 2.
    # activity/high: sim length 4 -> gap |2-4|/2 = 1; actions (.5, .5) vs (.75, .25); other blocks 0
    high = 1 - (1 + reference_jsd([0.5, 0.5], [0.75, 0.25])) / 8
    activity = (1 + 1 + high) / 3
    # occasional and frequent each hold 15 medium (identical) and 15 high users: sim mean length 3 -> gap
    # 0.5; sim actions: scroll_down 15*1 + 15*3 = 60, end 30 -> (2/3, 1/3)
    mixed = 1 - (0.5 + reference_jsd([0.5, 0.5], [2 / 3, 1 / 3])) / 8
    propensity = (1 + mixed + mixed) / 3
    assert result["schemes"]["activity"]["cohorts"]["high"]["fidelity"] == pytest.approx(high)
    assert result["schemes"]["activity"]["fidelity"] == pytest.approx(activity)
    assert result["schemes"]["purchase_propensity"]["fidelity"] == pytest.approx(propensity)
    assert result["PF"] == pytest.approx((activity + propensity) / 2)  # breadth not counted


def test_cohorts_under_30_sessions_do_not_count(tmp_path):
    real, _ = cohort_population(tmp_path, ("scroll_down", "end"))
    small = Side.of(frames(tmp_path, "small", [trace("x", steps("end"), prior_clicks=5)]))
    result = population_fidelity(real, small)
    # one simulated session: no cohort reaches 30 on both sides, no scheme counts, PF = mean of nothing = 0
    assert result["PF"] == 0.0
    assert result["schemes"]["activity"]["cohorts"]["low"]["counted"] is False


def test_simulated_sessions_take_their_real_sessions_profiles(tmp_path):
    real, _ = cohort_population(tmp_path, ("scroll_down", "end"))
    # the same 90 sessions simulated, but written without profiles (every count 0)
    bare = [
        trace(f"r{user}", steps("scroll_down", "end"), user_id=f"u{user}", source="sim") for user in range(90)
    ]
    result = population_fidelity(real, Side.of(frames(tmp_path, "bare", bare)))
    # each simulated session is placed in its real session's cohort, so the population matches exactly
    assert result["PF"] == 1.0
    assert result["schemes"]["activity"]["cohorts"]["high"]["sim_sessions"] == 30
