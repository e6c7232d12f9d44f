"""The export's token lengths under a real tokenizer, and the max_length that keeps every answer."""

from __future__ import annotations

import json

import pytest

from trainer.export_lengths import token_lengths
from trainer.models import load_tokenizer, train_tokenizer


def conversation(n: int) -> dict:
    prompt = [{"role": "system", "content": "You are a shopper."},
              {"role": "user", "content": "On screen: " + ", ".join(f"item {k}" for k in range(n))}]  # fmt: skip
    answer = json.dumps({"action": "click", "rationale": "the third one " * n})
    return {"record_id": f"s:{n}", "prompt": prompt, "completion": [{"role": "assistant", "content": answer}]}


@pytest.fixture
def export(tmp_path):
    rows = [conversation(n) for n in (2, 9, 5)]
    texts = [m["content"] for row in rows for m in [*row["prompt"], *row["completion"]]]
    train_tokenizer(texts, vocab_size=300).save_pretrained(tmp_path / "tokenizer")
    path = tmp_path / "sft.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path, tmp_path / "tokenizer", rows


def answer_tokens_kept(tokenizer, row: dict, max_length: int) -> tuple[int, int]:
    """(answer tokens within the first ``max_length``, answer tokens in all), from the chat template's
    generation markers: what a trainer that truncates to ``max_length`` keeps of the answer."""
    encoded = tokenizer.apply_chat_template(
        [*row["prompt"], *row["completion"]], return_dict=True, return_assistant_tokens_mask=True
    )
    mask = encoded["assistant_masks"]
    return sum(mask[:max_length]), sum(mask)


def test_the_printed_max_length_keeps_every_answer_and_one_less_cuts_the_longest(export):
    path, folder, rows = export
    lengths = token_lengths(path, folder)
    tokenizer = load_tokenizer(folder)
    whole = [
        len(tokenizer.apply_chat_template([*r["prompt"], *r["completion"]], return_dict=True)["input_ids"])
        for r in rows
    ]
    assert lengths.lines == 3 and lengths.longest == max(whole) and lengths.median == sorted(whole)[1]
    for row in rows:
        kept, every = answer_tokens_kept(tokenizer, row, lengths.max_length)
        assert every > 0 and kept == every
    # below it, the longest line (n = 9) loses its answer's last token once the template's closing
    # tokens after the answer (its newline) are cut
    encoded = tokenizer.apply_chat_template(
        [*rows[1]["prompt"], *rows[1]["completion"]], return_dict=True, return_assistant_tokens_mask=True
    )
    tail = encoded["assistant_masks"][::-1].index(1)
    kept, every = answer_tokens_kept(tokenizer, rows[1], lengths.max_length - tail)
    assert kept == every and tail <= 2
    kept, every = answer_tokens_kept(tokenizer, rows[1], lengths.max_length - tail - 1)
    assert kept == every - 1
