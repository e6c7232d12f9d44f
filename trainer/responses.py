"""Held-out responses, sampled from a fixed seed and judged on their records' screens (PROTOCOL.md §2).

The SFT and OPTD runs report, before the first update and at each evaluation, the share of
sampled responses that parse, the share executable on the screen the record was taken on, and the
rejection reasons counted. The check is the evaluation's (``evaluation.executable``: the replay
cursor and the environment's legality); it and the data stack are imported when a report is made,
not with this module, so the trainer's modules load where only torch and transformers are.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import PreTrainedTokenizerBase

from trainer.data import RecordText

if TYPE_CHECKING:
    from evaluation.executable import RecordScreens

EVAL_SEED_OFFSET = 1_000_003  # the held-out samples' RNG stream, apart from the training one


@contextmanager
def seeded(seed: int, device: torch.device) -> Iterator[None]:
    """Sampling from its own stream (``seed`` offset): it neither depends on nor disturbs the training
    samples, so a resumed run samples what an uninterrupted one would."""
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed + EVAL_SEED_OFFSET)
        yield


def record_id(record: RecordText) -> str:
    """The records table's ``record_id`` (a state's key is ``mode/record_id``)."""
    return record.key.split("/", 1)[1]


def record_screens_for(lake: str | Path, records: Sequence[RecordText]) -> RecordScreens:
    """The screens the records were taken on, placed once per run (the lake's steps replayed)."""
    from evaluation.executable import record_screens  # the data stack, for reports only

    return record_screens(lake, [record_id(r) for r in records])


def response_shares(
    tokenizer: PreTrainedTokenizerBase,
    records: Sequence[RecordText],
    responses: Sequence[list[int]],
    screens: RecordScreens,
) -> dict[str, Any]:
    """``parse_share``, ``executable_share`` (over the responses whose record has a screen: ``judged``),
    the rejection reasons counted, and the records without a screen counted by why."""
    from evaluation.executable import judge_responses

    texts = tokenizer.batch_decode(responses, skip_special_tokens=True)
    return judge_responses(screens, [record_id(r) for r in records], texts).as_json()
