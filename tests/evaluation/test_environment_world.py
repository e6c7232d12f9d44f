"""The environment over a lake ingested from a generated world (40 shoppers, about 2,200 steps).

The world's shoppers act under the environment's rules of legality, on detail pages laid out by the
world's own catalog (page heights the lake does not carry) with a review block of two: replay shows
its pages as rollout lays them out, so the few steps where a shopper opened a review that layout does
not show are rebuilt as recorded but not scored; every other recorded action is executable in its
state, and a rollout that plays a session's recorded actions sees replay's screens.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from evaluation.loader import load_sessions
from evaluation.replay import ReplayCursor
from evaluation.rollout import Rollout
from evaluation.session import Session
from evaluation.simulators import RandomSimulator, drive
from synthetic.bundle import write_bundle
from transforms.ingest import ingest_bundle
from transforms.prompts import Accepted


@pytest.fixture(scope="module")
def sessions(tmp_path_factory) -> list[Session]:
    root = tmp_path_factory.mktemp("world")
    write_bundle(root / "raw", users=40, seed=5, fmt="parquet", parts_per_table=1)
    ingest_bundle(root / "raw", root / "lake")
    return load_sessions(root / "lake")


def test_every_recorded_step_is_rebuilt_and_its_action_executable(sessions: list[Session]):
    recorded = sum(len(s.steps) for s in sessions)
    cursors = [ReplayCursor(s) for s in sessions]
    skipped = sum((c.skipped for c in cursors), Counter())
    assert set(skipped) <= {"review_out_of_view", "scroll_past_page_end"}
    assert sum(len(c) for c in cursors) + skipped.total() == recorded
    assert skipped.total() < recorded // 100
    rejected = Counter()
    for step in (step for c in cursors for step in c):
        verdict = step.judge(json.dumps({"rationale": "", "action": step.gold.action_object()}))
        if not isinstance(verdict, Accepted):
            rejected[(step.gold.type, verdict.reason)] += 1
    assert not rejected


def test_rollouts_open_where_the_recorded_session_opened(sessions: list[Session]):
    for session in sessions:
        first, opened = session.steps[0], Rollout(session).env
        assert first.screen == "feed"
        assert (opened.offset, tuple(opened.visible_item_ids())) == (first.scroll_top, first.visible_items)


def test_random_rollouts_are_always_accepted_and_end(sessions: list[Session]):
    rollouts = [Rollout(s) for s in sessions]
    drive(rollouts, RandomSimulator(seed=11))
    assert all(a.accepted for r in rollouts for a in r.attempts)
    endings = Counter(r.termination_reason for r in rollouts)
    assert set(endings) <= {"end", "budget"} and endings["end"] > 0
    # uniform over executable actions reaches the detail page and what it offers
    taken = Counter(a.action for r in rollouts for a in r.attempts)
    assert {"click", "ipv_enter_comment", "ipv_click_comment", "back_home"} <= set(taken)
