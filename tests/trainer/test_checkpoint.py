"""Checkpoint folders: a Hugging Face folder a model user takes as it is, the training state beside it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, GenerationConfig, LlamaConfig, LlamaForCausalLM

from tests.trainer.conftest import tiny_model
from trainer.models import model_vocab_size, save_model


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
