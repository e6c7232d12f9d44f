"""Trace records, JSONL round trips, and the reference implementation's trace format read into the
same frames (and so the same figures) as ours."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import polars as pl
import pytest

from evaluation.scorecard import score
from evaluation.traces import (
    TraceFormatError,
    TraceProfile,
    TraceStep,
    dropped_keys,
    load_replay,
    load_traces,
    read_replay,
    read_traces,
    write_jsonl,
)
from tests.evaluation.tiny import as_reference, as_reference_replay, our_replay, population, write_reference


def test_our_trace_round_trips(tmp_path):
    records = population()
    write_jsonl(tmp_path / "t.jsonl", records)
    assert read_traces(tmp_path / "t.jsonl") == records


def test_a_step_is_built_from_an_attempt_object():
    @dataclass
    class Attempt:  # an environment's record: the trace's fields among others of its own
        index: int
        screen: str
        action: str
        target_item_id: str
        review_alias: None
        accepted: bool
        reject_reason: None
        item_category: str
        item_price: float
        raw_output: str
        distance: None

    attempt = Attempt(3, "feed", "click", "i7", None, True, None, "A-x-y", 12.5, '{"action": ...}', None)
    step = TraceStep.model_validate(attempt, from_attributes=True)
    assert step == TraceStep(screen="feed", action="click", target_item_id="i7", accepted=True,
                             item_category="A-x-y", item_price=12.5, raw_output='{"action": ...}')  # fmt: skip


def test_reference_rollout_reads_into_the_same_frames(tmp_path):
    records = population()
    write_jsonl(tmp_path / "ours.jsonl", records)
    write_reference(tmp_path / "ref.jsonl", [as_reference(r) for r in records])
    ours, reference = load_traces(tmp_path / "ours.jsonl"), load_traces(tmp_path / "ref.jsonl")
    assert reference.sessions.equals(ours.sessions)
    assert reference.steps.equals(ours.steps)
    # the rejected buys: legal = false with an empty reason -> illegal_in_state, as ours say
    rejected = reference.steps.filter(~pl.col("accepted"))
    assert rejected["reject_reason"].unique().to_list() == ["illegal_in_state"]
    assert rejected.height == 4  # sessions 0, 3, 6, 9


def test_reference_rollout_gives_the_same_figures(tmp_path):
    records = population()
    real = [r for r in records if r.source == "real"]
    sim = [r for r in records if r.source != "real"]
    write_jsonl(tmp_path / "real.jsonl", real)
    write_jsonl(tmp_path / "sim.jsonl", sim)
    write_reference(tmp_path / "real_ref.jsonl", [as_reference(r) for r in real])
    write_reference(tmp_path / "sim_ref.jsonl", [as_reference(r) for r in sim])
    ours = score(load_traces(tmp_path / "real.jsonl"), load_traces(tmp_path / "sim.jsonl"))
    theirs = score(load_traces(tmp_path / "real_ref.jsonl"), load_traces(tmp_path / "sim_ref.jsonl"))
    assert theirs == ours
    # simulated sessions 0, 2, ..., 10 have 9 + 6 + 8 + 7 + 8 + 6 = 44 outputs; 0 and 6 each reject a buy
    assert ours["OVA"] == pytest.approx(42 / 44)


def test_reference_step_checks_map_to_reasons_in_protocol_order(tmp_path):
    episode = {
        "kind": "rollout",
        "session_id": "e",
        "visitor_id": "v",
        "profile": {},
        "terminated": False,
        "truncated": True,
        "termination_reason": "invalid_action_retry_exhausted",
        "steps": [
            {"layer": "feed", "action": "click", "parse_ok": False, "legal": False, "executed": False},
            {"layer": "feed", "action": "fly", "executed": False},
            {"layer": "feed", "action": "click", "target_resolved": False, "executed": False},
            {"layer": "feed", "action": "click", "executed": False, "reject_reason": "target_unresolved"},
            {
                "layer": "feed",
                "action": "scroll_up",
                "executed": False,
                "reject_reason": "action is not available on Feed",
            },
            {
                "layer": "feed",
                "action": "click",
                "executed": False,
                "reject_reason": "cannot resolve click target",
            },
            {"layer": "feed", "action": "click", "executed": False},
            {"action": "ipv_cart", "item_price": 129},  # no layer: an ipv action is on the detail page
        ],
    }
    write_reference(tmp_path / "ref.jsonl", [episode])
    frames = load_traces(tmp_path / "ref.jsonl")
    assert frames.steps["reject_reason"].to_list() == [
        "parse_failure",  # checked first, even though it was also illegal
        "unknown_action",
        "target_unresolved",
        "target_unresolved",
        "illegal_in_state",  # the reference's prose, read as our code
        "target_unresolved",
        "not_executed",  # not executed, and neither a failed check nor a reason says why
        None,
    ]
    assert frames.steps["screen"].to_list()[-1] == "ipv"
    assert frames.steps["item_price"].to_list()[-1] == 129.0
    session = frames.sessions.row(0, named=True)
    assert session["prior_clicks"] == 0  # missing profile counts -> 0
    assert session["termination_reason"] == "invalid_retry_exhausted"  # the reference's word for it, in ours


def test_replay_round_trip_and_reference_replay(tmp_path):
    records = our_replay()
    write_jsonl(tmp_path / "ours.jsonl", records)
    assert read_replay(tmp_path / "ours.jsonl") == records
    write_reference(tmp_path / "ref.jsonl", [as_reference_replay(r) for r in records])
    assert load_replay(tmp_path / "ref.jsonl").equals(load_replay(tmp_path / "ours.jsonl"))


def test_empty_review_aliases_are_no_aliases(tmp_path):
    line = {"session_id": "s", "step_index": 0, "layer": "ipv", "gt_action": "ipv_click_comment",
            "pred_action": "ipv_click_comment", "gt_target_alias": "", "pred_target_alias": ""}  # fmt: skip
    write_reference(tmp_path / "ref.jsonl", [line])
    row = load_replay(tmp_path / "ref.jsonl").row(0, named=True)
    # two empty aliases must not count as the same review (the exact-accuracy rule needs both present)
    assert (row["gt_review_alias"], row["pred_review_alias"]) == (None, None)


def test_reference_replay_without_prediction(tmp_path):
    line = {
        "session_id": "s",
        "step_index": 0,
        "layer": "feed",
        "gt_action": "end",
        "prediction_present": False,
    }
    write_reference(tmp_path / "ref.jsonl", [line])
    row = load_replay(tmp_path / "ref.jsonl").row(0, named=True)
    assert (row["accepted"], row["reject_reason"]) == (False, "missing_prediction")


def test_a_file_of_neither_format_is_refused(tmp_path):
    (tmp_path / "x.jsonl").write_text(json.dumps({"session": "s", "events": []}) + "\n")
    with pytest.raises(TraceFormatError, match="neither user_id"):
        load_traces(tmp_path / "x.jsonl")
    with pytest.raises(TraceFormatError, match="no gt_action"):
        load_replay(tmp_path / "x.jsonl")


def test_steps_no_metric_could_place_are_refused(tmp_path):
    record = population()[0]
    record.steps[1].screen = "cart_page"
    write_jsonl(tmp_path / "bad.jsonl", [record])
    with pytest.raises(TraceFormatError, match=r"1 accepted steps on no known screen .* session 's0'"):
        load_traces(tmp_path / "bad.jsonl")
    write_jsonl(tmp_path / "twice.jsonl", [population()[0], population()[0]])
    with pytest.raises(TraceFormatError, match="2 sessions without a session_id, or sharing one"):
        load_traces(tmp_path / "twice.jsonl")
    line = {"session_id": "s", "step_index": 0, "screen": "feed", "gt_action": "teleport", "accepted": True}
    write_reference(tmp_path / "replay.jsonl", [line])
    with pytest.raises(TraceFormatError, match="1 replay rows whose recorded action is not one of the 13"):
        load_replay(tmp_path / "replay.jsonl")


def test_empty_file_reads_as_no_sessions(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n")
    frames = load_traces(tmp_path / "empty.jsonl")
    assert (frames.sessions.height, frames.steps.height) == (0, 0)


def write_lines(path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def our_lines(records) -> list[dict]:
    return [json.loads(r.model_dump_json()) for r in records]


def test_a_misspelt_profile_key_is_refused_with_its_line_and_the_nearest_key(tmp_path):
    lines = our_lines(population()[:4])
    lines[2]["profile"]["clicks"] = lines[2]["profile"].pop("prior_clicks")  # the third line
    write_lines(tmp_path / "t.jsonl", lines)
    message = f"{tmp_path / 't.jsonl'}:3: unknown key 'clicks' in profile (did you mean 'prior_clicks'?)"
    expected = f"^{re.escape(message)}$"
    with pytest.raises(TraceFormatError, match=expected):
        load_traces(tmp_path / "t.jsonl")
    with pytest.raises(TraceFormatError, match=expected):  # the records reader says the same
        read_traces(tmp_path / "t.jsonl")


def test_unknown_keys_are_refused_at_every_level(tmp_path):
    cases = [
        (lambda line: line.update(sesion="s"), "session", "session_id"),
        (lambda line: line["steps"][1].update(acepted=True), "step", "accepted"),
        (lambda line: line.update(colour="red"), "session", None),  # nothing close: no guess
    ]
    for change, level, nearest in cases:
        lines = our_lines(population()[:2])
        change(lines[1])
        write_lines(tmp_path / "t.jsonl", lines)
        with pytest.raises(TraceFormatError, match=f":2: unknown key '.*' in {level}") as raised:
            load_traces(tmp_path / "t.jsonl")
        guess = str(raised.value).partition("(did you mean ")[2]
        assert guess == (f"'{nearest}'?)" if nearest else "")


def test_the_line_number_counts_blank_lines(tmp_path):
    lines = our_lines(population()[:2])
    lines[1]["steps"][0]["screen_type"] = "feed"  # a reference step key in our format
    (tmp_path / "t.jsonl").write_text(json.dumps(lines[0]) + "\n\n" + json.dumps(lines[1]) + "\n")
    with pytest.raises(TraceFormatError, match=r"t\.jsonl:3: unknown key 'screen_type' in step"):
        load_traces(tmp_path / "t.jsonl")


def test_every_unknown_key_of_the_file_is_named_with_the_first(tmp_path):
    lines = our_lines(population()[:3])
    lines[0]["profile"]["clicks"] = 1
    lines[1]["profile"]["clicks"] = 2
    lines[2]["steps"][0]["note"] = "x"
    write_lines(tmp_path / "t.jsonl", lines)
    with pytest.raises(TraceFormatError) as raised:
        load_traces(tmp_path / "t.jsonl")
    # two profiles hold 'clicks', one step holds 'note'
    assert str(raised.value).endswith(":1: unknown key 'clicks' in profile (did you mean 'prior_clicks'?); "
                                      "unknown keys in the file: profile.clicks (2), steps[].note (1)")  # fmt: skip


def test_a_reference_file_is_held_to_the_reference_keys(tmp_path):
    episodes = [as_reference(r) for r in population()[:2]]
    episodes[1]["steps"][0]["item_category"] = episodes[1]["steps"][0].pop("item_cate")  # our name for it
    write_reference(tmp_path / "ref.jsonl", episodes)
    expected = re.escape(":2: unknown key 'item_category' in step (did you mean 'item_cate'?)")
    with pytest.raises(TraceFormatError, match=expected):
        load_traces(tmp_path / "ref.jsonl")
    rows = [as_reference_replay(r) for r in our_replay()]
    rows[0]["pred_alias"] = rows[0].pop("pred_target_alias")
    write_reference(tmp_path / "replay.jsonl", rows)
    with pytest.raises(TraceFormatError, match=r":1: unknown key 'pred_alias' in replay step \(did you mean"):
        load_replay(tmp_path / "replay.jsonl")


def test_a_lenient_read_drops_unknown_keys_and_counts_them(tmp_path):
    lines = our_lines(population()[:4])
    for line in lines[1:3]:  # sessions s1 and s2, with 3 and 6 prior clicks
        line["profile"]["clicks"] = line["profile"].pop("prior_clicks")
    lines[3]["steps"][0]["note"] = "x"
    write_lines(tmp_path / "t.jsonl", lines)
    frames = load_traces(tmp_path / "t.jsonl", strict=False)
    # what a misspelt key costs: the lenient read sees no prior clicks there (s0 has 0, s3 has 9)
    assert frames.sessions["prior_clicks"].to_list() == [0, 0, 0, 9]
    assert dropped_keys(tmp_path / "t.jsonl", "rollout") == {"profile.clicks": 2, "steps[].note": 1}
    rows = our_lines(our_replay())
    rows[4]["gt_title"] = "Mug"
    write_lines(tmp_path / "replay.jsonl", rows)
    assert load_replay(tmp_path / "replay.jsonl", strict=False).height == 5
    assert dropped_keys(tmp_path / "replay.jsonl", "replay") == {"gt_title": 1}


def test_the_trace_records_forbid_undeclared_fields():
    with pytest.raises(ValueError, match="clicks"):
        TraceProfile(clicks=3)
    with pytest.raises(ValueError, match="acepted"):
        TraceStep(screen="feed", acepted=True)
