"""Checkpoint folders: a Hugging Face folder a model user takes as it is, the training state beside it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard
from transformers import AutoModelForCausalLM, GenerationConfig, LlamaConfig, LlamaForCausalLM

import trainer.checkpoint as checkpoint
from tests.trainer.conftest import tiny_model
from trainer.checkpoint import latest, read_meta, restore_training_state, save_checkpoint, state_folder
from trainer.loop import adam, schedule
from trainer.model_card import model_card
from trainer.models import model_vocab_size, save_model

MODEL_FILES = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "README.md",
}
META = {"stage": "sft", "settings": {"steps": 40, "lr": 5e-5}, "data_hash": "d" * 64}


def trained(tokenizer, seed: int = 0):
    """A tiny model after one Adam update, so that the optimizer has a state to save."""
    model = tiny_model(tokenizer, seed)
    optimizer = adam(model, 1e-2, (0.9, 0.999), 1e-8)
    scheduler = schedule(optimizer, 1, 4)
    ids = torch.tensor([tokenizer("I choose scroll_down.", add_special_tokens=False)["input_ids"]])
    model(ids, labels=ids).loss.backward()
    optimizer.step()
    scheduler.step()
    return model, optimizer, scheduler


def save(out: Path, step: int, parts, meta=META, keep: int = 2) -> Path:
    model, tokenizer, optimizer, scheduler = parts
    return save_checkpoint(out, step, model, tokenizer, optimizer, scheduler, meta, keep=keep)


def names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_the_model_folder_holds_only_what_a_model_user_needs_and_the_state_lies_beside_it(
    tokenizer, tmp_path
):
    model, optimizer, scheduler = trained(tokenizer)
    folder = save(tmp_path, 7, (model, tokenizer, optimizer, scheduler))
    assert folder == tmp_path / "checkpoints" / "step-000007"
    assert set(names(folder)) == MODEL_FILES
    state = state_folder(folder)
    assert state == tmp_path / "trainer_state" / "step-000007"
    assert names(state) == ["trainer.json", "trainer_state.pt"]
    # nothing staged is left behind
    assert names(tmp_path) == ["checkpoints", "trainer_state"]
    assert names(tmp_path / "checkpoints") == names(tmp_path / "trainer_state") == ["step-000007"]
    assert read_meta(folder) == {"step": 7, "world_size": 1, **META}
    assert latest(tmp_path) == folder

    loaded = AutoModelForCausalLM.from_pretrained(folder)
    for name, param in model.named_parameters():
        torch.testing.assert_close(dict(loaded.named_parameters())[name], param, rtol=0, atol=0)
    # the state is found from the model folder: Adam's moments after its one update come back
    fresh = adam(loaded, 1e-2, (0.9, 0.999), 1e-8)
    fresh_scheduler = schedule(fresh, 1, 4)
    restore_training_state(folder, loaded, fresh, fresh_scheduler)
    assert fresh_scheduler.last_epoch == scheduler.last_epoch == 1
    by_name = dict(zip([n for n, _ in model.named_parameters()], model.parameters(), strict=True))
    loaded_by_name = dict(loaded.named_parameters())
    name = "model.layers.0.mlp.up_proj.weight"
    expected = optimizer.state[by_name[name]]["exp_avg"]
    torch.testing.assert_close(fresh.state[loaded_by_name[name]]["exp_avg"], expected, rtol=0, atol=0)


def test_a_reader_of_the_folder_samples_as_the_protocol_does(tokenizer, tmp_path):
    model = tiny_model(tokenizer)
    model.generation_config.repetition_penalty = 1.3  # as some pretrained bases ship
    save_model(model, tokenizer, tmp_path / "model")
    config = GenerationConfig.from_pretrained(tmp_path / "model")
    # PROTOCOL.md §3: temperature 1.0, top-p 0.95, 512 new tokens; sampled from the plain distribution
    assert (config.do_sample, config.temperature, config.top_p, config.top_k, config.max_new_tokens) == (
        True,
        1.0,
        0.95,
        0,
        512,
    )
    assert config.repetition_penalty in (None, 1.0)
    # what fit_generation_config set is kept: stop at the eos, pad with the pad token, never a padded row
    assert (config.eos_token_id, config.pad_token_id) == (tokenizer.eos_token_id, tokenizer.pad_token_id)
    assert config.suppress_tokens == list(range(len(tokenizer), model_vocab_size(model)))
    # the run's own model keeps its config: the held-out sampling passes its settings anyway
    assert model.generation_config.repetition_penalty == 1.3


def test_the_model_card_names_the_base_the_data_and_the_held_out_figures(tokenizer, tmp_path):
    meta = {
        **META,
        "base": "/models/qwen2.5-0.5b-instruct",
        "lake": "/data/lake",
        "train_states": 120,
        "held_out_states": 12,
        "left_out": {"gold_missing": 3, "prompt_too_long": 0},
        "held_out_loss_start": 6.23456,
        "held_out_start": {"held_out_loss": 6.23456, "parse_share": 0.0, "executable_share": None},
        "held_out_end": {
            "kind": "eval",
            "step": 40,
            "held_out_loss": 0.5,
            "parse_share": 0.75,
            "executable_share": 2 / 3,
        },
        "sampler": {"drawn": 160},
    }
    model, optimizer, scheduler = trained(tokenizer)
    folder = save(tmp_path, 40, (model, tokenizer, optimizer, scheduler), meta)
    card = ModelCard.load(folder / "README.md")  # Hugging Face's own reader of the front matter
    assert card.data.to_dict() == {
        "library_name": "transformers",
        "pipeline_tag": "text-generation",
        "base_model": "/models/qwen2.5-0.5b-instruct",
        "tags": ["trajforge", "user-simulator", "shopping", "sft"],
    }
    text = card.text
    assert "# trajforge shopper simulator (SFT)" in text
    assert "after update 40 of 40" in text
    assert "`/models/qwen2.5-0.5b-instruct`, fine-tuned" in text
    assert f"| data hash (states and tokenizer) | `{'d' * 64}` |" in text
    assert "| lake | `/data/lake` |" in text
    assert "| train states | 120 |" in text and "| held-out states | 12 |" in text
    assert "| 3: gold_missing 3 |" in text  # a reason counted 0 times is not one
    # 6.23456 to four places; 2/3 to three; an executable share nobody could judge is a dash
    assert "| | start (before the first update) | end (update 40) |" in text
    assert "| held-out loss (response NLL per token, nats) | 6.2346 | 0.5000 |" in text
    assert "| parse share (responses that are the JSON shape) | 0.000 | 0.750 |" in text
    assert "| executable share (on the record's screen) | – | 0.667 |" in text
    assert "objective" not in text.split("## Held-out figures")[1].split("##")[0]  # OPTD's, not SFT's
    settings = text.split("```json\n")[1].split("\n```")[0]
    assert json.loads(settings) == META["settings"]
    assert '{"rationale": ' in text and "AutoModelForCausalLM.from_pretrained(folder)" in text


def test_an_optd_card_distils_from_its_teacher_and_a_card_tolerates_what_is_missing():
    teacher = "runs/sft/checkpoints/step-000040"
    optd = model_card(
        {"stage": "optd", "teacher": teacher, "held_out_start": {"probe_objective": 1.5, "parse_share": 0.25}}
    )
    front = optd.split("---\n")[1]
    assert f'base_model: "{teacher}"' in front and '- "optd"' in front
    assert "2. OPTD (this checkpoint)" in optd and f"its checkpoint `{teacher}` is the teacher" in optd
    # only the start is known: one column, and only the figures it has
    assert (
        "| | start (before the first update) |\n|---|---|\n| parse share (responses that are the JSON shape) | 0.250 |"
        in optd
    )
    assert "| OPTD objective on the probe states | 1.5000 |" in optd
    assert "held-out loss" not in optd and "executable share (on" not in optd

    bare = model_card({})
    assert bare.startswith("---\nlibrary_name: transformers\npipeline_tag: text-generation\ntags:\n")
    assert "base_model" not in bare and "## Held-out figures" not in bare and "## Settings" not in bare
    assert "## How to use" in bare and "## Data\n\nNot recorded." in bare


def test_the_cards_example_loads_the_folder_and_answers(tokenizer, tmp_path, capsys):
    model, optimizer, scheduler = trained(tokenizer)
    folder = save(tmp_path, 1, (model, tokenizer, optimizer, scheduler))
    example = (folder / "README.md").read_text().split("```python\n")[1].split("```")[0]
    assert 'folder = "path/to/this/folder"' in example
    namespace: dict = {}
    torch.manual_seed(0)
    exec(example.replace("path/to/this/folder", str(folder)), namespace)
    prompt, output = namespace["inputs"]["input_ids"], namespace["output"]
    # the chat template ends the prompt with the assistant's turn; the answer is at most the protocol's 512
    assert tokenizer.decode(prompt[0]).endswith("<|im_start|>assistant\n")
    assert 0 < output.shape[1] - prompt.shape[1] <= 512
    assert capsys.readouterr().out.strip("\n") == tokenizer.decode(
        output[0, prompt.shape[1] :], skip_special_tokens=True
    ).strip("\n")


def test_pruning_removes_both_halves_and_a_step_needs_both_to_count(tokenizer, tmp_path):
    model, optimizer, scheduler = trained(tokenizer)
    parts = (model, tokenizer, optimizer, scheduler)
    for step in (1, 2, 3):
        save(tmp_path, step, parts, keep=2)
    models, states = tmp_path / "checkpoints", tmp_path / "trainer_state"
    assert names(models) == names(states) == ["step-000002", "step-000003"]
    # a save stopped after its state was renamed, before its model folder was: step 4's state alone
    shutil.copytree(states / "step-000003", states / "step-000004")
    assert latest(tmp_path) == models / "step-000003"
    # a model folder whose state is gone cannot be resumed from
    shutil.rmtree(states / "step-000003")
    assert latest(tmp_path) == models / "step-000002"
    save(tmp_path, 5, parts, keep=2)
    # the newest two whole steps are 2 and 5; step 4's lone state goes. Step 3's lone model folder stays:
    # without its state nothing says which run it is, and pruning removes only the saving run's steps
    assert names(states) == ["step-000002", "step-000005"]
    assert names(models) == ["step-000002", "step-000003", "step-000005"]


def test_pruning_removes_only_the_saving_runs_steps_and_keeps_the_one_it_wrote(tokenizer, tmp_path):
    # an 8-update run left its steps 6 and 8 here, and someone a step folder of no run at all
    model, optimizer, scheduler = trained(tokenizer)
    parts = (model, tokenizer, optimizer, scheduler)
    for step in (6, 8):
        save(tmp_path, step, parts, meta=META | {"run": "earlier"}, keep=2)
    (tmp_path / "checkpoints" / "step-000009").mkdir()
    # a 2-update run keeping one checkpoint: sorted in with the earlier run's, its own would be the oldest
    for step in (1, 2):
        final = save(tmp_path, step, parts, meta=META | {"run": "this"}, keep=1)
    assert final == tmp_path / "checkpoints" / "step-000002" and set(names(final)) == MODEL_FILES
    assert read_meta(final)["run"] == "this"
    assert names(tmp_path / "checkpoints") == ["step-000002", "step-000006", "step-000008", "step-000009"]
    assert names(tmp_path / "trainer_state") == ["step-000002", "step-000006", "step-000008"]


def test_the_state_is_in_place_before_the_model_folder_appears(tokenizer, tmp_path, monkeypatch):
    model, optimizer, scheduler = trained(tokenizer)
    parts = (model, tokenizer, optimizer, scheduler)
    first = save(tmp_path, 1, parts)
    real_replace = os.replace

    def stopped_before_the_model_folder(src, dst):
        if Path(dst) == tmp_path / "checkpoints" / "step-000002":
            raise OSError("the machine went away")
        return real_replace(src, dst)

    monkeypatch.setattr(checkpoint.os, "replace", stopped_before_the_model_folder)
    with pytest.raises(OSError, match="went away"):
        save(tmp_path, 2, parts)
    # step 2's state was already in place; without its model folder the step does not count
    assert (tmp_path / "trainer_state" / "step-000002" / "trainer.json").is_file()
    assert not (tmp_path / "checkpoints" / "step-000002").exists()
    assert latest(tmp_path) == first
    monkeypatch.setattr(checkpoint.os, "replace", real_replace)
    again = save(tmp_path, 2, parts)  # the next save of the step replaces the leftovers
    assert latest(tmp_path) == again and set(names(again)) == MODEL_FILES
    assert (
        names(tmp_path / "checkpoints") == names(tmp_path / "trainer_state") == ["step-000001", "step-000002"]
    )


# --- RoPE settings that transformers 4.x reads ---------------------------------------------------

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 256,
}


def rope_model(tokenizer, rope_parameters: dict) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,  # head size 16: 8 rotation frequencies
        num_key_value_heads=1,
        max_position_embeddings=2048,
        rope_parameters=dict(rope_parameters),
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def test_the_config_carries_the_rope_base_where_transformers_4_reads_it(tokenizer, tmp_path):
    plain = rope_model(tokenizer, {"rope_type": "default", "rope_theta": 100000.0})
    save_model(plain, tokenizer, tmp_path / "plain")
    saved = json.loads((tmp_path / "plain" / "config.json").read_text())
    # 4.x would read no rope_theta as 10000 and rotate by other frequencies; the plain rotation has no scaling
    assert saved["rope_theta"] == 100000.0 and "rope_scaling" not in saved
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "plain")
    assert reloaded.config.rope_parameters == {"rope_type": "default", "rope_theta": 100000.0}
    inv_freq = reloaded.model.rotary_emb.inv_freq
    # frequency i of a head of 16 is base^(-2i/16): the second is 100000^(-1/8)
    assert float(inv_freq[1]) == pytest.approx(100000.0 ** (-1 / 8), rel=1e-6)
    torch.testing.assert_close(inv_freq, plain.model.rotary_emb.inv_freq, rtol=0, atol=0)

    scaled = rope_model(tokenizer, LLAMA3_ROPE)
    save_model(scaled, tokenizer, tmp_path / "scaled")
    saved = json.loads((tmp_path / "scaled" / "config.json").read_text())
    assert saved["rope_theta"] == 500000.0
    assert saved["rope_scaling"] == {k: v for k, v in LLAMA3_ROPE.items() if k != "rope_theta"}
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "scaled")
    assert reloaded.config.rope_parameters == LLAMA3_ROPE
    torch.testing.assert_close(
        reloaded.model.rotary_emb.inv_freq, scaled.model.rotary_emb.inv_freq, rtol=0, atol=0
    )


# transformers 4.57 with the hub client and tokenizers it accepts (the ones installed here are 5's)
TRANSFORMERS_4 = ("transformers==4.57.*", "huggingface-hub>=0.34,<1.0", "tokenizers>=0.22,<0.23")
READ_WITH_4 = """
import json, sys
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer
seen = {"version": transformers.__version__}
for folder in sys.argv[1:]:
    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    seen[folder] = {
        "rope_theta": model.config.rope_theta,
        "rope_scaling": model.config.rope_scaling,
        "inv_freq": model.model.rotary_emb.inv_freq.tolist(),
        "ids": tokenizer("I choose scroll_down.", add_special_tokens=False)["input_ids"],
        "chat_template": tokenizer.chat_template,
    }
print(json.dumps(seen))
"""


@pytest.mark.slow
def test_transformers_4_loads_the_folder_with_the_same_rope_and_tokenizer(tokenizer, tmp_path):
    target = tmp_path / "transformers4"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), *TRANSFORMERS_4],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if install.returncode != 0:
        pytest.skip(
            f"transformers 4.x could not be installed from the package index: {install.stderr[-400:]}"
        )
    models = {"plain": rope_model(tokenizer, {"rope_type": "default", "rope_theta": 100000.0})}
    models["scaled"] = rope_model(tokenizer, LLAMA3_ROPE)
    folders = {name: save_model(model, tokenizer, tmp_path / name) for name, model in models.items()}
    env = {**os.environ, "PYTHONPATH": str(target)}  # ahead of the installed transformers 5
    result = subprocess.run(
        [sys.executable, "-c", READ_WITH_4, *map(str, folders.values())],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["version"].startswith("4.")
    plain, scaled = seen[str(folders["plain"])], seen[str(folders["scaled"])]
    assert (plain["rope_theta"], plain["rope_scaling"]) == (100000.0, None)
    assert scaled["rope_theta"] == 500000.0 and scaled["rope_scaling"]["rope_type"] == "llama3"
    for name, read in (("plain", plain), ("scaled", scaled)):
        ours = models[name].model.rotary_emb.inv_freq
        torch.testing.assert_close(torch.tensor(read["inv_freq"]), ours, rtol=1e-6, atol=0)
        assert read["ids"] == tokenizer("I choose scroll_down.", add_special_tokens=False)["input_ids"]
        assert read["chat_template"] == tokenizer.chat_template
