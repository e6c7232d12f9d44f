"""The client over real HTTP, one fault kind at a time: retries made, final state, requests sent."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from extractors.cache import ResponseCache
from extractors.client import ExtractionStopped, LLMClient, RequestFailed, Stats, retry_after_s
from extractors.fakeserver import FakeOpenAIServer, drop, reply, slow, status
from extractors.prompts import RATIONALE_V1
from tests.extractors.conftest import fast_settings

ANSWER = json.dumps({"rationale": "Looks right for me, so I'll take a closer look."})
MESSAGES = RATIONALE_V1.messages(context="## Current observation\nFeed", action='{"type":"click"}')


def complete(
    server: FakeOpenAIServer, tmp_path: Path, messages=MESSAGES, stats: Stats | None = None, **overrides
):
    """One ``complete`` call with a fresh client; returns (answer or exception, stats)."""
    stats = stats or Stats()
    settings = fast_settings(server, **overrides)

    async def go():
        async with LLMClient(settings, cache=ResponseCache(tmp_path / "cache"), stats=stats) as client:
            try:
                return await client.complete(RATIONALE_V1, messages)
            except (ExtractionStopped, RequestFailed) as exc:
                return exc

    return asyncio.run(go()), stats


def test_valid_answer_is_one_request(server, tmp_path):
    server.enqueue(reply(ANSWER))
    answer, stats = complete(server, tmp_path)
    # one scripted 200 -> one request, no retry, and the text is exactly what the server sent
    assert answer.text == ANSWER and not answer.cached
    assert len(server.chat_requests()) == 1 and stats.requests == 1 and stats.retries == {}
    sent = server.chat_requests()[0].body
    assert (
        sent["response_format"]["type"] == "json_schema" and sent["response_format"]["json_schema"]["strict"]
    )
    assert sent["max_tokens"] == 512 and sent["seed"] == 42 and sent["model"] == "fake-model"


def test_429_waits_for_retry_after(server, tmp_path):
    server.enqueue(status(429, retry_after=0.4), reply(ANSWER))
    answer, stats = complete(server, tmp_path)
    first, second = server.chat_requests()
    # backoff alone would be <= 0.02 s (base 0.02, equal jitter); Retry-After: 0.4 must win
    assert second.at - first.at >= 0.4
    assert answer.text == ANSWER and stats.retries == {"rate_limited": 1} and stats.requests == 2


def test_500s_are_retried(server, tmp_path):
    server.enqueue(status(500), status(503), reply(ANSWER))
    answer, stats = complete(server, tmp_path)
    # two server errors, then the answer: 3 requests, 2 retries
    assert answer.text == ANSWER and len(server.chat_requests()) == 3 and stats.retries == {"server_error": 2}


def test_slow_response_times_out_and_is_retried(server, tmp_path):
    server.enqueue(slow(1.5), reply(ANSWER))
    answer, stats = complete(server, tmp_path)
    first, second = server.chat_requests()
    # the client gives up after its 0.3 s timeout (not the server's 1.5 s), then retries once
    assert 0.3 <= second.at - first.at < 1.5
    assert answer.text == ANSWER and stats.retries == {"timeout": 1}


def test_dropped_connection_is_retried(server, tmp_path):
    server.enqueue(drop(), reply(ANSWER))
    answer, stats = complete(server, tmp_path)
    # the server read the request and hung up: it saw 2 requests, the client retried once
    assert answer.text == ANSWER and len(server.chat_requests()) == 2 and stats.retries == {"connection": 1}


def test_attempts_are_bounded(server, tmp_path):
    server.enqueue(*[status(500)] * 4)
    failure, stats = complete(server, tmp_path)
    # max_attempts=4: 4 requests, 3 retries between them, then a RequestFailed (nothing cached)
    assert isinstance(failure, RequestFailed) and len(server.chat_requests()) == 4
    assert stats.retries == {"server_error": 3} and len(ResponseCache(tmp_path / "cache")) == 0


def test_json_schema_refusal_falls_back_to_json_mode(server, tmp_path):
    server.enqueue(status(400, message="response_format json_schema is not supported"), reply(ANSWER))
    answer, stats = complete(server, tmp_path)
    first, second = server.chat_requests()
    # auto mode: the 400 about response_format switches to JSON mode once; not counted as a retry
    assert first.body["response_format"]["type"] == "json_schema"
    assert second.body["response_format"] == {"type": "json_object"}
    assert answer.text == ANSWER and stats.format_fallbacks == 1 and stats.retries == {}


def test_other_400_fails_that_request_only(server, tmp_path):
    server.enqueue(status(400, message="bad request"))
    failure, stats = complete(server, tmp_path)
    assert isinstance(failure, RequestFailed) and len(server.chat_requests()) == 1 and stats.stopped is None


def test_401_stops_sending(server, tmp_path):
    server.enqueue(status(401, message="invalid key"))
    stats = Stats()
    first, _ = complete(server, tmp_path, stats=stats)
    second, _ = complete(server, tmp_path, stats=stats)
    # the first call hits 401 and stops the run; the second is refused without any request
    assert isinstance(first, ExtractionStopped) and first.reason == "http_401"
    assert isinstance(second, ExtractionStopped) and len(server.chat_requests()) == 1


def test_cached_answer_sends_nothing(server, tmp_path):
    server.enqueue(reply(ANSWER))
    complete(server, tmp_path)
    again, stats = complete(server, tmp_path)
    # same model, parameters and messages -> same key -> served from LAKE cache, no request
    assert (
        again.cached and again.text == ANSWER and len(server.chat_requests()) == 1 and stats.cache_hits == 1
    )


def test_other_parameters_miss_the_cache(server, tmp_path):
    complete(server, tmp_path)
    complete(server, tmp_path, temperature=0.9)
    # temperature is part of the key: a second request
    assert len(server.chat_requests()) == 2


def test_budget_refuses_what_could_overshoot(server, tmp_path):
    # $1 per output token; max_tokens 100, so every request reserves $100 before it is sent.
    # The fake server bills len(content)//4 + 1 completion tokens: 64 chars -> 17 tokens -> $17.
    assert len(ANSWER) == 64
    # Budget $116: the first request fits (0 + 100 <= 116); after it, 17 + 100 = 117 > 116 -> refused.
    stats = Stats()
    settings = fast_settings(server, max_tokens=100, price_output_per_mtok=1e6, budget_usd=116.0)
    other = [*MESSAGES[:1], {"role": "user", "content": "another record"}]

    async def go():
        async with LLMClient(settings, cache=ResponseCache(tmp_path / "cache"), stats=stats) as client:
            first = await client.complete(RATIONALE_V1, MESSAGES)
            with pytest.raises(ExtractionStopped):
                await client.complete(RATIONALE_V1, other)
            cached = await client.complete(RATIONALE_V1, MESSAGES)  # the cache still answers when stopped
            return first, cached

    server.enqueue(reply(ANSWER))
    first, cached = asyncio.run(go())
    assert first.text == ANSWER and cached.cached and len(server.chat_requests()) == 1
    assert stats.stopped == "budget" and stats.cost_usd == 17.0 and stats.tokens_out == 17


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after": "2"}, 2.0),
        ({"retry-after-ms": "250"}, 0.25),
        ({"retry-after": "soon"}, None),
        ({}, None),
    ],
)
def test_retry_after_parsing(headers, expected):
    assert retry_after_s(headers) == expected


def test_backoff_is_exponential_jittered_and_honours_retry_after(server):
    async def waits():
        settings = fast_settings(server, backoff_base_s=1.0, backoff_max_s=8.0, retry_after_max_s=30.0)
        async with LLMClient(settings, cache=None) as client:
            return (
                [client.backoff(a, None) for a in (1, 2, 3, 4, 5)],
                client.backoff(1, 20.0),
                client.backoff(1, 99),
            )

    plain, asked, capped = asyncio.run(waits())
    # equal jitter: attempt a waits in [c/2, c] with c = min(8, 2**(a-1)) -> [0.5,1], [1,2], [2,4], [4,8], [4,8]
    for wait, ceiling in zip(plain, (1, 2, 4, 8, 8), strict=True):
        assert ceiling / 2 <= wait <= ceiling
    assert asked == 20.0 and capped == 30.0  # Retry-After wins over the jitter, up to retry_after_max_s
