"""SFT warm-up: teacher-forced NLL of the gold responses, per-state token means, equal state weights.

Logits are computed for response positions only: the decoder's final hidden states
are gathered at the positions that predict response tokens before the LM head, so a
long prompt costs attention, not a [T, V] logits buffer. The loss runs on the decoder
body (``HiddenStates``, what DDP or FSDP2 wraps under ``torchrun``) and the LM head
outside it, as the OPTD objective does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel

from trainer.data import Batch
from trainer.distributed import World, gradient_sync, sum_over_ranks, unsharded
from trainer.loop import LossSums
from trainer.optd import HiddenStates, response_positions

Head = Callable[[], tuple[torch.Tensor, torch.Tensor | None]]  # the LM head's weight and bias, whole


def response_logits(head: Head, hidden: torch.Tensor, vocab: int) -> torch.Tensor:
    """Logits [N, vocab] in float32 at least (even under autocast), padded vocabulary rows left out."""
    weight, bias = head()
    dtype = torch.promote_types(hidden.dtype, torch.float32)
    with torch.autocast(hidden.device.type, enabled=False):
        bias = None if bias is None else bias[:vocab].to(dtype)
        return F.linear(hidden.to(dtype), weight[:vocab].to(dtype), bias)


def state_means(values: torch.Tensor, owner: torch.Tensor, n_states: int) -> torch.Tensor:
    """Mean of ``values`` per state [n_states] (``owner`` gives each value's state)."""
    sums = torch.zeros(n_states, dtype=values.dtype, device=values.device).index_add(0, owner, values)
    counts = torch.bincount(owner, minlength=n_states).to(values.dtype)
    return sums / counts


def state_nll(body: nn.Module, head: Head, batch: Batch, vocab: int) -> torch.Tensor:
    """Each state's mean NLL over its own response tokens [n_states]."""
    logits = response_logits(head, response_positions(body, batch), vocab)
    nll = F.cross_entropy(logits, batch.labels, reduction="none")
    return state_means(nll, batch.owner, batch.n_states)


def nll_sums(body: nn.Module, head: Head, batch: Batch, vocab: int) -> LossSums:
    """Sum over the batch's states of their mean response NLL (the step divides by the update's states)."""
    total = state_nll(body, head, batch, vocab).sum()
    return LossSums(total=total, parts={"nll": total.detach()}, tokens=batch.n_tokens)


def sft_loss(model: PreTrainedModel, batch: Batch, vocab: int) -> LossSums:
    """``nll_sums`` of a causal LM on its own, in one process."""
    body = HiddenStates(model)
    return nll_sums(body, body.head, batch, vocab)


@dataclass
class SFTObjective:
    """One update's loss over a micro-batch as the trainer calls it, on the body it trains (wrapped or not).

    Only this rank's ``last`` micro-batch of the update synchronises the gradients: each rank then
    syncs exactly once per update, however many micro-batches its shard has.
    """

    head: Head  # the student's head (gathered when sharded)
    vocab: int
    last: Batch

    def __call__(self, body: nn.Module, batch: Batch) -> LossSums:
        gradient_sync(body, batch is self.last)
        return nll_sums(body, self.head, batch, self.vocab)


@torch.no_grad()
def held_out_loss(
    body: HiddenStates, batches: list[Batch], vocab: int, world: World, device: torch.device
) -> float:
    """Mean over states of the state's mean response NLL; each rank scores its shard of the states.

    ``body`` unwrapped: under FSDP2 its weights are gathered once, so ranks whose shards take
    different numbers of forward passes wait on no collective inside.
    """
    body.eval()
    with unsharded(body):
        per_state = [state_nll(body, body.head, b, vocab) for b in batches]
    local = {"nll": float(sum(float(s.sum()) for s in per_state)), "states": float(sum(map(len, per_state)))}
    summed = sum_over_ranks(local, world, device)
    return summed["nll"] / summed["states"]
