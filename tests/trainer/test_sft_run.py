"""Whole SFT runs: on a lake built by the pipeline's own stages, exact resume, the CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)
from typer.testing import CliRunner

from cli.app import app
from evaluation.executable import ScreenJudge
from extractors.config import ExtractSettings
from extractors.pipeline import extract_lake
from synthetic.bundle import write_bundle
from tests.trainer.conftest import files, tiny_model
from trainer.checkpoint import (
    check_resumable,
    read_meta,
    restore_training_state,
    save_checkpoint,
    state_folder,
)
from trainer.config import TinyModelSettings, TrainSettings
from trainer.data import load_records, prompt_ids
from trainer.loop import adam, schedule
from trainer.run import run_sft
from transforms.ingest import ingest_bundle
from transforms.prompts import PromptSettings
from transforms.records import write_records

TINY = TinyModelSettings(
    vocab_size=512, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2, num_kv_heads=1
)


@pytest.fixture(scope="module")
def pipeline_lake(tmp_path_factory) -> Path:
    """6 synthetic shoppers through ingest, records, offline extraction (rationales) and records again."""
    root = tmp_path_factory.mktemp("pipeline")
    write_bundle(root / "raw", users=6, seed=1, fmt="parquet", parts_per_table=1)
    lake = root / "lake"
    ingest_bundle(root / "raw", lake)
    short = PromptSettings(window_single=2, recent_clicks=2, recent_buys=2, max_reviews=2)  # shorter prompts
    write_records(lake, modes=["single"], settings=short)
    extract_lake(lake, ExtractSettings(progress=False, cache=False))
    write_records(lake, modes=["single"], settings=short)
    return lake


def small(**overrides) -> TrainSettings:
    values = dict(
        modes=["single"],
        steps=6,
        states_per_update=4,
        micro_batch_states=2,
        lr=1e-2,
        warmup_steps=1,
        eval_every=0,
        checkpoint_every=0,
        held_out_states=4,
        held_out_sampled=0,
        tiny=TINY,
    )
    return TrainSettings(**(values | overrides))


def test_sft_lowers_the_held_out_loss_and_the_checkpoint_loads_and_generates(pipeline_lake, tmp_path):
    # these shoppers fall in the train and test splits only: the test split is the held-out one
    settings = small(eval_split="test", steps=8, micro_batch_states=4, held_out_states=6, held_out_sampled=3)
    summary = run_sft(
        settings, pipeline_lake, tmp_path / "run", progress=False, judge=ScreenJudge(pipeline_lake)
    )
    assert summary.held_out_states == 6 and summary.skipped_steps == 0
    # an untrained model scores about ln(512) = 6.2 nats per token; the JSON responses are very regular
    start, end = summary.held_out_start["held_out_loss"], summary.held_out_end["held_out_loss"]
    assert start == pytest.approx(math.log(512), abs=0.5)
    assert end < start - 0.5
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["kind"] == "train"]
    assert [r["step"] for r in train] == list(range(1, 9))
    assert all(
        math.isfinite(r["loss"]) and r["tokens_per_s"] > 0 and "forward_backward" in r["seconds"]
        for r in train
    )
    assert [r["step"] for r in rows if r["kind"] == "eval"] == [0, 8]

    folder = Path(summary.checkpoint)
    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert not {"trainer.json", "trainer_state.pt"} & {p.name for p in folder.iterdir()}
    trained_with = read_meta(folder)  # beside the model folder, in OUT/trainer_state/step-000008
    assert trained_with["settings"]["steps"] == 8 and trained_with["data_hash"] == summary.data_hash
    card = (folder / "README.md").read_text()
    # the card's figures are the run's: the held-out loss at the start and after update 8, four places
    start, end = summary.held_out_start["held_out_loss"], summary.held_out_end["held_out_loss"]
    assert f"| held-out loss (response NLL per token, nats) | {start:.4f} | {end:.4f} |" in card
    parse = (summary.held_out_start["parse_share"], summary.held_out_end["parse_share"])
    assert f"| parse share (responses that are the JSON shape) | {parse[0]:.3f} | {parse[1]:.3f} |" in card
    assert f"`{summary.data_hash}`" in card and f"| lake | `{pipeline_lake}` |" in card
    held_out = (
        f"| held-out states | 6, one per session, of {summary.held_out_users} held-out users (the test split"
    )
    assert f"| train states | {summary.train_states} |" in card and held_out in card
    assert "base_model" not in card  # the tiny default, trained from scratch
    record = load_records(pipeline_lake, ["test"], ["single"])[0][0]
    ids = torch.tensor([prompt_ids(tokenizer, record.messages())])
    generated = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False)
    new = generated[0, ids.shape[1] :]
    assert 0 < len(new) <= 12 and int(new.max()) < len(tokenizer)  # never a padded-vocabulary row
    assert isinstance(tokenizer.decode(new, skip_special_tokens=True), str)


def test_the_saved_tokenizer_reloads_with_the_same_ids(pipeline_lake, tmp_path):
    summary = run_sft(small(eval_split="test", steps=1), pipeline_lake, tmp_path / "run", progress=False)
    reloaded = AutoTokenizer.from_pretrained(summary.checkpoint)
    text = load_records(pipeline_lake, ["train"], ["single"])[0][0].response
    saved_tokenizer = json.loads((Path(summary.checkpoint) / "tokenizer.json").read_text())
    ours = {
        **saved_tokenizer["model"]["vocab"],
        **{token["content"]: token["id"] for token in saved_tokenizer["added_tokens"]},
    }
    # AutoTokenizer beside a Llama config keeps our BPE and the whole tokens added after it (the response
    # pieces and the action names): the same token -> id map, special tokens included
    assert reloaded.get_vocab() == ours
    assert (reloaded.bos_token, reloaded.eos_token, reloaded.pad_token) == (
        "<|bos|>",
        "<|im_end|>",
        "<|pad|>",
    )
    assert reloaded.decode(reloaded(text, add_special_tokens=False)["input_ids"]) == text
    # and older transformers (a vLLM install may pin one) find a class they have and the template inline
    saved = json.loads((Path(summary.checkpoint) / "tokenizer_config.json").read_text())
    assert saved["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert saved["chat_template"] == reloaded.chat_template and "{{ bos_token }}" in saved["chat_template"]


def parameters(checkpoint: str | Path) -> dict[str, torch.Tensor]:
    return load_file(Path(checkpoint) / "model.safetensors")


def test_resume_continues_exactly(tiny_lake, tmp_path):
    settings = small(steps=6, checkpoint_every=3, eval_every=2, eval_split="val", class_resampling_alpha=0.3)
    whole = run_sft(settings, tiny_lake, tmp_path / "whole", progress=False)
    first = run_sft(settings, tiny_lake, tmp_path / "parts", stop_after=3, progress=False)
    assert first.steps == 3 and first.checkpoint.endswith("step-000003")
    rest = run_sft(settings, tiny_lake, tmp_path / "parts", resume=True, progress=False)
    a, b = parameters(whole.checkpoint), parameters(rest.checkpoint)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    def losses(run: str) -> list[tuple[str, int, float]]:
        rows = [json.loads(line) for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
        return [(r["kind"], r["step"], r.get("loss", r.get("held_out_loss"))) for r in rows]

    # the resumed run's log is the uninterrupted one's, row for row (held-out at 0, 2, 4, 6)
    assert losses("parts") == losses("whole")
    assert rest.held_out_start == whole.held_out_start


def test_a_used_out_is_refused_untouched_and_overwrite_replaces_its_run(tiny_lake, tmp_path):
    out = tmp_path / "run"
    run_sft(small(steps=4, checkpoint_every=1, eval_split="val"), tiny_lake, out, progress=False)
    (out / "notes.txt").write_text("the owner's")
    before = files(out)
    shorter = small(steps=2, eval_split="val")
    with pytest.raises(ValueError, match="holds another run"):
        run_sft(shorter, tiny_lake, out, progress=False)
    assert files(out) == before
    replaced = run_sft(shorter, tiny_lake, out, progress=False, overwrite=True)
    # the earlier run's steps 3 and 4 sort after the new run's 2: none of them is left to prune it
    final = out / "checkpoints" / "step-000002"
    assert replaced.checkpoint == str(final) and (final / "model.safetensors").is_file()
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-000002"]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "train"] == [1, 2]  # the new run's rows only
    assert json.loads((out / "summary.json").read_text())["checkpoint"] == str(final)
    assert (out / "notes.txt").read_text() == "the owner's"


def test_resume_refuses_changed_settings(tiny_lake, tmp_path):
    run_sft(small(steps=4, eval_split="val"), tiny_lake, tmp_path / "run", stop_after=2, progress=False)
    with pytest.raises(ValueError, match="settings differ from the checkpoint's in lr"):
        run_sft(
            small(steps=4, eval_split="val", lr=1e-3),
            tiny_lake,
            tmp_path / "run",
            resume=True,
            progress=False,
        )
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        run_sft(small(), tiny_lake, tmp_path / "empty", resume=True, progress=False)


def test_a_checkpoint_before_any_update_saves_no_optimizer_state_and_restores_the_rng(tokenizer, tmp_path):
    # every update so far skipped (non-finite): Adam has no state yet. Asking torch.distributed.checkpoint for
    # it would first take a zero-gradient step, which Adam's bias correction counts as its first update.
    model = tiny_model(tokenizer)
    optimizer = adam(model, 1e-2, (0.9, 0.999), 1e-8)
    meta = {"settings": {}, "data_hash": "states"}
    folder = save_checkpoint(
        tmp_path, 1, model, tokenizer, optimizer, schedule(optimizer, 1, 4), meta, keep=1
    )
    assert not optimizer.state
    assert torch.load(state_folder(folder) / "trainer_state.pt", weights_only=False)["optimizer"] is None
    after_save = torch.rand(3)  # what the run would draw next

    resumed = AutoModelForCausalLM.from_pretrained(folder)
    fresh = adam(resumed, 1e-2, (0.9, 0.999), 1e-8)
    torch.manual_seed(123)
    restore_training_state(folder, resumed, fresh, schedule(fresh, 1, 4))
    assert not fresh.state
    assert torch.equal(torch.rand(3), after_save)  # the saved RNG state, not the reseeded one
    check_resumable(read_meta(folder), {}, "states", world_size=1)
    with pytest.raises(ValueError, match="world size is 1, this run's 2"):
        check_resumable(read_meta(folder), {}, "states", world_size=2)


runner = CliRunner()


def test_cli_trains_sft_end_to_end(prefect_harness, tiny_lake, tmp_path):
    config = tmp_path / "train.toml"
    config.write_text(
        "[train]\nmodes = ['single']\nsteps = 3\nstates_per_update = 2\nmicro_batch_states = 2\n"
        "eval_split = 'val'\nlr = 0.01\nwarmup_steps = 1\n"
        "[train.tiny]\nvocab_size = 400\nhidden_size = 32\nintermediate_size = 64\nnum_heads = 2\nnum_kv_heads = 1\n"
    )
    out = tmp_path / "ckpt"
    args = ["train", "--lake", str(tiny_lake), "--stage", "sft", "--out", str(out), "--config", str(config)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    final = out / "checkpoints" / "step-000003"
    assert f"checkpoint: {final}" in result.output.replace("\n", "")
    assert AutoModelForCausalLM.from_pretrained(final).config.vocab_size == 448  # 400 tokens padded to 7 x 64
    resumed = runner.invoke(app, [*args, "--resume"])
    assert resumed.exit_code == 0, resumed.output  # nothing left to train: the same final checkpoint
    before = files(out)
    again = runner.invoke(app, args)  # a new run into the used --out: one line, and the run untouched
    assert again.exit_code == 1 and one_stopped_line(again.output)
    assert str(out) in again.output and "--resume" in again.output and "--overwrite" in again.output
    assert files(out) == before
    replaced = runner.invoke(app, [*args, "--overwrite"])
    assert replaced.exit_code == 0, replaced.output
    assert (
        f"checkpoint: {final}" in replaced.output.replace("\n", "")
        and (final / "model.safetensors").is_file()
    )
    optd = runner.invoke(
        app, ["train", "--lake", str(tiny_lake), "--stage", "optd", "--out", str(tmp_path / "o")]
    )
    assert optd.exit_code == 1 and "needs --base" in optd.output


def test_cli_refuses_an_out_it_cannot_write_in_before_any_work(tiny_lake, tmp_path):
    (tmp_path / "file").write_text("")
    for out in (tmp_path / "file", tmp_path / "file" / "run"):
        refused = runner.invoke(app, ["train", "--lake", str(tiny_lake), "--stage", "sft", "--out", str(out)])
        assert refused.exit_code == 1 and one_stopped_line(refused.output), refused.output
        assert str(out) in refused.output
    args = ["train", "--lake", str(tiny_lake), "--stage", "sft", "--out", str(tmp_path / "new")]
    both = runner.invoke(app, [*args, "--resume", "--overwrite"])
    assert both.exit_code == 1 and one_stopped_line(both.output) and "pass one of them" in both.output


def one_stopped_line(output: str) -> bool:
    return output.startswith("stopped: ") and output.count("\n") == 1 and "Traceback" not in output


def foreign_checkpoint(folder: Path, texts: list[str]) -> Path:
    """A pretrained-style folder as a user brings it: its own chat template and special tokens, no pad token,
    and a model vocabulary a few rows larger than the tokenizer."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=350, special_tokens=["<s>", "</s>"], initial_alphabet=alphabet)
    backend.train_from_iterator(texts, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>")
    tokenizer.chat_template = FOREIGN_TEMPLATE
    config = LlamaConfig(
        vocab_size=len(tokenizer) + 5, hidden_size=32, intermediate_size=64, num_hidden_layers=1
    )
    config.num_attention_heads = config.num_key_value_heads = 2
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


FOREIGN_TEMPLATE = (
    "{% for m in messages %}[{{ m['role'] | upper }}] {{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}[ASSISTANT] {% endif %}"
)


def test_a_pretrained_base_is_trained_with_its_own_tokenizer_and_template(tiny_lake, tmp_path):
    records = load_records(tiny_lake, ["train"], ["single"])[0]
    base = foreign_checkpoint(
        tmp_path / "base", [t for r in records for t in (r.system, r.prompt, r.response)]
    )
    summary = run_sft(
        small(steps=2, eval_split="val"), tiny_lake, tmp_path / "run", base=base, progress=False
    )
    tokenizer = AutoTokenizer.from_pretrained(summary.checkpoint)
    assert tokenizer.chat_template == FOREIGN_TEMPLATE
    assert (tokenizer.eos_token, tokenizer.pad_token) == ("</s>", "</s>")  # no pad token: eos pads
    prompt = tokenizer.decode(prompt_ids(tokenizer, records[0].messages()))
    assert prompt == f"[SYSTEM] {records[0].system}</s>[USER] {records[0].prompt}</s>[ASSISTANT] "
    before, after = parameters(base), parameters(summary.checkpoint)
    assert after["model.embed_tokens.weight"].shape[0] == len(tokenizer) + 5  # padded rows kept as they are
    assert not torch.equal(
        before["model.layers.0.mlp.up_proj.weight"], after["model.layers.0.mlp.up_proj.weight"]
    )
    assert read_meta(summary.checkpoint)["base"] == str(base)
    assert f'base_model: "{base}"' in (Path(summary.checkpoint) / "README.md").read_text()
