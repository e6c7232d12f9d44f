"""The ``openai:MODEL@BASE_URL`` simulator: any OpenAI-compatible endpoint (a vLLM server, a hosted API).

A batch of prompts is sent concurrently, at most ``concurrency`` requests in flight, through the
extraction stage's client (``extractors.client.LLMClient``): the same timeouts, retries with backoff
on 429/5xx/timeouts/dropped connections, and key handling (the key is read from the environment
variable named by ``api_key_env`` and handed to the SDK only; it is never printed, logged or written
to a trace or manifest). A request that fails for good becomes a ``NoAnswer``: that episode ends
truncated with reason ``error`` and the others go on.

No ``response_format`` is sent: the evaluation measures whether the model itself answers in the
protocol's format (L0), which constrained decoding would hide. The client runs on an event loop of
its own thread, so its connections are kept from one batch to the next.

The traffic settings (concurrency, timeouts, attempts, backoff) may be set by ``TRAJFORGE_OPENAI_*``
environment variables (``TRAJFORGE_OPENAI_MAX_ATTEMPTS=3``); the model, base URL and sampling come
from the spec and the command's sampling only. :meth:`OpenAISimulatorSettings.probe` sends one request
before a run, so a wrong URL stops it before any trace is written, and :meth:`OpenAISimulator.traffic`
counts HTTP requests, retries and errors by status for the report's L0 accounting.

The request carries temperature, top-p and a seed of its own, derived from (the simulator's seed, the
prompt's session and step), so an answer does not depend on the requests sent before it; whether
they are honoured is the server's affair.
vLLM samples whenever the temperature is above 0; ``transformers serve`` samples only when the served
folder's ``generation_config.json`` says ``do_sample`` (the trainer's checkpoints do), and otherwise
answers greedily whatever the temperature.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Coroutine, Sequence
from contextvars import ContextVar
from typing import Any, TypeVar

import httpx
import openai
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from evaluation.simulators import Key, Messages, NoAnswer, Sampling, derived_seed, keys_or_positions
from extractors.client import ExtractionStopped, LLMClient, RequestFailed
from extractors.config import ExtractSettings
from extractors.prompts import PromptTemplate

# the client names its requests after a template; the simulator's prompts are rendered by the environment
T = TypeVar("T")
SIMULATOR_TEMPLATE = PromptTemplate(name="simulator", version="protocol-2", system="", user="", schema={})
#: the seed of the request being sent: each answer runs as a task of its own, with its own value
REQUEST_SEED: ContextVar[int | None] = ContextVar("request_seed", default=None)
PROBE_TIMEOUT_S = 10.0  # a reachable endpoint lists its models at once; no answer by then is a problem
TRANSPORT_FAULTS = ("timeout", "connection", "bad_body")  # the client's retry kinds with no HTTP status


class OpenAISimulatorSettings(BaseSettings):
    """Sampling (PROTOCOL.md §3) and traffic of the ``openai:`` simulator."""

    model_config = SettingsConfigDict(env_prefix="TRAJFORGE_OPENAI_", extra="forbid")

    model: str
    base_url: str
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(0.95, gt=0.0, le=1.0)
    max_tokens: int = Field(512, ge=1, description="new tokens per answer")
    seed: int | None = Field(42, description="sampling seed sent with every request")
    concurrency: int = Field(64, ge=1, le=4096, description="requests in flight at once")
    request_timeout_s: float = Field(120.0, gt=0)
    max_attempts: int = Field(6, ge=1, description="HTTP attempts per request")
    backoff_base_s: float = Field(1.0, ge=0)
    backoff_max_s: float = Field(60.0, ge=0)
    api_key_env: str = Field("OPENAI_API_KEY", description="name of the environment variable holding the key")

    @classmethod
    def from_spec(
        cls, argument: str, sampling: Sampling | None = None, **traffic: Any
    ) -> OpenAISimulatorSettings:
        model, at, base_url = argument.partition("@")
        if not (model and at and base_url):
            raise ValueError(f"openai:MODEL@BASE_URL needs a model and a base URL, not {argument!r}")
        s = sampling or Sampling()
        return cls(
            model=model,
            base_url=base_url,
            temperature=s.temperature,
            top_p=s.top_p,
            max_tokens=s.max_new_tokens,
            seed=s.seed,
            **traffic,
        )

    def client_settings(self) -> ExtractSettings:
        return ExtractSettings(
            backend="openai",
            base_url=self.base_url,
            model=self.model,
            api_key_env=self.api_key_env,
            temperature=self.temperature,
            max_tokens=self.max_tokens,
            seed=self.seed,
            concurrency=self.concurrency,
            request_timeout_s=self.request_timeout_s,
            max_attempts=self.max_attempts,
            backoff_base_s=self.backoff_base_s,
            backoff_max_s=self.backoff_max_s,
            cache=False,
            progress=False,
        )

    def sampling(self) -> dict[str, Any]:
        """What decides an answer, for the run manifest (the key's variable name, never the key)."""
        return self.model_dump(include={"model", "base_url", "temperature", "top_p", "max_tokens", "seed"})

    def probe(self) -> str | None:
        """One request to the endpoint before a run: ``GET {base}/models``, or where a server has no
        such route (404/405), one chat completion with this sampling. Returns what is wrong, in a few
        words, or None when the endpoint answered."""
        url = httpx.URL(self.base_url)
        if url.scheme not in ("http", "https") or not url.host:
            return f"the base URL {self.base_url!r} is not an http:// or https:// URL"
        headers = {"Authorization": f"Bearer {self.client_settings().api_key()}"}
        base = self.base_url.rstrip("/")
        try:
            with httpx.Client(timeout=min(self.request_timeout_s, PROBE_TIMEOUT_S), headers=headers) as http:
                answer = http.get(f"{base}/models")
                if answer.status_code in (404, 405):
                    answer = http.post(f"{base}/chat/completions", json=self.probe_body())
        except httpx.TimeoutException:
            return f"{base} did not answer within {min(self.request_timeout_s, PROBE_TIMEOUT_S):g} s"
        except httpx.HTTPError as error:
            return f"cannot reach {base} ({type(error).__name__}: {error})"
        if answer.status_code in (401, 403):
            return f"{answer.request.url} refuses the key in ${self.api_key_env} (HTTP {answer.status_code})"
        if answer.is_error:
            return f"{answer.request.url} answered HTTP {answer.status_code}"
        return None

    def probe_body(self) -> dict[str, Any]:
        """A chat request with the run's own sampling, so a probe asks nothing a run would not."""
        return {
            "model": self.model,
            "messages": [{"role": "user", "content": "ping"}],
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_tokens": self.max_tokens,
            **({"seed": self.seed} if self.seed is not None else {}),
        }


class SimulatorClient(LLMClient):
    """The extraction client sending the simulator's sampling (top-p, and no response format), counting
    every failed attempt: by HTTP status, or by kind where there was none (timeout, dropped connection,
    a body that is not a completion)."""

    def __init__(self, settings: ExtractSettings, top_p: float) -> None:
        super().__init__(settings, cache=None)
        self.top_p = top_p
        self.http_errors: Counter[str] = Counter()
        self.transport_errors: Counter[str] = Counter()

    def _body(self, template: PromptTemplate, messages: list[Any]) -> dict[str, Any]:
        body = super()._body(template, messages)
        body.pop("response_format")
        if (seed := REQUEST_SEED.get()) is not None:
            body["seed"] = seed
        return body | {"top_p": self.top_p}

    def _status_error(self, exc: openai.APIStatusError) -> Exception:
        self.http_errors[str(exc.status_code)] += 1
        return super()._status_error(exc)

    async def _send(self, template: PromptTemplate, messages: list[Any]) -> tuple[str, int, int]:
        try:
            return await super()._send(template, messages)
        except Exception as fault:
            if (kind := getattr(fault, "kind", None)) in TRANSPORT_FAULTS:
                self.transport_errors[kind] += 1
            raise


class OpenAISimulator:
    """Prompts answered by an OpenAI-compatible endpoint, a batch at a time, concurrently."""

    def __init__(self, settings: OpenAISimulatorSettings) -> None:
        self.settings = settings
        self.parameters = {"spec": f"openai:{settings.model}@{settings.base_url}", **settings.sampling()}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="openai-simulator", daemon=True)
        self._thread.start()
        self.client = self.run(self._client())

    @classmethod
    def from_spec(cls, argument: str, sampling: Sampling | None = None, **traffic: Any) -> OpenAISimulator:
        return cls(OpenAISimulatorSettings.from_spec(argument, sampling, **traffic))

    async def _client(self) -> SimulatorClient:
        return SimulatorClient(self.settings.client_settings(), self.settings.top_p)

    @property
    def concurrency(self) -> int:
        return self.settings.concurrency

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the client's event loop (its own thread) and return its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    @property
    def stats(self) -> dict[str, Any]:
        """Requests, retries by kind and tokens so far (the extraction client's counters)."""
        return self.client.stats.as_dict()

    def traffic(self) -> dict[str, Any]:
        """HTTP requests sent so far (retries included), retries by kind, failed attempts by HTTP status
        and by transport fault: the counts the report's L0 accounting adds up per phase."""
        stats = self.client.stats
        return {
            "http_requests": stats.requests,
            "retries": dict(stats.retries),
            "http_errors": dict(self.client.http_errors),
            "transport_errors": dict(self.client.transport_errors),
        }

    def act(self, prompts: Sequence[Messages], keys: Sequence[Key] | None = None) -> list[str | NoAnswer]:
        return self.run(self._answers(prompts, keys_or_positions(keys, len(prompts))))

    async def _answers(self, prompts: Sequence[Messages], keys: Sequence[Key]) -> list[str | NoAnswer]:
        asked = (self.answer(messages, key) for messages, key in zip(prompts, keys, strict=True))
        return list(await asyncio.gather(*asked))

    def request_seed(self, key: Key) -> int | None:
        """The seed sent with the prompt keyed ``key`` (31 bits, which every server takes), none when
        the simulator has no seed."""
        if self.settings.seed is None:
            return None
        return derived_seed(self.settings.seed, *key, bits=31)

    async def answer(self, messages: Messages, key: Key | None = None) -> str | NoAnswer:
        """One answer (waits for a free slot of the concurrency limit), sampled with the seed of
        ``key`` (without one, with the simulator's seed)."""
        REQUEST_SEED.set(self.settings.seed if key is None else self.request_seed(key))
        try:
            return (await self.client.complete(SIMULATOR_TEMPLATE, list(messages))).text
        except (RequestFailed, ExtractionStopped) as error:
            return NoAnswer(f"{type(error).__name__}: {error}")

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self.run(self.client.aclose())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def __enter__(self) -> OpenAISimulator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
