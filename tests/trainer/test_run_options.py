"""What the run's settings change: the tiny tokenizer's whole tokens, the teacher's intent share, the
grounding class weights, the ablations (no trust region, a teacher without the intent), and the files a
run writes beside its metrics."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from tests.trainer.test_optd import lake_rows, optd_settings, train_settings, write_lake
from trainer.config import RESPONSE_PIECES
from trainer.data import StatePool, load_records
from trainer.models import train_tokenizer
from trainer.optd import grounding_class_weights
from trainer.optd_run import run_optd
from trainer.run import TrainingRun, run_sft, starting_model


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> Path:
    return write_lake(tmp_path_factory.mktemp("options"))


@pytest.fixture(scope="module")
def sft(lake, tmp_path_factory) -> Path:
    return Path(
        run_sft(train_settings(steps=20), lake, tmp_path_factory.mktemp("sft"), progress=False).checkpoint
    )


def test_the_response_pieces_and_every_action_name_are_one_token_each(lake):
    records, _ = load_records(lake, ["train"], ["single"])
    _, tokenizer = starting_model(records, train_settings(), None)
    for piece in (*RESPONSE_PIECES, "click", "scroll_down"):  # the lake's two actions
        assert len(tokenizer(piece, add_special_tokens=False)["input_ids"]) == 1, piece
    for record in records:
        ids = tokenizer(record.response, add_special_tokens=False)["input_ids"]
        assert tokenizer.decode(ids) == record.response  # whole tokens change the split, never the text
        assert tokenizer.convert_ids_to_tokens(ids)[0] == '{"rationale":"'
    # without them a byte-level pre-tokenizer cuts an action name at each underscore
    plain = train_tokenizer([r.response for r in records], 400)
    assert len(plain("scroll_down", add_special_tokens=False)["input_ids"]) == 3


def test_a_teacher_intent_share_puts_the_intent_in_that_share_of_the_prompts(lake, tmp_path):
    records, _ = load_records(lake, ["train"], ["single"])
    runs = {}
    for share in (0.0, 0.5, 1.0):
        run = TrainingRun(train_settings(teacher_intent_share=share, probe_states=0), lake, tmp_path, None)
        runs[share] = run.pool.with_intent
    # every record of the train split carries an intent: 0 -> none, 1 -> all, 0.5 -> about half (24 draws)
    assert runs[0.0] == frozenset() and runs[1.0] == {r.key for r in records}
    assert 6 <= len(runs[0.5]) <= 18
    again = TrainingRun(train_settings(teacher_intent_share=0.5, probe_states=0), lake, tmp_path, None)
    assert again.pool.with_intent == runs[0.5]  # fixed by (seed, key): the same on every rank and rerun
    pool = again.pool
    chosen = next(i for i, r in enumerate(pool.records) if r.key in runs[0.5])
    assert (
        pool.tokenizer.decode(pool.get(chosen).prompt_ids).count("## Your intent over this whole trajectory")
        == 1
    )


def test_grounding_class_weights_follow_the_reference_recipe():
    counts = Counter({"scroll_down": 80, "click": 15, "ipv_buy": 5})
    actions = ["scroll_down", "scroll_down", "click", "ipv_buy"]
    weights = grounding_class_weights(actions, counts)
    # raw w = freq^-1/2: 1/sqrt(.8), 1/sqrt(.15), 1/sqrt(.05); c makes mean(min(c w, 2)) = 1
    raw = torch.tensor([0.8, 0.8, 0.15, 0.05], dtype=torch.float64) ** -0.5
    low, high = 0.0, 10.0
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if torch.clamp(mid * raw, max=2).mean() < 1 else (low, mid)
    torch.testing.assert_close(weights, torch.clamp(high * raw, max=2.0))
    assert float(weights.mean()) == pytest.approx(1.0) and float(weights.max()) <= 2.0
    assert weights[0] < weights[2] < weights[3]  # the rarer the action, the heavier its state


def updates(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["kind"] == "train"]


def test_the_ablations_change_the_target_as_they_say(lake, sft, tmp_path):
    no_region = run_optd(
        optd_settings(steps=2, trust_region=False), lake, tmp_path / "a", sft, progress=False
    )
    # without a trust region every token takes lambda_max: nothing binds, the KL is whatever it is
    assert all(r["mean_lambda"] == 1.0 and r["binding_share"] == 0.0 for r in updates(tmp_path / "a"))
    assert no_region.held_out_end["probe_mean_lambda"] == 1.0
    run_optd(optd_settings(steps=2, teacher_sees_intent=False), lake, tmp_path / "b", sft, progress=False)
    # a teacher scoring without the intent: q^I = q^0, so lambda* = 1 and the target is the plain teacher
    for row in updates(tmp_path / "b"):
        assert row["mean_lambda"] == 1.0 and row["guidance_kl"] == pytest.approx(0.0, abs=1e-6)
    run_optd(optd_settings(steps=2, gamma=0.0), lake, tmp_path / "c", sft, progress=False)
    assert all(r["loss"] == pytest.approx(r["distillation"], rel=1e-6) for r in updates(tmp_path / "c"))
    weighted = run_optd(optd_settings(steps=2, grounding_class_weights=True), lake, tmp_path / "d", sft,
                        progress=False)  # fmt: skip
    assert weighted.skipped_steps == 0


def test_a_run_writes_its_curves_and_summary_beside_its_metrics(lake, sft, tmp_path):
    run_optd(optd_settings(steps=2), lake, tmp_path / "run", sft, progress=False)
    for name in ("metrics.jsonl", "summary.json", "curves.png", "prepared.parquet"):
        assert (tmp_path / "run" / name).is_file(), name
    assert (tmp_path / "run" / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_held_out_states_of_a_trained_user_are_refused(tmp_path):
    rows = lake_rows()
    for row in rows:
        if row["split"] == "test":
            row["user_id"] = "u-t1"  # the held-out trajectory's shopper also trains
    (tmp_path / "records").mkdir()
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "records" / "part-0.parquet")
    with pytest.raises(
        ValueError, match=r"1 users \(e.g. u-t1\) have states in both the training and the held-out"
    ):
        run_sft(train_settings(steps=1), tmp_path, tmp_path / "run", progress=False)


def test_a_pool_reuses_ids_tokenized_before_and_tokenizes_the_rest(lake):
    records, _ = load_records(lake, ["train"], ["single"])
    tokenizer = train_tokenizer([t for r in records for t in (r.system, r.prompt, r.response)], 400)
    first = StatePool(records, tokenizer, 10_000, 10_000)
    state = first.get(0)
    second = StatePool(records, tokenizer, 10_000, 10_000, privileged=True)
    second.reuse(state.record.key, state.prompt_ids, state.response_ids, None)
    again = second.get(0)
    assert again.prompt_ids == state.prompt_ids and second.reused == 1
    assert second.privileged_ids[state.record.key]  # what the first pool did not need is tokenized now
