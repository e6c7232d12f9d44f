"""SFT warm-up: teacher-forced NLL of the gold responses, per-state token means, equal state weights.

Logits are computed for response positions only: the decoder's final hidden states
are gathered at the positions that predict response tokens before the LM head, so a
long prompt costs attention, not a [T, V] logits buffer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from trainer.data import Batch
from trainer.loop import LossSums


def response_hidden(model: PreTrainedModel, batch: Batch) -> torch.Tensor:
    """Final hidden states [N, H] at the positions that predict the batch's response tokens."""
    out = model.base_model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)
    return out.last_hidden_state[batch.rows, batch.positions]


def response_logits(model: PreTrainedModel, hidden: torch.Tensor, vocab: int) -> torch.Tensor:
    """Logits [N, vocab] in float32 at least (even under autocast), padded vocabulary rows left out."""
    head = model.get_output_embeddings()
    dtype = torch.promote_types(hidden.dtype, torch.float32)
    with torch.autocast(hidden.device.type, enabled=False):
        bias = None if head.bias is None else head.bias[:vocab].to(dtype)
        return F.linear(hidden.to(dtype), head.weight[:vocab].to(dtype), bias)


def state_means(values: torch.Tensor, owner: torch.Tensor, n_states: int) -> torch.Tensor:
    """Mean of ``values`` per state [n_states] (``owner`` gives each value's state)."""
    sums = torch.zeros(n_states, dtype=values.dtype, device=values.device).index_add(0, owner, values)
    counts = torch.bincount(owner, minlength=n_states).to(values.dtype)
    return sums / counts


def state_nll(model: PreTrainedModel, batch: Batch, vocab: int) -> torch.Tensor:
    """Each state's mean NLL over its own response tokens [n_states]."""
    logits = response_logits(model, response_hidden(model, batch), vocab)
    nll = F.cross_entropy(logits, batch.labels, reduction="none")
    return state_means(nll, batch.owner, batch.n_states)


def sft_loss(model: PreTrainedModel, batch: Batch, vocab: int) -> LossSums:
    """Sum over the batch's states of their mean response NLL (the step divides by the update's states)."""
    total = state_nll(model, batch, vocab).sum()
    return LossSums(total=total, parts={"nll": total.detach()}, tokens=batch.n_tokens)


@torch.no_grad()
def held_out_loss(model: PreTrainedModel, batches: list[Batch], vocab: int) -> float:
    """Mean over states of the state's mean response NLL."""
    model.eval()
    per_state = torch.cat([state_nll(model, b, vocab) for b in batches])
    return float(per_state.mean())
