"""The shopping environment: geometry, legality, detail-page dynamics, rollout endings, replay.

The in-memory session (fractional CSS pixels, as real logs have them; viewport 693 px,
a card is in view when at least half its height is)::

    card  y        height   spans              reading rank
    A       0      328.5      0    .. 328.5     0   (left column)
    B       0      300.25     0    .. 300.25    1   (right column)
    D     300.25   350.5    300.25 .. 650.75    2
    C     328.5    320.75   328.5  .. 649.25    3
    E     649.25   310      649.25 .. 959.25    4
    F     650.75   330.5    650.75 .. 981.25    5
    G     959.25   300      959.25 .. 1259.25   6
    H     981.25   318.25   981.25 .. 1299.5    7

feed height 1300.5 -> max offset 1300.5 - 693 = 607.5.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from evaluation.environment import (
    FRACTIONAL_PIXELS,
    EnvironmentSettings,
    PageLayout,
    ShoppingEnvironment,
    cards_in_view,
    shown_px,
)
from evaluation.loader import load_sessions
from evaluation.replay import ReplayCursor, recorded_action
from evaluation.rollout import Rollout
from evaluation.session import RecordedStep, Session, Trajectory
from evaluation.simulators import drive
from tests.bundles import tiny_bundle, write_bundle
from transforms.ingest import ingest_bundle
from transforms.lake import read_lake_table
from transforms.prompts import Accepted, PromptSettings, render_state
from transforms.prompts.render import reviews_open
from transforms.records import build_records, needed_items

BOXES = [  # item, x, y, height
    ("A", 4.0, 0.0, 328.5),
    ("B", 205.5, 0.0, 300.25),
    ("D", 4.0, 300.25, 350.5),
    ("C", 205.5, 328.5, 320.75),
    ("E", 205.5, 649.25, 310.0),
    ("F", 4.0, 650.75, 330.5),
    ("G", 205.5, 959.25, 300.0),
    ("H", 4.0, 981.25, 318.25),
]
FEED_HEIGHT = 1300.5
CATEGORY = {"A": "Apparel-Tops-Shirts", "C": "Home-Kitchen-Mugs"}


def layout() -> pl.DataFrame:
    return pl.DataFrame(
        {
            "item_id": [b[0] for b in BOXES],
            "rank": list(range(len(BOXES))),
            "x": [b[1] for b in BOXES],
            "y": [b[2] for b in BOXES],
            "width": [196.5] * len(BOXES),
            "height": [b[3] for b in BOXES],
            "feed_height": [FEED_HEIGHT] * len(BOXES),
        }
    )


def items() -> pl.DataFrame:
    ids = [b[0] for b in BOXES]
    return pl.DataFrame(
        {
            "item_id": ids,
            "title": [f"Item {i}" for i in ids],
            "price": [10.0 + n for n in range(len(ids))],
            "category": [CATEGORY.get(i, "Bags-Totes-Canvas") for i in ids],
            "params": [[{"label": "material", "value": "linen"}] for _ in ids],
            "reviews": [["fits well", "nice colour", "thin fabric"] for _ in ids],
        }
    )


def steps(offset: float = 120.5) -> pl.DataFrame:
    """The shopper's record: they scrolled and opened A, never C."""
    return pl.DataFrame(
        {
            "step": [0, 1, 2, 3],
            "screen": ["feed", "feed", "ipv", "ipv"],
            "action": ["scroll_up", "click", "back_home", "end"],
            "target_item_id": [None, "A", None, None],
            "distance": [100, None, None, None],
            "scroll_top": [offset, offset - 100, offset - 100, offset - 100],
            "ipv_item_id": [None, None, "A", "A"],
            "ipv_scroll": [None, None, 0.0, 0.0],
            "ui_state": [None, None, "main", "main"],
        }
    )


def session(offset: float = 120.5, **fields) -> Session:
    row = {"session_id": "s1", "user_id": "u1", "feed_height": FEED_HEIGHT, **fields}
    return Session.from_frames(row, layout(), items(), steps(offset))


def say(action: dict, rationale: str = "because") -> str:
    return json.dumps({"rationale": rationale, "action": action})


def accepted(env: ShoppingEnvironment, action: dict) -> Accepted:
    verdict = env.judge(say(action))
    assert isinstance(verdict, Accepted), verdict
    env.apply(verdict)
    return verdict


def reason(env: ShoppingEnvironment, action: dict) -> str | None:
    verdict = env.judge(say(action))
    return None if isinstance(verdict, Accepted) else verdict.reason


def shown(env: ShoppingEnvironment) -> list[str]:
    return [c.item_id for c in env.observation().cards]


# --- geometry --------------------------------------------------------------------------------


def test_viewport_crops_fractional_card_boxes():
    env = ShoppingEnvironment(session())
    # the feed opens at the first recorded offset, 120.5: view [120.5, 813.5]
    assert env.offset == 120.5
    assert env.max_offset == 607.5
    # A shows 328.5-120.5 = 208 >= 164.25; B 179.75 >= 150.125; D, C whole;
    # E 813.5-649.25 = 164.25 >= 155; F 813.5-650.75 = 162.75 < 165.25: out
    assert shown(env) == ["A", "B", "D", "C", "E"]
    accepted(env, {"type": "scroll_down", "distance": 200})
    # view [320.5, 1013.5]: A shows 8, B 0; D 650.75-320.5 = 330.25 >= 175.25; C, E, F whole;
    # G 1013.5-959.25 = 54.25 < 150, H 32.25 < 159.125
    assert env.offset == 320.5
    assert shown(env) == ["D", "C", "E", "F"]
    accepted(env, {"type": "scroll_down", "distance": 694})
    # 320.5 + 694 passes the bottom: clamped to 607.5, view [607.5, 1300.5]
    # D shows 43.25, C 41.75: out; E, F, G, H whole
    assert env.offset == 607.5
    assert shown(env) == ["E", "F", "G", "H"]


def test_a_card_showing_exactly_half_its_height_is_in_view():
    # at 123 the view ends at 816: F shows 816-650.75 = 165.25 = half of 330.5
    assert cards_in_view(session().cards, 123.0, EnvironmentSettings().geometry) == [
        "A",
        "B",
        "D",
        "C",
        "E",
        "F",
    ]


def test_a_missing_card_height_takes_the_reference_default():
    frame = layout().with_columns(
        pl.when(pl.col("item_id") == "A").then(None).otherwise(pl.col("height")).alias("height")
    )
    built = Session.from_frames({"session_id": "s"}, frame, items())
    assert built.cards[0].height == 328.0


def test_pixels_are_shown_as_the_renderer_carries_them():
    # whole values always print as integers; fractional ones stay exact where the models take floats
    assert shown_px(None) is None
    assert shown_px(120.0) == 120 and isinstance(shown_px(120.0), int)
    assert shown_px(120.25) == (120.25 if FRACTIONAL_PIXELS else 120)


def test_the_first_recorded_offset_is_clamped_to_the_feed():
    assert ShoppingEnvironment(session(offset=9000.0)).offset == 607.5


# --- legality ----------------------------------------------------------------------------------


def test_scroll_bounds():
    env = ShoppingEnvironment(session(offset=100.0))
    assert reason(env, {"type": "scroll_up", "distance": 694}) is None
    accepted(env, {"type": "scroll_up", "distance": 694})  # 100 - 694 clamps to 0
    assert env.offset == 0.0
    assert reason(env, {"type": "scroll_up", "distance": 1}) == "illegal_in_state"  # would not move
    accepted(env, {"type": "scroll_down", "distance": 500})
    assert env.offset == 500.0
    accepted(env, {"type": "scroll_down", "distance": 694})  # 500 + 694 clamps to 607.5
    assert env.offset == 607.5
    assert reason(env, {"type": "scroll_down", "distance": 1}) == "illegal_in_state"
    assert reason(env, {"type": "scroll_up", "distance": 695}) == "target_unresolved"


def test_click_needs_a_card_in_view():
    env = ShoppingEnvironment(session())
    # G is on the feed but out of view at 120.5
    assert reason(env, {"type": "click", "target_item_id": "G"}) == "target_unresolved"
    assert reason(env, {"type": "click", "target": "Item G"}) == "target_unresolved"
    empty = Session.from_frames({"session_id": "s"}, layout().clear(), items())
    assert reason(ShoppingEnvironment(empty), {"type": "click", "target_item_id": "A"}) == "illegal_in_state"


def test_a_counterfactual_click_opens_the_catalog_page():
    env = ShoppingEnvironment(session())
    # the shopper opened A only; C is in view and can be opened all the same
    accepted(env, {"type": "click", "target": "Item C"})
    page = env.observation().page
    assert env.screen == "ipv" and page is not None
    assert (page.item_id, page.title, page.price, page.category) == ("C", "Item C", 13.0, "Home-Kitchen-Mugs")
    accepted(env, {"type": "ipv_click_param"})
    text = render_state(Rollout(session()).state().model_copy(update={"observation": env.observation()}))[1][
        "content"
    ]
    assert "Open panel: params" in text
    assert "Parameters: material: linen" in text


def test_back_home_returns_to_the_feed_where_it_was():
    env = ShoppingEnvironment(session())
    before = shown(env)
    accepted(env, {"type": "click", "target_item_id": "E"})
    accepted(env, {"type": "ipv_scroll_down", "distance": 500})
    accepted(env, {"type": "back_home"})
    assert (env.screen, env.offset, shown(env)) == ("feed", 120.5, before)


# --- the detail page ---------------------------------------------------------------------------


def opened(item: str = "A", **layout_fields) -> ShoppingEnvironment:
    env = ShoppingEnvironment(session(), EnvironmentSettings(page=PageLayout(**layout_fields)))
    accepted(env, {"type": "click", "target_item_id": item})
    return env


def test_the_review_preview_c1_is_in_view_only_when_it_overlaps_the_viewport():
    env = opened(height=2750.0, review_block_at=0.6, review_block_height=240.0)
    # preview block at 0.6 * 2750 = 1650 .. 1890; the 837 px view [s, s + 837] reaches it at s > 813
    assert reason(env, {"type": "ipv_click_comment", "target": "C1"}) == "illegal_in_state"
    accepted(env, {"type": "ipv_scroll_down", "distance": 813})  # view ends at 1650: 0 px overlap
    assert reason(env, {"type": "ipv_click_comment", "target": "C1"}) == "illegal_in_state"
    accepted(env, {"type": "ipv_scroll_down", "distance": 1})  # 1 px overlap
    assert reason(env, {"type": "ipv_click_comment", "target": "C1"}) is None
    # the main page shows only the preview: C2 is not in view
    assert reason(env, {"type": "ipv_click_comment", "target": "C2"}) == "target_unresolved"
    assert env.observation().page.reviews == ["fits well"]  # type: ignore[union-attr]


def test_the_review_list_shows_every_alias():
    env = opened()
    accepted(env, {"type": "ipv_enter_comment"})
    assert env.observation().page.reviews == ["fits well", "nice colour", "thin fabric"]  # type: ignore[union-attr]
    assert accepted(env, {"type": "ipv_click_comment", "target": "C3"}).review_alias == "C3"
    assert reason(env, {"type": "ipv_click_comment", "target": "C4"}) == "target_unresolved"
    assert env.page is not None and env.page.panel == "comments"
    accepted(env, {"type": "ipv_cart"})  # any other action returns to the main page
    assert env.page.panel == "main"
    assert (
        reason(env, {"type": "ipv_click_comment", "target": "C3"}) == "illegal_in_state"
    )  # preview out of view


def test_page_scroll_bounds_and_the_review_list_at_the_bottom():
    env = opened(height=2750.0)
    # max page offset 2750 - 837 = 1913
    assert reason(env, {"type": "ipv_scroll_up", "distance": 10}) == "illegal_in_state"
    for _ in range(3):
        accepted(env, {"type": "ipv_scroll_down", "distance": 837})  # 837, 1674, 2511 -> 1913
    assert env.page is not None and env.page.scroll == 1913
    assert reason(env, {"type": "ipv_scroll_down", "distance": 1}) == "illegal_in_state"
    accepted(env, {"type": "ipv_enter_comment"})
    # inside the open review list ipv_scroll_down stays legal; it returns to the page, which cannot move
    accepted(env, {"type": "ipv_scroll_down", "distance": 100})
    assert (env.page.panel, env.page.scroll) == ("main", 1913)


def test_pictures_stop_at_the_last_one():
    env = opened(pictures=3)
    for _ in range(5):
        accepted(env, {"type": "ipv_swipe_pic"})
    assert env.page is not None and env.page.picture == 2  # 0, 1, 2 and no wrap
    assert env.observation().page.done == {"ipv_swipe_pic": 5}  # type: ignore[union-attr]


def test_a_catalog_page_height_wins_over_the_default():
    frame = items().with_columns(pl.lit(1000.0).alias("page_height"))
    built = Session.from_frames({"session_id": "s", "feed_height": FEED_HEIGHT}, layout(), frame, steps())
    env = ShoppingEnvironment(built)
    accepted(env, {"type": "click", "target_item_id": "A"})
    assert env.page is not None and env.page.max_scroll == 163.0  # 1000 - 837


# --- rollout endings -----------------------------------------------------------------------------


def test_budget_defaults():
    assert (EnvironmentSettings().budget("single"), EnvironmentSettings().budget("cross")) == (31, 42)


def test_invalid_outputs_do_not_consume_the_budget():
    rollout = Rollout(session(), EnvironmentSettings(budget_single=2, max_try=5))
    rollout.submit(say({"type": "scroll_down", "distance": 100}))
    rollout.submit("not json")
    rollout.submit(say({"type": "jump"}))
    assert not rollout.done and rollout.accepted_steps == 1
    rollout.submit(say({"type": "scroll_down", "distance": 100}))
    # two accepted actions spend the budget of 2 without an end
    assert (rollout.truncated, rollout.terminated, rollout.termination_reason) == (True, False, "budget")
    assert [a.reject_reason for a in rollout.attempts] == [None, "parse_failure", "unknown_action", None]
    assert [a.step for a in rollout.attempts] == [0, None, None, 1]
    with pytest.raises(RuntimeError):
        rollout.submit(say({"type": "end"}))


def test_end_on_the_last_budgeted_action_terminates():
    rollout = Rollout(session(), EnvironmentSettings(budget_single=2))
    rollout.submit(say({"type": "scroll_down", "distance": 100}))
    rollout.submit(say({"type": "end"}))
    assert (rollout.terminated, rollout.truncated, rollout.termination_reason) == (True, False, "end")


def test_max_try_default_one_invalid_output_ends_the_episode():
    rollout = Rollout(session())
    attempt = rollout.submit(say({"type": "scroll_up", "distance": True}))
    assert (attempt.accepted, attempt.reject_reason) == (False, "target_unresolved")
    assert (rollout.truncated, rollout.termination_reason) == (True, "invalid_retry_exhausted")


def test_max_try_counts_consecutive_invalid_outputs():
    rollout = Rollout(session(), EnvironmentSettings(max_try=2))
    rollout.submit("no")
    rollout.submit(say({"type": "scroll_down", "distance": 50}))  # resets the count
    rollout.submit("no")
    assert not rollout.done
    rollout.submit(say({"type": "ipv_buy"}))  # second in a row: illegal on the feed
    assert rollout.termination_reason == "invalid_retry_exhausted"
    assert [a.reject_reason for a in rollout.attempts] == [
        "parse_failure",
        None,
        "parse_failure",
        "illegal_in_state",
    ]


def test_a_simulator_error_truncates():
    rollout = Rollout(session())
    rollout.submit(say({"type": "scroll_down", "distance": 50}))
    rollout.fail("timeout after 60 s")
    assert (rollout.truncated, rollout.termination_reason, rollout.error) == (
        True,
        "error",
        "timeout after 60 s",
    )


def test_attempts_carry_the_item_and_the_window_grows_with_accepted_steps():
    rollout = Rollout(session())
    click = rollout.submit(say({"type": "click", "target": "Item C"}, rationale="a mug"))
    cart = rollout.submit(say({"type": "ipv_cart"}))
    assert (click.action, click.target_item_id, click.item_category, click.item_price) == (
        "click",
        "C",
        "Home-Kitchen-Mugs",
        13.0,
    )
    assert click.visible_item_ids == ("A", "B", "D", "C", "E")
    assert (cart.screen, cart.target_item_id) == ("ipv", "C")
    assert [(p.step, p.action, p.rationale) for p in rollout.window] == [
        (0, {"type": "click", "target": "Item C", "target_item_id": "C"}, "a mug"),
        (1, {"type": "ipv_cart"}, "because"),
    ]
    text = rollout.messages()[1]["content"]
    assert '5 items in view | thought: a mug | action: {"type":"click","target":"Item C"' in text
    assert "Already done on this item: ipv_cart x1" in text


def test_the_prompt_lists_exactly_the_executable_actions():
    rollout = Rollout(session(offset=0.0))
    text = rollout.messages()[1]["content"]
    listed = text.split("## Executable actions\n")[1].split("\n\n")[0]
    # offset 0: no scroll_up; cards in view: click
    assert [line.split()[1] for line in listed.splitlines()] == ["scroll_down", "click", "end"]


def test_cross_session_mode_carries_the_window_into_the_next_session():
    first = Rollout(session(), trajectory=Trajectory("cross", session_ordinal=1))
    first.submit(say({"type": "end"}))
    later = Rollout(session(), trajectory=first.trajectory.next_session(gap_s=300.0))
    later.submit(say({"type": "scroll_down", "distance": 10}))
    assert later.budget == 42
    assert [(p.session, p.step, p.gap_s) for p in later.window] == [(1, 0, None), (2, 0, 300.0)]
    text = later.messages()[1]["content"]
    # 300 s = 5 min; steps are labelled with their session in cross mode
    assert "-- session 2 started 5 min after the previous one --\nsession 2 step 0: feed at" in text
    assert "session 1 step 0: feed at" in text


# --- replay --------------------------------------------------------------------------------------


def test_replay_rebuilds_every_recorded_state_of_an_ingested_lake(tmp_path: Path):
    write_bundle(tiny_bundle(), tmp_path / "raw")
    ingest_bundle(tmp_path / "raw", tmp_path / "lake")
    (loaded,) = load_sessions(tmp_path / "lake")
    recorded = pl.read_parquet(tmp_path / "lake" / "steps").sort("step")
    cursor = ReplayCursor(loaded)
    assert (len(cursor), dict(cursor.skipped)) == (recorded.height, {})
    for step, row in zip(cursor, recorded.iter_rows(named=True), strict=True):
        assert step.recorded.step == row["step"]
        assert [c.item_id for c in step.state.observation.cards] == (row["visible_items"] or [])
        # the shopper's own action is executable in the state it was taken in
        assert isinstance(step.judge(say(step.gold.action_object())), Accepted), step.gold
    # the profile and the purchase before the session come with it
    assert loaded.recent_buys == ("Canvas tote",)
    assert loaded.profile["member_level"] == "gold"


def training_messages(lake: Path) -> dict[tuple[str, int], list[dict[str, str]]]:
    """(session, step) -> the [system, user] messages the records stage builds for that step."""
    prompt = PromptSettings()
    history = read_lake_table(lake, "history") if (lake / "history").exists() else None
    records = build_records(
        read_lake_table(lake, "steps"),
        read_lake_table(lake, "sessions"),
        needed_items(lake, prompt),
        history=history,
        settings=prompt,
    )
    return {
        (r["session_id"], r["step"]): [
            {"role": "system", "content": r["system"]},
            {"role": "user", "content": r["prompt"]},
        ]
        for r in records.iter_rows(named=True)
    }


MAIN_PAGE_REVIEWS = re.compile(r"\nReviews \(open one by its alias\):(?:\nC\d+: [^\n]*)+")
LAYOUT_ACTIONS = re.compile(r"\n- (?:ipv_click_comment|ipv_scroll_down)\b[^\n]*")


def without_page_layout(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """The messages less what only a detail page's layout decides: the page's own review block (under
    any panel but the review list) and whether a review click or a scroll down is executable. The
    training records lay no page out (they show the review block at every offset); replay shows the
    page rollout lays out."""
    system, user = messages
    panel = re.search(r"\nScreen: detail page\n(?:.*\n)*?Open panel: ([^\n]*)\n", user["content"])
    if panel is not None and not reviews_open(panel.group(1)):
        user = {**user, "content": LAYOUT_ACTIONS.sub("", MAIN_PAGE_REVIEWS.sub("", user["content"]))}
    return [system, user]


def test_replay_shows_each_recorded_state_as_the_training_prompt_shows_it(tmp_path: Path):
    write_bundle(tiny_bundle(), tmp_path / "raw")
    ingest_bundle(tmp_path / "raw", tmp_path / "lake")
    expected = training_messages(tmp_path / "lake")
    cursor = ReplayCursor(load_sessions(tmp_path / "lake")[0])
    # one renderer: every replayed state renders to its record's system and user messages, exactly
    # where no page layout is involved (feed, open review list) and but for the page's layout elsewhere
    assert len(cursor) == len(expected) == 9
    exact = 0
    for step in cursor:
        record = expected[(cursor.session.session_id, step.recorded.step)]
        assert without_page_layout(step.messages()) == without_page_layout(record)
        exact += step.messages() == record
    # 4 feed steps and the review list equal to the character; the 4 main-page steps at 0 and 500 px
    # do not: the preview (1650..1890 px of the 2750 px page) is out of their 837 px view, so replay lists
    # no review where the records list C1 and C2
    assert exact == 5
    main_page = cursor.steps[2].messages()[1]["content"]
    assert (
        "Open panel: main" in main_page and "\nC1: " not in main_page and "ipv_click_comment" not in main_page
    )


def test_replay_applies_recorded_actions_leniently_and_counts_what_it_cannot_rebuild():
    record = pl.DataFrame(
        {
            "step": [0, 1, 2, 3, 4, 5],
            "screen": ["feed", "feed", "feed", "ipv", "ipv", "feed"],
            "action": ["scroll_down", "scroll_down", "click", "ipv_swipe_pic", "back_home", "end"],
            "target_item_id": [None, None, "F", None, None, None],
            "distance": [900, 100, None, None, None, None],  # 900 px: beyond 694, applied anyway
            "scroll_top": [0.0, None, 123.0, 123.0, 123.0, 123.0],
            "visible_items": [["A", "B", "D", "C"], None, ["A", "B", "D", "C", "E", "F"], None, None, ["X"]],
            "visible_source": ["layout", None, "layout", None, None, "logged"],
            "ipv_item_id": [None, None, None, "F", None, None],
            "ui_state": [None, None, None, "main", "main", None],
        }
    )
    built = Session.from_frames({"session_id": "s", "feed_height": FEED_HEIGHT}, layout(), items(), record)
    cursor = ReplayCursor(built)
    # step 0 at offset 0 shows A, B, D, C (E shows 693-649.25 = 43.75): rebuilt and scored;
    # step 1 has no offset; step 2 at 123 shows A..F as recorded; step 3 on F's page;
    # step 4 has no open item; step 5's logged card X is not in the catalog
    assert [s.recorded.step for s in cursor] == [0, 2, 3]
    assert dict(cursor.skipped) == {
        "missing_feed_offset": 1,
        "no_open_item": 1,
        "visible_item_not_in_catalog": 1,
    }
    assert cursor.skipped_steps == [
        (1, "missing_feed_offset"),
        (4, "no_open_item"),
        (5, "visible_item_not_in_catalog"),
    ]
    # the prediction is judged on the recorded state, whatever the record did next
    at_page = cursor.steps[2]
    assert at_page.state.observation.page.item_id == "F"  # type: ignore[union-attr]
    assert at_page.judge(say({"type": "ipv_buy"})) == Accepted("ipv_buy", "because")
    assert at_page.judge(say({"type": "scroll_down", "distance": 5})).reason == "illegal_in_state"  # type: ignore[union-attr]


def test_replay_survives_records_it_cannot_apply():
    record = pl.DataFrame(
        {
            "step": [0, 1, 2, 3],
            "screen": ["feed", "feed", "ipv", "feed"],
            "action": ["click", "ipv_cart", "ipv_buy", "end"],  # step 1: a detail-page action on the feed
            "target_item_id": [None, None, None, None],  # step 0: the click names no card
            "target_title": ["Item A", None, None, None],
            "scroll_top": [0.0, 0.0, 0.0, 0.0],
            "ipv_item_id": [None, None, "A", None],
        }
    )
    built = Session.from_frames({"session_id": "s", "feed_height": FEED_HEIGHT}, layout(), items(), record)
    cursor = ReplayCursor(built)
    # the title-only click is scored (its state is whole) and opens nothing; step 2 seats A's page
    assert [s.recorded.step for s in cursor] == [0, 2, 3]
    assert cursor.steps[0].gold.target_title == "Item A"
    assert cursor.skipped_steps == [(1, "action_off_screen")]


def test_replay_flags_a_layout_that_disagrees_with_the_recorded_cards():
    record = pl.DataFrame(
        {
            "step": [0],
            "screen": ["feed"],
            "action": ["end"],
            "scroll_top": [0.0],
            "visible_items": [["A", "B"]],  # the layout at 0 shows A, B, D, C
            "visible_source": ["layout"],
        }
    )
    built = Session.from_frames({"session_id": "s", "feed_height": FEED_HEIGHT}, layout(), items(), record)
    cursor = ReplayCursor(built)
    assert (len(cursor), dict(cursor.skipped)) == (0, {"visible_items_differ": 1})


def test_replay_window_holds_the_recorded_steps_before_each_state():
    cursor = ReplayCursor(session())
    last = cursor.steps[-1]
    assert [p.action["type"] for p in last.state.window] == ["scroll_up", "click", "back_home"]
    assert last.messages() == render_state(last.state, last.settings)


# --- replay and rollout show the same screens ------------------------------------------------------


class RecordedPlayer:
    """A simulator that answers every prompt with the shopper's next recorded action and rationale, and
    keeps the prompts it was shown."""

    def __init__(self, session: Session) -> None:
        self.answers = iter(
            say(recorded_action(s, session).action_object(), s.rationale or "") for s in session.steps
        )
        self.prompts: list[list[dict[str, str]]] = []

    def act(self, prompts: list[list[dict[str, str]]]) -> list[str]:
        self.prompts.extend(prompts)
        return [next(self.answers) for _ in prompts]


def aliases_in_view(messages: list[dict[str, str]]) -> list[str]:
    """The review aliases the current observation lists."""
    observation = messages[1]["content"].split("## Current observation\n")[1].split("\n\n## ")[0]
    return re.findall(r"^(C\d+): ", observation, flags=re.MULTILINE)


def reviewing_session() -> Session:
    """A shopper who scrolls, opens A (2750 px page, review preview at 1650..1890), scrolls until the
    preview is in view, opens C1 from it and C3 inside the list, scrolls back up, returns and ends."""
    record = pl.DataFrame(
        {
            "step": list(range(8)),
            "screen": ["feed", "feed", "ipv", "ipv", "ipv", "ipv", "ipv", "feed"],
            "action": [
                "scroll_down",
                "click",
                "ipv_scroll_down",
                "ipv_click_comment",
                "ipv_click_comment",
                "ipv_scroll_up",
                "back_home",
                "end",
            ],
            "target_item_id": [None, "A", None, None, None, None, None, None],
            "review_alias": [None, None, None, "C1", "C3", None, None, None],
            "distance": [100, None, 837, None, None, 837, None, None],
            "scroll_top": [0.0, 100.0, 100.0, 100.0, 100.0, 100.0, 100.0, 100.0],
            "ipv_item_id": [None, None, "A", "A", "A", "A", "A", None],
            "ipv_scroll": [None, None, 0.0, 837.0, 837.0, 837.0, 0.0, None],
            "ui_state": [None, None, "main", "main", "comments", "comments", "main", None],
            "rationale": [f"thought {n}" for n in range(8)],
        }
    )
    row = {"session_id": "s-rev", "user_id": "u1", "feed_height": FEED_HEIGHT}
    return Session.from_frames(row, layout(), items(), record)


def test_replay_and_rollout_show_a_recorded_session_the_same_screens():
    recorded = reviewing_session()
    replayed = ReplayCursor(recorded)
    rollout, player = Rollout(recorded), RecordedPlayer(recorded)
    drive([rollout], player)
    assert rollout.terminated and all(a.accepted for a in rollout.attempts)
    assert (len(replayed), dict(replayed.skipped)) == (8, {})
    # the prompt before each recorded action is the same text in replay and in rollout: feed, page
    # offsets and panels, the reviews in view, the executable actions and the history window
    for scored, shown in zip(replayed, player.prompts, strict=True):
        assert scored.messages() == shown, scored.recorded.step
    # main page at 0 (view 0..837) and at 837 (837..1674, the preview 1650..1890 overlaps by 24 px),
    # the open list (every review), the main page at 0 again
    assert [aliases_in_view(p) for p in player.prompts[2:7]] == [
        [],
        ["C1"],
        ["C1", "C2", "C3"],
        ["C1", "C2", "C3"],
        [],
    ]


def test_a_review_click_on_the_main_page_is_judged_alike_in_replay_and_rollout():
    recorded = reviewing_session()
    replayed = ReplayCursor(recorded).steps
    env = ShoppingEnvironment(recorded)
    for action in recorded_actions(recorded)[:3]:  # scroll, open A, scroll the page to 837 px
        env.apply(action)
    # main page at 837 px: the preview shows C1 only, so C2 is not in view
    c2 = say({"type": "ipv_click_comment", "target": "C2"})
    assert replayed[3].judge(c2).reason == env.judge(c2).reason == "target_unresolved"  # type: ignore[union-attr]
    assert isinstance(replayed[3].judge(say({"type": "ipv_click_comment", "target": "C1"})), Accepted)
    # main page at 0 px: the preview is out of view, no review can be opened
    c1 = say({"type": "ipv_click_comment", "target": "C1"})
    assert replayed[2].judge(c1).reason == "illegal_in_state"  # type: ignore[union-attr]


def recorded_actions(recorded: Session) -> list[Accepted]:
    return [recorded_action(s, recorded) for s in recorded.steps]


def test_replay_shows_what_its_record_says_beyond_the_layout_but_does_not_score_it():
    record = pl.DataFrame(
        {
            "step": [0, 1, 2, 3, 4],
            "screen": ["feed", "ipv", "ipv", "ipv", "ipv"],
            "action": ["click", "ipv_click_comment", "ipv_scroll_down", "ipv_scroll_down", "back_home"],
            "target_item_id": ["A", None, None, None, None],
            "review_alias": [None, "C2", None, None, None],
            "distance": [None, None, 500, 500, None],
            "scroll_top": [0.0, 0.0, 0.0, 0.0, 0.0],
            "ipv_item_id": [None, "A", "A", "A", "A"],
            # 2000 px is past the layout's bottom, 2750 - 837 = 1913 px, and the shopper scrolls on
            "ipv_scroll": [None, 1700.0, 1700.0, 2000.0, 2500.0],
            "ui_state": [None, "main", "main", "main", "main"],
        }
    )
    built = Session.from_frames({"session_id": "s", "feed_height": FEED_HEIGHT}, layout(), items(), record)
    cursor = ReplayCursor(built)
    # step 1: the layout shows C1 only, the shopper opened C2; step 3: the layout's page ends at 2000 px
    # (at least as long as the record shows), the shopper scrolled further
    assert cursor.skipped_steps == [(1, "review_out_of_view"), (3, "scroll_past_page_end")]
    assert [s.recorded.step for s in cursor] == [0, 2, 4]
    # where the record agrees with the layout the page is the rollout's: C1 only, at 1700 px
    assert aliases_in_view(cursor.steps[1].messages()) == ["C1"]
    # the window shows the unscored steps as the record has them
    assert [p.action["type"] for p in cursor.steps[2].state.window][1:4] == [
        "ipv_click_comment",
        "ipv_scroll_down",
        "ipv_scroll_down",
    ]


def test_the_environment_imports_neither_the_synthetic_world_nor_prefect():
    code = (
        "import sys, evaluation.environment, evaluation.rollout, evaluation.replay, evaluation.loader; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'synthetic', 'prefect'}))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_recorded_step_fields_match_the_steps_table():
    from transforms.schemas import RATIONALES, STEPS

    # every field is a steps column, but the rationale, which the loader joins from the rationales table
    fields = set(RecordedStep.__dataclass_fields__)
    assert fields - {"rationale"} <= set(STEPS.names) and "rationale" in RATIONALES.names
