"""A real pretrained base (SmolLM2-135M-Instruct): SFT then one OPTD step, its own tokenizer and template.

The base goes in as a local Hugging Face folder, the way a user's Qwen checkpoint does (``--base PATH``
of ``trajforge train``, i.e. ``run_sft(..., base=PATH)`` then ``run_optd(..., PATH_OF_THE_SFT_CHECKPOINT)``).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.trainer.test_optd import lake_rows
from tests.trainer.test_sft_run import foreign_checkpoint
from trainer.config import OPTDSettings, TrainSettings
from trainer.data import encode, load_records
from trainer.models import load_pretrained, load_tokenizer, model_vocab_size, save_model
from trainer.optd_run import run_optd
from trainer.run import TrainSummary, run_sft
from trainer.sampling import SamplingSettings

SMOLLM2_VOCAB = 49152


@pytest.fixture(scope="module")
def short_lake(tmp_path_factory) -> Path:
    """Two train states with intents (a scroll and a click), prompts of ~60 tokens and replies of ~30, and
    the same two texts as the held-out states of another user (so the held-out loss is the trained states')."""
    rows = [r for r in lake_rows() if r["record_id"] in ("t1:1", "t2:2")]
    held_out = [
        r
        | {"record_id": f"v{i}:0", "session_id": f"v{i}", "user_id": "u-val", "split": "val", "intent": None}
        for i, r in enumerate(rows)
    ]
    rows += held_out
    root = tmp_path_factory.mktemp("smollake")
    (root / "records").mkdir()
    pq.write_table(pa.Table.from_pylist(rows), root / "records" / "part-0.parquet")
    return root


def settings(**overrides) -> TrainSettings:
    values = dict(
        modes=["single"],
        steps=3,
        states_per_update=2,  # every update sees both states: its loss is the same states' loss
        micro_batch_states=2,
        lr=5e-5,
        warmup_steps=0,
        eval_split="val",  # the held-out user's states repeat the training texts: the same loss
        eval_every=0,
        checkpoint_every=0,
        held_out_states=2,
        held_out_sampled=0,
        probe_states=0,
        max_prompt_tokens=160,
        max_response_tokens=64,
        device="cpu",
        bf16=False,
        torch_threads=1,  # on a shared machine one thread beats two waiting for each other
    )
    return TrainSettings(**(values | overrides))


def chat_ids(tokenizer, messages: list[dict[str, str]], **options) -> list[int]:
    return list(tokenizer.apply_chat_template(messages, **options)["input_ids"])


def reference_sequence(tokenizer, messages: list[dict[str, str]], response: str) -> tuple[list[int], int]:
    """The base's own chat template over the whole conversation, cut after the assistant's end-of-turn
    token (the template writes a newline after it, which no response needs); and where the reply starts."""
    prompt = chat_ids(tokenizer, messages, add_generation_prompt=True)
    full = chat_ids(tokenizer, [*messages, {"role": "assistant", "content": response}])
    assert full[: len(prompt)] == prompt and tokenizer.decode(full[-2:]) == "<|im_end|>\n"
    return full[:-1], len(prompt)


def reference_loss(folder: Path, tokenizer, records) -> float:
    """Mean over states of the mean NLL of the reply tokens, by the model's own ``labels`` loss."""
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    losses = []
    for record in records:
        ids, start = reference_sequence(tokenizer, record.messages(), record.response)
        input_ids = torch.tensor([ids])
        labels = input_ids.clone()
        labels[0, :start] = -100  # the prompt is context, never a target
        with torch.no_grad():
            losses.append(float(model(input_ids=input_ids, labels=labels).loss))
    return sum(losses) / len(losses)


def same_tokenizer(a, b) -> bool:
    return (
        a.get_vocab() == b.get_vocab()
        and a.chat_template == b.chat_template
        and a.special_tokens_map == b.special_tokens_map
    )


def answers(folder: Path, messages: list[dict[str, str]], reference) -> list[int]:
    """Load ``folder`` as a user would, check it is SmolLM2's shape and tokenizer, and return its greedy
    reply ids to a rendered prompt."""
    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert same_tokenizer(tokenizer, reference)
    prompt = chat_ids(tokenizer, messages, add_generation_prompt=True)
    assert prompt == chat_ids(reference, messages, add_generation_prompt=True)
    assert model.config.vocab_size == SMOLLM2_VOCAB and model.dtype == torch.float32
    head, embeddings = model.get_output_embeddings().weight, model.get_input_embeddings().weight
    assert head.data_ptr() == embeddings.data_ptr()  # still tied, as in the base
    assert model.generation_config.eos_token_id in (reference.eos_token_id, [reference.eos_token_id])
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False)
    return out[0, ids.shape[1] :].tolist()


@pytest.fixture(scope="module")
def reference(smollm2_folder):
    """SmolLM2's tokenizer straight from the folder, nothing of ours in between."""
    return AutoTokenizer.from_pretrained(smollm2_folder)


@pytest.fixture(scope="module")
def records(short_lake):
    found, _ = load_records(short_lake, ["train"], ["single"])
    assert len(found) == 2
    return found


@pytest.fixture(scope="module")
def sft_run(smollm2_folder, short_lake, tmp_path_factory) -> tuple[TrainSummary, list[dict]]:
    out = tmp_path_factory.mktemp("sft")
    summary = run_sft(settings(), short_lake, out, base=smollm2_folder, progress=False)
    return summary, metrics(out)


@pytest.fixture(scope="module")
def optd_run(sft_run, short_lake, tmp_path_factory) -> tuple[TrainSummary, list[dict]]:
    out = tmp_path_factory.mktemp("optd")
    summary = run_optd(
        OPTDSettings(
            **settings(steps=1, lr=1e-5, held_out_states=0).model_dump(),
            rollout_sampling=SamplingSettings(max_new_tokens=16),
            chunk_size=16,
        ),
        short_lake,
        out,
        sft_run[0].checkpoint,
        progress=False,
    )
    return summary, metrics(out)


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_the_states_are_the_base_chat_template_as_it_is(smollm2_folder, reference, records):
    states, dropped = encode(records, load_tokenizer(smollm2_folder), 160, 64)
    assert not dropped and len(reference) == SMOLLM2_VOCAB
    for state in states:
        ids, start = reference_sequence(reference, state.record.messages(), state.record.response)
        assert state.prompt_ids + state.response_ids == ids and len(state.prompt_ids) == start
        assert state.response_ids[-1] == reference.convert_tokens_to_ids("<|im_end|>")
        rendered = reference.decode(state.prompt_ids)
        assert rendered.startswith("<|im_start|>system\n") and rendered.endswith("<|im_start|>assistant\n")


@pytest.mark.slow
def test_sft_from_smollm2_starts_at_its_own_loss_and_lowers_it(smollm2_folder, reference, records, sft_run):
    summary, rows = sft_run
    # the loss before any update is the base model's own loss on these states: the weights are SmolLM2's
    expected = reference_loss(Path(smollm2_folder), reference, records)
    start, end = summary.held_out_start["held_out_loss"], summary.held_out_end["held_out_loss"]
    assert start == pytest.approx(expected, abs=1e-4)
    assert start < 0.5 * math.log(SMOLLM2_VOCAB)  # far below a uniform guess
    losses = [r["loss"] for r in rows if r["kind"] == "train"]
    assert len(losses) == 3 and summary.skipped_steps == 0
    # each update's loss is taken before it updates, on the same two states: it falls update by update
    assert losses[0] == pytest.approx(start, rel=1e-5)
    assert losses[0] > losses[1] > losses[2] > end


@pytest.mark.slow
def test_one_optd_step_from_the_sft_checkpoint_is_finite_and_taken(sft_run, optd_run):
    summary, rows = optd_run
    (step,) = [r for r in rows if r["kind"] == "train"]
    assert [r["kind"] for r in rows] == ["train"]  # no held-out or probe states: no (empty) evaluation rows
    assert summary.held_out_start is None and summary.held_out_end is None
    assert step["step"] == 1 and not step["skipped"] and summary.skipped_steps == 0
    assert math.isfinite(step["loss"]) and step["loss"] > 0 and math.isfinite(step["grad_norm"])
    assert step["loss"] == pytest.approx(step["distillation"] + 0.1 * step["grounding"], rel=1e-5)
    assert 0.0 < step["mean_lambda"] <= 1.0 and step["guidance_kl"] <= 0.02 + 1e-6  # epsilon bounds it
    before = load_file(Path(sft_run[0].checkpoint) / "model.safetensors")
    after = load_file(Path(summary.checkpoint) / "model.safetensors")
    name = "model.layers.0.mlp.up_proj.weight"
    assert not torch.equal(before[name], after[name])  # the update was applied


@pytest.mark.slow
def test_both_checkpoints_load_generate_and_keep_the_base_tokenizer(reference, records, sft_run, optd_run):
    for summary in (sft_run[0], optd_run[0]):
        new = answers(Path(summary.checkpoint), records[0].messages(), reference)
        assert 0 < len(new) <= 8 and max(new) < SMOLLM2_VOCAB


# --- what a base brings that the tiny default does not (small stand-ins, fast) ----------------------


@pytest.fixture
def foreign_base(tmp_path) -> Path:
    """A Llama folder with its own template and special tokens, no pad token, five padded vocabulary rows,
    and the generation config ``save_pretrained`` writes from a default Llama config (eos 2, no pad)."""
    texts = [t for r in lake_rows() for t in (r["system"], r["prompt"], r["response"])]
    return foreign_checkpoint(tmp_path / "base", texts)


def test_a_loaded_base_stops_at_its_eos_pads_and_never_emits_a_padded_row(foreign_base, tmp_path):
    model, tokenizer = load_pretrained(foreign_base)
    n = len(tokenizer)
    assert model_vocab_size(model) == n + 5 and not model.config.tie_word_embeddings
    config = model.generation_config
    assert tokenizer.eos_token == "</s>" and tokenizer.pad_token == "</s>"
    assert config.eos_token_id == [2, tokenizer.eos_token_id]  # the base's own stop kept, the eos added
    assert config.pad_token_id == tokenizer.eos_token_id
    assert config.suppress_tokens == [n, n + 1, n + 2, n + 3, n + 4]
    # make two padded rows the most likely tokens: every real row's logit is 0, rows n and n+1 get +-h.w
    with torch.no_grad():
        head = model.get_output_embeddings().weight
        head.zero_()
        head[n] = torch.randn(head.shape[1], generator=torch.Generator().manual_seed(0))
        head[n + 1] = -head[n]
    save_model(model, tokenizer, tmp_path / "ckpt")
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt")
    ids = torch.tensor([tokenizer("In view: Swift Runner", add_special_tokens=False)["input_ids"]])

    def greedy(**override) -> list[int]:
        out = saved.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, do_sample=False, **override
        )
        return out[0, ids.shape[1] :].tolist()

    assert greedy(suppress_tokens=None)[0] in (n, n + 1)  # control: unsuppressed, a padded row wins
    assert max(greedy()) < n  # the saved generation config suppresses them


def test_a_bf16_base_is_trained_from_float32_copies_of_its_weights(foreign_base, tmp_path):
    half = tmp_path / "bf16"
    shutil.copytree(foreign_base, half)
    AutoModelForCausalLM.from_pretrained(foreign_base, dtype=torch.bfloat16).save_pretrained(half)
    stored = load_file(half / "model.safetensors")
    assert {t.dtype for t in stored.values()} == {torch.bfloat16}
    model, _ = load_pretrained(half)
    # bf16 -> float32 is exact (the float32 mantissa extends bf16's), so each weight is its stored value
    for name, parameter in model.named_parameters():
        assert parameter.dtype == torch.float32
        assert torch.equal(parameter.detach(), stored[name].float())
