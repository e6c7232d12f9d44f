"""L0, L1, L2 and L4 on tiny traces; expected values worked out in the comments."""

from __future__ import annotations

import math

import polars as pl
import pytest

from evaluation.metrics import (
    Side,
    bin_label,
    decision_mix_jsd,
    jsd,
    macro_f1,
    non_scroll_accuracy,
    outcome_rates,
    output_validity,
    quantile_edges,
    terminal_jsd,
    trajectory_error,
)
from evaluation.scorecard import rounded, score
from evaluation.traces import REPLAY_SCHEMA
from tests.evaluation.tiny import frames, steps, trace


def reference_jsd(p: list[float], q: list[float]) -> float:
    """Textbook base-2 JSD of two distributions, written independently of the code under test."""
    m = [(a + b) / 2 for a, b in zip(p, q, strict=True)]
    kl = lambda x: sum(a * math.log2(a / c) for a, c in zip(x, m, strict=True) if a > 0)  # noqa: E731
    return (kl(p) + kl(q)) / 2


def test_jsd_shared_rules():
    assert jsd([2, 3], [4, 6]) == 0.0  # same distribution after normalising
    assert jsd([1, 0], [0, 1]) == 1.0  # disjoint supports: base-2 JSD = 1
    assert jsd([0, 0], [0, 0]) == 0.0  # both sides empty
    assert jsd([0, 0], [1, 2]) == 1.0  # one side empty


def test_jsd_worked_value():
    # P = (1, 0), Q = (.5, .5), M = (.75, .25)
    # KL(P||M) = log2(1/.75) = 0.4150375; KL(Q||M) = .5 log2(.5/.75) + .5 log2(.5/.25) = 0.2075187
    # JSD = (0.4150375 + 0.2075187) / 2 = 0.3112781
    assert jsd([3, 0], [5, 5]) == pytest.approx(0.3112781, abs=1e-7)
    assert jsd([3, 0], [5, 5]) == pytest.approx(reference_jsd([1, 0], [0.5, 0.5]))


def test_quantile_edges_interpolate_and_drop_duplicates():
    # [1, 2, 3, 4]: tertile positions 1/3*3 = 1 -> 2.0 and 2/3*3 = 2 -> 3.0
    assert quantile_edges(pl.Series([4, 1, 3, 2]), 3) == [2.0, 3.0]
    # [1, 2]: positions 1/3 and 2/3 -> 1 + 1/3 and 1 + 2/3 (linear interpolation)
    assert quantile_edges(pl.Series([1, 2]), 3) == pytest.approx([4 / 3, 5 / 3])
    # [0, 0, 0, 5]: positions 1 and 2 both fall on 0 -> one edge
    assert quantile_edges(pl.Series([0, 0, 0, 5]), 3) == [0.0]


def test_value_on_an_edge_goes_to_the_lower_bin():
    values = pl.DataFrame({"v": [2.0, 2.5, 3.0, 4.0, None]})
    labels = values.select(bin_label(pl.col("v"), [2.0, 3.0])).to_series().to_list()
    assert labels == ["b0", "b1", "b1", "b2", "unknown"]


def side(tmp_path, name, traces) -> Side:
    return Side.of(frames(tmp_path, name, traces))


def visit_rows(tmp_path, traces, name="t"):
    return side(tmp_path, name, traces).visits.sort("session_id", "visit")


def test_visits_decisions_and_information_depth(tmp_path):
    rows = visit_rows(
        tmp_path,
        [
            # visit 1: swipe, param (2 looks) then cart; the swipe after the decision and the rejected buy
            # do not count; visit 2: detail scroll then end on the page -> end, depth 0
            trace(
                "a",
                steps(
                    "scroll_down",
                    "click",
                    "ipv_swipe_pic",
                    "!ipv_buy",
                    "ipv_click_param",
                    "ipv_cart",
                    "ipv_swipe_pic",
                    "back_home",
                    "click",
                    "ipv_scroll_down",
                    "end@ipv",
                ),
            ),
            # a session that starts on a detail page opens a visit there: back_home -> return
            trace("b", steps("ipv_enter_comment", "back_home", "scroll_down", "end")),
            # no decision before the budget ran out -> open, depth 1
            trace("c", steps("click", "ipv_enter_comment", "ipv_scroll_down"), truncated=True),
        ],
    )
    assert rows.select("session_id", "decision", "depth").rows() == [
        ("a", "cart", 2),
        ("a", "end", 0),
        ("b", "return", 1),
        ("c", "open", 1),
    ]


def test_feed_step_closes_a_visit_and_detail_step_after_back_home_opens_one(tmp_path):
    # click, back_home (visit 1: return); then a detail step with no click before it opens visit 2
    rows = visit_rows(tmp_path, [trace("a", steps("click", "back_home", "ipv_buy", "end@ipv"))])
    assert rows["decision"].to_list() == ["return", "buy"]


def test_decision_mix_jsd(tmp_path):
    real = visit_rows(
        tmp_path, [trace("r", steps("click", "ipv_cart", "back_home", "click", "end@ipv"))], "r"
    )
    sim_steps = steps("click", "ipv_cart", "back_home", "click", "ipv_cart", "end@ipv")
    sim = visit_rows(tmp_path, [trace("s", sim_steps)], "s")
    # real decisions (cart, end), simulated (cart, cart): P = (.5, .5), Q = (1, 0) -> 0.3112781 as above
    assert decision_mix_jsd(real, sim) == pytest.approx(0.3112781, abs=1e-7)


def test_trajectory_error_counts_executed_actions_only(tmp_path):
    real = side(
        tmp_path,
        "r",
        [trace("r1", steps(*["scroll_down"] * 9, "end")), trace("r2", steps("click", "end@ipv"))],
    )
    sim = side(
        tmp_path,
        "s",
        [
            trace("s1", steps("scroll_down", "!click", "scroll_down", "end")),
            trace("s2", steps(*["scroll_down"] * 5)),
        ],
    )
    # real lengths 10 and 2 -> mean 6; simulated 3 (the rejected click is not an action) and 5 -> mean 4
    assert trajectory_error(real.sessions, sim.sessions) == 2.0


def test_outcome_rates_pool_executed_steps(tmp_path):
    pooled = side(
        tmp_path,
        "t",
        [
            trace("a", steps("scroll_down", "click", "ipv_cart", "back_home", "scroll_down", "end")),
            trace("b", steps("click", "!ipv_cart", "back_home", "click", "end@ipv")),
        ],
    )
    rates = outcome_rates(pooled.steps)
    # feed steps: a has scroll, click, scroll, end (4); b has click, click (2) -> 6; clicks 3 -> CTR = 1/2
    # carts: 1 executed (b's is rejected) over 3 clicks -> ACR = 1/3
    assert rates == pytest.approx({"CTR": 0.5, "ACR": 1 / 3})


def test_terminal_jsd_order_purchase_before_truncated(tmp_path):
    real = side(
        tmp_path, "r", [trace("r1", steps("click", "ipv_buy", "end@ipv")), trace("r2", steps("end"))]
    ).sessions
    sim = side(
        tmp_path,
        "s",
        [
            trace("s1", steps("click", "ipv_buy", "ipv_scroll_down"), truncated=True),  # bought -> purchase
            trace("s2", steps("click", "ipv_cart", "ipv_scroll_down"), truncated=True),  # -> truncated
        ],
    ).sessions
    assert sim["outcome"].to_list() == ["purchase", "truncated"]
    # real (purchase, browse_only), sim (purchase, truncated): P = (.5, 0, .5), Q = (.5, .5, 0)
    # M = (.5, .25, .25): KL(P||M) = .5 log2(.5/.25) = .5, KL(Q||M) = .5 -> JSD = .5
    assert terminal_jsd(real, sim) == pytest.approx(0.5)


def test_rollout_output_validity_counts_rejected_attempts(tmp_path):
    frame = frames(
        tmp_path, "s", [trace("s", steps("scroll_down", "!click", "click", "!ipv_buy", "back_home"))]
    )
    assert output_validity(frame.steps) == pytest.approx(3 / 5)  # 3 accepted of 5 outputs


def replay_frame(rows: list[dict]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=REPLAY_SCHEMA)


def row(gt: str, pred: str | None, accepted: bool = True, **targets: str) -> dict:
    return {"session_id": "s", "step_index": 0, "screen": "feed", "gt_action": gt, "pred_action": pred,
            "accepted": accepted, **targets}  # fmt: skip


REPLAY = [
    row("click", "click", gt_target_item_id="a", pred_target_item_id="a"),  # exact hit
    row("click", "click", gt_target_item_id="a", pred_target_item_id="b"),  # type only
    row("scroll_down", "scroll_down"),
    row("scroll_down", "click"),
    row("ipv_cart", "ipv_cart", accepted=False),  # rejected: counts as no prediction
    row("ipv_click_comment", "ipv_click_comment", gt_review_alias="C1", pred_review_alias="C2"),  # alias miss
    row("click", "click", gt_target_title="Red Mug ", pred_target_title=" Red Mug"),  # hit by stripped title
]


def test_replay_validity():
    assert output_validity(replay_frame(REPLAY)) == pytest.approx(6 / 7)


def test_macro_f1():
    # classes: gt {click, scroll_down, ipv_cart, ipv_click_comment} | accepted predictions (same set less cart)
    # click: 3 true, 4 predicted, 3 hits -> 2*3/(3+4) = 6/7; scroll_down: 2 true, 1 predicted, 1 hit -> 2/3
    # ipv_cart: 0 hits -> 0; ipv_click_comment: 1/1/1 -> 1; macro = (6/7 + 2/3 + 0 + 1) / 4
    assert macro_f1(replay_frame(REPLAY)) == pytest.approx((6 / 7 + 2 / 3 + 1) / 4)


def test_non_scroll_exact_accuracy():
    # click: hits on rows 1 and 7 of 3 -> 2/3; ipv_cart 0/1 (invalid); ipv_click_comment 0/1 (alias);
    # scroll classes left out -> (2/3 + 0 + 0) / 3
    assert non_scroll_accuracy(replay_frame(REPLAY)) == pytest.approx(2 / 9)


def test_click_with_id_on_one_side_and_title_on_the_other_is_a_miss():
    rows = [row("click", "click", gt_target_item_id="a", pred_target_title="Red Mug")]
    assert non_scroll_accuracy(replay_frame(rows)) == 0.0


def test_unscored_replay_rows_are_counted_not_scored(tmp_path):
    real = frames(tmp_path, "r", [trace("r", steps("scroll_down", "end"))])
    unscored = [{**row("click", None, accepted=False), "unscored_reason": "feed_layout_missing"}] * 2
    figures = score(real, real, replay_frame([row("end", "end"), *unscored]))
    # the one scored row is an accepted, correct end: RVA 1, F1 1, Acc 1; the two others only counted
    assert (figures["RVA"], figures["F1"], figures["Acc"]) == (1.0, 1.0, 1.0)
    assert figures["replay_unscored"] == {"feed_layout_missing": 2}


def test_score_without_replay_leaves_replay_figures_empty(tmp_path):
    real = frames(tmp_path, "r", [trace("r", steps("scroll_down", "end"))])
    figures = score(real, real)
    assert (figures["RVA"], figures["F1"], figures["Acc"]) == (None, None, None)
    assert (figures["OVA"], figures["TE"], figures["DM-JSD"], figures["T-JSD"]) == (1.0, 0.0, 0.0, 0.0)


def test_a_population_scored_against_itself_is_at_the_ceiling(tmp_path):
    walks = [
        ("scroll_down", "click", "ipv_swipe_pic", "ipv_cart", "back_home", "end"),
        ("click", "ipv_click_param", "ipv_buy", "end@ipv"),
        ("scroll_down", "scroll_down", "end"),
        ("click", "ipv_enter_comment", "ipv_click_comment", "back_home", "click", "back_home", "end"),
    ]
    categories = ["A-x-y", "B-z-w", "C-q-r", "D-d-d"]
    traces = [
        trace(
            f"s{n}",
            steps(*walks[n % 4], item=f"i{n % 9}", category=categories[n % 3], price=float(5 + n % 7)),
            user_id=f"u{n}",
            prior_clicks=n % 11,
            prior_buys=n % 5 if n % 3 else 0,
            categories=categories[: n % 4],
        )
        for n in range(120)
    ]
    real = frames(tmp_path, "r", traces)
    figures = score(real, real)
    # the same sessions on both sides: every distance 0, every cohort's fidelity 1, every overlap complete
    assert [figures[k] for k in ("DM-JSD", "TE", "dCTR", "dACR", "T-JSD", "action_JSD")] == [0.0] * 6
    assert figures["PF"] == 1.0
    assert all(entry["counted_cohorts"] >= 2 for entry in figures["cohorts"].values())
    assert figures["HCO"] == {"HCO": 100.0, "CP": 100.0, "CR": 100.0}
    assert figures["RecVerse"]["real"] == figures["RecVerse"]["sim"]


def test_printed_figures_have_four_decimals_and_te_and_atl_two():
    figures = {"TE": 1.23456, "PF": 0.123456, "RecVerse": {"real": {"ATL": 8.9251, "CTR": 12.345678}}, "n": 3}
    assert rounded(figures) == {
        "TE": 1.23,
        "PF": 0.1235,
        "RecVerse": {"real": {"ATL": 8.93, "CTR": 12.3457}},
        "n": 3,
    }
