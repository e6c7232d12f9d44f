"""Fixtures for the extraction tests: a local OpenAI-compatible server and a tiny lake."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from extractors.config import ExtractSettings
from extractors.fakeserver import FakeOpenAIServer
from tests.extractors.tinylake import TinyLake, write_tiny_lake


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    """A real HTTP server on 127.0.0.1 (ephemeral port), scriptable per test."""
    with FakeOpenAIServer() as srv:
        yield srv


@pytest.fixture
def lake(tmp_path: Path) -> TinyLake:
    return write_tiny_lake(tmp_path / "lake")


def fast_settings(server: FakeOpenAIServer, **overrides: object) -> ExtractSettings:
    """Short timeouts and backoffs so fault tests take fractions of a second."""
    values: dict[str, object] = {
        "backend": "openai",
        "base_url": server.base_url,
        "model": "fake-model",
        "request_timeout_s": 0.3,
        "backoff_base_s": 0.02,
        "backoff_max_s": 0.1,
        "max_attempts": 4,
        "jitter_seed": 0,
        "concurrency": 4,
        "progress": False,
    }
    values.update(overrides)
    return ExtractSettings(**values)
