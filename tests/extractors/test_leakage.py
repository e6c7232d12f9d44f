"""The leakage checker on a table of leaky and clean texts, and zero false positives on clean intents.

The trajectory: the tiny lake's items (titles, prices) plus one item seen only later.
Every expected code below follows from EXTRACTION.md's exclusions, reasoned per row.
"""

from __future__ import annotations

import pytest

from extractors.leakage import IndexEntry, LeakIndex, Violation, check_rationale, contradictions, find_leaks
from tests.extractors.tinylake import ITEM, ITEM_ROWS, USER

SEEN = [row for row in ITEM_ROWS if row[0] != "i06"]
LATER = [row for row in ITEM_ROWS if row[0] == "i06"]  # "Zenlia Everyday Satin Midi Dress", 99.00
TRAJECTORY = {
    "item_ids": [ITEM[s] for s, *_ in SEEN] + ["itm-00af31"],  # a raw-style id with a hyphen too
    "titles": [t for _, t, *_ in SEEN],
    "prices": [p for _, _, p, _ in SEEN],  # 129.00, 45.50, 59.90, 89.00, 75.00
    "identifiers": [USER["A"]],
    "future_item_ids": [ITEM[s] for s, *_ in LATER],
    "future_titles": [t for _, t, *_ in LATER],
    "generic_terms": ["Apparel", "Women", "Dresses", "Ankle boots", "Cotton", "Navy"],
}

# (text, expected codes in text order): 68 rows, 51 leaky and 17 clean
TABLE: list[tuple[str, list[str]]] = [
    # identifiers
    (f"revisits {ITEM['i01']} often", ["item_id"]),
    ("saw itm-00af31 twice", ["item_id"]),  # reported once: not again as a SKU-like identifier
    (f"user {USER['A']} likes linen", ["identifier"]),
    ("looks for SKU 88213-B and KX-44721 codes", ["identifier"]),  # letters + >= 3 digits
    ("remembers order 20260105113", ["identifier"]),  # 7+ digits in a row
    # titles and distinctive fragments
    ("wants the Lumora Slim Fit Linen Midi Dress", ["title"]),
    ("loyal to Lumora", ["title_fragment"]),  # brand position of a seen title
    ("likes the lumora slim cut", ["title_fragment"]),  # pair with a distinctive word
    ("keeps coming to Kanex classics", ["title_fragment"]),
    ("prefers slim fit linen midi lengths", ["title_fragment"]),  # 4 title words in a row
    ("veria relaxed cotton blouses", ["title"]),  # plural still matches the whole title
    # prices, in any format
    ("spends about 129 on a dress", ["price"]),
    ("pays 129.00 without blinking", ["price"]),
    ("¥129 feels right", ["price"]),
    ("a 129 yuan ceiling", ["price"]),
    ("checks whether it is under 45.5", ["price"]),  # 45.50 written with one decimal
    ("fine with $35 items", ["currency_amount"]),  # money, though not a trajectory price
    ("keeps to 60 euros", ["currency_amount"]),
    ("售价129元以内", ["price"]),
    # actions and outcomes, in several inflections
    ("clicked on anything green", ["action_word"]),
    ("keeps scrolling past basics", ["action_word"]),
    ("carts items fast", ["action_word"]),
    ("swipes through every photo", ["action_word"]),
    ("added it to her wishlist", ["action_word"]),
    ("went back to the feed quickly", ["action_word"]),
    ("bought two pairs", ["outcome_word"]),
    ("purchases on impulse", ["outcome_word"]),
    ("ordered the larger size", ["outcome_word"]),
    ("returned the skirt", ["outcome_word"]),
    ("ended the session without choosing", ["outcome_word"]),
    ("tends to end each session empty-handed", ["outcome_word"]),  # "end ... session" as an outcome
    # "check out", every inflection and spelling: one outcome each
    ("tends to check out fast", ["outcome_word"]),
    ("checks out without comparing", ["outcome_word"]),
    ("checking out is quick for her", ["outcome_word"]),
    ("prefers a checked-out basket", ["outcome_word"]),
    ("dislikes a slow check-out", ["outcome_word"]),
    ("many checkouts in a week", ["outcome_word"]),
    ("likes to check it out in person", ["outcome_word"]),
    # "add to cart", every inflection and spelling: one action each, the phrase not repeated as "cart"
    ("add to cart is her habit", ["action_word"]),
    ("added it to my cart at once", ["action_word"]),
    ("adding to cart without reading", ["action_word"]),
    ("put it in the cart", ["action_word"]),
    ("relies on add-to-cart", ["action_word"]),
    ("fond of add_to_cart", ["action_word"]),
    ("placed it in the basket", ["action_word"]),
    ("tosses options into her shopping trolley", ["action_word"]),
    ("wishlisted the dress", ["action_word"]),
    # steps and positions
    ("hesitated at step 5", ["step_reference"]),
    ("the third item caught her eye", ["position_reference"]),
    ("in the second session she slowed down", ["step_reference"]),
    # items seen only later
    ("would like the Zenlia style", ["future_item"]),
    # clean
    ("prefers relaxed, breathable linen in muted tones", []),
    ("reads other buyers' photos of fit", []),  # "buyers" is not "buy"
    ("drawn to high-end materials", []),  # "high-end" is not "end"
    ("commits only after reviews confirm the fit", []),
    ("needs 100% cotton against the skin", []),  # a percentage, not a price
    ("keeps to a budget under 200", []),  # 200 is not a trajectory price
    ("likes 2-in-1 and 3-piece sets", []),  # number-word compounds are not SKUs
    ("purchasing power sets a mid-range ceiling", []),  # the profile field, not an outcome
    ("weighs similar dresses against each other", []),  # category words belong to no item
    ("worries about return policies", []),  # a concern, not the outcome "returned"
    ("favours navy ankle boots in cotton", []),
    # words that only look like the forbidden ones
    ("drawn to checkered patterns", []),
    ("likes cartoon prints", []),
    ("wants sturdy carton packaging", []),
    ("I checked the price twice", []),  # checking something is not checking out
    ("wants outfits that stand out", []),
    ("adds layers in colder months", []),  # adding, but to nothing like a cart
]


@pytest.mark.parametrize(("text", "codes"), TABLE)
def test_leakage_table(text: str, codes: list[str]):
    assert [v.code for v in find_leaks(text, **TRAJECTORY)] == codes


def test_table_is_big_enough():
    leaky = [t for t, codes in TABLE if codes]
    assert len(TABLE) >= 30 and len(leaky) >= 20 and len(TABLE) - len(leaky) >= 10


def test_violation_carries_what_matched():
    (v,) = find_leaks("pays 129.00 for it", **TRAJECTORY)
    assert v == Violation("price", "129.00")


# Anchors written the way the prompt asks: abstract, about the person, not the log.
CLEAN_INTENTS = [
    "prefers light, breathable fabrics in muted colours",
    "worries about sizing consistency",
    "reads other buyers' photos of fit",
    "compares material quality across similar tops",
    "commits only after reviews confirm the fit",
    "drawn to minimalist, tailored silhouettes",
    "leans toward budget-friendly options",
    "comfortable with premium-priced options when quality is evident",
    "hesitates when delivery times are unclear",
    "checks the specifications before deciding",
    "relies on other shoppers' reviews before deciding",
    "looks closely at product photos",
    "weighs a handful of alternatives side by side",
    "settles on a shortlist quickly",
    "keeps options open rather than committing right away",
    "favours classic cuts that work for the office",
    "sensitive to stitching and finishing quality",
    "wants care instructions to be simple",
    "if the colour looks different from the photos, moves on",
    "values versatile pieces that layer across seasons",
    "prefers natural materials such as linen and wool",
    "cautious about thin or see-through fabrics",
    "compares how similar dresses drape before deciding",
    "drawn to earthy and neutral palettes",
    "looks for reassurance that the size runs true",
    "judges mostly from a first impression",
    "often unconvinced once the full details are in front of them",
    "holds off on a final commitment even when an option appeals",
    "commits quickly when an option matches at first glance",
    "favours mid-range prices",
]


@pytest.mark.parametrize("text", CLEAN_INTENTS)
def test_clean_intents_have_no_false_positives(text: str):
    assert find_leaks(text, **TRAJECTORY) == []


# --- rationale checks --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "action", "expected"),
    [
        (
            "I'll buy it now, it is perfect.",
            "scroll_down",
            ["contradicts_action"],
        ),  # buy claimed, scroll done
        ("Not ready to buy yet, so I'll keep looking.", "scroll_down", []),  # negated: no claim
        ("I'll add it to my cart for later.", "ipv_cart", []),  # the claim is the recorded action
        ("I'll add it to my cart for later.", "ipv_buy", ["contradicts_action"]),
        ("Time to stop browsing for now.", "end", []),
        ("Time to stop browsing for now.", "click", ["contradicts_action"]),
        ("I'll head back to the feed and keep looking.", "back_home", []),
        # claims of having done it, in any form
        ("I added it to cart.", "scroll_down", ["contradicts_action"]),
        ("I've added this to my cart.", "ipv_scroll_down", ["contradicts_action"]),
        ("Adding to cart now.", "scroll_down", ["contradicts_action"]),
        ("I put it in the cart.", "click", ["contradicts_action"]),
        ("I bought it.", "scroll_down", ["contradicts_action"]),
        ("I checked out.", "click", ["contradicts_action"]),
        ("I'm checking out now.", "ipv_cart", ["contradicts_action"]),
        ("I went back to the feed.", "click", ["contradicts_action"]),
        ("I'm done shopping for today.", "ipv_scroll_down", ["contradicts_action"]),
        ("I'll scroll down to see more.", "click", ["contradicts_action"]),
        ("I'll scroll down to see more.", "scroll_up", ["contradicts_action"]),  # the other direction
        ("I'll scroll down to see more.", "ipv_scroll_down", []),
        ("I'll keep scrolling.", "scroll_up", []),  # no direction: any scroll
        # not a claim of another action
        ("I already added it to my cart, so I'll keep looking.", "scroll_down", []),  # placed earlier
        ("I added it to my cart earlier; now I want more options.", "scroll_down", []),
        ("I'll check out the reviews first.", "ipv_enter_comment", []),  # looking, not paying
        ("The details check out and it suits me; I'll save it in my cart.", "ipv_cart", []),
        ("I saved some money last month.", "click", []),  # saved, but not into a cart
        ("I checked the price and it is fair.", "ipv_buy", []),
    ],
)
def test_rationale_consistency(text: str, action: str, expected: list[str]):
    assert [v.code for v in contradictions(text, action)] == expected


def test_rationale_checks_length_future_and_ids():
    # owners say who an entry belongs to; the rationale's job decides which owners are still in the future
    index = LeakIndex.build(
        [
            IndexEntry("i01", ITEM["i01"], "Lumora Slim Fit Linen Midi Dress", 129.0),
            IndexEntry("i06", ITEM["i06"], "Zenlia Everyday Satin Midi Dress", 99.0),
        ],
        identifiers=[USER["A"]],
    )

    def check(text: str, max_words: int = 40) -> list[str]:
        found = check_rationale(
            text, action="click", index=index, is_future=lambda o: o == "i06", max_words=max_words
        )
        return [v.code for v in found]

    assert check("") == ["empty"]
    assert check("one two three four five six", max_words=5) == ["too_long"]  # 6 words > 5
    assert check("The Lumora slim dress at 129 looks right.") == []  # on screen now: title and price are fair
    assert check("The Zenlia one further down is nicer.") == ["future_item"]  # first seen later
    assert check("Zenlia at 99 would be nicer.") == ["future_item", "future_item"]  # its brand and its price
    assert check(f"It is {ITEM['i01']}, I'll look.") == ["item_id"]  # ids never, even of a visible item
    assert check(f"Same as {USER['A']} wanted.") == ["identifier"]
    assert check("Like at step 3, I'll look closer.") == ["step_reference"]
