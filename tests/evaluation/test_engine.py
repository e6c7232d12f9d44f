"""The rollout engine: trace lines as episodes end, resuming without redoing, the run manifest, replay rows."""

from __future__ import annotations

import asyncio
import json

import pytest

from evaluation.engine import ManifestMismatch, finished_sessions, replay, roll_out, traces_manifest_path
from evaluation.environment import EnvironmentSettings
from evaluation.simulators import NoAnswer, RandomSimulator
from evaluation.traces import dropped_keys, load_replay, load_traces, read_replay, read_traces
from tests.evaluation.test_environment import session

END = '{"rationale": "done", "action": {"type": "end"}}'
SCROLL = '{"rationale": "more", "action": {"type": "scroll_down", "distance": 100}}'


class Counting:
    """Answers a fixed script per call; counts calls and prompts."""

    def __init__(self, answer=SCROLL):
        self.answer = answer
        self.calls = 0
        self.prompts = 0
        self.parameters = {"seed": 1}

    def act(self, prompts):
        self.calls += 1
        self.prompts += len(prompts)
        return [self.answer] * len(prompts)


class Killed(Exception):
    pass


class DiesAfter(Counting):
    """A process that is killed (the exception escapes) after ``calls_before_death`` calls."""

    def __init__(self, calls_before_death):
        super().__init__()
        self.left = calls_before_death

    def act(self, prompts):
        if self.left == 0:
            raise KeyboardInterrupt  # not an Exception: the engine does not catch it, as a kill
        self.left -= 1
        return super().act(prompts)


def sessions(count):
    return [session(session_id=f"s{i}") for i in range(count)]


def test_each_episode_is_one_trace_line_with_the_spec_as_source(tmp_path):
    path = tmp_path / "sim.jsonl"
    summary = roll_out(sessions(3), Counting(END), path, source="end-bot")
    traces = read_traces(path)
    assert [t.session_id for t in traces] == ["s0", "s1", "s2"]
    assert {(t.source, t.terminated, t.termination_reason, len(t.steps)) for t in traces} == {
        ("end-bot", True, "end", 1)
    }
    assert (summary.written, summary.resumed, summary.outputs) == (3, 0, 3)
    assert load_traces(path).sessions.height == 3  # the scorer reads what the engine writes


def test_batches_hold_at_most_batch_size_live_episodes_refilled_as_they_end(tmp_path):
    simulator = Counting(SCROLL)
    settings = EnvironmentSettings(budget_single=2)
    roll_out(sessions(5), simulator, tmp_path / "t.jsonl", source="s", settings=settings, batch_size=2)
    # 5 sessions x 2 scrolls = 10 outputs; pairs run in lockstep: rounds (2,2),(2,2),(1,1) -> 6 calls
    assert (simulator.prompts, simulator.calls) == (10, 6)


def test_a_resumed_run_skips_the_sessions_already_written(tmp_path):
    path = tmp_path / "t.jsonl"
    settings = EnvironmentSettings(budget_single=3)
    # one session at a time, 3 scrolls each: the kill comes on the 7th call, after two sessions ended
    with pytest.raises(KeyboardInterrupt):
        roll_out(sessions(4), DiesAfter(6), path, source="s", settings=settings, batch_size=1)
    assert finished_sessions(path) == {"s0", "s1"}
    again = Counting(SCROLL)
    summary = roll_out(sessions(4), again, path, source="s", settings=settings, batch_size=1)
    # only s2 and s3 are rolled out again: 2 sessions x 3 outputs
    assert (again.calls, summary.written, summary.resumed) == (6, 2, 2)
    assert [t.session_id for t in read_traces(path)] == ["s0", "s1", "s2", "s3"]
    manifest = json.loads(traces_manifest_path(path).read_text())
    assert len(manifest["resumed_at"]) == 1 and manifest["sessions"] == 4


def test_a_last_line_cut_short_by_a_kill_is_dropped_and_its_session_redone(tmp_path):
    path = tmp_path / "t.jsonl"
    roll_out(sessions(2), Counting(END), path, source="s")
    whole = path.read_text()
    path.write_text(whole + whole.splitlines()[0][:40])  # a third line, half written
    assert finished_sessions(path) == {"s0", "s1"}
    assert path.read_text() == whole


def test_resuming_under_other_parameters_is_refused(tmp_path):
    path = tmp_path / "t.jsonl"
    roll_out(sessions(1), Counting(END), path, source="s")
    other = Counting(END)
    other.parameters = {"seed": 2}
    with pytest.raises(ManifestMismatch, match="was begun with"):
        roll_out(sessions(1), other, path, source="s")


def test_the_manifest_records_seed_sampling_and_environment(tmp_path):
    path = tmp_path / "t.jsonl"
    roll_out(sessions(1), RandomSimulator(seed=9), path, source="random:9")
    manifest = json.loads(traces_manifest_path(path).read_text())
    assert manifest["run"]["kind"] == "rollout" and manifest["run"]["source"] == "random:9"
    assert manifest["run"]["environment"]["budget_single"] == 31  # the reference's budget
    assert manifest["run"]["simulator"] == {"spec": "random", "seed": 9}


class AnswersAllButSecond(Counting):
    def act(self, prompts):
        out = super().act(prompts)
        return [
            NoAnswer("RequestFailed: server_error on all 6 attempts") if i == 1 else a
            for i, a in enumerate(out)
        ]


def test_a_prompt_without_answer_ends_only_its_episode_with_error(tmp_path):
    path = tmp_path / "t.jsonl"
    roll_out(sessions(3), AnswersAllButSecond(END), path, source="s")
    endings = {t.session_id: (t.truncated, t.termination_reason) for t in read_traces(path)}
    assert endings == {"s0": (False, "end"), "s1": (True, "error"), "s2": (False, "end")}


def test_replay_writes_one_row_per_recorded_step_with_the_prediction(tmp_path):
    path = tmp_path / "replay.jsonl"
    # the recorded session: scroll_up, click A, back_home, end; the simulator always answers end,
    # which is executable on both screens
    summary = replay([session(session_id="r")], Counting(END), path, source="end-bot")
    rows = read_replay(path)
    assert [(r.step_index, r.screen, r.gt_action, r.pred_action, r.accepted) for r in rows] == [
        (0, "feed", "scroll_up", "end", True),
        (1, "feed", "click", "end", True),
        (2, "ipv", "back_home", "end", True),
        (3, "ipv", "end", "end", True),
    ]
    assert rows[1].gt_target_item_id == "A"
    assert summary.outputs == 4 and load_replay(path).height == 4
    again = Counting(END)
    assert replay([session(session_id="r")], again, path, source="end-bot").resumed == 1
    assert again.calls == 0


def test_what_the_engine_writes_reads_strictly(tmp_path):
    # scrolls up to the budget, an unparsable output and a random walk: every step field the engine
    # fills; each key written must be one the trace models declare, or the strict readers would stop
    settings = EnvironmentSettings(budget_single=3)
    roll_out(sessions(2), Counting(SCROLL), tmp_path / "sim.jsonl", source="s", settings=settings)
    roll_out([session(session_id="x")], Counting("not json"), tmp_path / "bad.jsonl", source="s")
    roll_out(sessions(2), RandomSimulator(seed=9), tmp_path / "random.jsonl", source="random:9")
    replay([session(session_id="r")], Counting(END), tmp_path / "replay.jsonl", source="s")
    for name in ("sim", "bad", "random"):
        assert dropped_keys(tmp_path / f"{name}.jsonl", "rollout") == {}
        assert load_traces(tmp_path / f"{name}.jsonl", strict=True).sessions.height == len(
            read_traces(tmp_path / f"{name}.jsonl")
        )
    assert dropped_keys(tmp_path / "replay.jsonl", "replay") == {}
    assert load_replay(tmp_path / "replay.jsonl", strict=True).height == 4  # four recorded steps


def test_a_replay_prediction_that_breaks_the_rules_is_kept_with_its_reason(tmp_path):
    path = tmp_path / "replay.jsonl"
    replay([session(session_id="r")], Counting("not json"), path, source="s")
    assert {(r.accepted, r.reject_reason) for r in read_replay(path)} == {(False, "parse_failure")}


class OneAtATime:
    """A concurrent simulator (answers one prompt at a time, several in flight) that counts them."""

    concurrency = 3

    def __init__(self):
        self.in_flight = self.most_in_flight = self.answered = 0

    def act(self, prompts):
        raise AssertionError("a concurrent simulator is driven through answer()")

    async def answer(self, messages):
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        await asyncio.sleep(0.01)
        self.in_flight -= 1
        self.answered += 1
        return END if self.answered % 4 else NoAnswer("TimeoutError: no answer")

    def run(self, coroutine):
        return asyncio.run(coroutine)


def test_a_concurrent_simulator_steps_each_episode_on_its_own_answer(tmp_path):
    simulator = OneAtATime()
    path = tmp_path / "t.jsonl"
    summary = roll_out(sessions(8), simulator, path, source="remote")
    # 8 one-step episodes, 3 in flight at most; every 4th answer is missing: 2 episodes end with error
    assert simulator.most_in_flight == 3
    assert (summary.written, summary.outputs) == (8, 8)
    endings = [t.termination_reason for t in read_traces(path)]
    assert sorted(endings) == ["end"] * 6 + ["error"] * 2
    assert summary.unanswered == 2
    # run again: the 6 finished episodes are kept, the 2 that lost their request are asked again (a
    # fresh simulator answers its first 3 requests, so both end now)
    again = roll_out(sessions(8), OneAtATime(), path, source="remote")
    assert (again.resumed, again.written, again.outputs, again.unanswered) == (6, 2, 2, 0)
    assert sorted(t.termination_reason for t in read_traces(path)) == ["end"] * 8


def test_a_concurrent_simulator_starts_the_longest_recorded_sessions_first(tmp_path):
    from dataclasses import replace

    # one slot: episodes run one after another, so the trace file's order is the order they started
    simulator = OneAtATime()
    simulator.concurrency = 1
    base = session()
    lengths = {"short": 1, "long": len(base.steps), "middle": 2}
    waiting = [replace(base, session_id=name, steps=base.steps[:n]) for name, n in lengths.items()]
    assert len(base.steps) > 2
    roll_out(waiting, simulator, tmp_path / "t.jsonl", source="remote")
    assert [t.session_id for t in read_traces(tmp_path / "t.jsonl")] == ["long", "middle", "short"]
