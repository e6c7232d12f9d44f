"""The ``markov`` baseline: what it reads from a prompt, its draws, and that it beats ``random``."""

from __future__ import annotations

import json
import random
from collections import Counter

import polars as pl
import pytest

from evaluation.engine import replay, roll_out
from evaluation.loader import load_sessions
from evaluation.markov import START, MarkovSimulator, Shown, read_prompt, transition_counts
from evaluation.rollout import Rollout
from evaluation.simulators import RandomSimulator, simulator_for_lake
from flows.score import export_real_traces, score_files
from synthetic.bundle import write_bundle
from tests.evaluation.test_environment import session
from transforms.ingest import ingest_bundle

WORLD_USERS, WORLD_SEED = 600, 5  # about 320 test sessions and 3,000 recorded test steps
L1_TO_L4 = {"F1": "higher", "Acc": "higher", "DM-JSD": "lower", "TE": "lower", "PF": "higher",
            "dCTR": "lower", "dACR": "lower", "T-JSD": "lower"}  # fmt: skip


def chain(rows: list[tuple[str, str, str, int]], categories: dict[str, str] | None = None) -> MarkovSimulator:
    transitions = pl.DataFrame(rows, schema=["screen", "previous", "action", "count"], orient="row")
    distances = pl.DataFrame({"action": ["scroll_down"] * 2, "distance": [50, 5000]})
    titles = pl.DataFrame({"title": list(categories or {}), "top": list((categories or {}).values())})
    return MarkovSimulator(transitions, distances, titles, seed=3)


def test_transitions_count_each_action_after_the_previous_one_in_its_session():
    steps = pl.DataFrame(
        {
            "session_id": ["a", "a", "a", "b", "b"],
            "step": [0, 1, 2, 0, 1],
            "screen": ["feed", "feed", "ipv", "feed", "feed"],
            "action": ["scroll_down", "click", "back_home", "scroll_down", "end"],
        }
    )
    counted = {(s, p, a): n for s, p, a, n in transition_counts(steps).iter_rows()}
    # both sessions open with scroll_down; a then clicks and goes back, b ends after its scroll
    assert counted == {
        ("feed", START, "scroll_down"): 2,
        ("feed", "scroll_down", "click"): 1,
        ("ipv", "click", "back_home"): 1,
        ("feed", "scroll_down", "end"): 1,
    }


def test_the_prompt_gives_screen_previous_action_cards_and_recent_clicks():
    rollout = Rollout(session())
    first = read_prompt(rollout.messages()[-1]["content"])
    assert (first.screen, first.previous) == ("feed", START)
    assert [item for item, _ in first.cards] == ["A", "B", "D", "C", "E"]  # in view at 120.5 px
    rollout.submit(json.dumps({"rationale": "r", "action": {"type": "scroll_down", "distance": 10}}))
    later = read_prompt(rollout.messages()[-1]["content"])
    assert later.previous == "scroll_down"
    assert set(later.executable) == {"scroll_down", "scroll_up", "click", "end"}


def test_only_executable_actions_are_drawn_by_their_counts():
    # after start on the feed: 3 clicks, 1 end, 6 ipv_buy (never executable on the feed)
    markov = chain([("feed", START, "click", 3), ("feed", START, "end", 1), ("feed", START, "ipv_buy", 6)])
    shown = Shown(
        "feed", START, {"click": "click", "end": "end", "scroll_down": "s"}, [("A", "Bags")], [], []
    )
    rng = random.Random(0)
    drawn = Counter(markov.next_action(shown, rng) for _ in range(1000))
    # click 3/4 of 1000 = 750, sd sqrt(1000 * 0.75 * 0.25) = 13.7; scroll_down has no count
    assert set(drawn) == {"click", "end"}
    assert 690 <= drawn["click"] <= 810


def test_a_state_the_train_split_never_saw_is_uniform_over_the_executable_actions():
    markov = chain([("feed", START, "click", 3)])
    shown = Shown("ipv", "click", {"back_home": "b", "end": "e"}, [], [], [])
    rng = random.Random(0)
    assert {markov.next_action(shown, rng) for _ in range(200)} == {"back_home", "end"}


def test_a_click_follows_the_category_affinity_of_recent_clicks():
    markov = chain([], categories={"Red tote": "Bags", "Blue tote": "Bags", "Canvas bag": "Bags"})
    shown = Shown(
        "feed", START, {}, [("A", "Bags"), ("B", "Shoes")], [], ["Red tote", "Blue tote", "Canvas bag"]
    )
    rng = random.Random(0)
    picks = Counter(markov.card(shown, rng) for _ in range(1000))
    # weights 1 + 3 recent Bags clicks = 4 for A, 1 for B: A 0.8 of 1000 = 800, sd 12.6
    assert 750 <= picks["A"] <= 850


def test_distances_come_from_the_real_ones_clipped_to_the_listed_range():
    markov = chain([])
    # the recorded distances are 50 and 5000; the range listed is 1..694
    rng = random.Random(0)
    assert {markov.distance("scroll_down", 694, rng) for _ in range(100)} == {50, 694}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("markov-world")
    write_bundle(root / "raw", users=WORLD_USERS, seed=WORLD_SEED, fmt="parquet", parts_per_table=1)
    ingest_bundle(root / "raw", root / "lake")
    return root


def scored(world, spec, simulator, sessions):
    out = world / "out"
    roll_out(sessions, simulator, out / f"{spec}.rollout.jsonl", source=spec)
    replay(sessions, simulator, out / f"{spec}.replay.jsonl", source=spec)
    return score_files(out / "real.jsonl", out / f"{spec}.rollout.jsonl", out / f"{spec}.replay.jsonl")


def test_markov_beats_random_on_at_least_six_of_the_eight_l1_to_l4_figures(world):
    lake = world / "lake"
    sessions = load_sessions(lake, split="test")
    export_real_traces(lake, world / "out" / "real.jsonl", ["test"])
    assert len(sessions) >= 300  # enough for cohorts of 30 on both sides, so PF counts
    markov = scored(world, "markov", simulator_for_lake("markov", lake), sessions)
    uniform = scored(world, "random", RandomSimulator(seed=42), sessions)
    better = [
        key
        for key, direction in L1_TO_L4.items()
        if (markov[key] > uniform[key] if direction == "higher" else markov[key] < uniform[key])
    ]
    assert len(better) >= 6, (better, markov, uniform)
    assert markov["OVA"] == 1.0 and markov["RVA"] == 1.0  # it only ever answers executable actions


def test_markov_needs_a_train_split(world):
    with pytest.raises(ValueError, match="no steps in its 'holdout' split"):
        MarkovSimulator.fit(world / "lake", split="holdout")
