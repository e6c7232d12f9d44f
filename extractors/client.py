"""The OpenAI-compatible client: concurrency, retries, cache, token/cost accounting and a budget.

Built on ``openai.AsyncOpenAI`` with the SDK's own retries switched off
(``max_retries=0``) so that the policy is ours and observable:

* 429, 408/409, 5xx, timeouts and dropped connections are retried with
  exponential backoff and "equal jitter", waiting at least ``Retry-After``
  (``retry-after-ms`` too) when the server sends one, up to ``max_attempts``;
* 401/403/404 stop the whole run cleanly (a wrong key or URL will not heal);
* other 4xx fail that request only (it is quarantined by the caller) — except a
  400/422 about ``response_format`` in ``auto`` mode, which switches the client
  to JSON mode once and re-sends;
* every answer is written to the content-addressed cache as it arrives;
* a request is sent only if its worst-case cost (prompt estimate + max_tokens)
  fits in the budget, so requests in flight cannot overshoot it (up to the
  prompt estimate, ~3 characters per token); the first refusal stops the
  client: cache hits are still served, nothing new is sent.

Requests go through ``AsyncOpenAI.post("/chat/completions", cast_to=httpx.Response)``
(the SDK's documented route for raw requests): the body is built here from typed
settings, and the answer parsed as plain JSON. Same auth, base URL, timeouts and
error classes as ``chat.completions.create``, without its per-request parameter
transform and response model, which cost ~0.8 ms of client CPU per request
(profiled; it caps throughput at high concurrency). The API key is handed to the
SDK only; it is never logged, stored or put in an exception message.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any

import httpx
import openai

from extractors.cache import CachedAnswer, ResponseCache, cache_key
from extractors.config import ExtractSettings
from extractors.prompts import Message, PromptTemplate

log = logging.getLogger(__name__)

FATAL_STATUS = frozenset({401, 403, 404})
RETRY_STATUS = frozenset({408, 409, 429})


class ExtractionStopped(Exception):
    """No new requests may be sent (budget spent, or the endpoint refuses us); done work is kept."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class RequestFailed(Exception):
    """One request failed for good (attempts exhausted, or a non-retryable error)."""


@dataclass
class Stats:
    """Counters of one run; summed over partitions for the summary artifact."""

    requests: int = 0  # HTTP requests sent
    cache_hits: int = 0
    answers: int = 0  # answers received from the endpoint (not the cache)
    retries: Counter[str] = field(
        default_factory=Counter
    )  # by kind: rate_limited, server_error, timeout, ...
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    rejects: Counter[str] = field(default_factory=Counter)  # violation codes of rejected answers
    reasks: int = 0
    recovered_json: int = 0  # answers whose JSON object was found inside fences or prose
    format_fallbacks: int = 0
    stopped: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "cache_hits": self.cache_hits,
            "answers": self.answers,
            "retries": dict(sorted(self.retries.items())),
            "retries_total": sum(self.retries.values()),
            "tokens_in": self.tokens_in,
            "tokens_out": self.tokens_out,
            "cost_usd": round(self.cost_usd, 6),
            "rejects": dict(sorted(self.rejects.items())),
            "reasks": self.reasks,
            "recovered_json": self.recovered_json,
            "format_fallbacks": self.format_fallbacks,
            "stopped": self.stopped,
        }


@dataclass
class Budget:
    """Spend so far plus reservations of requests in flight, against optional USD / token caps."""

    limit_usd: float | None = None
    limit_tokens: int | None = None
    usd_per_token_in: float = 0.0
    usd_per_token_out: float = 0.0
    spent_usd: float = 0.0
    spent_tokens: int = 0
    reserved_usd: float = 0.0
    reserved_tokens: int = 0

    @classmethod
    def from_settings(cls, s: ExtractSettings, *, spent_usd: float = 0.0, spent_tokens: int = 0) -> Budget:
        return cls(
            s.budget_usd,
            s.budget_tokens,
            s.price_input_per_mtok / 1e6,
            s.price_output_per_mtok / 1e6,
            spent_usd,
            spent_tokens,
        )

    def cost(self, tokens_in: int, tokens_out: int) -> float:
        return tokens_in * self.usd_per_token_in + tokens_out * self.usd_per_token_out

    def reserve(self, tokens_in: int, tokens_out: int) -> bool:
        usd, tokens = self.cost(tokens_in, tokens_out), tokens_in + tokens_out
        if self.limit_usd is not None and self.spent_usd + self.reserved_usd + usd > self.limit_usd:
            return False
        if (
            self.limit_tokens is not None
            and self.spent_tokens + self.reserved_tokens + tokens > self.limit_tokens
        ):
            return False
        self.reserved_usd += usd
        self.reserved_tokens += tokens
        return True

    def release(self, tokens_in: int, tokens_out: int) -> None:
        self.reserved_usd -= self.cost(tokens_in, tokens_out)
        self.reserved_tokens -= tokens_in + tokens_out

    def spend(self, tokens_in: int, tokens_out: int) -> float:
        usd = self.cost(tokens_in, tokens_out)
        self.spent_usd += usd
        self.spent_tokens += tokens_in + tokens_out
        return usd


def estimate_prompt_tokens(messages: list[Message]) -> int:
    """Budget reservation estimate: ~3 characters per token plus a little per message."""
    return sum(len(m["content"]) for m in messages) // 3 + 4 * len(messages)


def retry_after_s(headers: Any) -> float | None:
    """Seconds asked for by ``retry-after-ms`` or ``retry-after`` (seconds or an HTTP date)."""
    if headers is None:
        return None
    if (ms := headers.get("retry-after-ms")) is not None:
        try:
            return max(0.0, float(ms) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        try:
            return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
        except (TypeError, ValueError):
            return None


@dataclass(frozen=True)
class Answer:
    text: str
    tokens_in: int
    tokens_out: int
    cached: bool
    key: str


class _Retry(Exception):
    def __init__(self, kind: str, wait_hint: float | None = None):
        super().__init__(kind)
        self.kind = kind
        self.wait_hint = wait_hint


class LLMClient:
    """Chat completions with our retry policy, cache, accounting and budget; use ``async with``."""

    def __init__(
        self,
        settings: ExtractSettings,
        *,
        cache: ResponseCache | None,
        stats: Stats | None = None,
        budget: Budget | None = None,
    ):
        self.settings = settings
        self.cache = cache if settings.cache else None
        self.stats = stats or Stats()
        self.budget = budget or Budget.from_settings(settings)
        self.mode = "json_object" if settings.structured_output == "json_object" else "json_schema"
        self._rng = random.Random(settings.jitter_seed)
        self._slots = asyncio.Semaphore(settings.concurrency)
        if not os.environ.get(settings.api_key_env):
            log.warning("%s is unset: sending a placeholder key (fine for local vLLM)", settings.api_key_env)
        # several small connection pools: httpcore scans its whole pool on every request
        self._shards = [self._sdk() for _ in range(settings.shards())]
        self._next_shard = itertools.cycle(range(len(self._shards)))

    def _sdk(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            api_key=self.settings.api_key(),
            base_url=self.settings.base_url,
            max_retries=0,
            timeout=self.settings.request_timeout_s,
        )

    async def __aenter__(self) -> LLMClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        for sdk in self._shards:
            await sdk.close()
        if self.cache is not None:
            self.cache.close()

    def stop(self, reason: str) -> None:
        if self.stats.stopped is None:
            log.warning("extraction stops sending requests: %s", reason)
            self.stats.stopped = reason

    # --- the one public call ---------------------------------------------------------------

    async def complete(self, template: PromptTemplate, messages: list[Message]) -> Answer:
        """One answer for ``messages``: from the cache, or from the endpoint within the budget."""
        key = cache_key(self.settings.request_params(), template.hash, messages, template.name)
        if self.cache is not None and (hit := self.cache.get(key)) is not None:
            self.stats.cache_hits += 1
            return Answer(hit.text, hit.tokens_in, hit.tokens_out, True, key)
        if self.stats.stopped:
            raise ExtractionStopped(self.stats.stopped)
        est_in, est_out = estimate_prompt_tokens(messages), self.settings.max_tokens
        if not self.budget.reserve(est_in, est_out):
            self.stop("budget")
            raise ExtractionStopped("budget")
        try:
            text, tokens_in, tokens_out = await self._with_retries(template, messages)
        finally:
            self.budget.release(est_in, est_out)
        usd = self._account(tokens_in, tokens_out)
        if self.cache is not None:  # persisted before it is used
            self.cache.put(key, CachedAnswer(text, tokens_in, tokens_out, self.settings.model, usd))
        return Answer(text, tokens_in, tokens_out, False, key)

    def _account(self, tokens_in: int, tokens_out: int) -> float:
        """Count one answer from the endpoint; returns what it cost."""
        self.stats.answers += 1
        self.stats.tokens_in += tokens_in
        self.stats.tokens_out += tokens_out
        usd = self.budget.spend(tokens_in, tokens_out)
        self.stats.cost_usd += usd
        return usd

    # --- retries -------------------------------------------------------------------------

    async def _with_retries(self, template: PromptTemplate, messages: list[Message]) -> tuple[str, int, int]:
        attempt = 0
        while True:
            attempt += 1
            try:
                return await self._send(template, messages)
            except _Retry as retry:
                if retry.kind == "format_fallback":
                    attempt -= 1  # the server told us what it supports; not a failed attempt
                    continue
                if attempt >= self.settings.max_attempts:
                    raise RequestFailed(f"{retry.kind} on all {attempt} attempts") from None
                if self.stats.stopped and self.stats.stopped != "budget":
                    raise ExtractionStopped(self.stats.stopped) from None  # refused meanwhile
                wait = self.backoff(attempt, retry.wait_hint)
                self.stats.retries[retry.kind] += 1
                log.info(
                    "retrying after %s in %.2fs (attempt %d/%d)",
                    retry.kind,
                    wait,
                    attempt,
                    self.settings.max_attempts,
                )
                await asyncio.sleep(wait)

    def backoff(self, attempt: int, retry_after: float | None) -> float:
        """Exponential backoff with equal jitter; never shorter than the server's Retry-After."""
        ceiling = min(self.settings.backoff_max_s, self.settings.backoff_base_s * 2 ** (attempt - 1))
        wait = ceiling / 2 + self._rng.uniform(0, ceiling / 2)
        if retry_after is not None:
            wait = max(wait, min(retry_after, self.settings.retry_after_max_s))
        return wait

    async def _send(self, template: PromptTemplate, messages: list[Message]) -> tuple[str, int, int]:
        sdk = self._shards[next(self._next_shard)]
        try:
            async with self._slots:
                self.stats.requests += 1
                response = await sdk.post(
                    "/chat/completions",
                    body=self._body(template, messages),
                    cast_to=httpx.Response,  # the raw response: we parse the JSON ourselves
                    options={"timeout": self.settings.request_timeout_s},
                )
                body = response.content
        except openai.APITimeoutError:
            raise _Retry("timeout") from None
        except openai.APIConnectionError:
            raise _Retry("connection") from None
        except openai.APIStatusError as exc:
            raise self._status_error(exc) from None
        return self._read(body, messages)

    def _status_error(self, exc: openai.APIStatusError) -> Exception:
        status = exc.status_code
        if status in (400, 422) and self._format_refused(exc):
            self.mode = "json_object"
            self.stats.format_fallbacks += 1
            log.warning("endpoint refuses json_schema output (HTTP %d); using JSON mode", status)
            return _Retry("format_fallback")
        if status in FATAL_STATUS:
            self.stop(f"http_{status}")
            return ExtractionStopped(f"http_{status}")
        if status in RETRY_STATUS or status >= 500:
            return _Retry(
                "rate_limited" if status == 429 else "server_error", retry_after_s(exc.response.headers)
            )
        return RequestFailed(f"HTTP {status}")

    def _format_refused(self, exc: openai.APIStatusError) -> bool:
        message = str(exc).lower()
        return (
            self.mode == "json_schema"
            and self.settings.structured_output == "auto"
            and ("response_format" in message or "json_schema" in message)
        )

    def _body(self, template: PromptTemplate, messages: list[Message]) -> dict[str, Any]:
        if self.mode == "json_schema":
            fmt: dict[str, Any] = {
                "type": "json_schema",
                "json_schema": {"name": template.name, "schema": template.schema, "strict": True},
            }
        else:
            fmt = {"type": "json_object"}
        body: dict[str, Any] = {
            "model": self.settings.model,
            "messages": messages,
            "temperature": self.settings.temperature,
            "response_format": fmt,
            self.settings.max_tokens_param: self.settings.max_tokens,
        }
        if self.settings.seed is not None:
            body["seed"] = self.settings.seed
        return body

    def _read(self, body: bytes, messages: list[Message]) -> tuple[str, int, int]:
        try:
            data = json.loads(body)
            text = data["choices"][0]["message"].get("content") or ""
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            raise _Retry("bad_body") from None  # a proxy's HTML page, a truncated body: try again
        usage = data.get("usage") or {}
        tokens_in = int(usage.get("prompt_tokens") or estimate_prompt_tokens(messages))
        tokens_out = int(usage.get("completion_tokens") or len(text) // 3 + 1)
        return text, tokens_in, tokens_out
