"""The tiny model's chat template: ChatML text, and generation markers around the answer, so a trainer
that reads them (TRL's ``assistant_only_loss``) learns the answer and not the prompt."""

from __future__ import annotations

from trainer.data import prompt_ids, response_ids
from trainer.models import train_tokenizer

MESSAGES = [
    {"role": "system", "content": "You simulate one shopper."},
    {"role": "user", "content": "Screen: feed. Items in view: 1. Blue Mug"},
    {"role": "assistant", "content": '{"rationale":"I like mugs","action":{"type":"end"}}'},
]


def tokenizer():
    texts = [m["content"] for m in MESSAGES] * 20
    return train_tokenizer(texts, vocab_size=300)


def test_the_text_is_plain_chatml():
    rendered = tokenizer().apply_chat_template(MESSAGES, tokenize=False)
    turns = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in MESSAGES)
    assert rendered == "<|bos|>" + turns


def test_the_assistant_mask_covers_the_answer_and_its_end_of_turn_only():
    tok = tokenizer()
    encoded = tok.apply_chat_template(MESSAGES, return_dict=True, return_assistant_tokens_mask=True)
    ids, mask = encoded["input_ids"], encoded["assistant_masks"]
    answer = [i for i, m in zip(ids, mask, strict=True) if m]
    # what training itself scores: the response's ids after the prompt's, its eos the end of turn
    assert answer == response_ids(tok, MESSAGES[-1]["content"])
    assert ids[: len(ids) - len(answer) - 1] == prompt_ids(tok, MESSAGES[:-1])
