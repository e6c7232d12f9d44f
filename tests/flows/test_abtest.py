"""``trajforge abtest``: two policies on a 150-shopper generated world (its train split: ~128 users, enough
for two arms whose intervals mean something)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from flows.abtest import COUNTS_SCHEMA, abtest_flow, bootstrap_delta, split_by_hash
from tests.flows.generated_lakes import generated_lake


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> Path:
    return generated_lake(tmp_path_factory.mktemp("abtest"), users=150, seed=5)


def test_users_are_split_in_halves_by_hash():
    a, b = split_by_hash([f"u{k}" for k in range(7)], seed=1)
    assert (len(a), len(b)) == (4, 3) and not set(a) & set(b)
    assert split_by_hash([f"u{k}" for k in range(7)], seed=1) == (a, b)


def test_the_bootstrap_delta_of_two_arms():
    arm = lambda clicks: pl.DataFrame(  # noqa: E731
        {"user_id": ["x", "y"], "views": [2, 2], "clicks": clicks, "carts": [0, 0], "buys": [0, 0],
         "steps": [4, 4]}, schema=COUNTS_SCHEMA)  # fmt: skip
    delta = bootstrap_delta(arm([1, 1]), arm([2, 2]), resamples=200)
    # PV-CTR 2/4 vs 4/4: Δ 0.5, and every resample of identical users gives the same 0.5
    assert delta["PV-CTR"] == {"mean": 0.5, "lo": 0.5, "hi": 0.5}
    assert delta["session_length"]["mean"] == 0.0


def test_abtest_with_the_worlds_shoppers_reproduces_the_worlds_own_effect(prefect_harness, lake, tmp_path):
    # the train split: a small world holds out too few users for two arms
    out = tmp_path / "ab"
    abtest_flow(str(lake), "baseline", "treatment", "world", str(out), split="train", resamples=1_000)
    report = json.loads((out / "report.json").read_text())
    assert min(arm["users"] for arm in report["arms"].values()) >= 20
    # the world's A/B effect (PROTOCOL.md §4: Δ PV-CTR) from its own state machine on the served pages
    # lies inside the interval of the same shoppers acting in the environment (detail pages there have
    # the environment's geometry, not the world's, so individual visits may differ)
    delta, true = report["delta"]["PV-CTR"], report["true_delta"]["PV-CTR"]
    assert delta["lo"] <= true <= delta["hi"]
    assert report["delta"]["PV-CTR"]["mean"] == pytest.approx(true, abs=0.1)
    assert "<table>" in (out / "report.html").read_text()


def test_two_identical_policies_give_a_delta_interval_covering_zero(prefect_harness, lake, tmp_path):
    # the arms differ only in their users, which the bootstrap over users resamples
    out = tmp_path / "same"
    abtest_flow(str(lake), "popularity", "popularity", "world", str(out), split="train", resamples=1_000)
    report = json.loads((out / "report.json").read_text())
    for metric, delta in report["delta"].items():
        assert delta["lo"] <= 0 <= delta["hi"], metric


def test_the_cli_runs_an_abtest_with_a_team_policy(lake, tmp_path):
    env = os.environ | {"PYTHONPATH": os.getcwd(), "PREFECT_HOME": str(tmp_path / ".prefect")}
    out = tmp_path / "cli"
    args = ["--lake", str(lake), "--policy-a", "popularity", "--policy-b",
            "tests.evaluation.test_policies:cheapest_first", "--simulator", "world", "--out", str(out),
            "--users", "10", "--split", "train"]  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "cli", "abtest", *args], env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["arms"]["a"]["users"] + report["arms"]["b"]["users"] == 10
    bad = subprocess.run([sys.executable, "-m", "cli", "abtest", *args[:3], "nope", *args[4:]], env=env,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert bad.returncode == 1 and "unknown policy 'nope'" in bad.stderr
    assert "Traceback" not in bad.stderr and "temporary server" not in bad.stderr  # refused before any work
