"""The screen-id loss: after a click's opening, the probability of writing any of the ids a feed state's
click line lists; checked against a float64 reference, and in a run whose tokenizer holds every id."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from tests.extractors.tinylake import ITEM
from tests.trainer.conftest import tiny_model
from tests.trainer.test_optd import train_settings, write_lake
from trainer.data import RecordText, encode, load_records
from trainer.models import train_tokenizer
from trainer.optd import HiddenStates
from trainer.run import catalog_item_ids, run_sft, starting_model
from trainer.sft import IdNotOneToken, screen_id_batch, screen_id_nll
from transforms.click_line import CLICK_ID_PREFIX, click_ids_signature, listed_click_ids

IDS = ["i_00aa11bb22cc33dd", "i_44ee55ff66aa77bb", "i_8899aabbccddeeff", "i_0123456789abcdef"]


def feed_prompt(shown: list[str], step: int) -> str:
    cards = "\n".join(f"{n}. card {n} | id {i}" for n, i in enumerate(shown, 1))
    return f"Step {step}.\n{cards}\n\n## Executable actions\n- {click_ids_signature(shown)}\n- end\n\nYour action?"


def small_model_rows() -> list[dict[str, object]]:
    """Four trajectories of four feed steps in the small model's format: the click line lists the ids
    in view and every response writes its action first, a click by its id alone."""
    rows = []
    for t in range(4):
        for step in range(4):
            shown = [IDS[(t + step) % 4], IDS[(t + step + 1) % 4]]
            if step % 2:
                action, reason = {"type": "click", "target_item_id": shown[0]}, "That one."
            else:
                action, reason = {"type": "scroll_down", "distance": 300}, "Nothing yet."
            response = json.dumps({"action": action, "rationale": reason}, separators=(",", ":"))
            rows.append({
                "record_id": f"t{t}:{step}", "session_id": f"t{t}", "user_id": f"u{t}", "mode": "single",
                "system": "You are a shopper.", "prompt": feed_prompt(shown, step), "response": response,
                "action": action["type"], "intent": None, "split": "test" if t == 3 else "train",
                "trajectory_id": f"t{t}", "step": step,
            })  # fmt: skip
    return rows


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> Path:
    return write_lake(tmp_path_factory.mktemp("screen-ids"), small_model_rows())


@pytest.fixture(scope="module")
def records(lake) -> list[RecordText]:
    return load_records(lake, ["train"], ["single"])[0]


@pytest.fixture(scope="module")
def tokenizer(records):
    texts = [t for r in records for t in (r.system, r.prompt, r.response)]
    return train_tokenizer(texts, 400, whole_tokens=IDS)


def test_a_click_line_lists_the_ids_in_view_and_reads_back():
    prompt = feed_prompt(IDS[:3], 0)
    assert '- click {"target_item_id": one of "i_00aa11bb22cc33dd", "i_44ee55ff66aa77bb", ' in prompt
    assert listed_click_ids(prompt) == IDS[:3]
    assert listed_click_ids("## Executable actions\n- end") == []


@pytest.mark.parametrize("tail", [None, 12])
def test_the_screen_id_loss_matches_a_float64_reference(records, tokenizer, tail):
    states, _ = encode(records, tokenizer, 10_000, 10_000)
    model = tiny_model(tokenizer, seed=3)
    batch = screen_id_batch(states, tokenizer, tail)
    assert batch is not None and len(batch.last) == len(states)  # every state lists ids
    body = HiddenStates(model)
    got = screen_id_nll(body, body.head, batch, len(tokenizer)).detach()

    reference = model.to(torch.float64).eval()
    opening = tokenizer(CLICK_ID_PREFIX, add_special_tokens=False)["input_ids"]
    for k, state in enumerate(states):
        context = (state.prompt_ids[-tail:] if tail else state.prompt_ids) + opening
        with torch.no_grad():
            logits = reference(input_ids=torch.tensor([context])).logits[0, -1, : len(tokenizer)]
        probs = torch.softmax(logits, dim=-1)
        listed = [tokenizer.convert_tokens_to_ids(i) for i in listed_click_ids(state.record.prompt)]
        expected = -math.log(sum(float(probs[i]) for i in listed))
        assert float(got[k]) == pytest.approx(expected, abs=1e-5)


def test_an_id_of_several_tokens_is_one_clear_error(records):
    plain = train_tokenizer([t for r in records for t in (r.system, r.prompt, r.response)], 400)
    states, _ = encode(records, plain, 10_000, 10_000)
    with pytest.raises(IdNotOneToken, match=r"tiny\.item_id_tokens"):
        screen_id_batch(states, plain, None)


def test_a_run_with_the_screen_id_loss_reports_it_and_writes_its_ids_as_one_token(lake, records, tmp_path):
    tiny = {"vocab_size": 400, "hidden_size": 32, "intermediate_size": 64, "num_layers": 2,
            "num_heads": 2, "num_kv_heads": 1, "whole_tokens": IDS}  # fmt: skip
    settings = train_settings(steps=2, screen_id_weight=1.0, screen_id_states=4, screen_id_tail=24, tiny=tiny)
    summary = run_sft(settings, lake, tmp_path / "run", progress=False)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if r["kind"] == "train"]
    assert len(trained) == 2 and all(r["screen_id"] > 0 for r in trained)
    # the update's loss is the responses' mean NLL plus the screen-id states' sum over the update's states
    assert all(r["loss"] == pytest.approx(r["nll"] + r["screen_id"]) for r in trained)
    # held out, the probability of a listed id after a click's opening, the whole prompt read
    evaluated = [r for r in rows if r["kind"] == "eval"]
    assert evaluated and all(0 < r["screen_id_mass"] < 1 for r in evaluated)
    _, tokenizer = starting_model(records, settings, None)
    # the records write the action first: the tokenizer has that order's fixed pieces as whole tokens
    for piece in ('{"action":{"type":"', '"},"rationale":"', *IDS):
        assert len(tokenizer(piece, add_special_tokens=False)["input_ids"]) == 1, piece
    assert Path(summary.checkpoint).is_dir()


def test_item_id_tokens_take_every_catalog_id_of_the_lake(tiny_lake):
    assert catalog_item_ids(tiny_lake) == sorted(set(ITEM.values()))
    records, _ = load_records(tiny_lake, ["train"], ["single"])
    settings = train_settings(tiny={"vocab_size": 400, "item_id_tokens": True})
    _, tokenizer = starting_model(records, settings, None, tiny_lake)
    for item_id in ITEM.values():
        assert len(tokenizer(item_id, add_special_tokens=False)["input_ids"]) == 1
    with pytest.raises(ValueError, match="needs the lake"):
        starting_model(records, settings, None)
