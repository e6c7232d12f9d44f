"""The OPTD objective: per-token trust-region target, generalized JSD and grounding NLL.

Two paths compute the same loss:

- from logits (``optd_loss``): padded ``[S, T, V]`` batches with masks, autograd end to end;
- from hidden states (``optd_loss_from_hidden``, ``grounding_nll_from_hidden``): the final hidden
  states of the response positions are projected through the LM head one chunk of positions at a
  time, and the gradients of the hidden states and of the head are computed chunk by chunk during
  the forward pass, so no ``[T, V]`` buffer exists in forward or backward whatever T is.

Both average token losses within each state over its valid tokens, then states with fixed weights
``state_weight / num_states``. Every returned part is a weighted sum of token terms, so summing the
parts (and the gradients) of micro-batches that together hold the states of one update gives the
parts and gradients of the whole update, provided every micro-batch passes the update's
``num_states``.

The math runs in float32 at least (float64 stays float64) whatever the model dtype and whatever
autocast is active: every entry point turns autocast off on its inputs' devices, since autocast would
run the matmuls below (row dots, head projections, gradient products) in bf16 even on float32 inputs,
which moves lambda* by grid steps and pushes targets past epsilon. Teacher inputs are always detached.
Only torch is imported: the module runs on a machine without the data stack.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

import torch
from torch import Tensor

PADDING_STATE = -1  # state index of a padded position in the hidden-state path: no loss, no gradient

_Params = ParamSpec("_Params")
_Result = TypeVar("_Result")


def _without_autocast(function: Callable[_Params, _Result]) -> Callable[_Params, _Result]:
    """Run ``function`` with autocast off on the device types of its tensor arguments.

    Autocast applies per device type, to ops on that device's tensors, so these are the ones that
    matter; leaving the context restores the caller's state (enabled or not, and its dtype).
    """

    @functools.wraps(function)
    def without(*args: _Params.args, **kwargs: _Params.kwargs) -> _Result:
        devices = {value.device.type for value in (*args, *kwargs.values()) if isinstance(value, Tensor)}
        with ExitStack() as stack:
            for device in sorted(devices):
                if torch.amp.is_autocast_available(device):
                    stack.enter_context(torch.autocast(device, enabled=False))
            return function(*args, **kwargs)

    return without


@dataclass(frozen=True)
class ObjectiveSettings:
    """Hyper-parameters of the objective; defaults are the paper's (OPTD.md)."""

    epsilon: float = 0.02  # per-token bound on KL(q^lambda || q^0)
    lambda_max: float = 1.0  # largest guidance weight tried
    steps: int = 8  # bisection steps when lambda_max is infeasible: error <= lambda_max / 2**steps
    beta: float = 0.5  # generalized-JSD mixture weight of the target; 0: KL(q || p), 1: KL(p || q)
    gamma: float = 0.1  # weight of the grounding NLL

    def __post_init__(self) -> None:
        if not self.epsilon >= 0:
            raise ValueError(f"epsilon must be >= 0, got {self.epsilon}")
        if not self.lambda_max >= 0:
            raise ValueError(f"lambda_max must be >= 0, got {self.lambda_max}")
        if self.steps < 0:
            raise ValueError(f"steps must be >= 0, got {self.steps}")
        _check_beta(self.beta)
        if not self.gamma >= 0:
            raise ValueError(f"gamma must be >= 0, got {self.gamma}")


@dataclass(frozen=True)
class OPTDLoss:
    """The loss and its parts, each a state-weighted mean of token terms (so micro-batch sums add up).

    ``total`` carries the gradient. On the logits path ``distillation`` and ``grounding`` do too; on
    the hidden-state path they are detached values and only ``total`` can be differentiated.
    """

    total: Tensor
    distillation: Tensor  # JSD_beta (a KL at beta 0 or 1) between the trust-region target and the student
    grounding: Tensor  # NLL of the gold response (class-weighted when weights are given)
    mean_lambda: Tensor  # mean lambda*
    binding_share: Tensor  # share of tokens with lambda* < lambda_max
    guidance_kl: Tensor  # mean KL(q^lambda* || q^0)


def _check_beta(beta: float) -> None:
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must lie in [0, 1] (0: forward KL, 1: reverse KL), got {beta}")


def _rowdot(left: Tensor, right: Tensor) -> Tensor:
    """Row-wise dot product of [..., V] tensors, through matmul: no [..., V] product is allocated.

    For values autograd does not differentiate (see ``_kl_rows`` for those it does).
    """
    return (left.unsqueeze(-2) @ right.unsqueeze(-1)).reshape(left.shape[:-1])


def _compute_dtype(*tensors: Tensor) -> torch.dtype:
    dtype = torch.float32
    for tensor in tensors:
        dtype = torch.promote_types(dtype, tensor.dtype)
    return dtype


# ---------------------------------------------------------------------------------------------
# trust-region target
# ---------------------------------------------------------------------------------------------


def _tilted_kl(base: Tensor, shift: Tensor, lam: Tensor, base_lse: Tensor) -> Tensor:
    """KL(q^lam || q^0) per row without keeping log q^lam: lam * E_lam[shift] - (A(lam) - A(0)).

    With unnormalised base logits b, log q^lam = b + lam*shift - A(lam) and A(lam) = logsumexp(b +
    lam*shift); subtracting A(0) computed the same way cancels its rounding (identical teachers
    give exactly 0).
    """
    tilted = torch.addcmul(base, lam.unsqueeze(-1), shift)
    peak = tilted.amax(-1, keepdim=True)
    weights = tilted.sub_(peak).exp_()
    total = weights.sum(-1)
    mean_shift = _rowdot(weights, shift) / total
    return lam * mean_shift - (peak.squeeze(-1) + total.log() - base_lse)


def _tilted_log_probs(base: Tensor, shift: Tensor, lam: Tensor, base_lse: Tensor) -> tuple[Tensor, Tensor]:
    """log q^lam per row and KL(q^lam || q^0)."""
    log_q = torch.addcmul(base, lam.unsqueeze(-1), shift)
    lse = torch.logsumexp(log_q, -1)
    log_q.sub_(lse.unsqueeze(-1))
    mean_shift = _rowdot(log_q.exp(), shift)
    return log_q, lam * mean_shift - (lse - base_lse)


def _bisect(
    base: Tensor, shift: Tensor, base_lse: Tensor, epsilon: float, lambda_max: float, steps: int
) -> Tensor:
    """Largest grid point of [0, lambda_max] found feasible by bisection (rows infeasible at lambda_max)."""
    low = torch.zeros_like(base_lse)
    high = torch.full_like(base_lse, lambda_max)
    for _ in range(steps):
        mid = 0.5 * (low + high)
        feasible = _tilted_kl(base, shift, mid, base_lse) <= epsilon
        low = torch.where(feasible, mid, low)
        high = torch.where(feasible, high, mid)
    return low


@_without_autocast
def trust_region_target(
    base_logits: Tensor,
    intent_logits: Tensor,
    epsilon: float = 0.02,
    lambda_max: float = 1.0,
    steps: int = 8,
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-token target log q^lambda*, lambda* = max{lambda in [0, lambda_max]: KL(q^lambda||q^0) <= eps}.

    ``log q^lambda = log_softmax((1-lambda) log q^0 + lambda log q^I)`` on teacher logits shaped
    ``[..., V]`` (finite; slice a padded vocabulary off first). Where lambda_max is feasible it is
    lambda*; only the other tokens are bisected (``steps`` times, lambda* = the lower end, always
    feasible). Returns (target log-probs ``[..., V]``, lambda* ``[...]``, KL(q^lambda* || q^0)
    ``[...]``), detached, in float32 at least.
    """
    ObjectiveSettings(epsilon=epsilon, lambda_max=lambda_max, steps=steps)  # the same checks as the settings
    if base_logits.shape != intent_logits.shape:
        raise ValueError(
            f"teacher logits differ in shape: {tuple(base_logits.shape)} vs {tuple(intent_logits.shape)}"
        )
    dtype = _compute_dtype(base_logits, intent_logits)
    lead, vocab = base_logits.shape[:-1], base_logits.shape[-1]
    with torch.no_grad():
        base = base_logits.detach().to(dtype).reshape(-1, vocab)
        scratch = intent_logits.detach().to(dtype, copy=True).reshape(-1, vocab)
        target, lam, kl = _trust_region(base, scratch, epsilon, lambda_max, steps)
    return target.reshape(*lead, vocab), lam.reshape(lead), kl.reshape(lead)


def _trust_region(
    base: Tensor, intent: Tensor, epsilon: float, lambda_max: float, steps: int
) -> tuple[Tensor, Tensor, Tensor]:
    """``trust_region_target`` on [N, V] logits in the compute dtype; ``intent`` is overwritten."""
    base_lse = torch.logsumexp(base, -1)
    intent_lse = torch.logsumexp(intent, -1)
    # log q^I - log q^0, the direction of the geometric mixture
    shift = intent.sub_(base).sub_((intent_lse - base_lse).unsqueeze(-1))
    lam = torch.full_like(base_lse, lambda_max)
    target, kl = _tilted_log_probs(base, shift, lam, base_lse)
    infeasible = (kl > epsilon).nonzero().squeeze(-1)
    if infeasible.numel():
        sub_base, sub_shift, sub_lse = base[infeasible], shift[infeasible], base_lse[infeasible]
        sub_lam = _bisect(sub_base, sub_shift, sub_lse, epsilon, lambda_max, steps)
        sub_target, sub_kl = _tilted_log_probs(sub_base, sub_shift, sub_lam, sub_lse)
        target[infeasible], lam[infeasible], kl[infeasible] = sub_target, sub_lam, sub_kl
    return target, lam, kl


# ---------------------------------------------------------------------------------------------
# generalized JSD and NLL
# ---------------------------------------------------------------------------------------------


def _kl_rows(log_left: Tensor, log_right: Tensor) -> Tensor:
    """KL(left || right) per row, for autograd.

    A sum of elementwise products rather than ``_rowdot``: autograd replays a matmul's backward
    under whatever autocast is active where backward runs (bf16 inside a bf16 region), while these
    ops' backwards hold no lower-precision op.
    """
    return (log_left.exp() * (log_left - log_right)).sum(-1)


def _jsd_terms(target_logprobs: Tensor, student_logprobs: Tensor, beta: float) -> Tensor:
    """Per-row JSD_beta (a KL at the endpoints), written for autograd (no in-place step)."""
    if beta == 0.0:
        return _kl_rows(target_logprobs, student_logprobs)
    if beta == 1.0:
        return _kl_rows(student_logprobs, target_logprobs)
    log_mix = torch.logaddexp(target_logprobs + math.log(beta), student_logprobs + math.log1p(-beta))
    kl_target = _kl_rows(target_logprobs, log_mix)
    kl_student = _kl_rows(student_logprobs, log_mix)
    return beta * kl_target + (1.0 - beta) * kl_student


@_without_autocast
def generalized_jsd(target_logprobs: Tensor, student_logits: Tensor, beta: float = 0.5) -> Tensor:
    """Per-token ``beta*KL(q||m) + (1-beta)*KL(p||m)``, m = beta*q + (1-beta)*p, natural log.

    At the endpoints that formula is identically zero (m is p at beta = 0, q at beta = 1), so there
    the divergence is a KL instead, the convention of the paper's authors and of TRL's GKD:
    beta = 0 is the forward KL(q || p), beta = 1 the reverse KL(p || q).
    q = exp(target_logprobs) carries no gradient; p = softmax(student_logits) does, through m too.
    Shapes ``[..., V]`` -> ``[...]``, float32 at least.
    """
    _check_beta(beta)
    dtype = _compute_dtype(target_logprobs, student_logits)
    student_logprobs = torch.log_softmax(student_logits.to(dtype), -1)
    return _jsd_terms(target_logprobs.detach().to(dtype), student_logprobs, beta)


def _student_kl_and_logit_grad(student_logprobs: Tensor, log_reference: Tensor) -> tuple[Tensor, Tensor]:
    """KL(p || r) per row and its gradient w.r.t. the student logits, r held fixed.

    dKL/ds_v = p_v (d_v - sum_u p_u d_u) with d = log p - log r, and sum_u p_u d_u = KL(p || r).
    ``student_logprobs`` is overwritten.
    """
    probs = student_logprobs.exp()
    student_vs_reference = student_logprobs.sub_(log_reference)
    kl = _rowdot(probs, student_vs_reference)
    return kl, student_vs_reference.sub_(kl.unsqueeze(-1)).mul_(probs)


def _jsd_and_logit_grad(
    target_logprobs: Tensor, student_logprobs: Tensor, beta: float
) -> tuple[Tensor, Tensor]:
    """JSD per row and its gradient w.r.t. the student logits; ``student_logprobs`` is overwritten.

    The same value as ``_jsd_terms``, computed in place to hold fewer [rows, V] buffers at once.
    dJ/dp_v = (1-beta) log(p_v / m_v) + const (the terms through m add up to (1-beta), as
    m = beta q + (1-beta) p), and a constant vanishes through the softmax: dJ/ds is (1-beta) times
    the gradient of KL(p || m) with m held fixed. At the endpoints: the forward KL(q || p) has
    dJ/ds = p - q; the reverse KL(p || q) is that of KL(p || m) with m = q.
    """
    if beta == 1.0:
        return _student_kl_and_logit_grad(student_logprobs, target_logprobs)
    target_probs = target_logprobs.exp()
    if beta == 0.0:
        kl = _rowdot(target_probs, target_logprobs) - _rowdot(target_probs, student_logprobs)
        return kl, student_logprobs.exp_().sub_(target_probs)
    log_mix = target_logprobs + math.log(beta)
    torch.logaddexp(log_mix, student_logprobs + math.log1p(-beta), out=log_mix)
    kl_target = _rowdot(target_probs, target_logprobs) - _rowdot(target_probs, log_mix)
    del target_probs
    kl_student, grad = _student_kl_and_logit_grad(student_logprobs, log_mix)
    del log_mix
    return beta * kl_target + (1.0 - beta) * kl_student, grad.mul_(1.0 - beta)


def _nll_and_logit_grad(logits: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """-log softmax(logits)[label] per row and its gradient softmax - onehot(label)."""
    log_probs = torch.log_softmax(logits, -1)
    nll = -log_probs.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    grad = log_probs.exp_()
    grad.scatter_add_(-1, labels.unsqueeze(-1), torch.full_like(nll, -1.0).unsqueeze(-1))
    return nll, grad


# ---------------------------------------------------------------------------------------------
# weights
# ---------------------------------------------------------------------------------------------


@_without_autocast
def class_balance_weights(classes: Tensor, cap: float = 2.0) -> Tensor:
    """Per-item weights ``min(c * freq(class)^-0.5, cap)`` with c chosen so their mean is 1.

    ``classes`` holds one class id per training state (e.g. its action). mean(min(c*w, cap)) rises
    continuously from 0 to cap as c grows, so c is found by bisection (to float64 precision).
    """
    if cap < 1.0:
        raise ValueError(f"cap must be >= 1 for the weights to average 1, got {cap}")
    if classes.numel() == 0:
        raise ValueError("class_balance_weights needs at least one item")
    _, inverse, counts = torch.unique(classes.reshape(-1), return_inverse=True, return_counts=True)
    raw = (counts.double() / classes.numel()).pow(-0.5)[inverse]
    low, high = 0.0, cap / raw.min().item()
    for _ in range(200):
        mid = 0.5 * (low + high)
        if torch.clamp(mid * raw, max=cap).mean().item() < 1.0:
            low = mid
        else:
            high = mid
    return torch.clamp(high * raw, max=cap).reshape(classes.shape)


@_without_autocast
def state_token_weights(state_index: Tensor, num_states: int, state_weights: Tensor | None = None) -> Tensor:
    """Weight of each token: ``state_weight / (num_states * valid tokens of its state)``.

    ``state_index`` [N] in ``[0, K)`` (the states of this micro-batch); ``num_states`` is the number
    of states in the whole update, so micro-batch sums add up to the update's mean.
    ``state_weights`` [K] defaults to ones.
    """
    if state_index.numel() == 0:
        return torch.zeros(0, dtype=torch.float64, device=state_index.device)
    if int(state_index.min()) < 0:
        raise ValueError("state_index must be >= 0 on valid positions")
    local_states = int(state_index.max()) + 1
    if state_weights is not None:
        if state_weights.shape[0] < local_states:
            raise ValueError(f"{state_weights.shape[0]} state_weights for {local_states} states")
        local_states = state_weights.shape[0]
    if num_states < local_states:
        raise ValueError(f"num_states={num_states} is smaller than the {local_states} states of this batch")
    counts = torch.bincount(state_index, minlength=local_states).double()
    missing = (counts[: int(state_index.max()) + 1] == 0).nonzero().squeeze(-1)
    if missing.numel():
        raise ValueError(f"states must be numbered 0..K-1, each with a token; none for {missing.tolist()}")
    weights = torch.ones(local_states, dtype=torch.float64, device=state_index.device)
    if state_weights is not None:
        weights = state_weights.detach().double()
    per_token = weights / (num_states * counts.clamp_min(1.0))  # states past K may be absent
    return per_token[state_index]


def _check_vocabularies(
    student: Tensor, base: Tensor, intent: Tensor, grounding: Tensor, vocab_size: int | None
) -> int:
    if not student.shape == base.shape == intent.shape:
        raise ValueError(
            f"student {tuple(student.shape)} and teacher logits {tuple(base.shape)}, {tuple(intent.shape)} "
            "differ: they must cover the same response tokens over one shared vocabulary"
        )
    if grounding.shape[-1] != student.shape[-1]:
        raise ValueError(
            f"grounding logits have {grounding.shape[-1]} columns, the student {student.shape[-1]}"
        )
    vocab_size = vocab_size or student.shape[-1]
    if not 0 < vocab_size <= student.shape[-1]:
        raise ValueError(
            f"vocab_size={vocab_size} must lie in [1, {student.shape[-1]}] (the logits' columns)"
        )
    return vocab_size


def _states_with_tokens(mask: Tensor, what: str) -> Tensor:
    if mask.dim() != 2:
        raise ValueError(f"{what} must be [states, positions], got shape {tuple(mask.shape)}")
    empty = (~mask.any(-1)).nonzero().squeeze(-1)
    if empty.numel():
        raise ValueError(f"{what}: states {empty.tolist()} have no valid token")
    return mask.nonzero()[:, 0]


# ---------------------------------------------------------------------------------------------
# the loss from logits
# ---------------------------------------------------------------------------------------------


@_without_autocast
def optd_loss(
    student_logits: Tensor,
    base_logits: Tensor,
    intent_logits: Tensor,
    response_mask: Tensor,
    grounding_logits: Tensor,
    grounding_labels: Tensor,
    grounding_mask: Tensor,
    *,
    settings: ObjectiveSettings | None = None,
    grounding_weights: Tensor | None = None,
    num_states: int | None = None,
    vocab_size: int | None = None,
) -> OPTDLoss:
    """``L = mean_states mean_tokens JSD(q^lambda*, p) + gamma * mean_states mean_tokens NLL(gold)``.

    - ``student_logits``, ``base_logits``, ``intent_logits``: [S, T, V], the student and the teacher
      without / with the intent, on the same sampled response tokens (aligned by the caller);
    - ``response_mask`` [S, T]: valid response tokens; elsewhere values may be anything, even NaN;
    - ``grounding_logits`` [S, G, V] at the positions that predict ``grounding_labels`` [S, G], the
      gold response; ``grounding_mask`` [S, G];
    - ``grounding_weights`` [S]: optional per-state weights of the grounding term
      (``class_balance_weights``); ``num_states``: states in the whole update (default S);
    - ``vocab_size``: the tokenizer's vocabulary when the model's is padded beyond it; the padded
      columns are dropped from every distribution (as -inf logits would be).
    """
    settings = settings or ObjectiveSettings()
    vocab_size = _check_vocabularies(student_logits, base_logits, intent_logits, grounding_logits, vocab_size)
    student_logits, base_logits, intent_logits, grounding_logits = (
        logits[..., :vocab_size] for logits in (student_logits, base_logits, intent_logits, grounding_logits)
    )
    num_states = num_states or student_logits.shape[0]
    response_mask, grounding_mask = response_mask.bool(), grounding_mask.bool()
    response_states = _states_with_tokens(response_mask, "response_mask")
    grounding_states = _states_with_tokens(grounding_mask, "grounding_mask")
    dtype = _compute_dtype(student_logits, base_logits, intent_logits, grounding_logits)
    target, lam, kl = trust_region_target(
        base_logits[response_mask],
        intent_logits[response_mask],
        settings.epsilon,
        settings.lambda_max,
        settings.steps,
    )
    jsd = generalized_jsd(target, student_logits[response_mask], settings.beta)
    token_weights = state_token_weights(response_states, num_states).to(dtype)
    labels = grounding_labels[grounding_mask]
    _check_labels(labels, vocab_size)
    grounding_log_probs = torch.log_softmax(grounding_logits[grounding_mask].to(dtype), -1)
    nll = -grounding_log_probs.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    grounding_token_weights = state_token_weights(grounding_states, num_states, grounding_weights).to(dtype)
    distillation = (token_weights * jsd).sum()
    grounding = (grounding_token_weights * nll).sum()
    return OPTDLoss(
        total=distillation + settings.gamma * grounding,
        distillation=distillation,
        grounding=grounding,
        mean_lambda=(token_weights * lam).sum(),
        binding_share=(token_weights * (lam < settings.lambda_max)).sum(),
        guidance_kl=(token_weights * kl).sum(),
    )


# ---------------------------------------------------------------------------------------------
# the loss from hidden states, chunk by chunk
# ---------------------------------------------------------------------------------------------


@dataclass
class _Head:
    """An LM head cut to the tokenizer's vocabulary, in the compute dtype."""

    weight: Tensor
    bias: Tensor | None

    def project(self, hidden: Tensor) -> Tensor:
        if self.bias is None:
            return hidden @ self.weight.T
        return torch.addmm(self.bias, hidden, self.weight.T)


@dataclass
class _HeadGrads:
    """Gradients accumulated chunk by chunk: of the hidden states and of the head."""

    hidden: Tensor | None
    weight: Tensor | None
    bias: Tensor | None

    def add(self, grad_logits: Tensor, hidden: Tensor, head: _Head, rows: slice) -> None:
        if self.hidden is not None:
            self.hidden[rows] = (grad_logits @ head.weight).to(self.hidden.dtype)
        if self.weight is not None:
            self.weight.addmm_(grad_logits.T, hidden)
        if self.bias is not None:
            self.bias.add_(grad_logits.sum(0))


@dataclass
class _ChunkPlan:
    """What the autograd function needs besides the differentiable tensors."""

    base_hidden: Tensor
    intent_hidden: Tensor
    response_weights: Tensor
    grounding_labels: Tensor
    grounding_weights: Tensor
    teacher_weight: Tensor
    teacher_bias: Tensor | None
    vocab_size: int
    chunk_size: int
    settings: ObjectiveSettings


def _cut_head(weight: Tensor, bias: Tensor | None, vocab_size: int, dtype: torch.dtype) -> _Head:
    return _Head(
        weight=weight.detach()[:vocab_size].to(dtype),
        bias=None if bias is None else bias.detach()[:vocab_size].to(dtype),
    )


def _grad_buffers(
    hidden: Tensor, weight: Tensor, bias: Tensor | None, needs: tuple[bool, ...], dtype: torch.dtype
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    return (
        torch.empty_like(hidden) if needs[0] else None,
        torch.zeros(weight.shape, dtype=dtype, device=weight.device) if needs[1] else None,
        torch.zeros(bias.shape, dtype=dtype, device=bias.device) if needs[2] and bias is not None else None,
    )


def _distillation_chunks(
    hidden: Tensor, plan: _ChunkPlan, head: _Head, teacher: _Head, grads: _HeadGrads
) -> Tensor:
    """Sums over response tokens of w*JSD, w*lambda*, w*[lambda* < lambda_max], w*KL; grads scaled by w."""
    settings, sums = plan.settings, torch.zeros(4, dtype=head.weight.dtype, device=hidden.device)
    for start in range(0, hidden.shape[0], plan.chunk_size):
        rows = slice(start, start + plan.chunk_size)
        student = hidden[rows].to(head.weight.dtype)
        target, lam, kl = _trust_region(
            teacher.project(plan.base_hidden[rows].to(teacher.weight.dtype)),
            teacher.project(plan.intent_hidden[rows].to(teacher.weight.dtype)),
            settings.epsilon,
            settings.lambda_max,
            settings.steps,
        )
        logits = head.project(student)
        student_logprobs = torch.log_softmax(logits, -1)
        del logits
        jsd, grad_logits = _jsd_and_logit_grad(target, student_logprobs, settings.beta)
        del target, student_logprobs
        weights = plan.response_weights[rows]
        sums += torch.stack([jsd, lam, (lam < settings.lambda_max).to(lam.dtype), kl]) @ weights
        grads.add(grad_logits.mul_(weights.unsqueeze(-1)), student, head, rows)
    return sums


def _grounding_chunks(hidden: Tensor, plan: _ChunkPlan, head: _Head, grads: _HeadGrads) -> Tensor:
    """Sum over gold tokens of w*NLL; gradients scaled by gamma*w (the total's coefficient)."""
    total = torch.zeros((), dtype=head.weight.dtype, device=hidden.device)
    for start in range(0, hidden.shape[0], plan.chunk_size):
        rows = slice(start, start + plan.chunk_size)
        gold = hidden[rows].to(head.weight.dtype)
        nll, grad_logits = _nll_and_logit_grad(head.project(gold), plan.grounding_labels[rows])
        weights = plan.grounding_weights[rows]
        total += nll @ weights
        grads.add(grad_logits.mul_((plan.settings.gamma * weights).unsqueeze(-1)), gold, head, rows)
    return total


@_without_autocast  # guards the forward and the recomputation in a second backward alike
def _loss_and_grads(
    student_hidden: Tensor,
    grounding_hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    plan: _ChunkPlan,
    needs: tuple[bool, ...],
) -> tuple[Tensor, Tensor, tuple]:
    """One pass over the chunks: (total, [distillation, grounding, lambda, binding, KL], gradients)."""
    dtype = _compute_dtype(student_hidden, weight)
    head = _cut_head(weight, bias, plan.vocab_size, dtype)
    teacher = head
    if plan.teacher_weight is not weight or plan.teacher_bias is not bias:
        teacher = _cut_head(plan.teacher_weight, plan.teacher_bias, plan.vocab_size, dtype)
    student_grad, weight_grad, bias_grad = _grad_buffers(
        student_hidden, weight, bias, (needs[0], *needs[2:4]), dtype
    )
    grounding_grad = torch.empty_like(grounding_hidden) if needs[1] else None
    vocab_rows = slice(0, plan.vocab_size)
    cut = lambda full: None if full is None else full[vocab_rows]  # noqa: E731 - padded rows get no gradient
    distillation = _distillation_chunks(
        student_hidden, plan, head, teacher, _HeadGrads(student_grad, cut(weight_grad), cut(bias_grad))
    )
    grounding = _grounding_chunks(
        grounding_hidden, plan, head, _HeadGrads(grounding_grad, cut(weight_grad), cut(bias_grad))
    )
    total = distillation[0] + plan.settings.gamma * grounding
    parts = torch.cat([distillation[:1], grounding.reshape(1), distillation[1:]])
    return total, parts, (student_grad, grounding_grad, weight_grad, bias_grad)


class _ChunkedOPTD(torch.autograd.Function):
    """Loss from hidden states; its gradients are computed in forward, chunk by chunk, and kept.

    Keeping them costs [N, H] + [M, H] + the head's [V, H], the same as the gradients themselves;
    the logits exist one chunk at a time. Returns (total, detached parts).
    """

    @staticmethod
    def forward(ctx, student_hidden, grounding_hidden, weight, bias, plan: _ChunkPlan):
        total, parts, ctx.grads = _loss_and_grads(
            student_hidden, grounding_hidden, weight, bias, plan, ctx.needs_input_grad
        )
        ctx.save_for_backward(student_hidden, grounding_hidden, weight, bias)
        ctx.plan, ctx.needs = plan, ctx.needs_input_grad
        ctx.mark_non_differentiable(parts)
        return total, parts

    @staticmethod
    def backward(ctx, grad_total, _grad_parts):
        # the first backward hands the buffers over (autograd takes them as .grad without a copy);
        # a second one through a retained graph computes them again
        held, ctx.grads = ctx.grads, None
        if held is None:
            held = _loss_and_grads(*ctx.saved_tensors, ctx.plan, ctx.needs)[2]
        unit = bool(grad_total == 1)
        grads = [None if grad is None else grad if unit else grad * grad_total for grad in held]
        del held
        dtypes = (
            ctx.saved_tensors[2].dtype,
            None if ctx.saved_tensors[3] is None else ctx.saved_tensors[3].dtype,
        )
        # the head's gradients were accumulated in the compute dtype
        return (
            *grads[:2],
            *(None if g is None else g.to(d) for g, d in zip(grads[2:], dtypes, strict=True)),
            None,
        )


def _valid_rows(state_index: Tensor, what: str) -> Tensor:
    if state_index.dim() != 1:
        raise ValueError(f"{what} must be one index per position, got shape {tuple(state_index.shape)}")
    if bool((state_index < PADDING_STATE).any()):
        raise ValueError(f"{what}: an index below {PADDING_STATE} is neither a state nor padding")
    return state_index != PADDING_STATE


def _check_head(weight: Tensor, teacher_weight: Tensor, vocab_size: int | None) -> int:
    if teacher_weight.shape != weight.shape:
        raise ValueError(
            f"student and teacher LM heads differ: {tuple(weight.shape)} vs {tuple(teacher_weight.shape)}; "
            "they must share one tokenizer and vocabulary"
        )
    vocab_size = vocab_size or weight.shape[0]
    if not 0 < vocab_size <= weight.shape[0]:
        raise ValueError(f"vocab_size={vocab_size} must lie in [1, {weight.shape[0]}] (the head's rows)")
    return vocab_size


def _check_labels(labels: Tensor, vocab_size: int) -> None:
    outside = (labels < 0) | (labels >= vocab_size)
    if bool(outside.any()):
        raise ValueError(f"{int(outside.sum())} grounding labels outside the vocabulary [0, {vocab_size})")


@_without_autocast
def optd_loss_from_hidden(
    student_hidden: Tensor,
    base_hidden: Tensor,
    intent_hidden: Tensor,
    state_index: Tensor,
    grounding_hidden: Tensor,
    grounding_labels: Tensor,
    grounding_state_index: Tensor,
    head_weight: Tensor,
    head_bias: Tensor | None = None,
    *,
    teacher_head_weight: Tensor | None = None,
    teacher_head_bias: Tensor | None = None,
    vocab_size: int | None = None,
    settings: ObjectiveSettings | None = None,
    grounding_weights: Tensor | None = None,
    num_states: int | None = None,
    chunk_size: int = 256,
) -> OPTDLoss:
    """The OPTD loss from final hidden states of response positions only, O(chunk_size x V) extra memory.

    - ``student_hidden`` [N, H] (with grad), ``base_hidden`` / ``intent_hidden`` [N, H] (the teacher
      without / with the intent, detached): the positions that predict the sampled response tokens;
    - ``state_index`` [N]: the state of each position, ``PADDING_STATE`` (-1) for padding, whose
      values may be anything (even NaN) and get neither loss nor gradient;
    - ``grounding_hidden`` [M, H] predicting ``grounding_labels`` [M] (the gold responses), with
      ``grounding_state_index`` [M] likewise;
    - ``head_weight`` [V', H] (and ``head_bias``) of the student; the teacher's head defaults to the
      same tensors (detached); ``vocab_size`` <= V' drops padded vocabulary rows from every
      distribution (as -inf logits would).

    Only ``total`` is differentiable. See ``optd_loss`` for the weighting.
    """
    settings = settings or ObjectiveSettings()
    teacher_head_weight = head_weight if teacher_head_weight is None else teacher_head_weight
    if teacher_head_weight is head_weight and teacher_head_bias is None:
        teacher_head_bias = head_bias
    vocab_size = _check_head(head_weight, teacher_head_weight, vocab_size)
    response_rows = _valid_rows(state_index, "state_index")
    grounding_rows = _valid_rows(grounding_state_index, "grounding_state_index")
    response_states, grounding_states = state_index[response_rows], grounding_state_index[grounding_rows]
    present = torch.cat([response_states, grounding_states])
    if present.numel() == 0:
        raise ValueError("no valid position: every state index is PADDING_STATE")
    num_states = num_states or int(present.max()) + 1
    # either term may be absent altogether (SFT: no responses; distillation alone: no gold)
    both = response_states.numel() and grounding_states.numel()
    if both and not torch.equal(response_states.unique(), grounding_states.unique()):
        raise ValueError("every state needs both response tokens and gold (grounding) tokens")
    labels = grounding_labels[grounding_rows]
    _check_labels(labels, vocab_size)
    dtype = _compute_dtype(student_hidden, head_weight)
    plan = _ChunkPlan(
        base_hidden=base_hidden.detach()[response_rows],
        intent_hidden=intent_hidden.detach()[response_rows],
        response_weights=state_token_weights(response_states, num_states).to(dtype),
        grounding_labels=labels,
        grounding_weights=state_token_weights(grounding_states, num_states, grounding_weights).to(dtype),
        teacher_weight=teacher_head_weight,
        teacher_bias=teacher_head_bias,
        vocab_size=vocab_size,
        chunk_size=chunk_size,
        settings=settings,
    )
    total, parts = _ChunkedOPTD.apply(
        student_hidden[response_rows], grounding_hidden[grounding_rows], head_weight, head_bias, plan
    )
    return OPTDLoss(total, *parts.unbind())


@_without_autocast
def grounding_nll_from_hidden(
    hidden: Tensor,
    labels: Tensor,
    state_index: Tensor,
    head_weight: Tensor,
    head_bias: Tensor | None = None,
    *,
    vocab_size: int | None = None,
    state_weights: Tensor | None = None,
    num_states: int | None = None,
    chunk_size: int = 256,
) -> Tensor:
    """Teacher-forced NLL, per-state token means then state-weighted, chunk by chunk (the SFT loss).

    ``hidden`` [M, H] predicts ``labels`` [M]; ``state_index`` [M] with ``PADDING_STATE`` for padding.
    """
    empty = hidden[:0]
    loss = optd_loss_from_hidden(
        empty,
        empty,
        empty,
        state_index[:0],
        hidden,
        labels,
        state_index,
        head_weight,
        head_bias,
        vocab_size=vocab_size,
        settings=ObjectiveSettings(gamma=1.0),
        grounding_weights=state_weights,
        num_states=num_states,
        chunk_size=chunk_size,
    )
    return loss.total
