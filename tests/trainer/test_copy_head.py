"""The copy head: wired into a fresh tiny model, a click's opening writes one of the ids in view and nothing
else does; its weights stay as wired through updates, a save and a load; SFT leaves the copied id out."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from tests.trainer.test_optd import train_settings
from trainer.config import TinyModelSettings
from trainer.copy_head import (
    CopyHeadMismatch,
    FixedWeights,
    copied_tokens,
    cue_token,
    wire_copy_head,
)
from trainer.data import RecordText, collate, encode
from trainer.loop import Trainer, adam, schedule
from trainer.models import TinyModelSpec, build_tiny_model, load_pretrained, save_model, train_tokenizer
from trainer.pieces import ACTION_FIRST_PIECES, RESPONSE_PIECES
from trainer.run import run_sft
from trainer.sft import sft_loss
from transforms.click_line import CLICK_ID_PREFIX, click_ids_signature

rng = random.Random(5)
IDS = sorted({"i_" + "".join(rng.choice("0123456789abcdef") for _ in range(16)) for _ in range(400)})
SPEC = TinyModelSpec(hidden_size=128, intermediate_size=256, num_layers=2, num_heads=4, num_kv_heads=4,
                     tie_embeddings=False)  # fmt: skip


def feed_prompt(shown: list[str]) -> str:
    cards = "\n".join(f"{n}. a card about {n * 7} things | id {i}" for n, i in enumerate(shown, 1))
    return f"## Current observation\n{cards}\n\n## Executable actions\n- {click_ids_signature(shown)}\n- end"


def response(action: dict[str, object]) -> str:
    return json.dumps({"action": action, "rationale": "I look at it."}, separators=(",", ":"))


def record(k: int, shown: list[str]) -> RecordText:
    action = {"type": "click", "target_item_id": shown[k % len(shown)]} if k % 2 else {"type": "end"}
    return RecordText(key=f"single/s{k}:1", system="You are a shopper.", prompt=feed_prompt(shown),
                      response=response(action), action=str(action["type"]), intent=None, split="train",
                      session_id=f"s{k}", user_id=f"u{k}")  # fmt: skip


def screens(n: int) -> list[list[str]]:
    pick = random.Random(11)
    return [pick.sample(IDS, 4) for _ in range(n)]


@pytest.fixture(scope="module")
def tokenizer():
    texts = [
        t for k, shown in enumerate(screens(40)) for t in (feed_prompt(shown), record(k, shown).response)
    ]
    return train_tokenizer(texts, 400, [*RESPONSE_PIECES, *ACTION_FIRST_PIECES, *IDS])


def wired(tokenizer, seed: int = 0):
    torch.manual_seed(seed)
    model = build_tiny_model(tokenizer, SPEC)
    wire_copy_head(model, tokenizer, IDS)
    return model.eval()


def next_token_probs(model, tokenizer, shown: list[str], answer: str) -> torch.Tensor:
    messages = [
        {"role": "system", "content": "You are a shopper."},
        {"role": "user", "content": feed_prompt(shown)},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) + answer
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids
    with torch.no_grad():
        return model(ids).logits[0].softmax(-1)


def id_rows(tokenizer, ids: list[str]) -> list[int]:
    return tokenizer.convert_tokens_to_ids(ids)


def test_a_click_opening_writes_an_id_in_view_and_no_other_position_writes_ids(tokenizer):
    model = wired(tokenizer)
    every_id = id_rows(tokenizer, IDS)
    for shown in screens(8):
        at_opening = next_token_probs(model, tokenizer, shown, CLICK_ID_PREFIX)[-1]
        assert float(at_opening[id_rows(tokenizer, shown)].sum()) > 0.99
        # a scroll's answer: at none of its positions does any id stand out of the untrained model's
        # near-uniform next token (the copy writes nothing there)
        scrolling = next_token_probs(model, tokenizer, shown, '{"action":{"type":"scroll_down","distance":3')
        assert float(scrolling[:, every_id].max()) < 2 / scrolling.shape[-1]


def test_the_cue_is_the_piece_a_click_writes_before_its_id(tokenizer):
    some_id = id_rows(tokenizer, IDS[:1])[0]
    assert tokenizer.convert_ids_to_tokens(cue_token(tokenizer, some_id)) == '","target_item_id":"'


def test_updates_leave_the_circuit_as_wired_and_train_the_rest(tokenizer):
    model = wired(tokenizer).train()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    states, _ = encode([record(k, shown) for k, shown in enumerate(screens(8))], tokenizer, 4096, 256)
    batch = collate(states, tokenizer.pad_token_id)
    optimizer = adam(model, 1e-2, (0.9, 0.999), 1e-8)
    trainer = Trainer(model, optimizer, schedule(optimizer, 0, 10), clip=1.0, device=torch.device("cpu"),
                      bf16=False, fixed=FixedWeights.of(model))  # fmt: skip
    for _ in range(3):
        trainer.step([batch], lambda m, b: sft_loss(m, b, len(tokenizer)), len(states))
    fixed = FixedWeights.of(model)
    for parameter, dim, index in fixed.slices:
        name = next(n for n, p in model.named_parameters() if p is parameter)
        assert torch.equal(
            parameter.detach().index_select(dim, index), before[name].index_select(dim, index)
        ), name
    moved = [n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])]
    assert "model.layers.1.mlp.up_proj.weight" in moved and "lm_head.weight" in moved
    shown = screens(1)[0]
    at_opening = next_token_probs(model.eval(), tokenizer, shown, CLICK_ID_PREFIX)[-1]
    assert float(at_opening[id_rows(tokenizer, shown)].sum()) > 0.99


def test_a_saved_checkpoint_loads_with_its_circuit_recorded(tokenizer, tmp_path):
    model = wired(tokenizer)
    save_model(model, tokenizer, tmp_path / "ckpt")
    loaded, loaded_tokenizer = load_pretrained(tmp_path / "ckpt")
    assert json.loads((tmp_path / "ckpt" / "config.json").read_text())["tie_word_embeddings"] is False
    assert torch.equal(copied_tokens(loaded), torch.tensor(sorted(id_rows(tokenizer, IDS))))
    assert FixedWeights.of(loaded) is not None
    shown = screens(1)[0]
    assert torch.allclose(next_token_probs(loaded.eval(), loaded_tokenizer, shown, CLICK_ID_PREFIX),
                          next_token_probs(model, tokenizer, shown, CLICK_ID_PREFIX), atol=1e-6)  # fmt: skip


def test_sft_leaves_the_copied_id_out_of_its_loss(tokenizer):
    states, _ = encode([record(1, screens(1)[0])], tokenizer, 4096, 256)
    batch = collate(states, tokenizer.pad_token_id)
    copied = torch.tensor(id_rows(tokenizer, IDS))
    kept = batch.unscored(copied)
    assert len(kept.labels) == len(batch.labels) - 1
    assert not torch.isin(kept.labels, copied).any() and torch.isin(batch.labels, copied).sum() == 1
    assert batch.unscored(None) is batch


def test_the_copy_head_is_refused_where_it_cannot_be_wired(tokenizer):
    with pytest.raises(ValueError, match="item_id_tokens"):
        TinyModelSettings(copy_head=True, hidden_size=128, num_heads=4, num_kv_heads=4)
    with pytest.raises(ValueError, match="num_kv_heads = 4"):
        TinyModelSettings(copy_head=True, item_id_tokens=True, hidden_size=128, num_heads=4, num_kv_heads=2)
    tied = build_tiny_model(tokenizer, TinyModelSpec(hidden_size=128, num_heads=4, num_kv_heads=4))
    with pytest.raises(CopyHeadMismatch, match="untied"):
        wire_copy_head(tied, tokenizer, IDS)


def test_a_run_with_the_copy_head_keeps_it_in_its_checkpoint(tiny_lake, train_records, tmp_path):
    tiny = {"vocab_size": 400, "hidden_size": 128, "intermediate_size": 128, "num_layers": 2, "num_heads": 4,
            "num_kv_heads": 4, "item_id_tokens": True, "copy_head": True}  # fmt: skip
    summary = run_sft(train_settings(steps=2, tiny=tiny), tiny_lake, tmp_path / "run", progress=False)
    model, tokenizer = load_pretrained(summary.checkpoint)
    record = model.config.copy_head
    assert record["layer"] == 0 and record["heads"] == 2
    ids = [t for t in tokenizer.get_added_vocab() if t.startswith("i_")]
    assert len(copied_tokens(model)) == len(ids)
    shown = ids[:3]
    at_opening = next_token_probs(model.eval(), tokenizer, shown, CLICK_ID_PREFIX)[-1]
    assert float(at_opening[id_rows(tokenizer, shown)].sum()) > 0.99
    assert "copy head wired at initialisation" in (Path(summary.checkpoint) / "README.md").read_text()
