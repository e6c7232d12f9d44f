"""The OPTD objective inside a bf16 autocast region against a float64 reference written here.

The trainer calls the objective inside bf16 autocast (CUDA); CPU autocast stands in for it here:
inside it a float32 matmul runs in bf16. The reference (``ref_*``, torch float64, no code shared
with ``trainer.objective``) follows OPTD.md literally: the geometric mixture in log space, eight
bisection steps per token, the generalized JSD through the log-space mixture (the two KLs at beta 0
and 1), per-state token means then equal state weights, gamma times the gold NLL. Its gradients
come from autograd.
"""

from __future__ import annotations

import math

import pytest
import torch

from trainer.objective import (
    ObjectiveSettings,
    generalized_jsd,
    grounding_nll_from_hidden,
    optd_loss,
    optd_loss_from_hidden,
    trust_region_target,
)

torch.set_num_threads(2)
F64 = torch.float64
EPSILON, STEPS, GAMMA = 0.02, 8, 0.1
TOL = 1e-5
LENGTHS, GOLD_LENGTHS = (9, 5, 3), (4, 7, 2)  # response / gold tokens of each of the three states
VOCAB, HIDDEN = 200, 16


def bf16_autocast() -> torch.autocast:
    return torch.autocast("cpu", dtype=torch.bfloat16)


# ---------------------------------------------------------------------------------------------
# the reference
# ---------------------------------------------------------------------------------------------


def ref_kl(log_a: torch.Tensor, log_b: torch.Tensor) -> torch.Tensor:
    return (log_a.exp() * (log_a - log_b)).sum(-1)


def ref_mix(base, intent, lam, dtype=F64):
    """log q^lambda per token, the geometric mixture of the two teachers, in ``dtype``."""
    log_q0, log_qi = torch.log_softmax(base.to(dtype), -1), torch.log_softmax(intent.to(dtype), -1)
    lam = lam.to(dtype).unsqueeze(-1)
    return torch.log_softmax((1 - lam) * log_q0 + lam * log_qi, -1)


def ref_target(base, intent, dtype=F64):
    """Per token: (log q^lambda*, lambda*, KL(q^lambda* || q^0)), computed in ``dtype``."""
    log_q0 = torch.log_softmax(base.to(dtype), -1)

    def mix(lam):
        return ref_mix(base, intent, lam, dtype)

    def kl(lam):
        return ref_kl(mix(lam), log_q0)

    top = torch.ones(base.shape[:-1], dtype=dtype)
    low, high = torch.zeros_like(top), top.clone()
    for _ in range(STEPS):
        mid = (low + high) / 2
        feasible = kl(mid) <= EPSILON
        low, high = torch.where(feasible, mid, low), torch.where(feasible, high, mid)
    lam = torch.where(kl(top) <= EPSILON, top, low)
    return mix(lam), lam, kl(lam)


def ref_jsd(log_q, log_p, beta=0.5):
    """JSD_beta; at beta 0 and 1, where it vanishes, the forward KL(q || p) and reverse KL(p || q)."""
    if beta == 0:
        return ref_kl(log_q, log_p)
    if beta == 1:
        return ref_kl(log_p, log_q)
    log_m = torch.logsumexp(torch.stack([log_q + math.log(beta), log_p + math.log1p(-beta)]), 0)
    return beta * ref_kl(log_q, log_m) + (1 - beta) * ref_kl(log_p, log_m)


def ref_nll(gold_logits, labels):
    return -torch.log_softmax(gold_logits, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def ref_loss(student, base, intent, gold, labels, beta=0.5):
    """(total, distillation, grounding, mean lambda*) over per-state lists of float64 logits."""
    dist, ground, lam_mean = 0.0, 0.0, 0.0
    for s_logits, b_logits, i_logits, g_logits, g_labels in zip(
        student, base, intent, gold, labels, strict=True
    ):
        target, lam, _ = ref_target(b_logits, i_logits)
        dist = dist + ref_jsd(target, torch.log_softmax(s_logits, -1), beta).mean() / len(student)
        ground = ground + ref_nll(g_logits, g_labels).mean() / len(student)
        lam_mean = lam_mean + lam.mean() / len(student)
    return dist + GAMMA * ground, dist, ground, lam_mean


# ---------------------------------------------------------------------------------------------
# inputs: the intent moves the teacher far enough that the trust region binds on most tokens
# ---------------------------------------------------------------------------------------------


def randn(*shape, gen, scale=1.0):
    return scale * torch.randn(*shape, generator=gen, dtype=F64)


def teacher_logits(tokens: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 logits; the intent's shift grows from a whisper (lambda_max feasible) to 2 nats."""
    gen = torch.Generator().manual_seed(seed)
    base = randn(tokens, VOCAB, gen=gen, scale=2.0)
    spread = torch.linspace(0.02, 2.0, tokens, dtype=F64).unsqueeze(-1)
    return base.float(), (base + spread * randn(tokens, VOCAB, gen=gen)).float()


def split(flat: torch.Tensor, lengths) -> list[torch.Tensor]:
    return list(flat.to(F64).split(list(lengths)))


def padded(pieces: list[torch.Tensor]) -> torch.Tensor:
    """[S, T, ...] with NaN (or -100 for labels) past each state's length."""
    length = max(len(piece) for piece in pieces)
    fill = float("nan") if pieces[0].is_floating_point() else -100
    out = torch.full((len(pieces), length, *pieces[0].shape[1:]), fill, dtype=pieces[0].dtype)
    for s, piece in enumerate(pieces):
        out[s, : len(piece)] = piece
    return out


def mask_of(lengths) -> torch.Tensor:
    return torch.arange(max(lengths)) < torch.tensor(lengths).unsqueeze(-1)


def state_index(lengths) -> torch.Tensor:
    return torch.cat([torch.full((n,), s) for s, n in enumerate(lengths)])


def assert_close_rel(got: torch.Tensor, want: torch.Tensor, tol: float = TOL) -> None:
    """Largest error within ``tol`` times the largest magnitude of the reference."""
    err = float((got.detach().to(F64) - want.detach()).abs().max())
    assert err <= tol * float(want.abs().max()), (err, float(want.abs().max()))


def assert_parts_match(loss, want) -> None:
    parts = (loss.total, loss.distillation, loss.grounding, loss.mean_lambda)
    for got, value in zip(parts, want, strict=True):
        got, value = float(got.detach()), float(value.detach())
        assert abs(got - value) <= TOL, (got, value)


# ---------------------------------------------------------------------------------------------
# the tolerance sees bf16
# ---------------------------------------------------------------------------------------------


def test_bf16_autocast_rounds_beyond_the_tolerance():
    # without the objective's guard its matmuls would run like this one; the same reference evaluated
    # in bf16 moves lambda* by grid steps and the JSD by far more than TOL, so the tests below fail on
    # an objective that lets autocast through
    base, intent = teacher_logits(40, seed=1)
    student = torch.randn(40, VOCAB, generator=torch.Generator().manual_seed(2))
    with bf16_autocast():
        assert torch.is_autocast_enabled("cpu")
        assert (base[:1] @ intent[:1].T).dtype == torch.bfloat16
    target, lam, _ = ref_target(base, intent)
    target16, lam16, _ = ref_target(base, intent, dtype=torch.bfloat16)
    assert float((lam16.to(F64) - lam).abs().max()) >= 1 / 256
    jsd = ref_jsd(target, torch.log_softmax(student.to(F64), -1))
    jsd16 = ref_jsd(target16, torch.log_softmax(student.to(torch.bfloat16), -1))
    assert float((jsd16.to(F64) - jsd).abs().max()) > 100 * TOL


# ---------------------------------------------------------------------------------------------
# the parts
# ---------------------------------------------------------------------------------------------


def test_trust_region_target_under_autocast_matches_reference():
    base, intent = teacher_logits(60, seed=3)
    want_target, want_lam, want_kl = ref_target(base, intent)
    assert 0.5 < float((want_lam < 1).double().mean()) < 1  # most tokens bind, not all
    with bf16_autocast():
        target, lam, kl = trust_region_target(base, intent)
    assert target.dtype == lam.dtype == kl.dtype == torch.float32
    assert torch.equal(lam.to(F64), want_lam)  # grid points k/256: exact in float32
    assert float((target.to(F64) - want_target).abs().max()) <= TOL
    assert float((kl.to(F64) - want_kl).abs().max()) <= TOL
    # every chosen target within the trust region: by the module's KL, and by the float64 KL of the
    # mixture at the module's lambda*
    assert bool((kl <= EPSILON).all())
    chosen_kl = ref_kl(ref_mix(base, intent, lam), torch.log_softmax(base.to(F64), -1))
    assert bool((chosen_kl <= EPSILON).all())


def test_trust_region_target_unguarded_misses_the_reference_under_autocast():
    # the same computation with the autocast guard peeled off: its matmuls run in bf16 and lambda*
    # leaves the reference's grid point on some tokens (the failure the guard exists for)
    base, intent = teacher_logits(60, seed=3)
    _, want_lam, _ = ref_target(base, intent)
    with bf16_autocast():
        _, lam, _ = trust_region_target.__wrapped__(base, intent)
    assert not torch.equal(lam.to(F64), want_lam)


@pytest.mark.parametrize("beta", [0.5, 0.0, 1.0])
def test_generalized_jsd_under_autocast_matches_reference(beta):
    base, intent = teacher_logits(30, seed=4)
    target = ref_target(base, intent)[0].float()
    student = torch.randn(30, VOCAB, generator=torch.Generator().manual_seed(5), requires_grad=True)
    student64 = student.detach().to(F64).requires_grad_()
    want = ref_jsd(target.to(F64), torch.log_softmax(student64, -1), beta)
    (want_grad,) = torch.autograd.grad(want.sum(), student64)
    with bf16_autocast():
        jsd = generalized_jsd(target, student, beta)
        (grad,) = torch.autograd.grad(jsd.sum(), student)  # backward inside the region too
    assert jsd.dtype == torch.float32 and grad.dtype == torch.float32
    assert float((jsd.detach().to(F64) - want.detach()).abs().max()) <= TOL
    assert_close_rel(grad, want_grad)


def test_float64_stays_float64_under_autocast():
    base, intent = (t.to(F64) for t in teacher_logits(12, seed=6))
    with bf16_autocast():
        target, _, _ = trust_region_target(base, intent)
        jsd = generalized_jsd(target, torch.randn(12, VOCAB, dtype=F64))
    assert target.dtype == jsd.dtype == F64


def test_the_callers_autocast_state_is_restored():
    base, intent = teacher_logits(4, seed=7)
    with bf16_autocast():
        trust_region_target(base, intent)
        assert torch.is_autocast_enabled("cpu")
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16
        assert (base[:1] @ intent[:1].T).dtype == torch.bfloat16
    trust_region_target(base, intent)
    assert not torch.is_autocast_enabled("cpu")


# ---------------------------------------------------------------------------------------------
# the loss from logits
# ---------------------------------------------------------------------------------------------


def test_optd_loss_under_autocast_matches_reference():
    tokens, gold_tokens = sum(LENGTHS), sum(GOLD_LENGTHS)
    base, intent = teacher_logits(tokens, seed=8)
    gen = torch.Generator().manual_seed(9)
    student = randn(tokens, VOCAB, gen=gen).float()
    gold = randn(gold_tokens, VOCAB, gen=gen).float()
    labels = torch.randint(0, VOCAB, (gold_tokens,), generator=gen)

    refs = [split(student, LENGTHS), split(gold, GOLD_LENGTHS)]
    for piece in (*refs[0], *refs[1]):
        piece.requires_grad_()
    want = ref_loss(
        refs[0], split(base, LENGTHS), split(intent, LENGTHS), refs[1], list(labels.split(GOLD_LENGTHS))
    )
    want_grads = torch.autograd.grad(want[0], [*refs[0], *refs[1]])

    student_logits = padded(list(student.split(LENGTHS))).requires_grad_()
    gold_logits = padded(list(gold.split(GOLD_LENGTHS))).requires_grad_()
    with bf16_autocast():
        loss = optd_loss(
            student_logits,
            padded(list(base.split(LENGTHS))),
            padded(list(intent.split(LENGTHS))),
            mask_of(LENGTHS),
            gold_logits,
            padded(list(labels.split(GOLD_LENGTHS))),
            mask_of(GOLD_LENGTHS),
        )
        grads = torch.autograd.grad(loss.total, [student_logits, gold_logits])
    assert loss.total.dtype == torch.float32
    assert 0.5 < float(loss.binding_share) < 1
    assert_parts_match(loss, want)
    assert bool((loss.guidance_kl <= EPSILON).all())
    assert_close_rel(grads[0][mask_of(LENGTHS)], torch.cat(want_grads[: len(LENGTHS)]))
    assert_close_rel(grads[1][mask_of(GOLD_LENGTHS)], torch.cat(want_grads[len(LENGTHS) :]))


# ---------------------------------------------------------------------------------------------
# the loss from hidden states, chunk by chunk
# ---------------------------------------------------------------------------------------------


def hidden_inputs(seed: int) -> dict[str, torch.Tensor]:
    """float32 hidden states of the response and gold positions and the two heads (with bias)."""
    gen = torch.Generator().manual_seed(seed)
    tokens, gold_tokens = sum(LENGTHS), sum(GOLD_LENGTHS)
    base = randn(tokens, HIDDEN, gen=gen)
    spread = torch.linspace(0.02, 1.5, tokens, dtype=F64).unsqueeze(-1)
    weight = randn(VOCAB, HIDDEN, gen=gen, scale=0.5)
    values = {
        "student_hidden": randn(tokens, HIDDEN, gen=gen),
        "base_hidden": base,
        "intent_hidden": base + spread * randn(tokens, HIDDEN, gen=gen),
        "grounding_hidden": randn(gold_tokens, HIDDEN, gen=gen),
        "head_weight": weight,
        "head_bias": randn(VOCAB, gen=gen, scale=0.3),
        "teacher_head_weight": weight + randn(VOCAB, HIDDEN, gen=gen, scale=0.1),
        "teacher_head_bias": randn(VOCAB, gen=gen, scale=0.3),
    }
    out = {key: value.float() for key, value in values.items()}
    out["grounding_labels"] = torch.randint(0, VOCAB, (gold_tokens,), generator=gen)
    return out


STUDENT_LEAVES = ("student_hidden", "grounding_hidden", "head_weight", "head_bias")


def chunked_loss(x, **kwargs):
    return optd_loss_from_hidden(
        x["student_hidden"],
        x["base_hidden"],
        x["intent_hidden"],
        state_index(LENGTHS),
        x["grounding_hidden"],
        x["grounding_labels"],
        state_index(GOLD_LENGTHS),
        x["head_weight"],
        x["head_bias"],
        teacher_head_weight=x["teacher_head_weight"],
        teacher_head_bias=x["teacher_head_bias"],
        **kwargs,
    )


def ref_from_hidden(x, beta=0.5):
    """The reference loss of ``hidden_inputs`` (float32 values taken exactly into float64) and the
    gradients of its total w.r.t. the student hidden, gold hidden, head weight and head bias."""
    x64 = {k: v.detach().to(F64) if v.is_floating_point() else v for k, v in x.items()}
    leaves = [x64[k].requires_grad_() for k in STUDENT_LEAVES]

    def student(h):
        return h @ x64["head_weight"].T + x64["head_bias"]

    def teacher(h):
        return h @ x64["teacher_head_weight"].T + x64["teacher_head_bias"]

    want = ref_loss(
        split(student(x64["student_hidden"]), LENGTHS),
        split(teacher(x64["base_hidden"]), LENGTHS),
        split(teacher(x64["intent_hidden"]), LENGTHS),
        split(student(x64["grounding_hidden"]), GOLD_LENGTHS),
        list(x64["grounding_labels"].split(GOLD_LENGTHS)),
        beta,
    )
    return want, torch.autograd.grad(want[0], leaves)


@pytest.mark.parametrize(("chunk_size", "beta"), [(4, 0.5), (256, 0.5), (4, 0.0), (4, 1.0)])
def test_optd_loss_from_hidden_under_autocast_matches_reference(chunk_size, beta):
    x = hidden_inputs(seed=10)
    want, want_grads = ref_from_hidden(x, beta)
    leaves = [x[k].requires_grad_() for k in STUDENT_LEAVES]
    with bf16_autocast():
        loss = chunked_loss(x, chunk_size=chunk_size, settings=ObjectiveSettings(beta=beta))
        grads = torch.autograd.grad(loss.total, leaves)
    assert loss.total.dtype == torch.float32
    assert 0.5 < float(loss.binding_share) < 1
    assert_parts_match(loss, want)
    assert float(loss.guidance_kl) <= EPSILON
    for grad, want_grad in zip(grads, want_grads, strict=True):
        assert grad.dtype == torch.float32
        assert_close_rel(grad, want_grad)


def test_grounding_nll_from_hidden_under_autocast_matches_reference():
    x = hidden_inputs(seed=11)
    hidden = x["grounding_hidden"].requires_grad_()
    weight = x["head_weight"].requires_grad_()
    hidden64, weight64 = hidden.detach().to(F64).requires_grad_(), weight.detach().to(F64).requires_grad_()
    per_state = split(hidden64 @ weight64.T, GOLD_LENGTHS)
    labels = list(x["grounding_labels"].split(GOLD_LENGTHS))
    want = sum(ref_nll(logits, gold).mean() for logits, gold in zip(per_state, labels, strict=True)) / len(
        GOLD_LENGTHS
    )
    want_grads = torch.autograd.grad(want, [hidden64, weight64])
    with bf16_autocast():
        nll = grounding_nll_from_hidden(
            hidden, x["grounding_labels"], state_index(GOLD_LENGTHS), weight, chunk_size=5
        )
        grads = torch.autograd.grad(nll, [hidden, weight])
    assert nll.dtype == torch.float32
    assert abs(float(nll.detach()) - float(want.detach())) <= TOL
    for grad, want_grad in zip(grads, want_grads, strict=True):
        assert_close_rel(grad, want_grad)


def test_chunked_backward_recomputation_under_autocast_matches_reference():
    # a second backward through a retained graph recomputes the gradients, inside the region too
    x = hidden_inputs(seed=12)
    leaves = [x[k].requires_grad_() for k in STUDENT_LEAVES]
    _, want_grads = ref_from_hidden(x)
    with bf16_autocast():
        loss = chunked_loss(x, chunk_size=8).total
        torch.autograd.grad(loss, leaves, retain_graph=True)
        again = torch.autograd.grad(loss, leaves)
    for grad, want_grad in zip(again, want_grads, strict=True):
        assert_close_rel(grad, want_grad)


def test_float64_hidden_path_stays_float64_under_autocast():
    x = {k: v.to(F64) if v.is_floating_point() else v for k, v in hidden_inputs(seed=13).items()}
    want, _ = ref_from_hidden(x)
    with bf16_autocast():
        loss = chunked_loss(x, chunk_size=4)
    assert loss.total.dtype == F64
    for got, value in zip((loss.total, loss.distillation, loss.grounding), want[:3], strict=True):
        assert abs(float(got) - float(value.detach())) <= 1e-12
