"""Shared test setup: an isolated Prefect home and one ephemeral Prefect API per session."""

from __future__ import annotations

import os
import tempfile

_PREFECT_HOME = tempfile.mkdtemp(prefix="trajforge-prefect-")
os.environ.setdefault("PREFECT_HOME", _PREFECT_HOME)
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
os.environ.setdefault("PREFECT_LOGGING_TO_API_ENABLED", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def prefect_harness():
    """One ephemeral Prefect API for every flow test of the session (~12 s to start)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture(scope="session")
def smollm2_folder():
    """SmolLM2-135M-Instruct as a Hugging Face folder, converted once per machine and reused after."""
    from trainer.pretrained import ModelUnavailable, convert_smollm2

    try:
        return convert_smollm2()
    except ModelUnavailable as exc:  # scripts/setup.sh installs what it needs
        pytest.skip(str(exc))
