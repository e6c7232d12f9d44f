"""SFT pieces on the hand-built lake: states, batches, the loss, the update step, sampling, vocabularies."""

from __future__ import annotations

import math
import subprocess
import sys
from collections import Counter
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F

from tests.trainer.conftest import TINY, answered_records, tiny_model
from trainer.data import StateSampler, collate, encode, load_records, power_law_weights
from trainer.loop import LossSums, Trainer, WarmupLinearDecay, accumulate, adam, schedule, split
from trainer.models import (
    VocabularyMismatch,
    check_same_vocabulary,
    enable_activation_checkpointing,
    train_tokenizer,
)
from trainer.optd import HiddenStates
from trainer.sft import SFTObjective, sft_loss, states_per_scored_token
from transforms.lake import write_table

# --- states and batches ----------------------------------------------------------------------


def test_records_without_a_gold_response_are_skipped_and_counted(tmp_path):
    frame = answered_records()
    # the first three rows are user A's (train, single mode only): one empty, two null responses
    blank = frame["record_id"].head(3).to_list()
    response = pl.col("response")
    blanked = frame.with_columns(
        pl.when(pl.col("record_id") == blank[0])
        .then(pl.lit(""))
        .when(pl.col("record_id").is_in(blank))
        .then(pl.lit(None, dtype=pl.String))
        .otherwise(response)
        .alias("response")
    )
    write_table(tmp_path, "records", blanked)
    records, skipped = load_records(tmp_path, ["train"], ["single", "cross"])
    assert skipped == Counter({"no_gold_response": 3})
    assert len(records) == frame.filter(pl.col("split") == "train").height - 3
    assert not {f"single/{r}" for r in blank} & {r.key for r in records}


def test_the_records_reason_code_for_a_missing_gold_response_is_what_is_counted(tmp_path):
    frame = answered_records().filter(pl.col("mode") == "single").head(4)
    reasons = [None, "rationale_missing", "rationale_quarantined", "rationale_missing"]
    coded = frame.with_columns(
        pl.Series("gold_missing", reasons, dtype=pl.String),
        pl.when(pl.Series(reasons).is_null()).then(pl.col("response")).alias("response"),
    )
    (tmp_path / "records" / "bucket=0").mkdir(parents=True)
    pq.write_table(coded.drop("bucket").to_arrow(), tmp_path / "records" / "bucket=0" / "part-0.parquet")
    records, skipped = load_records(tmp_path, ["train"], ["single"])
    assert skipped == Counter({"rationale_missing": 2, "rationale_quarantined": 1})
    assert [r.key for r in records] == [f"single/{frame['record_id'][0]}"]


def test_state_is_chat_prompt_with_generation_prompt_then_response_and_eos(train_records, tokenizer, states):
    record, state = train_records[0], states[0]
    # ChatML: bos, system turn, user turn, then the assistant's opening "<|im_start|>assistant\n"
    text = (
        f"<|bos|><|im_start|>system\n{record.system}<|im_end|>\n"
        f"<|im_start|>user\n{record.prompt}<|im_end|>\n<|im_start|>assistant\n"
    )
    assert tokenizer.decode(state.prompt_ids) == text
    assert tokenizer.decode(state.response_ids) == record.response + "<|im_end|>"
    assert state.response_ids[-1] == tokenizer.eos_token_id


def test_labels_are_the_response_tokens_each_predicted_by_the_position_before(states, tokenizer):
    batch = collate(states[:3], tokenizer.pad_token_id)
    expected = [t for s in states[:3] for t in s.response_ids]
    assert batch.labels.tolist() == expected
    # the token after each predicting position is the label itself (teacher forcing)
    assert torch.equal(batch.input_ids[batch.rows, batch.positions + 1], batch.labels)
    first = (
        len(states[0].prompt_ids) - 1
    )  # the generation prompt's last token predicts the first response token
    assert batch.positions[0].item() == first
    assert Counter(batch.owner.tolist()) == {i: len(s.response_ids) for i, s in enumerate(states[:3])}


def test_over_long_states_are_dropped_and_counted_never_cut(train_records, tokenizer, states):
    limit = sorted(len(s.prompt_ids) for s in states)[len(states) // 2]
    expected_dropped = sum(len(s.prompt_ids) > limit for s in states)
    kept, dropped = encode(train_records, tokenizer, limit, 10_000)
    assert dropped == Counter({"prompt_too_long": expected_dropped})
    assert len(kept) == len(states) - expected_dropped
    short = [s for s in states if len(s.prompt_ids) <= limit]
    assert [k.prompt_ids for k in kept] == [s.prompt_ids for s in short]


# --- the loss and accumulation -----------------------------------------------------------------


def reference_loss(model, states, vocab: int) -> torch.Tensor:
    """Mean over states of the mean response NLL, one full-vocabulary forward per state."""
    per_state = []
    for s in states:
        ids = torch.tensor([s.prompt_ids + s.response_ids])
        logits = model(input_ids=ids).logits[0, len(s.prompt_ids) - 1 : -1, :vocab]
        per_state.append(F.cross_entropy(logits.double(), torch.tensor(s.response_ids)))
    return torch.stack(per_state).mean()


def grads(model) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters()]


def accumulated(model, states, tokenizer, size: int, pad_to: int | None = None):
    model.zero_grad(set_to_none=True)
    micro = [collate(chunk, tokenizer.pad_token_id, pad_to) for chunk in split(states, size)]
    total, _, _ = accumulate(model, micro, lambda m, b: sft_loss(m, b, len(tokenizer)), n_states=len(states))
    return total / len(states), grads(model)


def test_loss_is_the_mean_over_states_of_per_state_token_means(states, tokenizer):
    model = tiny_model(tokenizer).double()
    # four states of different response lengths: a flat token mean would weight long ones more
    chosen = states[:4]
    assert len({len(s.response_ids) for s in chosen}) > 1
    loss, _ = accumulated(model, chosen, tokenizer, size=4)
    with torch.no_grad():
        assert loss == pytest.approx(float(reference_loss(model, chosen, len(tokenizer))), abs=1e-12)


def per_token_loss(model, states, tokenizer, size: int, unscored: torch.Tensor | None = None):
    model.zero_grad(set_to_none=True)
    micro = [collate(chunk, tokenizer.pad_token_id).unscored(unscored) for chunk in split(states, size)]
    per_token = states_per_scored_token(states, unscored)
    objective = SFTObjective(
        HiddenStates(model).head, len(tokenizer), last=micro[-1], states_per_token=per_token
    )
    total, parts, _ = accumulate(HiddenStates(model), micro, objective, n_states=len(states))
    return total / len(states), parts["nll"] / len(states), grads(model)


def test_per_token_averaging_weights_every_response_token_alike_across_micro_batches(states, tokenizer):
    model = tiny_model(tokenizer).double()
    chosen = states[:4]
    assert len({len(s.response_ids) for s in chosen}) > 1
    with torch.no_grad():
        flat = []
        for s in chosen:
            logits = model(input_ids=torch.tensor([s.prompt_ids + s.response_ids])).logits
            flat.append(
                F.cross_entropy(
                    logits[0, len(s.prompt_ids) - 1 : -1, : len(tokenizer)],
                    torch.tensor(s.response_ids),
                    reduction="none",
                )
            )
        token_mean = float(torch.cat(flat).mean())
        state_mean = float(reference_loss(model, chosen, len(tokenizer)))
    assert token_mean != pytest.approx(state_mean, abs=1e-6)  # the two averagings differ on these states
    whole, reported, reference_grads = per_token_loss(model, chosen, tokenizer, size=4)
    assert whole == pytest.approx(token_mean, abs=1e-12)
    assert reported == pytest.approx(state_mean, abs=1e-12)  # the logged nll keeps its meaning
    for size in (1, 3):
        value, _, grad = per_token_loss(model, chosen, tokenizer, size=size)
        assert value == pytest.approx(token_mean, abs=1e-12)
        for a, b in zip(grad, reference_grads, strict=True):
            torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)


def test_per_token_averaging_counts_only_scored_tokens(states, tokenizer):
    model = tiny_model(tokenizer).double()
    chosen = states[:4]
    unscored = torch.tensor(sorted({chosen[0].response_ids[1], chosen[2].response_ids[3]}))
    with torch.no_grad():
        kept = []
        for s in chosen:
            logits = model(input_ids=torch.tensor([s.prompt_ids + s.response_ids])).logits
            labels = torch.tensor(s.response_ids)
            nll = F.cross_entropy(
                logits[0, len(s.prompt_ids) - 1 : -1, : len(tokenizer)], labels, reduction="none"
            )
            kept.append(nll[~torch.isin(labels, unscored)])
        token_mean = float(torch.cat(kept).mean())
    value, _, _ = per_token_loss(model, chosen, tokenizer, size=2, unscored=unscored)
    assert value == pytest.approx(token_mean, abs=1e-12)


def test_loss_and_gradients_identical_across_micro_batch_splits_and_padding(states, tokenizer):
    model = tiny_model(tokenizer).double()
    chosen = states[:4]
    longest = max(len(s.prompt_ids) + len(s.response_ids) for s in chosen)
    reference_value, reference_grads = accumulated(model, chosen, tokenizer, size=4)
    for size, pad_to in [(2, None), (1, None), (4, longest + 17), (2, longest + 5)]:
        value, grad = accumulated(model, chosen, tokenizer, size=size, pad_to=pad_to)
        assert value == pytest.approx(reference_value, abs=1e-12), (size, pad_to)
        for a, b in zip(grad, reference_grads, strict=True):
            torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)


def test_activation_checkpointing_leaves_loss_and_gradients_unchanged(states, tokenizer):
    model = tiny_model(tokenizer).double().train()
    reference_value, reference_grads = accumulated(model, states[:3], tokenizer, size=2)
    enable_activation_checkpointing(model)
    value, grad = accumulated(model, states[:3], tokenizer, size=2)
    assert value == pytest.approx(reference_value, abs=1e-12)
    for a, b in zip(grad, reference_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)


def test_padded_vocabulary_rows_get_no_probability_and_no_gradient(states, tokenizer):
    model = tiny_model(tokenizer).double()
    rows = model.get_output_embeddings().weight.shape[0]
    # 400 tokenizer tokens rounded up to a multiple of 64 -> 448 rows, 48 of them padding
    assert (len(tokenizer), rows) == (400, 448)
    accumulated(model, states[:2], tokenizer, size=2)
    assert torch.count_nonzero(model.get_output_embeddings().weight.grad[len(tokenizer) :]) == 0


# --- the update step -----------------------------------------------------------------------------


def make_trainer(model, steps: int = 10, warmup: int = 2, clip: float | None = 1.0) -> Trainer:
    optimizer = adam(model, 1e-2, (0.9, 0.999), 1e-8)
    return Trainer(
        model, optimizer, schedule(optimizer, warmup, steps), clip=clip, device=torch.device("cpu")
    )


def test_non_finite_gradients_skip_the_update_and_say_so(states, tokenizer):
    model = tiny_model(tokenizer)
    trainer = make_trainer(model)
    micro = [collate(states[:2], tokenizer.pad_token_id)]
    before = [p.detach().clone() for p in model.parameters()]

    def poisoned(m, b):
        sums = sft_loss(m, b, len(tokenizer))
        return LossSums(total=sums.total * float("nan"), tokens=sums.tokens)

    report = trainer.step(micro, poisoned, n_states=2)
    assert report.skipped and math.isnan(report.loss)
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))
    assert trainer.optimizer.state == {}  # Adam's moments never saw the NaN
    # the schedule advanced (warm-up 2: factor 1/2 then 2/2), and a clean update goes through
    clean = trainer.step(micro, lambda m, b: sft_loss(m, b, len(tokenizer)), n_states=2)
    assert (report.lr, clean.lr) == (pytest.approx(5e-3), pytest.approx(1e-2))
    assert not clean.skipped and math.isfinite(clean.grad_norm)
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))


def test_warmup_then_linear_decay():
    factor = WarmupLinearDecay(warmup=4, total=10)
    # up: 1/4, 2/4, 3/4, 4/4; then (10 - s) / (10 - 4) for s = 4..9: 1, 5/6, ..., 1/6
    assert [factor(s) for s in range(10)] == pytest.approx(
        [0.25, 0.5, 0.75, 1.0, 1, 5 / 6, 4 / 6, 3 / 6, 2 / 6, 1 / 6]
    )


def test_gradient_clipping_reports_the_norm_before_clipping(states, tokenizer):
    model = tiny_model(tokenizer).double()
    micro = [collate(states[:2], tokenizer.pad_token_id)]
    _, reference = accumulated(model, states[:2], tokenizer, size=2)
    expected = math.sqrt(sum(float(g.pow(2).sum()) for g in reference))
    report = make_trainer(model, clip=1e-3).step(
        micro, lambda m, b: sft_loss(m, b, len(tokenizer)), n_states=2
    )
    assert report.grad_norm == pytest.approx(expected, rel=1e-9)


# --- sampling ----------------------------------------------------------------------------------------


def test_power_law_resampling_gives_class_probabilities_n_to_the_alpha():
    actions = ["scroll_down"] * 16 + ["click"] * 4 + ["end"]
    weights = power_law_weights(actions, alpha=0.5)
    # q_i = sqrt(n_i) / sum_j sqrt(n_j) = 4/7, 2/7, 1/7 for n = 16, 4, 1
    expected = {"scroll_down": 4 / 7, "click": 2 / 7, "end": 1 / 7}
    by_class = Counter()
    for action, w in zip(actions, weights.tolist(), strict=True):
        by_class[action] += w / float(weights.sum())
    assert by_class == pytest.approx(expected, abs=1e-12)
    drawn = Counter(actions[i] for i in StateSampler(len(actions), seed=3, weights=weights).take(42_000))
    # 42,000 draws: standard error of a share <= sqrt(0.25 / 42000) ~ 0.0024; allow 4 of them
    assert {k: v / 42_000 for k, v in drawn.items()} == pytest.approx(expected, abs=0.01)


def test_sampler_is_a_seeded_sequence_of_epochs_resumable_from_its_count():
    one = StateSampler(10, seed=1)
    first = one.take(25)
    # without weights every epoch is a permutation of all states
    assert sorted(first[:10]) == list(range(10)) and sorted(first[10:20]) == list(range(10))
    again = StateSampler(10, seed=1)
    again.load_state_dict({"drawn": 7, "n_states": 10, "seed": 1})
    assert again.take(18) == first[7:25]
    assert StateSampler(10, seed=2).take(25) != first


# --- vocabularies ------------------------------------------------------------------------------------


def test_student_and_teacher_with_different_vocabularies_fail_at_once(train_records, tokenizer):
    texts = [t for r in train_records for t in (r.system, r.prompt, r.response)]
    student = tiny_model(tokenizer)
    check_same_vocabulary(student, tokenizer, tiny_model(tokenizer, seed=1), tokenizer)  # same: passes
    other = train_tokenizer(texts, TINY.vocab_size + 40)
    with pytest.raises(VocabularyMismatch, match="tokenizer sizes differ: student 400, teacher 440"):
        check_same_vocabulary(student, tokenizer, tiny_model(other), other)
    # same size, different ids: trained on different texts
    shuffled = train_tokenizer(["zzzz qqqq " * 50, *texts[::-1]], TINY.vocab_size)
    with pytest.raises(VocabularyMismatch, match="token -> id maps"):
        check_same_vocabulary(student, tokenizer, tiny_model(shuffled), shuffled)
    wider = tiny_model(tokenizer, spec=TINY.__class__(**{**vars(TINY), "pad_vocab_multiple": 256}))
    with pytest.raises(VocabularyMismatch, match="model vocabulary rows differ: student 448, teacher 512"):
        check_same_vocabulary(student, tokenizer, wider, tokenizer)


def test_trainer_modules_import_without_the_pipeline_stack():
    # the GPU machine has torch, transformers, tokenizers, safetensors and pyarrow, nothing of the pipeline
    blocked = ("polars", "prefect", "duckdb", "pydantic", "pydantic_settings", "great_expectations")
    code = (
        "import sys\n"
        f"for name in {blocked!r}:\n    sys.modules[name] = None\n"
        "import trainer.checkpoint, trainer.data, trainer.loop, trainer.model_card, trainer.models, trainer.run\n"
        "import trainer.sft\n"
    )
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
