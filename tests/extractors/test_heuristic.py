"""The offline backend: rules from trajectory statistics, labelled as such, passing the same checker."""

from __future__ import annotations

import polars as pl

from extractors.config import ExtractSettings
from extractors.heuristic import MODEL, VERSION, heuristic_intent, heuristic_rationale, rules_hash, visits
from extractors.pipeline import extract_lake, intent_jobs, load_bucket, rationale_jobs
from tests.extractors.tinylake import SESSION, USER
from transforms.lake import read_lake_table, write_table

OFFLINE = ExtractSettings(progress=False)  # backend "heuristic" is the default


def bucket_jobs(lake, bucket):
    records, timelines = load_bucket(lake.path, bucket)
    return intent_jobs(records, timelines), rationale_jobs(records, timelines)


def test_visits_follow_the_protocol(lake):
    (job,), _ = bucket_jobs(lake, 0)
    (visit,) = visits(job.steps)
    # sA: click i01, swipe, enter comments, cart, back_home -> one visit, decided by the first of
    # return/cart/buy/end, which is the cart (step 4) before back_home (step 5)
    assert visit.decision == "cart" and dict(visit.info) == {"ipv_swipe_pic": 1, "ipv_enter_comment": 1}


def test_intent_from_statistics(lake):
    (job,), _ = bucket_jobs(lake, 0)
    anchors = {(a.type, a.text) for a in heuristic_intent(job.steps, job.items).anchors}
    assert anchors == {
        ("preference", "drawn to dresses"),  # the one visited item is a dress
        # visited median 129 / on-screen median of the six prices (45.5 59.9 75 89 99 129 -> 82) = 1.57 > 1.25
        ("preference", "comfortable with premium-priced options"),
        ("information_need", "relies on other shoppers' reviews before deciding"),  # 1 review action
        ("information_need", "looks closely at product photos"),  # 1 swipe
        ("concern", "holds off on a final commitment even when an option appeals"),  # cart, no buy
        ("comparison_criterion", "weighs a handful of alternatives side by side"),  # 2 feed moves / 1 visit
        ("conditional_tendency", "commits only after the details confirm the choice"),  # cart after info
    }


def test_rationale_mentions_only_the_past(lake):
    _, jobs = bucket_jobs(lake, 0)
    by_step = {j.step: j for j in jobs}
    # step 6 scrolls after a dress was opened at step 1: the rule recalls the category, nothing later
    assert heuristic_rationale(by_step[6]) == (
        "I'm still hoping for more dresses like the ones I liked, so I'll keep looking further down."
    )
    # step 4 carts after looking at pictures and reviews in the same visit
    assert (
        heuristic_rationale(by_step[4])
        == "The details check out and it suits me; I'll save it in my cart for now."
    )


def test_offline_run_fills_everything_and_labels_provenance(lake):
    summary = extract_lake(lake.path, OFFLINE)
    assert summary["counts"] == {
        "intents": {"jobs": 4, "ok": 4, "quarantined": 0, "pending": 0},
        "rationales": {"jobs": 19, "ok": 19, "quarantined": 0, "pending": 0},
    }
    assert summary["requests"] == 0 and summary["rejects"] == {} and summary["model"] == "rules"
    for name in ("intents", "rationales"):
        table = read_lake_table(lake.path, name)
        assert set(table["backend"]) == {"heuristic"} and set(table["model"]) == {MODEL}
        assert set(table["prompt_version"]) == {VERSION} and set(table["prompt_hash"]) == {rules_hash()}
    # one rationale per recorded action; the records themselves are the records stage's to fill
    records = read_lake_table(lake.path, "records")
    rationales = read_lake_table(lake.path, "rationales")
    assert (
        set(rationales["record_id"]) == set(records["record_id"])
        and rationales["rationale"].str.len_chars().min() > 0
    )
    assert records["response"].is_null().all()
    # intents for train trajectories only (user C is val); B's cross trajectory has its own intent
    intents = read_lake_table(lake.path, "intents")
    train = records.filter(pl.col("split") == "train").select("mode", "trajectory_id").unique()
    assert sorted(intents.select("mode", "trajectory_id").rows()) == sorted(train.rows())
    assert USER["C"] not in set(records.filter(pl.col("split") == "train")["user_id"])
    by_mode = dict(intents.select("mode", "intent_text").rows())
    assert intents.filter(pl.col("mode") == "cross").height == 1 and by_mode["cross"] not in set(
        intents.filter(pl.col("mode") == "single")["intent_text"]
    )


def test_offline_rerun_reproduces_identical_bytes(lake):
    extract_lake(lake.path, OFFLINE)
    first = {
        p: p.read_bytes() for name in ("intents", "rationales") for p in (lake.path / name).rglob("*.parquet")
    }
    extract_lake(lake.path, OFFLINE)
    second = {
        p: p.read_bytes() for name in ("intents", "rationales") for p in (lake.path / name).rglob("*.parquet")
    }
    assert first == second


def test_records_without_steps_are_quarantined_not_dropped(lake):
    records = read_lake_table(lake.path, "records")
    first = records.head(1)
    # a step that does not exist in a known session, and a whole train trajectory with no steps at all
    stray = first.with_columns(pl.lit(f"{SESSION['sA']}:99").alias("record_id"), pl.lit(99).alias("step"))
    ghost = first.with_columns(
        pl.lit("s_00000000000000ff:0").alias("record_id"),
        pl.lit("s_00000000000000ff").alias("session_id"),
        pl.lit("s_00000000000000ff").alias("trajectory_id"),
        pl.lit("u_00000000000000ff").alias("user_id"),
    )
    write_table(lake.path, "records", pl.concat([records, stray, ghost]))
    summary = extract_lake(lake.path, OFFLINE)
    # rationales: 19 actions + 2 without steps = 21 jobs; intents: 4 + the ghost trajectory = 5 jobs
    assert summary["counts"]["rationales"] == {"jobs": 21, "ok": 19, "quarantined": 2, "pending": 0}
    assert summary["counts"]["intents"] == {"jobs": 5, "ok": 4, "quarantined": 1, "pending": 0}
    quarantine = read_lake_table(lake.path, "quarantine").filter(pl.col("stage") == "extract")
    assert sorted(quarantine["table_name"]) == ["intents", "rationales", "rationales"]
    assert set(quarantine["reason"]) == {"missing_step"} and not quarantine["kept"].any()
