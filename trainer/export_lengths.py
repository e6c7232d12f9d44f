"""Token lengths of a chat-JSONL export under the tokenizer that will train on it, and the
``max_length`` that keeps every answer: a trainer that truncates a line to its sequence limit (TRL's
``SFTTrainer`` keeps the first ``max_length`` tokens) cuts the completion, which comes last."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel
from transformers import PreTrainedTokenizerBase

from trainer.models import load_tokenizer

LINES_PER_BATCH = 256


class TokenLengths(BaseModel):
    """Tokens per exported line (prompt and completion in the tokenizer's chat template)."""

    tokenizer: str
    lines: int
    longest: int
    median: int
    p99: int

    @property
    def max_length(self) -> int:
        """The smallest sequence limit that keeps every line whole."""
        return self.longest


def line_lengths(path: str | Path, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Tokens of each line of the export at ``path``, as its chat template renders the whole conversation."""
    lengths: list[int] = []
    batch: list[list[dict]] = []

    def flush() -> None:
        texts = tokenizer.apply_chat_template(batch, tokenize=False)
        lengths.extend(len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"])
        batch.clear()

    with Path(path).open(encoding="utf-8") as lines:
        for line in lines:
            row = json.loads(line)
            batch.append([*row["prompt"], *row["completion"]])
            if len(batch) == LINES_PER_BATCH:
                flush()
    if batch:
        flush()
    return lengths


def token_lengths(path: str | Path, tokenizer_path: str | Path) -> TokenLengths:
    """The export's lengths under the tokenizer of the local model folder ``tokenizer_path``."""
    lengths = sorted(line_lengths(path, load_tokenizer(tokenizer_path)))
    if not lengths:
        raise ValueError(f"{path} has no lines to measure")
    return TokenLengths(
        tokenizer=str(tokenizer_path),
        lines=len(lengths),
        longest=lengths[-1],
        median=lengths[len(lengths) // 2],
        p99=lengths[min(len(lengths) - 1, (99 * len(lengths)) // 100)],
    )
