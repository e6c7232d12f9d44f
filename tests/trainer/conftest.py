"""A hand-built lake with short prompts (tests/extractors/tinylake.py) and a tiny model for it."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
import torch

from tests.extractors.tinylake import records_frame, write_tiny_lake
from trainer.data import RecordText, encode, load_records
from trainer.models import TinyModelSpec, build_tiny_model, train_tokenizer
from transforms.lake import write_table

TINY = TinyModelSpec(
    vocab_size=400, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2, num_kv_heads=1
)


def answered_records() -> pl.DataFrame:
    """The hand-built records with a gold response each, as after extraction: a short rationale and the action."""
    frame = records_frame()
    response = pl.concat_str(
        pl.lit('{"rationale":"I choose '),
        pl.col("action"),
        pl.lit('.","action":'),
        pl.col("action_json"),
        pl.lit("}"),
    )
    filled = frame.with_columns(response.alias("response"))
    if "gold_missing" in frame.columns:
        filled = filled.with_columns(pl.lit(None, dtype=pl.String).alias("gold_missing"))
    return filled


@pytest.fixture(scope="module")
def tiny_lake(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tinylake")
    write_tiny_lake(path)
    write_table(path, "records", answered_records())
    return path


@pytest.fixture(scope="module")
def train_records(tiny_lake: Path) -> list[RecordText]:
    records, _ = load_records(tiny_lake, ["train"], ["single"])
    return records


@pytest.fixture(scope="module")
def tokenizer(train_records):
    return train_tokenizer(
        (t for r in train_records for t in (r.system, r.prompt, r.response)), TINY.vocab_size
    )


@pytest.fixture(scope="module")
def states(train_records, tokenizer):
    encoded, dropped = encode(train_records, tokenizer, 10_000, 10_000)
    assert not dropped
    return encoded


def files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` by its path relative to it, with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def tiny_model(tokenizer, seed: int = 0, spec: TinyModelSpec = TINY):
    torch.manual_seed(seed)
    return build_tiny_model(tokenizer, spec)
