"""The ``openai:`` simulator over real HTTP against the local fake OpenAI-compatible server."""

from __future__ import annotations

import hashlib
import json
import logging
import random

import pytest

from evaluation.engine import roll_out, traces_manifest_path
from evaluation.environment import EnvironmentSettings
from evaluation.openai_simulator import OpenAISimulator, OpenAISimulatorSettings
from evaluation.rollout import Rollout
from evaluation.simulators import NoAnswer, RandomSimulator, Sampling, simulator_for_lake
from evaluation.traces import read_traces
from extractors.fakeserver import FakeOpenAIServer, status
from tests.evaluation.test_environment import session

KEY = "sk-test-DO-NOT-LEAK-4f1c"


def shopper_answers(seed: int = 5):
    """A chat handler answering simulator JSON: a random executable action of the prompt shown."""
    rng = random.Random(seed)
    return lambda body: RandomSimulator.answer(body["messages"][-1]["content"], rng)


def first_31_bits(*parts) -> int:
    """A request's seed: the first 31 bits of sha256 of [seed, session, output index] as JSON."""
    return int.from_bytes(hashlib.sha256(json.dumps(list(parts)).encode()).digest()[:8], "big") >> 33


@pytest.fixture
def server():
    with FakeOpenAIServer(responder=shopper_answers()) as running:
        yield running


def simulator(server, **traffic) -> OpenAISimulator:
    fast = {"backoff_base_s": 0.01, "backoff_max_s": 0.05, **traffic}
    return OpenAISimulator.from_spec(f"fake-model@{server.base_url}", Sampling(max_new_tokens=64), **fast)


def test_the_spec_names_model_and_base_url():
    settings = OpenAISimulatorSettings.from_spec("Qwen/Qwen3-8B@http://127.0.0.1:8000/v1")
    assert (settings.model, settings.base_url) == ("Qwen/Qwen3-8B", "http://127.0.0.1:8000/v1")
    # PROTOCOL.md §3's sampling by default
    assert (settings.temperature, settings.top_p, settings.max_tokens, settings.seed) == (1.0, 0.95, 512, 42)
    with pytest.raises(ValueError, match="needs a model and a base URL"):
        OpenAISimulatorSettings.from_spec("just-a-model")


def test_rollouts_over_http_send_the_protocol_sampling_and_no_response_format(server, tmp_path):
    with simulator(server) as sim:
        summary = roll_out([session(session_id=f"s{i}") for i in range(3)], sim, tmp_path / "t.jsonl",
                           source="openai:fake")  # fmt: skip
    traces = read_traces(tmp_path / "t.jsonl")
    assert {t.termination_reason for t in traces} <= {"end", "budget"}
    assert all(step.accepted for t in traces for step in t.steps)  # the handler only answers legal actions
    chats = server.chat_requests()
    assert len(chats) == summary.outputs == sum(len(t.steps) for t in traces)
    body = chats[0].body
    assert (body["temperature"], body["top_p"], body["max_tokens"]) == (1.0, 0.95, 64)
    assert "response_format" not in body and body["model"] == "fake-model"
    expected = {first_31_bits(42, t.session_id, k) for t in traces for k in range(len(t.steps))}
    assert sorted(c.body["seed"] for c in chats) == sorted(expected)


def test_a_batch_is_sent_concurrently_up_to_the_limit(tmp_path):
    with FakeOpenAIServer(responder=shopper_answers(), latency=0.3) as slow_server:
        with simulator(slow_server, concurrency=4) as sim:
            prompt = Rollout(session()).messages()
            answers = sim.act([prompt] * 8)
        arrivals = sorted(r.at for r in slow_server.chat_requests())
    assert len(answers) == 8 and not any(isinstance(a, NoAnswer) for a in answers)
    # 8 prompts, 4 in flight, 0.3 s each: the first four arrive together, the next four only once
    # the first answers come back, about 0.3 s later
    assert arrivals[3] - arrivals[0] < 0.2
    assert arrivals[4] - arrivals[0] >= 0.25


def test_server_errors_and_rate_limits_are_retried(server, tmp_path):
    server.enqueue(status(500), status(429, retry_after=0))
    with simulator(server) as sim:
        summary = roll_out([session()], sim, tmp_path / "t.jsonl", source="openai:fake")
        retries = sim.stats["retries"]
    assert retries == {"rate_limited": 1, "server_error": 1}
    # the two refused requests are sent again: every output arrived, none was lost
    assert len(server.chat_requests()) == summary.outputs + 2
    assert read_traces(tmp_path / "t.jsonl")[0].termination_reason in ("end", "budget")


def test_a_request_failing_on_every_attempt_ends_its_episode_with_error(server, tmp_path):
    server.enqueue(status(500), status(500))
    with simulator(server, max_attempts=2) as sim:
        roll_out([session()], sim, tmp_path / "t.jsonl", source="openai:fake")
    (trace,) = read_traces(tmp_path / "t.jsonl")
    assert (trace.truncated, trace.termination_reason, trace.steps) == (True, "error", [])


def test_the_api_key_is_sent_but_never_logged_printed_or_written(
    server, tmp_path, monkeypatch, caplog, capfd
):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    caplog.set_level(logging.DEBUG)
    server.enqueue(status(500))  # a retry is logged: the key must not be in that line either
    sim = simulator_for_lake(f"openai:fake-model@{server.base_url}", tmp_path, Sampling(max_new_tokens=64))
    try:
        roll_out([session()], sim, tmp_path / "t.jsonl", source="openai:fake", settings=EnvironmentSettings())
    finally:
        sim.close()
    assert server.chat_requests()[0].headers["authorization"] == f"Bearer {KEY}"
    printed = capfd.readouterr()
    written = (tmp_path / "t.jsonl").read_text() + traces_manifest_path(tmp_path / "t.jsonl").read_text()
    assert "retrying after server_error" in caplog.text
    for text in (caplog.text, printed.out, printed.err, written):
        assert KEY not in text
