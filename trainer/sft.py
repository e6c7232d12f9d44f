"""SFT warm-up: teacher-forced NLL of the gold responses, per-state token means with equal state
weights, or (``sft_averaging = "per_token"``) every response token of an update weighted equally.

Logits are computed for response positions only: the decoder's final hidden states
are gathered at the positions that predict response tokens before the LM head, so a
long prompt costs attention, not a [T, V] logits buffer. The loss runs on the decoder
body (``HiddenStates``, what DDP or FSDP2 wraps under ``torchrun``) and the LM head
outside it, as the OPTD objective does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from trainer.data import Batch, EncodedState
from trainer.distributed import World, gradient_sync, sum_over_ranks, unsharded
from trainer.loop import LossSums
from trainer.optd import HiddenStates, response_positions
from transforms.click_line import CLICK_ID_PREFIX, listed_click_ids

Head = Callable[[], tuple[torch.Tensor, torch.Tensor | None]]  # the LM head's weight and bias, whole


class IdNotOneToken(ValueError):
    """The screen-id loss needs every listed item id to be a single token."""


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


def token_nll(body: nn.Module, head: Head, batch: Batch, vocab: int) -> torch.Tensor:
    """The NLL of each scored response token of the batch [N]."""
    logits = response_logits(head, response_positions(body, batch), vocab)
    return F.cross_entropy(logits, batch.labels, reduction="none")


def state_nll(body: nn.Module, head: Head, batch: Batch, vocab: int) -> torch.Tensor:
    """Each state's mean NLL over its own response tokens [n_states]."""
    return state_means(token_nll(body, head, batch, vocab), batch.owner, batch.n_states)


@dataclass
class ScreenIdBatch:
    """Feed states for the screen-id loss: each prompt's last tokens followed by a click's opening
    (right-padded), ``last`` the position that predicts the id, ``choices`` the token of each id the
    state's click line lists (-1: padding)."""

    input_ids: torch.Tensor  # [B, L]
    attention_mask: torch.Tensor  # [B, L]
    last: torch.Tensor  # [B]
    choices: torch.Tensor  # [B, M]

    @property
    def n_tokens(self) -> int:
        return int(self.attention_mask.sum())

    def to(self, device: torch.device) -> ScreenIdBatch:
        return ScreenIdBatch(*(t.to(device) for t in vars(self).values()))


def one_token(tokenizer: PreTrainedTokenizerBase, text: str) -> int:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise IdNotOneToken(
            f"item id {text!r} is {len(ids)} tokens: the screen-id loss needs each id as one token "
            "(train the tiny model with tiny.item_id_tokens)"
        )
    return ids[0]


def screen_id_batch(
    states: Sequence[EncodedState], tokenizer: PreTrainedTokenizerBase, tail: int | None
) -> ScreenIdBatch | None:
    """The screen-id batch of those ``states`` whose click line lists ids (as anonymised, where a state's
    ids were); None when none does."""
    opening = tokenizer(CLICK_ID_PREFIX, add_special_tokens=False)["input_ids"]
    rows, choices = [], []
    for state in states:
        listed = listed_click_ids(state.record.prompt)
        if listed:
            prompt = state.prompt_ids[-tail:] if tail else state.prompt_ids
            rows.append(prompt + opening)
            tokens = [one_token(tokenizer, item_id) for item_id in listed]
            choices.append([state.id_map.get(t, t) for t in tokens])
    if not rows:
        return None
    width, most = max(map(len, rows)), max(map(len, choices))
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    padded = torch.full((len(rows), most), -1, dtype=torch.long)
    for i, (row, chosen) in enumerate(zip(rows, choices, strict=True)):
        input_ids[i, : len(row)] = torch.tensor(row)
        attention_mask[i, : len(row)] = 1
        padded[i, : len(chosen)] = torch.tensor(chosen)
    last = torch.tensor([len(row) - 1 for row in rows])
    return ScreenIdBatch(input_ids, attention_mask, last, padded)


def screen_id_nll(body: nn.Module, head: Head, batch: ScreenIdBatch, vocab: int) -> torch.Tensor:
    """Per state, -log of the probability the model gives to any of the listed ids after the opening [B]."""
    hidden = body(batch.input_ids, batch.attention_mask)[torch.arange(len(batch.last)), batch.last]
    log_probs = F.log_softmax(response_logits(head, hidden, vocab), dim=-1)
    listed = log_probs.gather(1, batch.choices.clamp(min=0)).masked_fill(batch.choices < 0, float("-inf"))
    return -torch.logsumexp(listed, dim=1)


def nll_sums(
    body: nn.Module, head: Head, batch: Batch, vocab: int, states_per_token: float | None = None
) -> LossSums:
    """Sum over the batch's states of their mean response NLL (the step divides by the update's states).

    ``states_per_token`` (the update's states over its scored response tokens): the loss is instead the
    batch's token NLL sum times it, so the step's division gives the mean over the update's tokens;
    the reported ``nll`` part stays the states' mean NLL."""
    nll = token_nll(body, head, batch, vocab)
    by_state = state_means(nll, batch.owner, batch.n_states).sum()
    total = by_state if states_per_token is None else nll.sum() * states_per_token
    return LossSums(total=total, parts={"nll": by_state.detach()}, tokens=batch.n_tokens)


def states_per_scored_token(states: Sequence[EncodedState], unscored: torch.Tensor | None) -> float:
    """The update's states over its scored response tokens (a copy head's ids are not scored), counted
    on the whole update's states so every rank weights a token alike."""
    tokens = torch.tensor([token for state in states for token in state.response_ids])
    scored = len(tokens) if unscored is None else int((~torch.isin(tokens, unscored)).sum())
    return len(states) / scored


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
    last: Batch | ScreenIdBatch
    screen_id_weight: float = 0.0  # each screen-id state counts as that share of a gold response's state
    states_per_token: float | None = None  # per_token averaging: ``states_per_scored_token`` of the update

    def __call__(self, body: nn.Module, batch: Batch | ScreenIdBatch) -> LossSums:
        gradient_sync(body, batch is self.last)
        if isinstance(batch, ScreenIdBatch):
            nll = screen_id_nll(body, self.head, batch, self.vocab).sum()
            return LossSums(self.screen_id_weight * nll, {"screen_id": nll.detach()}, batch.n_tokens)
        return nll_sums(body, self.head, batch, self.vocab, self.states_per_token)


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
