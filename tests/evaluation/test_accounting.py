"""The L0 accounting of traces, written out on frames of a few rows; the spec checks; the traffic
arithmetic of the run manifests; the accounting table of the Prefect artifact."""

from __future__ import annotations

import json

import polars as pl
import pytest

from evaluation.engine import added, counted
from evaluation.preflight import SimulatorSpecError, check_specs, model_folder_problem, spec_problem
from evaluation.report import comparison_markdown
from evaluation.scorecard import replay_accounting, rollout_accounting, score
from evaluation.simulators import Sampling
from evaluation.trace_frames import REPLAY_SCHEMA, SESSION_SCHEMA, STEP_SCHEMA, TraceFrames, unanswered_errors
from evaluation.traces import REJECT_REASONS


def sessions(*endings: str) -> pl.DataFrame:
    rows = [
        {"session_id": f"s{i}", "user_id": f"u{i}", "terminated": e == "end", "truncated": e != "end",
         "termination_reason": e, "prior_clicks": 0, "prior_buys": 0, "recent_click_categories": []}
        for i, e in enumerate(endings)
    ]  # fmt: skip
    return pl.DataFrame(rows, schema=SESSION_SCHEMA)


def steps(*verdicts: str | None) -> pl.DataFrame:
    """One feed step per verdict, in session s0: None accepted (an ``end``), else rejected so."""
    rows = [
        {"session_id": "s0", "step": i, "screen": "feed", "action": "end", "target_item_id": None,
         "review_alias": None, "accepted": v is None, "reject_reason": v, "item_category": None,
         "item_price": None}
        for i, v in enumerate(verdicts)
    ]  # fmt: skip
    return pl.DataFrame(rows, schema=STEP_SCHEMA)


def replay_rows(*verdicts: str | None, unscored: int = 0) -> pl.DataFrame:
    rows = [
        {"session_id": "s0", "step_index": i, "screen": "feed", "gt_action": "end",
         "pred_action": "end" if v is None else None, "accepted": v is None, "reject_reason": v}
        for i, v in enumerate(verdicts)
    ]  # fmt: skip
    rows += [
        {"session_id": "s0", "step_index": len(verdicts) + i, "screen": "feed", "gt_action": "end",
         "accepted": False, "unscored_reason": "state_not_rebuilt"}
        for i in range(unscored)
    ]  # fmt: skip
    return pl.DataFrame(rows, schema=REPLAY_SCHEMA)


def rejected(**found: int) -> dict[str, int]:
    """The four reasons of PROTOCOL §2, each with its count (0 unless given)."""
    return {reason: found.get(reason, 0) for reason in REJECT_REASONS}


ROLLOUT = TraceFrames(
    sessions("end", "budget", "invalid_retry_exhausted", "error"),
    steps(None, None, None, "parse_failure", "target_unresolved"),
)


def test_rollout_accounting_counts_every_output_and_ending():
    # 5 outputs judged and 1 episode ended by an unanswered request: 6 requests
    assert rollout_accounting(ROLLOUT) == {
        "requests": 6,
        "unanswered": 1,
        "outputs_judged": 5,
        "accepted": 3,
        "rejected": rejected(parse_failure=1, target_unresolved=1),
        "episodes": {"end": 1, "budget": 1, "invalid_retry_exhausted": 1, "error": 1},
    }


def test_replay_accounting_and_rva_leave_an_unanswered_request_out():
    replay = replay_rows(None, None, "unknown_action", "error", unscored=1)
    # 4 scored steps asked, 1 unanswered: 3 outputs, 2 of them accepted
    assert replay_accounting(replay) == {
        "requests": 4,
        "unanswered": 1,
        "outputs_judged": 3,
        "accepted": 2,
        "rejected": rejected(unknown_action=1),
        "unscored": 1,
    }
    figures = score(ROLLOUT, ROLLOUT, replay, supplementary=False)
    # RVA = 2 accepted / 3 outputs (the unanswered one is no output), as OVA = 3 / 5 over its outputs
    assert figures["RVA"] == pytest.approx(2 / 3) and figures["OVA"] == pytest.approx(3 / 5)


def test_unanswered_errors_are_counted_from_the_trace_file_most_common_first(tmp_path):
    path = tmp_path / "t.rollout.jsonl"
    lines = [("error", "RequestFailed: timeout on all 6 attempts"), ("end", None), ("error", "ExtractionStopped: http_404"),
             ("error", "RequestFailed: timeout on all 6 attempts")]  # fmt: skip
    path.write_text("".join(json.dumps({"session_id": f"s{i}", "termination_reason": r, "error": e}) + "\n"
                            for i, (r, e) in enumerate(lines)))  # fmt: skip
    assert unanswered_errors(path, "rollout") == {
        "RequestFailed: timeout on all 6 attempts": 2,
        "ExtractionStopped: http_404": 1,
    }


def test_traffic_of_one_call_and_its_running_total():
    before = {"http_requests": 2, "retries": {"server_error": 1}, "http_errors": {"500": 1}}
    after = {
        "http_requests": 7,
        "retries": {"server_error": 1, "rate_limited": 2},
        "http_errors": {"500": 1, "429": 2},
    }
    # what this call added: 5 requests, 2 rate-limit retries, two 429s; the 500 came before it
    assert counted(after, before) == {
        "http_requests": 5,
        "retries": {"rate_limited": 2},
        "http_errors": {"429": 2},
    }
    assert added(None, before) == before
    assert added(before, counted(after, before)) == {
        "http_requests": 7,
        "retries": {"server_error": 1, "rate_limited": 2},
        "http_errors": {"500": 1, "429": 2},
    }


def test_a_model_folder_needs_config_weights_and_tokenizer(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    assert model_folder_problem(folder) == (
        f"{folder} lacks weights (*.safetensors or pytorch_model*.bin), "
        "tokenizer files (tokenizer.json or tokenizer.model or vocab.json or vocab.txt)"
    )
    (folder / "model.safetensors").write_bytes(b"")
    (folder / "tokenizer.json").write_text("{}")
    assert model_folder_problem(folder) is None
    assert model_folder_problem(tmp_path / "nowhere") == (
        f"{tmp_path / 'nowhere'} does not exist (a local model folder is expected)"
    )


def test_each_bad_spec_is_one_line_naming_it(tmp_path):
    sampling = Sampling()
    assert spec_problem("markov:3", tmp_path, sampling).startswith("markov takes no argument")
    assert spec_problem("oracle", tmp_path, sampling).startswith("unknown simulator 'oracle'; known: ")
    assert spec_problem("openai:just-a-model", tmp_path, sampling).startswith("openai:MODEL@BASE_URL needs")
    assert spec_problem("random:7", tmp_path, sampling) is None
    with pytest.raises(SimulatorSpecError) as raised:
        check_specs(["random", "oracle", "markov:3"], tmp_path)
    assert isinstance(raised.value, ValueError)
    # every problem, each on its line, the good spec not among them
    lines = str(raised.value).splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("--simulator 'oracle': unknown simulator")
    assert lines[1].startswith("--simulator 'markov:3': markov takes no argument")


def test_the_artifact_tables_the_accounting():
    http = {"http_requests": 9, "retries": {"server_error": 2, "rate_limited": 1},
            "http_errors": {"500": 2, "429": 1}, "transport_errors": {}}  # fmt: skip
    rollout = {**rollout_accounting(ROLLOUT), "traffic": http, "unanswered_errors": {"RequestFailed: x": 1}}
    report = {"simulators": {"s": {}}, "accounting": {"s": {"rollout": rollout, "replay": None}}}
    markdown = comparison_markdown(report, "report.html")
    # requests 6, unanswered 1, judged 5, accepted 3, reasons 1 0 0 1; then endings 1 1 1 1, traffic
    verdicts = "| s | rollout | 6 | 1 | 5 | 3 | 1 | 0 | 0 | 1 |"
    endings = "| s | rollout | 1 | 1 | 1 | 1 | 9 | 3 | 429 ×1, 500 ×2 | 0 |"
    assert "## L0 accounting" in markdown and verdicts in markdown and endings in markdown
    assert markdown.index(verdicts) < markdown.index(endings)
    assert "- s, rollout: 1 unanswered (1 × RequestFailed: x)" in markdown
