"""``trajforge evaluate --simulator openai:`` against a scripted OpenAI-compatible server: a spec that
cannot work stops before anything is written, a mostly failing endpoint stops the run without a
report (and a rerun resumes), every rejection reason and HTTP fault is counted in report.json's L0
accounting, and every request of a run, the A/B effect's arms included, carries the CLI's sampling.

Expected numbers come from what the server itself sent (each exchange is kept with its reply), and
from the trace files, never from the figures under test.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cli.app import app
from evaluation.openai_simulator import OpenAISimulator
from evaluation.simulators import RandomSimulator, derived_seed, executable_lines
from evaluation.traces import read_replay, read_traces
from tests.evaluation.scripted_server import Reply, closed_port, scripted_server
from tests.flows.generated_lakes import generated_lake
from transforms.lake import world_path

runner = CliRunner()
SESSIONS = 4
# retries in milliseconds, not seconds: the policy is the client's, the waiting is not under test
FAST = {"TRAJFORGE_OPENAI_BACKOFF_BASE_S": "0.01", "TRAJFORGE_OPENAI_BACKOFF_MAX_S": "0.02"}
SAMPLING_FLAGS = ["--temperature", "0.5", "--seed", "7", "--top-p", "0.9", "--max-new-tokens", "256"]
SAMPLING_SENT = {"temperature": 0.5, "top_p": 0.9, "max_tokens": 256}
SEED = 7  # each request's own seed derives from it, the prompt's session and step
REASONS = ("parse_failure", "unknown_action", "illegal_in_state", "target_unresolved")
ENDINGS = ("end", "budget", "invalid_retry_exhausted", "error")


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> Path:
    return generated_lake(tmp_path_factory.mktemp("failures"), users=60, seed=5)


def evaluate(lake: Path, out: Path, *specs: str, extra: tuple[str, ...] = (), env: dict | None = None):
    args = ["evaluate", "--lake", str(lake), "--out", str(out), "--sessions", str(SESSIONS), *extra]
    for spec in specs:
        args += ["--simulator", spec]
    return runner.invoke(app, args, env={**FAST, **(env or {})})


def flat(output: str) -> str:
    return " ".join(output.split())


def prompt_of(body: dict[str, Any]) -> str:
    return body["messages"][-1]["content"]


def listed(body: dict[str, Any]) -> list[str]:
    """The action names the prompt lists as executable."""
    return [line.split(" ", 1)[0] for line in executable_lines(prompt_of(body))]


def say(action: dict[str, Any]) -> str:
    return json.dumps({"rationale": "scripted", "action": action})


def valid(body: dict[str, Any]) -> Reply:
    # a uniform choice among the prompt's executable actions, arguments in view and in range, drawn by
    # the request's own seed so the same request gets the same answer
    return Reply("valid", RandomSimulator.answer(prompt_of(body), random.Random(body.get("seed", 3))))


def rejected_as(reason: str, body: dict[str, Any]) -> Reply:
    """An answer PROTOCOL §2 rejects for ``reason`` in the prompt's state (a valid one where the state
    offers no way to break that rule; it is then recorded as valid)."""
    names = listed(body)
    if reason == "parse_failure":
        return Reply(reason, "I think I will scroll down a little.")
    if reason == "unknown_action":
        return Reply(reason, say({"type": "teleport"}))
    if reason == "illegal_in_state":  # a detail-page action on the feed, a feed action on a detail page
        return Reply(reason, say({"type": "scroll_down" if "back_home" in names else "ipv_buy"}))
    if "click" in names:  # target_unresolved: a card that is not in view
        return Reply(reason, say({"type": "click", "target_item_id": "no-such-item"}))
    for scroll in ("scroll_down", "scroll_up", "ipv_scroll_down", "ipv_scroll_up"):
        if scroll in names:  # a distance far out of range
            return Reply(reason, say({"type": scroll, "distance": 99_999}))
    return valid(body)


class Cycle:
    """Each new request (a body not being retried) takes the next of ten parts: four accepted answers
    between the four rejections, then a request failing on both its attempts (500, then 429), then one
    refused once with 429 (Retry-After: 0) and answered on its retry."""

    PARTS = ("valid", "parse_failure", "valid", "unknown_action", "valid", "illegal_in_state", "valid",
             "target_unresolved", "lost", "recovered")  # fmt: skip

    def __init__(self) -> None:
        self.requests = 0
        self.retrying: dict[str, list[str]] = {}  # body digest -> the replies still to come

    def __call__(self, body: dict[str, Any], number: int) -> Reply:
        key = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
        if key in self.retrying:
            plan = self.retrying[key]
            step = plan.pop(0)
            if not plan:
                del self.retrying[key]
        else:
            part = self.PARTS[self.requests % len(self.PARTS)]
            self.requests += 1
            plan = {"lost": ["500", "429"], "recovered": ["429", "valid"]}.get(part, [part])
            step = plan[0]
            if len(plan) > 1:
                self.retrying[key] = plan[1:]
        if step == "500":
            return Reply("500", status=500)
        if step == "429":
            return Reply("429", status=429, retry_after="0")
        return valid(body) if step == "valid" else rejected_as(step, body)


def test_specs_that_cannot_work_stop_before_anything_is_written(prefect_harness, lake, tmp_path):
    closed = f"openai:m@http://127.0.0.1:{closed_port()}/v1"
    no_scheme = "openai:m@127.0.0.1:8000/v1"
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    checkpoint = f"checkpoint:{tmp_path / 'model'}"
    out = tmp_path / "eval"
    result = evaluate(lake, out, closed, no_scheme, checkpoint, "random:x", extra=("--no-effect",))
    assert result.exit_code == 1, result.output
    printed = flat(result.output)
    # one line per spec, each naming it and what is wrong
    assert f"--simulator {closed!r}: cannot reach http://127.0.0.1:" in printed
    assert (
        f"--simulator {no_scheme!r}: the base URL '127.0.0.1:8000/v1' is not an http:// or https:// URL"
        in printed
    )
    assert f"--simulator {checkpoint!r}: {tmp_path / 'model'} lacks weights" in printed
    assert (
        "tokenizer files" in printed
        and "--simulator 'random:x': random:SEED takes a whole-number seed" in printed
    )
    assert "Traceback" not in result.output
    # checked before the real traces are exported: nothing at all was written
    assert not out.exists()


def test_a_world_spec_on_a_lake_without_a_world_stops_with_its_name(prefect_harness, lake, tmp_path):
    # the same lake as if ingested from logs: no world to play the shoppers
    logs = tmp_path / "logs"
    shutil.copytree(lake, logs)
    world_path(logs).unlink()
    result = evaluate(logs, tmp_path / "eval", "world", extra=("--no-effect",))
    assert result.exit_code == 1
    assert "--simulator 'world': " in flat(result.output) and "not generated from a synthetic world" in flat(
        result.output
    )


def test_a_mostly_failing_endpoint_exits_1_without_a_report_and_a_rerun_resumes(
    prefect_harness, lake, tmp_path
):
    healthy = {"now": False}

    def script(body: dict[str, Any], number: int) -> Reply:
        # three of every four requests refused while unhealthy
        if not healthy["now"] and number % 4:
            return Reply("500", status=500)
        return valid(body)

    out = tmp_path / "eval"
    out.mkdir()
    for stale in ("report.json", "report.html"):  # an earlier run's report must not outlive this one
        (out / stale).write_text("{}")
    one_attempt = {"TRAJFORGE_OPENAI_MAX_ATTEMPTS": "1"}
    with scripted_server(script) as (base_url, exchanges):
        spec = f"openai:scripted@{base_url}"
        # --resume: the earlier run left no run.json, so its folder is continued only when asked
        result = evaluate(lake, out, spec, extra=("--no-effect", "--resume"), env=one_attempt)
        assert result.exit_code == 1, result.output
        # one attempt per request: each exchange is one request, each 500 one that got no answer
        sent, refused = len(exchanges), sum(e.reply.status == 500 for e in exchanges)
        assert refused / sent > 0.2
        printed = flat(result.output)
        assert f"{spec}: {refused} of {sent} rollout requests got no answer after retries" in printed
        assert f"{refused} × RequestFailed: server_error on all 1 attempts" in printed
        assert "no report written" in printed and "Traceback" not in result.output
        assert not (out / "report.json").exists() and not (out / "report.html").exists()
        # the rollout's traces stay: every session, those that lost their request ended by error
        (rollout,) = out.glob("*.rollout.jsonl")
        traces = read_traces(rollout)
        assert len(traces) == SESSIONS
        lost = [t for t in traces if t.termination_reason == "error"]
        assert len(lost) == refused and {t.error for t in lost} == {
            "RequestFailed: server_error on all 1 attempts"
        }
        assert not list(out.glob("*.replay.jsonl"))  # the run stopped before the replay

        healthy["now"] = True
        again = evaluate(lake, out, spec, extra=("--no-effect",), env=one_attempt)
    assert again.exit_code == 0, again.output
    report = json.loads((out / "report.json").read_text())
    runs = report["runs"][spec]["rollout"]
    # the episodes that ended well are kept, those that lost a request are asked again
    assert (runs["resumed"], runs["written"]) == (SESSIONS - refused, refused)
    assert {t.termination_reason for t in read_traces(rollout)} <= {"end", "budget"}
    assert report["accounting"][spec]["rollout"]["unanswered"] == 0


def test_every_rejection_reason_and_http_fault_is_counted_in_report_json(prefect_harness, lake, tmp_path):
    out = tmp_path / "eval"
    cycle = Cycle()
    # one request at a time, so each request's retry is the next thing the server sees of it
    env = {"TRAJFORGE_OPENAI_CONCURRENCY": "1", "TRAJFORGE_OPENAI_MAX_ATTEMPTS": "2"}
    with scripted_server(cycle) as (base_url, exchanges):
        spec = f"openai:scripted@{base_url}"
        extra = ("--no-effect", "--max-unanswered", "0.5", *SAMPLING_FLAGS)
        result = evaluate(lake, out, spec, extra=extra, env=env)
    assert result.exit_code == 0, result.output
    assert cycle.retrying == {}  # every planned retry came
    report = json.loads((out / "report.json").read_text())
    account = report["accounting"][spec]
    rollout, replay = account["rollout"], account["replay"]
    both = lambda key: rollout[key] + replay[key]  # noqa: E731

    sent = Counter(e.reply.kind for e in exchanges)
    assert all(sent[reason] > 0 for reason in REASONS) and sent["500"] > 0 and sent["429"] > sent["500"]
    # each planned 'lost' request got 500 then 429 and no answer; a 'recovered' one 429 then an answer
    lost = sent["500"]
    recovered = sent["429"] - lost
    for reason in REASONS:
        assert rollout["rejected"][reason] + replay["rejected"][reason] == sent[reason], reason
    assert both("accepted") == sent["valid"]
    assert both("outputs_judged") == sum(e.reply.status == 200 for e in exchanges)
    assert both("unanswered") == lost
    assert both("requests") == cycle.requests == sum(e.reply.status == 200 for e in exchanges) + lost

    traffic = [rollout["traffic"], replay["traffic"]]
    assert sum(t["http_requests"] for t in traffic) == len(exchanges)
    errors = Counter()
    retries = Counter()
    for t in traffic:
        errors.update(t["http_errors"])
        retries.update(t["retries"])
    assert errors == {"500": lost, "429": lost + recovered}
    # a lost request is retried once (after its 500; its 429 is its last attempt), a recovered one once
    assert retries == {"server_error": lost, "rate_limited": recovered}

    # the rollout's episodes: one rejection ends an episode (max_try 1), a lost request too
    rollout_file, replay_file = (Path(report["traces"][spec][kind]) for kind in ("rollout", "replay"))
    traces = read_traces(rollout_file)
    episodes = rollout["episodes"]
    assert sum(episodes.values()) == len(traces) == SESSIONS
    assert episodes["invalid_retry_exhausted"] == sum(rollout["rejected"].values())
    assert episodes["error"] == rollout["unanswered"]
    assert episodes == {ending: sum(t.termination_reason == ending for t in traces) for ending in ENDINGS}
    # the traces keep each rejection's detail and each lost request's error
    steps = [s for t in traces for s in t.steps]
    assert all(s.detail for s in steps if not s.accepted)
    assert {t.error for t in traces if t.termination_reason == "error"} <= {
        "RequestFailed: rate_limited on all 2 attempts"
    }
    rows = read_replay(replay_file)
    assert all(r.detail for r in rows if r.reject_reason in REASONS)
    assert {r.error for r in rows if r.reject_reason == "error"} <= {
        "RequestFailed: rate_limited on all 2 attempts"
    }

    # RVA and OVA leave the unanswered requests out, alike: accepted over the outputs there were
    figures = report["simulators"][spec]
    answered_rows = [r for r in rows if r.unscored_reason is None and r.reject_reason != "error"]
    assert figures["OVA"] == pytest.approx(sum(s.accepted for s in steps) / len(steps), abs=5e-5)
    assert figures["RVA"] == pytest.approx(
        sum(r.accepted for r in answered_rows) / len(answered_rows), abs=5e-5
    )

    # every request of the run carried the command's sampling, and a seed derived from --seed and
    # the prompt's session and step
    assert all({key: e.body[key] for key in SAMPLING_SENT} == SAMPLING_SENT for e in exchanges)
    sessions = [json.loads(line)["session_id"] for line in (out / "real.jsonl").read_text().splitlines()]
    derived = {derived_seed(SEED, session, step, bits=31) for session in sessions for step in range(64)}
    assert {e.body["seed"] for e in exchanges} <= derived

    page = (out / "report.html").read_text()
    assert "<h2>L0 accounting</h2>" in page
    assert (
        f"<td>{spec}</td><td>rollout</td><td>{rollout['requests']}</td><td>{rollout['unanswered']}</td>"
        in page
    )


def test_the_effect_arms_sample_as_the_command_says_and_close_their_simulator(
    prefect_harness, lake, tmp_path, monkeypatch
):
    opened, closed = [], []
    original_init, original_close = OpenAISimulator.__init__, OpenAISimulator.close

    def init(self, settings):
        original_init(self, settings)
        opened.append(self)

    def close(self):
        if not self._loop.is_closed():
            closed.append(self)
        original_close(self)

    monkeypatch.setattr(OpenAISimulator, "__init__", init)
    monkeypatch.setattr(OpenAISimulator, "close", close)
    out = tmp_path / "eval"
    with scripted_server(lambda body, number: valid(body)) as (base_url, exchanges):
        spec = f"openai:scripted@{base_url}"
        result = evaluate(lake, out, spec, extra=("--effect-users", "4", *SAMPLING_FLAGS))
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    assert report["simulators"][spec]["effect_ratio"] is not None
    traffic = [report["accounting"][spec][kind]["traffic"]["http_requests"] for kind in ("rollout", "replay")]
    # the A/B arms asked the same server beyond the rollout's and the replay's requests
    assert len(exchanges) > sum(traffic)
    assert all({key: e.body[key] for key in SAMPLING_SENT} == SAMPLING_SENT for e in exchanges)
    assert all(isinstance(e.body["seed"], int) for e in exchanges)
    # one simulator for the rollout and replay, one for the arms: both closed
    assert len(opened) == 2 and closed == opened
