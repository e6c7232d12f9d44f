"""The OPTD step (OPTD.md §2): on-policy samples scored by a frozen teacher with and without the intent.

Per update: the student samples a whole response for each of its states; the teacher (the
SFT checkpoint, frozen) scores those response **ids** after the plain prompt and after the
privileged prompt (the trajectory's intent appended to the user turn); the student scores
them with gradients, and the gold response for the grounding term. Only the final hidden
states of response positions are kept; the objective projects them through the LM heads
chunk by chunk. Each context ends with the response, so the k-th response token sits at
the same offset from the right end in every context, whatever each prompt's length.

Only torch and transformers are imported: the module runs on a machine without the data stack.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel

from trainer.data import Batch, EncodedState, RecordText, collate
from trainer.distributed import full_tensor, gradient_sync
from trainer.loop import LossSums, PhaseTimer, split
from trainer.objective import ObjectiveSettings, OPTDLoss, optd_loss_from_hidden

# --- states -------------------------------------------------------------------------------


@dataclass(frozen=True)
class OPTDState:
    """A training state and the teacher's context for it: the privileged prompt (the intent appended)."""

    state: EncodedState
    privileged_prompt_ids: list[int]

    @property
    def record(self) -> RecordText:
        return self.state.record


def grounding_class_weights(
    actions: Sequence[str], counts: Counter[str] | dict[str, int], cap: float = 2.0
) -> Tensor:
    """Per-state weights of the grounding NLL for one update (the reference's practice, OPTD.md):
    ``min(c * freq(action)^-0.5, cap)`` with the frequencies of the whole training pool and c chosen
    so the update's weights average 1 (found by bisection; mean(min(c*w, cap)) rises with c)."""
    total = sum(counts.values())
    raw = torch.tensor([(counts[a] / total) ** -0.5 for a in actions], dtype=torch.float64)
    low, high = 0.0, cap / float(raw.min())
    for _ in range(100):
        mid = 0.5 * (low + high)
        if float(torch.clamp(mid * raw, max=cap).mean()) < 1.0:
            low = mid
        else:
            high = mid
    return torch.clamp(high * raw, max=cap)


# --- the models' final hidden states --------------------------------------------------------


class HiddenStates(nn.Module):
    """The decoder body of a causal LM: final hidden states, no LM head (what DDP or FSDP wraps)."""

    def __init__(self, lm: PreTrainedModel) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        # no KV cache: a training or scoring pass never decodes on from it
        out = self.lm.base_model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        return out.last_hidden_state

    def head(self) -> tuple[Tensor, Tensor | None]:
        """The LM head's weight and bias, whole (gathered when sharded)."""
        head = self.lm.get_output_embeddings()
        bias = None if head.bias is None else full_tensor(head.bias)
        return full_tensor(head.weight), bias


def response_positions(body: nn.Module, batch: Batch) -> Tensor:
    """Final hidden states [N, H] at the positions that predict the batch's response tokens."""
    return body(batch.input_ids, batch.attention_mask)[batch.rows, batch.positions]


def after(
    states: Sequence[OPTDState], responses: Sequence[list[int]], privileged: bool
) -> list[EncodedState]:
    """Each state's (plain or privileged) prompt followed by its sampled response ids, as they are."""
    return [
        EncodedState(s.record, s.privileged_prompt_ids if privileged else s.state.prompt_ids, list(r))
        for s, r in zip(states, responses, strict=True)
    ]


# --- one update's micro-batches -------------------------------------------------------------


@dataclass
class Rollout:
    """One micro-batch: sampled responses in the student's context, gold responses, teacher states."""

    sampled: Batch  # plain prompt + sampled response: the student's context and the plain teacher's
    privileged: Batch  # privileged prompt + the same sampled response: the intent teacher's context
    gold: Batch  # plain prompt + gold response (grounding)
    base_hidden: Tensor  # teacher, plain prompt, at the positions of ``sampled``
    intent_hidden: Tensor  # teacher, privileged prompt, at the positions of ``privileged``
    n_states: int
    last: bool = True  # the update's last micro-batch on this rank: its backward syncs the gradients
    grounding_weights: Tensor | None = None  # per state of the micro-batch (class weights), or equal


@torch.no_grad()
def teacher_pass(teacher: HiddenStates, batch: Batch) -> Tensor:
    return response_positions(teacher, batch)


def build_rollouts(
    states: Sequence[OPTDState],
    responses: Sequence[list[int]],
    teacher: HiddenStates,
    pad_id: int,
    micro_batch_states: int,
    device: torch.device,
    timer: PhaseTimer,
    cast: Callable[[], AbstractContextManager[Any]] = nullcontext,
    grounding_weights: Tensor | None = None,
) -> list[Rollout]:
    """Micro-batches of the update with both teacher passes done (frozen: eval, no grad; ``cast``: the
    trainer's autocast, so the teacher runs in the student's precision). ``grounding_weights``: one per
    state, in the order of ``states``. When a state's teacher context is its plain prompt (the
    self-distillation ablation) the second teacher pass is the first one's result."""
    teacher.eval()
    rollouts = []
    chunks = split(list(zip(states, responses, strict=True)), micro_batch_states)
    for index, chunk in enumerate(chunks):
        chunk_states, chunk_responses = [s for s, _ in chunk], [r for _, r in chunk]
        plain = collate(after(chunk_states, chunk_responses, privileged=False), pad_id).to(device)
        privileged = collate(after(chunk_states, chunk_responses, privileged=True), pad_id).to(device)
        if not torch.equal(plain.labels, privileged.labels):
            raise RuntimeError("plain and privileged contexts must end with the same response ids")
        with timer.phase("teacher_plain"), cast():
            base_hidden = teacher_pass(teacher, plain)
        with timer.phase("teacher_intent"), cast():
            same = all(s.privileged_prompt_ids == s.state.prompt_ids for s in chunk_states)
            intent_hidden = base_hidden if same else teacher_pass(teacher, privileged)
        gold = collate([s.state for s in chunk_states], pad_id).to(device)
        last = index == len(chunks) - 1
        weights = None
        if grounding_weights is not None:
            start = index * micro_batch_states
            weights = grounding_weights[start : start + len(chunk)].to(device)
        rollouts.append(
            Rollout(plain, privileged, gold, base_hidden, intent_hidden, len(chunk), last, weights)
        )
    return rollouts


PART_NAMES = ("distillation", "grounding", "mean_lambda", "binding_share", "guidance_kl")


@dataclass
class OPTDObjective:
    """The loss over one micro-batch as the trainer wants it: sums over states (divided later)."""

    head: Callable[[], tuple[Tensor, Tensor | None]]  # the student's head (gathered when sharded)
    teacher_head: tuple[Tensor, Tensor | None]
    vocab_size: int
    settings: ObjectiveSettings
    chunk_size: int
    timer: PhaseTimer | None = None  # student-side phases, kept apart from the step's own timer

    def __call__(self, body: nn.Module, rollout: Rollout) -> LossSums:
        timer = self.timer or PhaseTimer(rollout.sampled.input_ids.device)
        gradient_sync(body, rollout.last)
        with timer.phase("student_forward"):
            student_hidden = response_positions(body, rollout.sampled)
        with timer.phase("grounding_forward"):
            gold_hidden = response_positions(body, rollout.gold)
        with timer.phase("loss"):
            loss = self.loss(student_hidden, gold_hidden, rollout)
        n = rollout.n_states  # state means -> state sums
        parts = {name: getattr(loss, name).detach() * n for name in PART_NAMES}
        tokens = rollout.sampled.n_tokens + rollout.gold.n_tokens
        return LossSums(total=loss.total * n, parts=parts, tokens=tokens)

    def loss(self, student_hidden: Tensor, gold_hidden: Tensor, rollout: Rollout) -> OPTDLoss:
        weight, bias = self.head()
        teacher_weight, teacher_bias = self.teacher_head
        return optd_loss_from_hidden(
            student_hidden,
            rollout.base_hidden,
            rollout.intent_hidden,
            rollout.sampled.owner,
            gold_hidden,
            rollout.gold.labels,
            rollout.gold.owner,
            weight,
            bias,
            teacher_head_weight=teacher_weight,
            teacher_head_bias=teacher_bias,
            vocab_size=self.vocab_size,
            settings=self.settings,
            grounding_weights=rollout.grounding_weights,
            num_states=rollout.n_states,
            chunk_size=self.chunk_size,
        )

    def detached(self) -> OPTDObjective:
        """The same objective with the student's head detached (evaluation: no gradient buffers)."""
        weight, bias = self.head()
        fixed = (weight.detach(), None if bias is None else bias.detach())
        return replace(self, head=lambda: fixed, timer=None)


@torch.no_grad()
def objective_value(
    student: HiddenStates, objective: OPTDObjective, rollouts: list[Rollout]
) -> dict[str, float]:
    """The OPTD objective and its parts, means over the rollouts' states (no update)."""
    student.eval()
    fixed = objective.detached()
    sums: dict[str, float] = {}
    n_states = 0
    for rollout in rollouts:
        student_hidden = response_positions(student, rollout.sampled).detach()
        gold_hidden = response_positions(student, rollout.gold).detach()
        loss = fixed.loss(student_hidden, gold_hidden, rollout)
        for name in ("total", *PART_NAMES):
            sums[name] = sums.get(name, 0.0) + float(getattr(loss, name)) * rollout.n_states
        n_states += rollout.n_states
    return {("objective" if k == "total" else k): v / n_states for k, v in sums.items()}
