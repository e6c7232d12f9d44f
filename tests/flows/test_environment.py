"""The environment ``flows`` sets on import reaches what reads it: here Polars' allocator."""

import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="Polars uses mimalloc on Windows")

# jemalloc prints its options at exit with ``stats_print``; appended after ``flows`` set its
# default, so the printed options are the ones the default (or the user's setting) produced
PROBE = """
import os
import flows
os.environ["_RJEM_MALLOC_CONF"] = ",".join(filter(None, [os.environ.get("_RJEM_MALLOC_CONF"), "stats_print:true"]))
import polars
polars.Series(range(1000)).sum()
"""


def _decay_ms(env: dict[str, str]) -> dict[str, int]:
    run = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    found = dict(re.findall(r"opt\.(dirty|muzzy)_decay_ms: (-?\d+)", run.stderr))
    assert found, f"jemalloc printed no options:\n{run.stderr[:2000]}"
    return {kind: int(ms) for kind, ms in found.items()}


def _env_without_allocator() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "_RJEM_MALLOC_CONF"}


def test_flows_sets_the_allocators_decay_before_polars_loads() -> None:
    assert _decay_ms(_env_without_allocator()) == {"dirty": 1000, "muzzy": 1000}


def test_a_users_allocator_setting_wins() -> None:
    env = _env_without_allocator() | {"_RJEM_MALLOC_CONF": "dirty_decay_ms:100"}
    assert _decay_ms(env)["dirty"] == 100
