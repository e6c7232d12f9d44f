"""Typed configuration of the extraction stage (one settings model, written into every run summary).

Values come from CLI flags, a TOML ``[extract]`` table, or ``TRAJFORGE_EXTRACT_*``
environment variables. The API key itself is never a setting: only the *name*
of the environment variable that holds it is, so settings can be logged,
hashed and stored in run manifests safely.
"""

from __future__ import annotations

import math
import os
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

Backend = Literal["heuristic", "openai"]
StructuredOutput = Literal["auto", "json_schema", "json_object"]


class ExtractSettings(BaseSettings):
    """How intents and rationales are extracted."""

    model_config = SettingsConfigDict(env_prefix="TRAJFORGE_EXTRACT_", extra="forbid")

    backend: Backend = Field("heuristic", description="heuristic (offline rules, the default) | openai")
    # --- the endpoint ----------------------------------------------------
    base_url: str = Field("http://127.0.0.1:8000/v1", description="OpenAI-compatible base URL (vLLM default)")
    model: str = Field("Qwen/Qwen3.5-397B-A17B", description="model name the endpoint serves")
    api_key_env: str = Field("OPENAI_API_KEY", description="name of the environment variable holding the key")
    temperature: float = Field(0.2, ge=0.0, le=2.0)
    max_tokens: int = Field(512, ge=16, description="completion token cap per request")
    max_tokens_param: Literal["max_tokens", "max_completion_tokens"] = "max_tokens"
    seed: int | None = Field(42, description="sampling seed sent to the endpoint (part of the cache key)")
    structured_output: StructuredOutput = Field(
        "auto", description="json_schema, json_object, or auto (json_schema, falling back to JSON mode)"
    )
    # --- traffic ---------------------------------------------------------
    concurrency: int = Field(16, ge=1, le=4096, description="requests in flight at once")
    pool_shards: int = Field(0, ge=0, description="HTTP connection pools (0 = one per 8 concurrent requests)")
    request_timeout_s: float = Field(120.0, gt=0, description="per-request timeout")
    max_attempts: int = Field(6, ge=1, description="HTTP attempts per request (429/5xx/timeout/drop retried)")
    backoff_base_s: float = Field(
        1.0, ge=0, description="first retry delay before jitter; doubles per attempt"
    )
    backoff_max_s: float = Field(60.0, ge=0)
    retry_after_max_s: float = Field(300.0, ge=0, description="longest Retry-After honoured")
    jitter_seed: int | None = Field(None, description="fixes the backoff jitter (tests)")
    # --- money -----------------------------------------------------------
    budget_usd: float | None = Field(None, ge=0, description="stop sending once this much is spent/reserved")
    budget_tokens: int | None = Field(None, ge=0, description="same, in prompt + completion tokens")
    price_input_per_mtok: float = Field(0.0, ge=0, description="USD per million prompt tokens")
    price_output_per_mtok: float = Field(0.0, ge=0, description="USD per million completion tokens")
    # --- content checks --------------------------------------------------
    max_reasks: int = Field(2, ge=0, description="re-asks after a rejected answer (then quarantine)")
    rationale_max_words: int = Field(40, ge=5)
    cache: bool = Field(True, description="content-addressed response cache under LAKE/_cache/extract")
    progress: bool = Field(True, description="show a progress bar on stderr")

    def shards(self) -> int:
        return self.pool_shards or max(1, math.ceil(self.concurrency / 8))

    def api_key(self) -> str:
        """The key from the named environment variable ("EMPTY" for local servers that need none)."""
        return os.environ.get(self.api_key_env) or "EMPTY"

    def request_params(self) -> dict[str, object]:
        """Sampling parameters that change an answer: part of every cache key."""
        return {
            "model": self.model,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            "seed": self.seed,
            "structured_output": self.structured_output,
        }
