"""Catalog ids anonymised per state (``TrainSettings.anonymise_item_ids``).

Each drawn state's item ids, wherever they stand in its prompt and response, are replaced by catalog
ids drawn at random, one map for the whole state, as reading-comprehension data anonymises its
entities. An id then means nothing beyond the state it appears in: a model can copy it from the
screen, never remember which screens show it. That is the copy a click on a new shopper's screen
needs (bench/RESULTS.md, seventh round). Every id must be one token (``tiny.item_id_tokens``).

The draws come from torch's global generator, which a checkpoint saves, so a resumed run anonymises
as the uninterrupted one does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch
from transformers import PreTrainedTokenizerBase

from trainer.data import EncodedState
from trainer.sft import one_token


def id_token_table(tokenizer: PreTrainedTokenizerBase, item_ids: Sequence[str]) -> torch.Tensor:
    """The token of every catalog id, sorted ([n]); IdNotOneToken where an id is several tokens."""
    if not item_ids:
        raise ValueError("anonymise_item_ids needs a catalog with items to draw ids from")
    return torch.tensor(sorted({one_token(tokenizer, item_id) for item_id in item_ids}))


def anonymised(state: EncodedState, id_tokens: torch.Tensor) -> EncodedState:
    """``state`` with each distinct id token mapped to its own random catalog id token (``id_map``)."""
    tokens = torch.tensor(state.prompt_ids + state.response_ids)
    present = torch.unique(tokens[torch.isin(tokens, id_tokens)])
    if len(present) > len(id_tokens):
        raise ValueError(f"a state shows {len(present)} ids, more than the catalog's {len(id_tokens)}")
    drawn = id_tokens[torch.randperm(len(id_tokens))[: len(present)]]
    id_map = dict(zip(present.tolist(), drawn.tolist(), strict=True))
    return replace(
        state,
        prompt_ids=[id_map.get(t, t) for t in state.prompt_ids],
        response_ids=[id_map.get(t, t) for t in state.response_ids],
        id_map=id_map,
    )
