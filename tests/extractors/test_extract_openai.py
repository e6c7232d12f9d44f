"""The openai backend end to end over real HTTP: every fault kind in one run, cache, budget, key secrecy."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import polars as pl
import pytest

from extractors.cache import CACHE_DIR, ResponseCache
from extractors.fakeserver import default_responder, drop, malformed, reply, slow, status
from extractors.pipeline import extract_lake
from flows.extract import spend_line
from tests.extractors.conftest import fast_settings
from tests.extractors.tinylake import SESSION
from transforms.lake import read_lake_table

LEAKY_INTENT = json.dumps(
    {"anchors": [{"type": "preference", "text": "bought the Solvia boots for 89", "confidence": 0.9}]}
)
LEAKY_RATIONALE = json.dumps(
    {"rationale": "The Zenlia satin dress further down looks nicer, so I'll read reviews."}
)
ENTER_COMMENT = f"{SESSION['sA']}:3"  # sA step 3, where Zenlia (first in view at step 6) is not seen yet


def script_faults(server) -> None:
    """One fault kind per job, addressed by a marker only that job's requests contain."""
    server.enqueue_for(
        "## Session 2 (", reply(LEAKY_INTENT)
    )  # only user B's cross-mode intent has 2 sessions
    server.enqueue_for("## Session 1 (8 actions)", malformed())  # user A's single-session intent
    server.enqueue_for('"type":"click","target":"Lumora', status(429, retry_after=0.2))
    server.enqueue_for('"type":"ipv_buy"', status(500))
    server.enqueue_for('"type":"ipv_click_param"', slow(1.0))
    server.enqueue_for('"type":"ipv_swipe_pic"', drop())
    server.enqueue_for('"type":"ipv_enter_comment"', *[reply(LEAKY_RATIONALE)] * 3)


def test_every_fault_kind_end_to_end(server, lake):
    script_faults(server)
    summary = extract_lake(lake.path, fast_settings(server, max_reasks=2))

    # 23 jobs (4 intents + 19 rationales) ask once each; on top: 1 re-ask after the leaky intent,
    # 1 after the malformed one, 1 retry each for 429 / 500 / timeout / drop, 2 re-asks of the leaky
    # rationale (3 answers, max_reasks=2) -> 23 + 1 + 1 + 4 + 2 = 31 requests, all consumed.
    assert len(server.chat_requests()) == summary["requests"] == 31 and server.pending() == 0
    assert summary["retries"] == {"connection": 1, "rate_limited": 1, "server_error": 1, "timeout": 1}
    assert summary["reasks"] == 4
    assert summary["rejects"] == {
        "future_item": 3,
        "invalid_json": 1,
        "outcome_word": 1,
        "price": 1,
        "title_fragment": 1,
    }
    assert summary["counts"] == {
        "intents": {"jobs": 4, "ok": 4, "quarantined": 0, "pending": 0},
        "rationales": {"jobs": 19, "ok": 18, "quarantined": 1, "pending": 0},
    }
    assert summary["balanced"] and summary["quarantine_by_reason"] == {"rationales:leakage": 1}

    # the re-ask lists the violations to the model
    reask = server.chat_requests("## Session 2 (")[1].body["messages"]
    assert (
        reask[-2] == {"role": "assistant", "content": LEAKY_INTENT}
        and "outcome_word: 'bought'" in reask[-1]["content"]
    )

    intents = read_lake_table(lake.path, "intents")
    assert intents.height == 4 and intents.select("mode", "trajectory_id").is_unique().all()
    cross = intents.filter(pl.col("mode") == "cross").row(0, named=True)
    assert cross["leakage_verdict"] == "clean" and cross["attempts"] == 2  # clean after one re-ask
    assert cross["violations"] == ["outcome_word", "price", "title_fragment"]
    single_a = intents.filter(pl.col("trajectory_id") == SESSION["sA"]).row(0, named=True)
    assert single_a["violations"] == ["invalid_json"] and single_a["attempts"] == 2

    # nothing lost, nothing duplicated: each of the 19 actions is either a rationale or quarantined
    rationales = read_lake_table(lake.path, "rationales")
    quarantine = read_lake_table(lake.path, "quarantine").filter(pl.col("stage") == "extract")
    quarantined = [json.loads(p)["record_id"] for p in quarantine["payload"]]
    assert rationales["record_id"].is_unique().all() and quarantined == [ENTER_COMMENT]
    assert set(rationales["record_id"]) | set(quarantined) == set(
        read_lake_table(lake.path, "records")["record_id"]
    )
    assert not set(rationales["record_id"]) & set(quarantined)
    assert json.loads(quarantine["detail"][0])[0]["code"] == "future_item"

    # the records have one writer, the records stage: extraction leaves them as they were
    assert read_lake_table(lake.path, "records")["response"].is_null().all()


def test_second_run_sends_zero_requests(server, lake):
    script_faults(server)
    first = extract_lake(lake.path, fast_settings(server, max_reasks=2))
    before = read_lake_table(lake.path, "rationales").select("record_id", "rationale")
    sent = len(server.chat_requests())
    second = extract_lake(lake.path, fast_settings(server, max_reasks=2))
    # every answer of the first run (23 first answers + 4 re-asks = 27) is in the cache;
    # the checker is deterministic, so the re-asks are the same messages: 27 hits, 0 requests
    assert len(server.chat_requests()) == sent and second["requests"] == 0 and second["cache_hits"] == 27
    assert second["counts"] == first["counts"]
    assert read_lake_table(lake.path, "rationales").select("record_id", "rationale").equals(before)
    assert read_lake_table(lake.path, "rationales")["cached"].all()


def fixed_length(text_key: str, length: int) -> str:
    """A valid answer of exactly ``length`` characters (padding inside the string is stripped by pydantic)."""
    if text_key == "anchors":
        base = {"anchors": [{"type": "preference", "text": "drawn to calm colours", "confidence": 0.5}]}
        pad = length - len(json.dumps(base))
        base["anchors"][0]["text"] += " " * pad
    else:
        base = {"rationale": "This suits what I want."}
        base["rationale"] += " " * (length - len(json.dumps(base)))
    return json.dumps(base)


def test_budget_cap_stops_cleanly_then_resumes(server, lake):
    intent, rationale = fixed_length("anchors", 100), fixed_length("rationale", 100)
    assert len(intent) == len(rationale) == 100  # the server bills 100 // 4 + 1 = 26 completion tokens each
    server.responder = lambda body: (
        intent if body["response_format"]["json_schema"]["name"] == "intent" else rationale
    )
    # $1 per completion token, max_tokens 100 -> each request reserves $100; prompts are free.
    # Request k (0-based, concurrency 1) is sent iff 26 k + 100 <= 350, i.e. k <= 9: 10 requests.
    # Bucket 0 takes 9 (its intent, then its 8 rationales); bucket 1 gets 1 of its 3 intents; the rest wait.
    capped = fast_settings(server, concurrency=1, max_tokens=100, price_output_per_mtok=1e6, budget_usd=350.0)
    summary = extract_lake(lake.path, capped)
    assert (
        len(server.chat_requests()) == 10 and summary["stopped"] == "budget" and summary["cost_usd"] == 260.0
    )
    assert summary["counts"] == {
        "intents": {"jobs": 4, "ok": 2, "quarantined": 0, "pending": 2},
        "rationales": {"jobs": 19, "ok": 8, "quarantined": 0, "pending": 11},
    }
    # all that is done is kept: in the tables and in the cache; pending is not quarantine
    assert (
        read_lake_table(lake.path, "rationales").height == 8 and len(ResponseCache.in_lake(lake.path)) == 10
    )
    assert read_lake_table(lake.path, "quarantine").filter(pl.col("stage") == "extract").height == 0

    assert summary["budget_usd"] == 350.0 and summary["lake_cost_usd"] == 260.0  # the lake's first spend

    raised = fast_settings(
        server, concurrency=1, max_tokens=100, price_output_per_mtok=1e6, budget_usd=1000.0
    )
    resumed = extract_lake(lake.path, raised)
    # resume: the 10 paid answers come from the cache; only the 13 pending jobs are sent
    assert len(server.chat_requests()) == 23 and resumed["cache_hits"] == 10 and resumed["requests"] == 13
    assert resumed["counts"]["rationales"]["ok"] == 19 and resumed["stopped"] is None
    assert read_lake_table(lake.path, "rationales")["record_id"].is_unique().all()
    # this run paid 13 x 26 = $338; the lake in all 260 + 338 = $598, also read back from disk alone
    assert resumed["cost_usd"] == 338.0 and resumed["lake_cost_usd"] == 598.0
    assert ResponseCache(Path(lake.path) / CACHE_DIR).spent_usd == 598.0
    assert spend_line(resumed) == (
        "cost $338.0000 this run (budget $1000.00); $598.0000 for this lake in all "
        "(every answer in its response cache)"
    )


def test_api_key_never_logged_or_written(server, lake, caplog, capsys, monkeypatch):
    secret = "sk-test-" + os.urandom(12).hex()
    monkeypatch.setenv("TRAJFORGE_TEST_SECRET", secret)
    caplog.set_level(logging.DEBUG)  # every logger, the SDK's and the HTTP stack's included
    script_faults(server)
    summary = extract_lake(
        lake.path, fast_settings(server, api_key_env="TRAJFORGE_TEST_SECRET", max_reasks=2)
    )
    server.reset()
    server.enqueue(status(401, message="invalid key"))  # the stop path logs too
    extract_lake(lake.path, fast_settings(server, api_key_env="TRAJFORGE_TEST_SECRET", cache=False))

    # the key was really used ...
    assert summary["requests"] == 31
    assert server.chat_requests()[0].headers["authorization"] == f"Bearer {secret}"
    # ... and appears in no log record, no console output, no file of the lake
    out = capsys.readouterr()
    assert caplog.records and secret not in caplog.text and secret not in out.out + out.err
    files = [p for p in Path(lake.path).rglob("*") if p.is_file()]
    assert files and not [p for p in files if secret.encode() in p.read_bytes()]


def test_default_responder_answers_are_clean(server, lake):
    # the fake server's own default answers pass every check: 23 jobs, 23 requests, all ok
    summary = extract_lake(lake.path, fast_settings(server))
    assert summary["requests"] == 23 and summary["rejects"] == {}
    assert summary["counts"]["rationales"]["ok"] == 19 and summary["counts"]["intents"]["ok"] == 4
    assert default_responder({"messages": [{"content": "x"}]})  # usable outside the server


@pytest.mark.parametrize("mode", ["json_object"])
def test_json_mode_configured(server, lake, mode):
    summary = extract_lake(lake.path, fast_settings(server, structured_output=mode))
    formats = {json.dumps(r.body["response_format"]) for r in server.chat_requests()}
    assert formats == {'{"type": "json_object"}'} and summary["counts"]["rationales"]["ok"] == 19
