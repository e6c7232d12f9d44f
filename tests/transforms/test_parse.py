"""The simulator-response parser: PROTOCOL.md §2, every rejection reason and their order."""

from __future__ import annotations

import json

import pytest

from transforms.prompts import (
    REJECT_REASONS,
    Accepted,
    Candidate,
    Card,
    DetailPage,
    Observation,
    Rejected,
    judge_response,
    legal_actions,
    parse_rate,
    parse_response,
    strip_thinking,
)

CARDS = [
    Card(item_id="a", title="Linen shirt", price=10.0, category_l1="Apparel"),
    Card(item_id="b", title="Canvas tote", price=20.0, category_l1="Bags"),
    Card(item_id="c", title="Two\nlines", price=5.0, category_l1="Home"),
]
FEED = Observation(screen="feed", scroll_top=100, max_scroll=547, cards=CARDS)
FEED_TOP = Observation(screen="feed", scroll_top=0, max_scroll=547, cards=CARDS)
FEED_EMPTY = Observation(screen="feed", scroll_top=100, max_scroll=547, cards=[])


def page(scroll: int = 0, max_scroll: int | None = 1913, ui: str = "main", reviews: int = 1) -> Observation:
    detail = DetailPage(
        item_id="a",
        title="Linen shirt",
        scroll=scroll,
        max_scroll=max_scroll,
        ui_state=ui,
        reviews=[f"review {n}" for n in range(1, reviews + 1)],
    )
    return Observation(screen="ipv", scroll_top=100, max_scroll=547, page=detail)


def response(action: object, rationale: object = "I want to see more") -> str:
    return json.dumps({"rationale": rationale, "action": action})


def reason(text: str, obs: Observation = FEED) -> str | None:
    verdict = judge_response(text, obs)
    return verdict.reason if isinstance(verdict, Rejected) else None


# --- parsing -------------------------------------------------------------------------------


def test_reasons_are_the_protocol_order():
    assert REJECT_REASONS == ("parse_failure", "unknown_action", "illegal_in_state", "target_unresolved")


def test_a_leading_think_block_is_stripped():
    text = '  <think>the tote is cheaper</think>\n{"rationale": "r", "action": {"type": "end"}}'
    assert strip_thinking(text).strip() == '{"rationale": "r", "action": {"type": "end"}}'
    assert parse_response(text) == Candidate(type="end", rationale="r")


@pytest.mark.parametrize(
    "text",
    [
        '<think>never closed {"rationale": "r", "action": {"type": "end"}}',
        '<think>a <think>nested</think> one</think>{"rationale": "r", "action": {"type": "end"}}',
        'Sure! {"rationale": "r", "action": {"type": "end"}}',  # text before the JSON: not strict
        '{"rationale": "r", "action": {"type": "end"}} trailing',
        '```json\n{"rationale": "r", "action": {"type": "end"}}\n```',
    ],
)
def test_only_strict_json_after_one_complete_think_block_parses(text):
    assert reason(text) == "parse_failure"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not json",
        json.dumps([{"rationale": "r", "action": {"type": "end"}}]),  # an array, not an object
        json.dumps({"action": {"type": "end"}}),  # no rationale
        response({"type": "end"}, rationale=3),  # rationale not a string
        response({"type": "end"}, rationale=None),
        json.dumps({"rationale": "r", "action": "end"}),  # action not an object
        response({"kind": "end"}),  # no type
        response({"type": ""}),  # empty type
        response({"type": "   "}),  # blank type
        response({"type": 7}),  # type not a string
        response({"type": "click", "target": 12}),  # a non-string target
        response({"type": "click", "target_item_id": ["a"]}),
        '{"rationale": "r", "action": {"type": "scroll_down", "distance": NaN}}',  # NaN is not JSON
    ],
)
def test_parse_failures(text):
    assert reason(text) == "parse_failure"


def test_parse_keeps_the_written_arguments_unchecked():
    parsed = parse_response(response({"type": "scroll_down", "distance": 100.0, "target": "x"}))
    assert parsed == Candidate(type="scroll_down", rationale="I want to see more", target="x", distance=100.0)


# --- unknown and illegal actions ---------------------------------------------------------------


@pytest.mark.parametrize("kind", ["jump", "Click", " click", "ipv_share"])
def test_unknown_actions(kind):
    assert reason(response({"type": kind})) == "unknown_action"


@pytest.mark.parametrize(
    ("action", "obs"),
    [
        ({"type": "scroll_up", "distance": 100}, FEED_TOP),  # offset 0: scroll_up would not move
        (
            {"type": "scroll_down", "distance": 100},
            Observation(screen="feed", scroll_top=547, max_scroll=547),
        ),
        ({"type": "click", "target_item_id": "a"}, FEED_EMPTY),  # no card in view
        ({"type": "ipv_cart"}, FEED),  # a detail-page action on the feed
        ({"type": "back_home"}, FEED),
        ({"type": "scroll_down", "distance": 100}, page()),  # a feed action on the detail page
        ({"type": "click", "target_item_id": "a"}, page()),
        ({"type": "ipv_scroll_up", "distance": 100}, page(scroll=0)),
        ({"type": "ipv_scroll_down", "distance": 100}, page(scroll=1913)),  # bottom of the main page
        ({"type": "ipv_click_comment", "target": "C1"}, page(reviews=0)),  # no reviews
    ],
)
def test_illegal_in_state(action, obs):
    assert reason(response(action), obs) == "illegal_in_state"


def test_ipv_scroll_down_inside_the_review_list_and_on_a_page_of_unknown_height():
    down = response({"type": "ipv_scroll_down", "distance": 100})
    # at the page bottom (1913 = max) the open review list still scrolls; a page without a known
    # height is never at its bottom
    assert reason(down, page(scroll=1913, ui="comments")) is None
    assert reason(down, page(scroll=5000, max_scroll=None)) is None
    assert "ipv_scroll_down" not in legal_actions(page(scroll=1913))


def test_end_is_legal_on_both_screens():
    assert reason(response({"type": "end"}), FEED) is None
    assert reason(response({"type": "end"}), page()) is None


# --- targets ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("action", "obs"),
    [
        ({"type": "click", "target_item_id": "zzz"}, FEED),  # id not among the cards in view
        ({"type": "click", "target_item_id": "zzz", "target": "Linen shirt"}, FEED),  # the id alone decides
        ({"type": "click", "target": "Linen Shirt"}, FEED),  # titles match exactly
        ({"type": "click", "target": "Linen shirt "}, FEED),
        ({"type": "click"}, FEED),  # nothing named
        ({"type": "click", "target": ""}, FEED),
        # the page's review block shows PromptSettings.inline_reviews = 2 reviews: C3 is not in view
        # (the environment passes only the reviews its geometry puts in view: test_environment.py)
        ({"type": "ipv_click_comment", "target": "C3"}, page(reviews=3)),
        ({"type": "ipv_click_comment", "target": "C4"}, page(ui="comments", reviews=3)),
        ({"type": "ipv_click_comment", "target": "c1"}, page(reviews=3)),
        ({"type": "ipv_click_comment"}, page(reviews=3)),
        ({"type": "scroll_down", "distance": True}, FEED),  # a bool is not a plain integer
        ({"type": "scroll_down", "distance": 100.0}, FEED),  # nor is a float, even a whole one
        ({"type": "scroll_down", "distance": "100"}, FEED),
        ({"type": "scroll_down"}, FEED),  # missing
        ({"type": "scroll_down", "distance": 0}, FEED),  # range 1..694
        ({"type": "scroll_up", "distance": 695}, FEED),
        ({"type": "scroll_down", "distance": -5}, FEED),
        ({"type": "ipv_scroll_down", "distance": 838}, page()),  # range 1..837
        ({"type": "ipv_scroll_down", "distance": False}, page()),
    ],
)
def test_target_unresolved(action, obs):
    assert reason(response(action), obs) == "target_unresolved"


def test_click_by_id_decides_even_against_another_cards_title():
    verdict = judge_response(
        response({"type": "click", "target_item_id": "b", "target": "Linen shirt"}), FEED
    )
    assert verdict == Accepted("click", "I want to see more", target_item_id="b", target_title="Canvas tote")


def test_click_by_exact_title_as_shown_or_as_catalogued():
    shown = judge_response(response({"type": "click", "target": "Two lines"}), FEED)  # clean(): LF -> space
    catalogued = judge_response(response({"type": "click", "target": "Two\nlines"}), FEED)
    assert isinstance(shown, Accepted) and shown.target_item_id == "c"
    assert isinstance(catalogued, Accepted) and catalogued.target_item_id == "c"


def test_review_aliases_in_view():
    main = judge_response(response({"type": "ipv_click_comment", "target": "C1"}), page(reviews=3))
    listed = judge_response(
        response({"type": "ipv_click_comment", "target": "C3"}), page(ui="comments", reviews=3)
    )
    assert isinstance(main, Accepted) and main.review_alias == "C1"
    assert isinstance(listed, Accepted) and listed.review_alias == "C3"


def test_scroll_limits_are_inclusive():
    assert judge_response(response({"type": "scroll_down", "distance": 694}), FEED) == Accepted(
        "scroll_down", "I want to see more", distance=694
    )
    assert reason(response({"type": "scroll_up", "distance": 1}), FEED) is None
    assert reason(response({"type": "ipv_scroll_down", "distance": 837}), page()) is None


def test_accepted_action_object_is_the_history_windows_form():
    verdict = judge_response(response({"type": "click", "target_item_id": "c"}), FEED)
    assert isinstance(verdict, Accepted)
    assert verdict.action_object() == {"type": "click", "target": "Two lines", "target_item_id": "c"}


# --- order ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("action", "obs", "expected"),
    [
        # a non-string target is a parse failure before the unknown type is looked at
        ({"type": "teleport", "target": 5}, FEED, "parse_failure"),
        # an unknown type before legality: nothing about the state matters
        ({"type": "teleport", "distance": True}, FEED_EMPTY, "unknown_action"),
        # illegal before the argument: scroll_up at the top with a bad distance
        ({"type": "scroll_up", "distance": True}, FEED_TOP, "illegal_in_state"),
        # click on an empty feed with an unknown id: illegal (no card in view), not unresolved
        ({"type": "click", "target_item_id": "zzz"}, FEED_EMPTY, "illegal_in_state"),
        # an ipv action on the feed with an alias that is nowhere: illegal
        ({"type": "ipv_click_comment", "target": "C9"}, FEED, "illegal_in_state"),
        # legal action, bad argument: unresolved
        ({"type": "scroll_up", "distance": True}, FEED, "target_unresolved"),
    ],
)
def test_the_first_reason_that_applies_wins(action, obs, expected):
    assert reason(response(action), obs) == expected


def test_rejections_keep_the_type_asked_for():
    verdict = judge_response(response({"type": "scroll_up", "distance": 1}), FEED_TOP)
    assert isinstance(verdict, Rejected)
    assert (verdict.reason, verdict.type) == ("illegal_in_state", "scroll_up")
    assert judge_response("nope", FEED).type is None  # type: ignore[union-attr]


def test_parse_rate_is_the_share_in_the_response_format():
    # 2 of 4 parse: an unknown type still has the format (rejected later, with the state)
    texts = [response({"type": "end"}), response({"type": "jump"}), "no", response({"type": ""})]
    assert parse_rate(texts) == 0.5
    assert parse_rate([]) == 0.0
