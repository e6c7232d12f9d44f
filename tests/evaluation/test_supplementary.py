"""Supplementary figures: action mix, funnel, RecVerse statistics, HCO and decision alignment."""

from __future__ import annotations

import polars as pl
import pytest

from evaluation.metrics import Side
from evaluation.supplementary import (
    action_jsd,
    decision_alignment,
    funnel,
    hierarchical_category_overlap,
    recverse_statistics,
)
from tests.evaluation.tiny import frames, steps, trace


def side(tmp_path, name, traces) -> Side:
    return Side.of(frames(tmp_path, name, traces))


def test_recverse_statistics(tmp_path):
    pooled = side(
        tmp_path,
        "t",
        [
            trace("a", steps("scroll_down", "click", "ipv_swipe_pic", "ipv_cart", "back_home", "end")),
            trace("b", steps("click", "ipv_buy", "!ipv_cart", "end@ipv")),
        ],
    )
    stats = recverse_statistics(pooled.steps, pooled.sessions)
    # executed actions: a 6, b 3 -> ATL 4.5; feed actions: a scroll, click, end + b click = 4, clicks 2
    # -> CTR 50 %; detail-page actions: a 3 + b 2 = 5 of 9 -> IPVR 55.56 %; carts 1 / 2 clicks -> ACR
    # 50 %; buys 1 / 2 clicks -> CVR 50 %
    assert stats == pytest.approx({"ATL": 4.5, "CTR": 50.0, "IPVR": 500 / 9, "ACR": 50.0, "CVR": 50.0})


def test_funnel_shares_and_counts(tmp_path):
    pooled = side(
        tmp_path,
        "t",
        [
            trace("a", steps("click", "ipv_cart", "back_home", "end")),
            trace("b", steps("scroll_down", "end")),
            trace("c", steps("click", "ipv_buy", "end@ipv")),
            trace("d", steps("!click", "end")),
        ],
    )
    result = funnel(pooled.steps, pooled.sessions)
    # 4 sessions: a and c click and open a page; a carts; c buys (d's click was rejected)
    assert result == {
        "sessions": 4,
        "click_share": 0.5,
        "detail_page_share": 0.5,
        "cart_share": 0.25,
        "buy_share": 0.25,
        "visits": 2,
        "feed_actions": 6,  # a: click, end; b: scroll, end; c: click; d: end
        "clicks": 2,
        "carts": 1,
        "buys": 1,
    }


def test_action_jsd(tmp_path):
    real = side(tmp_path, "r", [trace("r", steps("scroll_down", "end"))])
    sim = side(tmp_path, "s", [trace("s", steps("scroll_up", "end"))])
    # P = (scroll_down .5, end .5), Q = (scroll_up .5, end .5): M = (.25, .25, .5)
    # KL(P||M) = .5 log2(2) + .5 log2(1) = .5 = KL(Q||M) -> JSD .5
    assert action_jsd(real.steps, sim.steps) == pytest.approx(0.5)


def clicks(session_id: str, *categories: str) -> list:
    out = []
    for number, category in enumerate(categories):
        out += steps("click", "back_home", item=f"{session_id}{number}", category=category)
    return out + steps("end")


def test_hierarchical_category_overlap(tmp_path):
    real = side(
        tmp_path,
        "r",
        [
            trace("s1", clicks("r", "A-x-y", "B-z-w")),
            trace("only-real", clicks("q", "C-a-b")),
            trace("s2", clicks("p", "D-d-d")),
        ],
    )
    sim = side(tmp_path, "s", [trace("s1", clicks("s", "A-x-q")), trace("s2", steps("!click", "end"))])
    # sim s1 A-x-q: best over real {A-x-y: 2 of 3 levels, B-z-w: 0} -> 2/3; s2 clicked nothing -> CP = 2/3
    # real s1 A-x-y -> 2/3, B-z-w -> 0; s2 D-d-d has no simulated click to match -> 0: CR = (2/3) / 3
    # 'only-real' is not on both sides and is left out
    # HCO = 2 * (2/3) * (2/9) / (2/3 + 2/9) = (8/27) / (8/9) = 1/3
    expected = {"HCO": 100 / 3, "CP": 200 / 3, "CR": 200 / 9}
    assert hierarchical_category_overlap(real, sim) == pytest.approx(expected)


def test_decision_alignment(tmp_path):
    sim = side(
        tmp_path,
        "s",
        [
            trace("bought-ok", steps("click", "ipv_buy", "end@ipv", item="i1")),
            trace("bought-bad", steps("click", "ipv_buy", "end@ipv", item="i2")),
            trace("carted-ok", steps("click", "ipv_cart", "back_home", "end", item="i3")),
            trace("rejected-cart", steps("click", "!ipv_cart", "back_home", "end", item="i4")),
            trace("left-acceptable", steps("scroll_down", "end")),
            trace("left-nothing", steps("scroll_down", "end")),
        ],
    )
    acceptable = pl.DataFrame(
        {
            "session_id": ["bought-ok", "bought-bad", "carted-ok", "rejected-cart", "left-acceptable"],
            "item_id": ["i1", "i9", "i3", "i4", "i5"],
        }
    )
    # purchases (a cart or a buy that was executed): bought-ok (i1 acceptable, aligned), bought-bad (i2 is
    # not, misaligned), carted-ok (i3 acceptable, aligned) -> 2 of 3. The rejected cart is no purchase:
    # rejected-cart left with i4 acceptable on show (misaligned), like left-acceptable; left-nothing is
    # aligned -> 1 of 3. Overall 3 of 6.
    assert decision_alignment(sim, acceptable) == pytest.approx(
        {
            "decision_alignment": 0.5,
            "purchase_alignment": 2 / 3,
            "no_purchase_alignment": 1 / 3,
            "purchase_sessions": 3,
            "no_purchase_sessions": 3,
        }
    )
