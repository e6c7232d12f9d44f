"""The OPTD objective against a float64 reference written here from OPTD.md, in probability space.

The reference (numpy, ``ref_*``) shares no code with ``trainer.objective``: q^lambda is the
normalised product q0^(1-lambda) * qI^lambda, KLs and JSDs are sums of p*log(p/q), lambda* is the
largest point of the 2**steps grid on [0, lambda_max] below which every grid point is feasible
(a scan, not a bisection), and the averaging loops over states.
"""

from __future__ import annotations

import math

import numpy as np
import pydantic
import pytest
import torch

from trainer import objective
from trainer.config import OPTDSettings
from trainer.objective import (
    PADDING_STATE,
    ObjectiveSettings,
    class_balance_weights,
    generalized_jsd,
    grounding_nll_from_hidden,
    optd_loss,
    optd_loss_from_hidden,
    trust_region_target,
)

torch.set_num_threads(2)
F64 = torch.float64

# ---------------------------------------------------------------------------------------------
# the reference
# ---------------------------------------------------------------------------------------------


def ref_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(-1, keepdims=True))  # exp(-inf) = 0 masks a row
    return shifted / shifted.sum(-1, keepdims=True)


def ref_kl(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    ratio = np.where(p > 0, p / np.where(q > 0, q, 1.0), 1.0)
    return (p * np.log(ratio)).sum(-1)


def ref_geometric_mix(q0: np.ndarray, qi: np.ndarray, lam: float) -> np.ndarray:
    mixed = q0 ** (1.0 - lam) * qi**lam
    return mixed / mixed.sum()


def ref_lambda_star(q0: np.ndarray, qi: np.ndarray, eps: float, lam_max: float, steps: int) -> float:
    """One token: largest grid point k*lam_max/2**steps with every grid point up to it feasible."""
    if ref_kl(ref_geometric_mix(q0, qi, lam_max), q0) <= eps:
        return lam_max
    best = 0.0
    for k in range(1, 2**steps):
        lam = k * lam_max / 2**steps
        if ref_kl(ref_geometric_mix(q0, qi, lam), q0) > eps:
            break
        best = lam
    return best


def ref_target(base, intent, eps=0.02, lam_max=1.0, steps=8):
    """Per token (rows of [N, V] logits): (q^lambda*, lambda*, KL(q^lambda* || q0))."""
    q0, qi = ref_softmax(np.asarray(base, np.float64)), ref_softmax(np.asarray(intent, np.float64))
    lams = np.array([ref_lambda_star(a, b, eps, lam_max, steps) for a, b in zip(q0, qi, strict=True)])
    targets = np.stack([ref_geometric_mix(a, b, lam) for a, b, lam in zip(q0, qi, lams, strict=True)])
    return targets, lams, ref_kl(targets, q0)


def ref_jsd(q: np.ndarray, p: np.ndarray, beta: float = 0.5) -> np.ndarray:
    """JSD_beta(q, p); at the endpoints, where it vanishes, the forward KL(q||p) (0) or reverse KL(p||q) (1)."""
    if beta == 0:
        return ref_kl(q, p)
    if beta == 1:
        return ref_kl(p, q)
    m = beta * q + (1 - beta) * p
    return beta * ref_kl(q, m) + (1 - beta) * ref_kl(p, m)


def ref_optd(
    student, base, intent, mask, grounding, labels, gold_mask, weights=None, gamma=0.1, beta=0.5, **tr
):
    """The whole loss on [S, T, V] arrays: per state token means, then the mean over states."""
    states = student.shape[0]
    weights = np.ones(states) if weights is None else weights
    dist, ground, lam_mean, binding, kl_mean = 0.0, 0.0, 0.0, 0.0, 0.0
    for s in range(states):
        keep = mask[s]
        targets, lams, kls = ref_target(base[s][keep], intent[s][keep], **tr)
        dist += ref_jsd(targets, ref_softmax(student[s][keep]), beta).mean() / states
        lam_mean += lams.mean() / states
        binding += (lams < tr.get("lam_max", 1.0)).mean() / states
        kl_mean += kls.mean() / states
        gold = ref_softmax(grounding[s][gold_mask[s]])
        nll = -np.log(gold[np.arange(gold.shape[0]), labels[s][gold_mask[s]]])
        ground += weights[s] * nll.mean() / states
    return {
        "total": dist + gamma * ground,
        "distillation": dist,
        "grounding": ground,
        "mean_lambda": lam_mean,
        "binding_share": binding,
        "guidance_kl": kl_mean,
    }


def scalar(tensor: torch.Tensor) -> float:
    return float(tensor.detach())


def numpy64(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().to(F64).numpy()


def teachers(tokens: int, vocab: int, spread: float, seed: int, dtype=torch.float32):
    """Plain-teacher logits and privileged ones that differ by noise of size ``spread``."""
    gen = torch.Generator().manual_seed(seed)
    base = 2.0 * torch.randn(tokens, vocab, generator=gen, dtype=F64)
    return base.to(dtype), (base + spread * torch.randn(tokens, vocab, generator=gen, dtype=F64)).to(dtype)


# ---------------------------------------------------------------------------------------------
# trust-region target
# ---------------------------------------------------------------------------------------------


def test_trust_region_matches_reference_on_random_logits():
    # spreads from near-identical to far apart: endpoint-feasible and bisected tokens both occur
    base, intent = teachers(48, 30, 0.0, seed=1)
    intent = intent + torch.linspace(0.0, 1.5, 48).unsqueeze(-1) * torch.randn(
        48, 30, generator=torch.Generator().manual_seed(2)
    )
    target, lam, kl = trust_region_target(base, intent)
    want_q, want_lam, want_kl = ref_target(numpy64(base), numpy64(intent))
    assert target.dtype == torch.float32
    assert 0 < (want_lam < 1).sum() < 48  # both kinds of token are present
    np.testing.assert_array_equal(numpy64(lam), want_lam)
    np.testing.assert_allclose(numpy64(target.exp()), want_q, atol=1e-5)
    np.testing.assert_allclose(numpy64(target), np.log(want_q), atol=1e-5)
    np.testing.assert_allclose(numpy64(kl), want_kl, atol=1e-5)


def test_identical_teachers_take_the_whole_guidance():
    # q^I = q^0: every q^lambda is q^0, KL = 0 <= eps, so lambda* = lambda_max = 1 and the target is q^0
    base, _ = teachers(10, 25, 0.0, seed=3)
    target, lam, kl = trust_region_target(base, base.clone())
    assert torch.equal(lam, torch.ones(10))
    assert torch.equal(kl, torch.zeros(10))
    torch.testing.assert_close(target, torch.log_softmax(base, -1), atol=1e-6, rtol=0)


def test_identical_teachers_are_feasible_even_at_epsilon_zero():
    base, _ = teachers(6, 25, 0.0, seed=4)
    _, lam, _ = trust_region_target(base, base.clone(), epsilon=0.0)
    assert torch.equal(lam, torch.ones(6))


def test_strongly_divergent_teachers_get_a_small_lambda():
    base, intent = teachers(12, 40, 6.0, seed=5)
    target, lam, kl = trust_region_target(base, intent)
    want_q, want_lam, want_kl = ref_target(numpy64(base), numpy64(intent))
    assert want_lam.max() < 0.1  # noise of 6 nats: only a sliver of the intent fits in KL 0.02
    np.testing.assert_array_equal(numpy64(lam), want_lam)
    np.testing.assert_allclose(numpy64(target.exp()), want_q, atol=1e-5)
    np.testing.assert_allclose(numpy64(kl), want_kl, atol=1e-5)
    assert bool((kl <= 0.02 + 1e-6).all())


def test_epsilon_zero_keeps_the_plain_teacher():
    # any lambda > 0 moves q^lambda off q^0 (KL > 0), so lambda* = 0 and the target is q^0 itself
    base, intent = teachers(9, 20, 1.0, seed=6)
    target, lam, kl = trust_region_target(base, intent, epsilon=0.0)
    assert torch.equal(lam, torch.zeros(9))
    torch.testing.assert_close(target, torch.log_softmax(base, -1), atol=1e-6, rtol=0)
    assert float(kl.abs().max()) < 1e-6


@pytest.fixture
def bisected_rows(monkeypatch) -> list[int]:
    """The number of rows of every bisection ``trust_region_target`` runs."""
    rows: list[int] = []
    real_bisect = objective._bisect
    monkeypatch.setattr(
        objective, "_bisect", lambda base, *a: rows.append(base.shape[0]) or real_bisect(base, *a)
    )
    return rows


def test_feasible_endpoint_gives_the_privileged_teacher_without_bisection(bisected_rows):
    # at lambda = 1 the mixture is q^I itself; teachers this close stay within KL 0.02 everywhere
    base, intent = teachers(16, 30, 0.02, seed=7)
    target, lam, kl = trust_region_target(base, intent)
    assert torch.equal(lam, torch.ones(16))
    torch.testing.assert_close(target, torch.log_softmax(intent, -1), atol=1e-6, rtol=0)
    np.testing.assert_allclose(
        numpy64(kl), ref_kl(ref_softmax(numpy64(intent)), ref_softmax(numpy64(base))), atol=1e-6
    )
    assert bisected_rows == []


def test_only_infeasible_tokens_are_bisected(bisected_rows):
    near, near_intent = teachers(5, 30, 0.02, seed=8)
    far, far_intent = teachers(3, 30, 4.0, seed=9)
    _, lam, _ = trust_region_target(torch.cat([near, far]), torch.cat([near_intent, far_intent]))
    assert bisected_rows == [3]
    assert torch.equal(lam[:5], torch.ones(5)) and bool((lam[5:] < 1).all())


@pytest.mark.parametrize("lambda_max", [1.0, 0.8])
def test_lambda_star_is_feasible_and_the_next_grid_point_is_not(lambda_max):
    base, intent = teachers(40, 30, 0.0, seed=10, dtype=F64)
    intent = intent + torch.linspace(0.1, 3.0, 40, dtype=F64).unsqueeze(-1) * torch.randn(
        40, 30, generator=torch.Generator().manual_seed(11), dtype=F64
    )
    _, lam, _ = trust_region_target(base, intent, lambda_max=lambda_max)
    q0, qi = ref_softmax(numpy64(base)), ref_softmax(numpy64(intent))
    binding = numpy64(lam) < lambda_max
    assert binding.sum() >= 30
    for a, b, value in zip(q0[binding], qi[binding], numpy64(lam)[binding], strict=True):
        assert ref_kl(ref_geometric_mix(a, b, value), a) <= 0.02
        assert ref_kl(ref_geometric_mix(a, b, value + lambda_max / 256), a) > 0.02


def test_bf16_teachers_are_promoted():
    base, intent = teachers(20, 30, 0.8, seed=12, dtype=torch.bfloat16)
    target, lam, kl = trust_region_target(base, intent)
    want_q, want_lam, want_kl = ref_target(numpy64(base), numpy64(intent))  # the bf16 values, exactly
    assert target.dtype == torch.float32
    np.testing.assert_array_equal(numpy64(lam), want_lam)
    np.testing.assert_allclose(numpy64(target.exp()), want_q, atol=1e-5)
    np.testing.assert_allclose(numpy64(kl), want_kl, atol=1e-5)


def test_trust_region_keeps_leading_dimensions():
    base, intent = teachers(12, 10, 1.0, seed=13)
    target, lam, kl = trust_region_target(base.reshape(3, 4, 10), intent.reshape(3, 4, 10))
    flat_target, flat_lam, _ = trust_region_target(base, intent)
    assert target.shape == (3, 4, 10) and lam.shape == (3, 4) and kl.shape == (3, 4)
    torch.testing.assert_close(target.reshape(12, 10), flat_target, atol=0, rtol=0)
    assert torch.equal(lam.reshape(12), flat_lam)


# ---------------------------------------------------------------------------------------------
# generalized JSD
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("beta", [0.5, 0.2, 0.9, 0.0, 1.0])
def test_generalized_jsd_matches_reference(beta):
    gen = torch.Generator().manual_seed(14)
    target = torch.log_softmax(torch.randn(8, 25, generator=gen), -1)
    student = torch.randn(8, 25, generator=gen)
    loss = generalized_jsd(target, student, beta=beta)
    want = ref_jsd(np.exp(numpy64(target)), ref_softmax(numpy64(student)), beta)
    np.testing.assert_allclose(numpy64(loss), want, atol=1e-5)


def test_generalized_jsd_of_equal_distributions_is_zero_and_of_disjoint_ones_is_log2():
    logits = torch.randn(3, 9, dtype=F64)
    assert float(generalized_jsd(torch.log_softmax(logits, -1), logits).abs().max()) < 1e-15
    # q and p on disjoint supports: m = q/2 + p/2, each KL = log 2, JSD_0.5 = log 2
    disjoint = torch.tensor([[0.0, -1e4], [-1e4, 0.0]], dtype=F64)
    loss = generalized_jsd(torch.log_softmax(disjoint[0:1], -1), disjoint[1:2])
    assert math.isclose(float(loss), math.log(2.0), rel_tol=1e-12)


@pytest.mark.parametrize("beta", [0.3, 0.0, 1.0])
def test_generalized_jsd_gradcheck(beta):
    gen = torch.Generator().manual_seed(15)
    target = torch.log_softmax(torch.randn(4, 7, generator=gen, dtype=F64), -1)
    student = torch.randn(4, 7, generator=gen, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda s: generalized_jsd(target, s, beta=beta), (student,))


def test_generalized_jsd_endpoints_are_the_two_kls():
    # q = (1/2, 1/2), p = (1/4, 3/4): KL(q||p) = 1/2 log(2) + 1/2 log(2/3) = 1/2 log(4/3);
    # KL(p||q) = 1/4 log(1/2) + 3/4 log(3/2) = 3/4 log 3 - log 2
    target = torch.log(torch.tensor([[0.5, 0.5]], dtype=F64))
    student = torch.log(torch.tensor([[0.25, 0.75]], dtype=F64))
    assert math.isclose(
        float(generalized_jsd(target, student, beta=0.0)), 0.5 * math.log(4 / 3), rel_tol=1e-12
    )
    assert math.isclose(
        float(generalized_jsd(target, student, beta=1.0)), 0.75 * math.log(3) - math.log(2), rel_tol=1e-12
    )


@pytest.mark.parametrize("beta", [-0.1, 1.1, float("nan")])
def test_beta_outside_the_unit_interval_is_rejected(beta):
    with pytest.raises(ValueError, match="beta"):
        generalized_jsd(torch.zeros(1, 3), torch.zeros(1, 3), beta=beta)
    with pytest.raises(ValueError, match="beta"):
        ObjectiveSettings(beta=beta)
    with pytest.raises(pydantic.ValidationError, match="beta"):
        OPTDSettings(beta=beta)


@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_the_endpoints_are_valid_settings(beta):
    assert OPTDSettings(beta=beta).objective() == ObjectiveSettings(beta=beta)


# ---------------------------------------------------------------------------------------------
# the loss from logits
# ---------------------------------------------------------------------------------------------


def padded_batch(seed: int, states=3, length=6, vocab=20, spread=1.0, dtype=torch.float32, extra_padding=0):
    """Student/teacher/gold logits [S, T, V] with ragged masks; padding filled with NaN."""
    gen = torch.Generator().manual_seed(seed)
    lengths, gold_lengths = [length, length - 2, 1][:states], [length - 1, length, 3][:states]
    total = length + extra_padding

    def logits(scale=1.0):
        return (scale * torch.randn(states, total, vocab, generator=gen, dtype=F64)).to(dtype)

    mask = torch.arange(total) < torch.tensor(lengths).unsqueeze(-1)
    gold_mask = torch.arange(total) < torch.tensor(gold_lengths).unsqueeze(-1)
    base = logits(2.0)
    batch = {
        "student_logits": logits(),
        "base_logits": base,
        "intent_logits": (
            base.to(F64) + spread * torch.randn(states, total, vocab, generator=gen, dtype=F64)
        ).to(dtype),
        "response_mask": mask,
        "grounding_logits": logits(),
        "grounding_labels": torch.randint(0, vocab, (states, total), generator=gen),
        "grounding_mask": gold_mask,
    }
    for key, keep in (
        ("student_logits", mask),
        ("base_logits", mask),
        ("intent_logits", mask),
        ("grounding_logits", gold_mask),
    ):
        batch[key] = batch[key].masked_fill(~keep.unsqueeze(-1), float("nan"))
    batch["grounding_labels"] = batch["grounding_labels"].masked_fill(~gold_mask, -100)
    return batch


def reference_of(batch, **kwargs):
    arrays = {k: v.detach().to(F64).numpy() if v.is_floating_point() else v.numpy() for k, v in batch.items()}
    return ref_optd(
        arrays["student_logits"],
        arrays["base_logits"],
        arrays["intent_logits"],
        arrays["response_mask"],
        arrays["grounding_logits"],
        arrays["grounding_labels"],
        arrays["grounding_mask"],
        **kwargs,
    )


def assert_parts_match(loss, want, atol):
    for name, value in want.items():
        assert math.isclose(scalar(getattr(loss, name)), value, abs_tol=atol), (
            name,
            scalar(getattr(loss, name)),
            value,
        )


def test_optd_loss_matches_reference_with_nan_padding():
    batch = padded_batch(seed=16, spread=0.3)
    loss = optd_loss(**batch)
    assert_parts_match(loss, reference_of(batch), atol=1e-5)
    assert 0 < float(loss.binding_share) < 1


def test_optd_loss_padding_gets_no_gradient_and_no_nan():
    batch = padded_batch(seed=17)
    student = batch["student_logits"].requires_grad_()
    gold = batch["grounding_logits"].requires_grad_()
    optd_loss(**batch).total.backward()
    for grad, keep in ((student.grad, batch["response_mask"]), (gold.grad, batch["grounding_mask"])):
        assert bool(torch.isfinite(grad).all())
        assert bool((grad[~keep] == 0).all())
        assert bool((grad[keep].abs().sum(-1) > 0).all())


def test_optd_loss_class_weights_scale_each_state_grounding():
    batch = padded_batch(seed=18)
    weights = torch.tensor([0.5, 2.0, 0.5])
    loss = optd_loss(**batch, grounding_weights=weights)
    assert_parts_match(loss, reference_of(batch, weights=weights.numpy()), atol=1e-5)


def test_optd_loss_settings_reach_every_part():
    batch = padded_batch(seed=19, spread=2.0)
    settings = ObjectiveSettings(epsilon=0.05, lambda_max=0.6, steps=5, gamma=0.3)
    loss = optd_loss(**batch, settings=settings)
    want = reference_of(batch, gamma=0.3, eps=0.05, lam_max=0.6, steps=5)
    assert_parts_match(loss, want, atol=1e-5)


def test_optd_loss_bf16_inputs():
    batch = padded_batch(seed=20, dtype=torch.bfloat16)
    loss = optd_loss(**batch)
    assert loss.total.dtype == torch.float32
    assert_parts_match(loss, reference_of(batch), atol=1e-5)


def test_optd_loss_is_the_same_whatever_the_padding():
    short, long = padded_batch(seed=21), padded_batch(seed=21, extra_padding=5)
    for key in ("student_logits", "base_logits", "intent_logits", "grounding_logits", "grounding_labels"):
        long[key][:, :6] = short[key]  # the same values on the shared positions
    for batch in (short, long):
        batch["student_logits"].requires_grad_()
    losses = [optd_loss(**batch) for batch in (short, long)]
    grads = [
        torch.autograd.grad(loss.total, batch["student_logits"])[0]
        for loss, batch in zip(losses, (short, long), strict=True)
    ]
    assert float(losses[0].total.detach()) == float(losses[1].total.detach())
    assert torch.equal(grads[0], grads[1][:, :6]) and bool((grads[1][:, 6:] == 0).all())


def test_optd_loss_no_gradient_reaches_the_teacher():
    batch = padded_batch(seed=22)
    for key in ("student_logits", "base_logits", "intent_logits"):
        batch[key].requires_grad_()
    optd_loss(**batch).total.backward()
    assert batch["student_logits"].grad is not None
    assert batch["base_logits"].grad is None and batch["intent_logits"].grad is None


def test_optd_loss_gradcheck():
    batch = padded_batch(seed=23, states=2, length=3, vocab=6, dtype=F64)
    student, gold = batch.pop("student_logits"), batch.pop("grounding_logits")
    student, gold = student.nan_to_num(0.0).requires_grad_(), gold.nan_to_num(0.0).requires_grad_()
    assert torch.autograd.gradcheck(
        lambda s, g: optd_loss(student_logits=s, grounding_logits=g, **batch).total, (student, gold)
    )


def test_optd_loss_drops_padded_vocabulary_columns():
    # 4 columns past the tokenizer's 20 hold NaN: the loss equals the reference on the first 20
    # columns and those columns get no gradient (float64: no lambda* on a rounding tie)
    batch = padded_batch(seed=40, dtype=F64)
    padded = dict(batch)
    for key in ("student_logits", "base_logits", "intent_logits", "grounding_logits"):
        nan = torch.full((*batch[key].shape[:-1], 4), float("nan"), dtype=F64)
        padded[key] = torch.cat([batch[key], nan], -1)
    padded["student_logits"].requires_grad_()
    loss = optd_loss(**padded, vocab_size=20)
    assert_parts_match(loss, reference_of(batch), atol=1e-10)
    grad = torch.autograd.grad(loss.total, padded["student_logits"])[0]
    assert bool((grad[..., 20:] == 0).all()) and bool(torch.isfinite(grad).all())


def test_optd_loss_rejects_teachers_over_another_vocabulary():
    batch = padded_batch(seed=41)
    batch["base_logits"] = batch["base_logits"][..., :-1]
    with pytest.raises(ValueError, match="one shared vocabulary"):
        optd_loss(**batch)


def test_optd_loss_rejects_labels_outside_the_vocabulary():
    batch = padded_batch(seed=42)
    batch["grounding_labels"][0, 0] = 20
    with pytest.raises(ValueError, match="outside the vocabulary"):
        optd_loss(**batch)


def split_states(batch, groups):
    return [{k: v[list(g)] for k, v in batch.items()} for g in groups]


@pytest.mark.parametrize("groups", [[(0, 1), (2,)], [(0,), (1,), (2,)], [(2,), (0, 1)]])
def test_optd_loss_micro_batches_add_up_to_the_update(groups):
    batch = padded_batch(seed=24, dtype=F64)
    weights = torch.tensor([0.7, 1.6, 0.7], dtype=F64)
    batch["student_logits"].requires_grad_()
    full = optd_loss(**batch, grounding_weights=weights)
    full_grad = torch.autograd.grad(full.total, batch["student_logits"])[0]
    summed = {
        name: 0.0
        for name in ("total", "distillation", "grounding", "mean_lambda", "binding_share", "guidance_kl")
    }
    for group, micro in zip(groups, split_states(batch, groups), strict=True):
        loss = optd_loss(**micro, grounding_weights=weights[list(group)], num_states=3)
        micro_grad = torch.autograd.grad(loss.total, micro["student_logits"])[0]
        torch.testing.assert_close(micro_grad, full_grad[list(group)], atol=1e-15, rtol=0)
        for name in summed:
            summed[name] += scalar(getattr(loss, name).detach())
    for name, value in summed.items():
        assert math.isclose(value, scalar(getattr(full, name).detach()), abs_tol=1e-14), name


def test_optd_loss_rejects_a_state_without_tokens():
    batch = padded_batch(seed=25)
    batch["response_mask"][1] = False
    with pytest.raises(ValueError, match=r"states \[1\] have no valid token"):
        optd_loss(**batch)


# ---------------------------------------------------------------------------------------------
# class weights
# ---------------------------------------------------------------------------------------------


def test_class_balance_weights_without_the_cap():
    # freq 3/4 and 1/4 -> w = 2/sqrt(3) and 2; c = 4 / (3*2/sqrt(3) + 2) makes the mean 1; 2c < 2
    weights = class_balance_weights(torch.tensor([0, 0, 0, 1]))
    c = 4 / (3 * 2 / math.sqrt(3) + 2)
    torch.testing.assert_close(weights, torch.tensor([c * 2 / math.sqrt(3)] * 3 + [2 * c], dtype=F64))


def test_class_balance_weights_with_the_cap():
    # freq 0.9 and 0.1: uncapped the rare class would get 2.5 > 2; capped, 9*c*w0 + 2 = 10 -> 8/9 each
    weights = class_balance_weights(torch.tensor([3] * 9 + [7]))
    torch.testing.assert_close(weights, torch.tensor([8 / 9] * 9 + [2.0], dtype=F64))


# ---------------------------------------------------------------------------------------------
# the loss from hidden states
# ---------------------------------------------------------------------------------------------


def hidden_batch(seed: int, dtype=F64, hidden=6, vocab=17, padded_vocab=21, bias=True, own_teacher_head=True):
    """Hidden states [S, T, H] with ragged masks (NaN in padding) and LM heads with padded vocab rows."""
    gen = torch.Generator().manual_seed(seed)
    states, length = 3, 7

    def rand(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=gen, dtype=F64)).to(dtype)

    weight = rand(padded_vocab, hidden, scale=0.8)
    teacher_weight = weight + rand(padded_vocab, hidden, scale=0.1) if own_teacher_head else weight
    base = rand(states, length, hidden)
    out = {
        "student_hidden": rand(states, length, hidden),
        "base_hidden": base,
        "intent_hidden": base + rand(states, length, hidden, scale=0.7),
        "grounding_hidden": rand(states, length, hidden),
        "grounding_labels": torch.randint(0, vocab, (states, length), generator=gen),
        "response_mask": torch.arange(length) < torch.tensor([[7], [4], [2]]),
        "grounding_mask": torch.arange(length) < torch.tensor([[5], [7], [1]]),
        "head_weight": weight,
        "head_bias": rand(padded_vocab, scale=0.3) if bias else None,
        "teacher_head_weight": teacher_weight,
        "vocab_size": vocab,
    }
    out["teacher_head_bias"] = out["head_bias"] + 0.1 if bias else None
    for key, mask in (
        ("student_hidden", "response_mask"),
        ("base_hidden", "response_mask"),
        ("intent_hidden", "response_mask"),
        ("grounding_hidden", "grounding_mask"),
    ):
        out[key] = out[key].masked_fill(~out[mask].unsqueeze(-1), float("nan"))
    return out


def project(hidden, weight, bias, vocab):
    logits = hidden @ weight[:vocab].T
    return logits if bias is None else logits + bias[:vocab]


def logits_path(b, **kwargs):
    """The unchunked loss: project every position through the (cut) heads, then ``optd_loss``.

    Padding hidden states are zeroed first: NaN rows would reach the head's gradient through the
    projection (0 * NaN), which is the caller's matmul, not the loss.
    """
    vocab = b["vocab_size"]
    b = {
        **b,
        **{
            k: b[k].nan_to_num(0.0)
            for k in ("student_hidden", "base_hidden", "intent_hidden", "grounding_hidden")
        },
    }
    student = project(b["student_hidden"], b["head_weight"], b["head_bias"], vocab)

    def teacher(hidden):
        return project(hidden, b["teacher_head_weight"], b["teacher_head_bias"], vocab).detach()

    return optd_loss(
        student,
        teacher(b["base_hidden"]),
        teacher(b["intent_hidden"]),
        b["response_mask"],
        project(b["grounding_hidden"], b["head_weight"], b["head_bias"], vocab),
        b["grounding_labels"],
        b["grounding_mask"],
        **kwargs,
    )


def flat_state_index(mask):
    return torch.where(mask, torch.arange(mask.shape[0]).unsqueeze(-1), PADDING_STATE).reshape(-1)


def hidden_path(b, chunk_size, **kwargs):
    def flat(key):
        return b[key].reshape(-1, b[key].shape[-1])

    return optd_loss_from_hidden(
        flat("student_hidden"),
        flat("base_hidden"),
        flat("intent_hidden"),
        flat_state_index(b["response_mask"]),
        flat("grounding_hidden"),
        b["grounding_labels"].reshape(-1),
        flat_state_index(b["grounding_mask"]),
        b["head_weight"],
        b["head_bias"],
        teacher_head_weight=b["teacher_head_weight"],
        teacher_head_bias=b["teacher_head_bias"],
        vocab_size=b["vocab_size"],
        chunk_size=chunk_size,
        **kwargs,
    )


def student_leaves(b):
    return [
        b[k].requires_grad_()
        for k in ("student_hidden", "grounding_hidden", "head_weight", "head_bias")
        if b[k] is not None
    ]


PARTS = ("total", "distillation", "grounding", "mean_lambda", "binding_share", "guidance_kl")


@pytest.mark.parametrize("chunk_size", [1, 2, 3, 4, 5, 7, 13, 1024])
def test_chunked_path_equals_the_logits_path(chunk_size):
    # 13 response and 13 gold positions: chunk sizes 1 and 13 divide them, the others leave a remainder
    b = hidden_batch(seed=26)
    leaves = student_leaves(b)
    weights = torch.tensor([1.5, 0.5, 1.0], dtype=F64)
    unchunked = logits_path(b, grounding_weights=weights)
    want_grads = torch.autograd.grad(unchunked.total, leaves)
    chunked = hidden_path(b, chunk_size, grounding_weights=weights)
    grads = torch.autograd.grad(chunked.total, leaves)
    for name in PARTS:
        assert abs(scalar(getattr(chunked, name)) - scalar(getattr(unchunked, name))) < 1e-10, name
    for grad, want in zip(grads, want_grads, strict=True):
        assert bool(torch.isfinite(grad).all())
        torch.testing.assert_close(grad, want, atol=1e-10, rtol=0)


def test_chunked_path_matches_reference_with_padded_vocabulary():
    # the reference masks padded vocabulary rows with -inf logits in every distribution
    b = hidden_batch(seed=27)

    def masked(h, w, bias):
        return np.where(np.arange(w.shape[0]) < b["vocab_size"], numpy64(h @ w.T + bias), -np.inf)

    student = masked(b["student_hidden"], b["head_weight"], b["head_bias"])
    base = masked(b["base_hidden"], b["teacher_head_weight"], b["teacher_head_bias"])
    intent = masked(b["intent_hidden"], b["teacher_head_weight"], b["teacher_head_bias"])
    gold = masked(b["grounding_hidden"], b["head_weight"], b["head_bias"])
    want = ref_optd(
        student,
        base,
        intent,
        b["response_mask"].numpy(),
        gold,
        b["grounding_labels"].numpy(),
        b["grounding_mask"].numpy(),
    )
    assert_parts_match(hidden_path(b, chunk_size=4), want, atol=1e-10)


def test_chunked_path_padded_vocabulary_rows_get_no_gradient():
    b = hidden_batch(seed=28)
    student_leaves(b)
    hidden_path(b, chunk_size=3).total.backward()
    assert bool((b["head_weight"].grad[b["vocab_size"] :] == 0).all())
    assert bool((b["head_bias"].grad[b["vocab_size"] :] == 0).all())
    assert bool((b["head_weight"].grad[: b["vocab_size"]].abs().sum(-1) > 0).all())


def test_chunked_path_padding_holding_nan_gets_no_gradient():
    b = hidden_batch(seed=29)
    student_leaves(b)
    hidden_path(b, chunk_size=4).total.backward()
    for key, mask in (("student_hidden", "response_mask"), ("grounding_hidden", "grounding_mask")):
        grad = b[key].grad
        assert bool(torch.isfinite(grad).all()) and bool((grad[~b[mask]] == 0).all())
    assert bool(torch.isfinite(b["head_weight"].grad).all()) and bool(
        torch.isfinite(b["head_bias"].grad).all()
    )


def test_chunked_path_no_gradient_reaches_the_teacher():
    b = hidden_batch(seed=30)
    student_leaves(b)
    teacher = [
        b[k].requires_grad_()
        for k in ("base_hidden", "intent_hidden", "teacher_head_weight", "teacher_head_bias")
    ]
    hidden_path(b, chunk_size=5).total.backward()
    assert all(t.grad is None for t in teacher)
    assert b["student_hidden"].grad is not None


def test_chunked_path_shares_one_head_between_student_and_teacher():
    b = hidden_batch(seed=31, bias=False, own_teacher_head=False)
    b["teacher_head_weight"], b["teacher_head_bias"] = None, None
    leaves = student_leaves(b)
    chunked = hidden_path(b, chunk_size=3)
    b["teacher_head_weight"] = b["head_weight"]
    unchunked = logits_path(b)
    for grad, want in zip(
        torch.autograd.grad(chunked.total, leaves), torch.autograd.grad(unchunked.total, leaves), strict=True
    ):
        torch.testing.assert_close(grad, want, atol=1e-10, rtol=0)


def test_chunked_path_backward_twice_through_a_retained_graph():
    # the second backward recomputes the gradients the first one handed over: the same values
    b = hidden_batch(seed=43)
    leaves = student_leaves(b)
    loss = hidden_path(b, chunk_size=4).total
    first = torch.autograd.grad(loss, leaves, retain_graph=True)
    second = torch.autograd.grad(loss, leaves)
    for one, two in zip(first, second, strict=True):
        torch.testing.assert_close(one, two, atol=0, rtol=0)


def test_chunked_path_scales_its_gradients_by_the_upstream_gradient():
    b = hidden_batch(seed=44)
    leaves = student_leaves(b)
    plain = torch.autograd.grad(hidden_path(b, chunk_size=4).total, leaves)
    scaled = torch.autograd.grad(2.5 * hidden_path(b, chunk_size=4).total, leaves)
    for one, many in zip(plain, scaled, strict=True):
        torch.testing.assert_close(many, 2.5 * one, atol=1e-15, rtol=1e-14)


def test_chunked_path_gradcheck():
    b = hidden_batch(seed=32, hidden=3, vocab=5, padded_vocab=6)
    for key in ("student_hidden", "grounding_hidden"):
        b[key] = b[key].nan_to_num(0.0)
    leaves = student_leaves(b)

    def loss(student, gold, weight, bias):
        return hidden_path(
            {
                **b,
                "student_hidden": student,
                "grounding_hidden": gold,
                "head_weight": weight,
                "head_bias": bias,
            },
            chunk_size=4,
        ).total

    # fast mode checks the Jacobian along random directions: one forward pair per direction, not per input
    assert torch.autograd.gradcheck(loss, tuple(leaves), fast_mode=True)


def test_chunked_path_bf16_model():
    # bf16 hidden states and head: the projection and the loss run in float32 on the bf16 values
    b = hidden_batch(seed=33, dtype=torch.bfloat16)
    leaves = student_leaves(b)
    chunked = hidden_path(b, chunk_size=4)
    up = {k: v.float() if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in b.items()}
    assert_parts_match(chunked, {name: scalar(getattr(logits_path(up), name)) for name in PARTS}, atol=1e-5)
    chunked.total.backward()
    assert all(leaf.grad.dtype == torch.bfloat16 and bool(torch.isfinite(leaf.grad).all()) for leaf in leaves)


def test_chunked_path_is_the_same_whatever_the_padding():
    b = hidden_batch(seed=34)
    leaves = student_leaves(b)
    plain = hidden_path(b, chunk_size=4)
    plain_grads = torch.autograd.grad(plain.total, leaves)
    extra = {**b}
    for key in ("student_hidden", "base_hidden", "intent_hidden", "grounding_hidden"):
        extra[key] = torch.cat([b[key], torch.full((3, 4, b[key].shape[-1]), float("nan"), dtype=F64)], 1)
    extra["grounding_labels"] = torch.cat([b["grounding_labels"], torch.full((3, 4), -100)], 1)
    for key in ("response_mask", "grounding_mask"):
        extra[key] = torch.cat([b[key], torch.zeros(3, 4, dtype=torch.bool)], 1)
    padded = hidden_path(extra, chunk_size=4)
    padded_grads = torch.autograd.grad(padded.total, leaves)
    for name in PARTS:
        assert scalar(getattr(padded, name)) == scalar(getattr(plain, name)), name
    for grad, want in zip(padded_grads, plain_grads, strict=True):
        torch.testing.assert_close(grad, want, atol=1e-15, rtol=0)


@pytest.mark.parametrize("groups", [[(0, 1), (2,)], [(0,), (1,), (2,)]])
def test_chunked_path_micro_batches_add_up_to_the_update(groups):
    b = hidden_batch(seed=35)
    leaves = student_leaves(b)
    weights = torch.tensor([0.5, 1.25, 1.25], dtype=F64)
    full = hidden_path(b, chunk_size=3, grounding_weights=weights)
    full_grads = torch.autograd.grad(full.total, leaves)
    micro_losses = []
    for group in groups:
        micro = {**b}
        for key in (
            "student_hidden",
            "base_hidden",
            "intent_hidden",
            "grounding_hidden",
            "grounding_labels",
            "response_mask",
            "grounding_mask",
        ):
            micro[key] = b[key][list(group)]
        micro_losses.append(
            hidden_path(micro, chunk_size=3, grounding_weights=weights[list(group)], num_states=3)
        )
    summed_grads = torch.autograd.grad(sum(loss.total for loss in micro_losses), leaves)
    for name in PARTS:
        assert math.isclose(
            sum(scalar(getattr(m, name)) for m in micro_losses), scalar(getattr(full, name)), abs_tol=1e-14
        )
    for grad, want in zip(summed_grads, full_grads, strict=True):
        torch.testing.assert_close(grad, want, atol=1e-14, rtol=0)


def test_grounding_nll_from_hidden_matches_reference():
    b = hidden_batch(seed=36)
    weights = np.array([2.0, 0.5, 1.0])
    nll = grounding_nll_from_hidden(
        b["grounding_hidden"].reshape(-1, 6),
        b["grounding_labels"].reshape(-1),
        flat_state_index(b["grounding_mask"]),
        b["head_weight"],
        b["head_bias"],
        vocab_size=b["vocab_size"],
        state_weights=torch.tensor(weights),
        chunk_size=4,
    )
    logits = numpy64(project(b["grounding_hidden"], b["head_weight"], b["head_bias"], b["vocab_size"]))
    want = 0.0
    for s in range(3):
        keep = b["grounding_mask"][s].numpy()
        probs = ref_softmax(logits[s][keep])
        want += (
            weights[s]
            * -np.log(probs[np.arange(keep.sum()), b["grounding_labels"][s].numpy()[keep]]).mean()
            / 3
        )
    assert math.isclose(float(nll), want, abs_tol=1e-12)


def test_chunked_path_rejects_mismatched_heads_and_bad_labels():
    b = hidden_batch(seed=37)
    b["teacher_head_weight"] = b["teacher_head_weight"][:-1]
    with pytest.raises(ValueError, match="share one tokenizer"):
        hidden_path(b, chunk_size=4)
    b = hidden_batch(seed=37)
    b["grounding_labels"][0, 0] = b["vocab_size"]  # a padded-vocabulary id is no valid label
    with pytest.raises(ValueError, match="outside the vocabulary"):
        hidden_path(b, chunk_size=4)


def test_chunked_path_rejects_a_state_missing_from_one_term():
    b = hidden_batch(seed=38)
    b["response_mask"][2] = False
    with pytest.raises(ValueError, match="both response tokens and gold"):
        hidden_path(b, chunk_size=4)


# ---------------------------------------------------------------------------------------------
# beta at the endpoints: forward KL(q||p) at 0, reverse KL(p||q) at 1, both paths
# ---------------------------------------------------------------------------------------------


def torch_ref_divergence(log_q: torch.Tensor, log_p: torch.Tensor, beta: float) -> torch.Tensor:
    """The reference's divergence per token in torch (float64, for autograd), m in probability space."""

    def kl(log_a, log_b):
        return (log_a.exp() * (log_a - log_b)).sum(-1)

    if beta == 0:
        return kl(log_q, log_p)
    if beta == 1:
        return kl(log_p, log_q)
    log_m = torch.log(beta * log_q.exp() + (1 - beta) * log_p.exp())
    return beta * kl(log_q, log_m) + (1 - beta) * kl(log_p, log_m)


def torch_ref_total(student, base, intent, mask, grounding, labels, gold_mask, beta, gamma=0.1):
    """The total loss on [S, T, V] float64 logits with autograd through the student's and the gold
    logits; the targets come from the numpy reference (no gradient reaches them)."""
    states, total = student.shape[0], 0.0
    for s in range(states):
        keep, gold_keep = mask[s], gold_mask[s]
        targets, _, _ = ref_target(numpy64(base[s][keep]), numpy64(intent[s][keep]))
        log_q = torch.from_numpy(np.log(targets))
        total = (
            total + torch_ref_divergence(log_q, torch.log_softmax(student[s][keep], -1), beta).mean() / states
        )
        log_gold = torch.log_softmax(grounding[s][gold_keep], -1)
        nll = -log_gold.gather(-1, labels[s][gold_keep].unsqueeze(-1)).squeeze(-1)
        total = total + gamma * nll.mean() / states
    return total


PADDED_KEYS = (
    "student_logits",
    "base_logits",
    "intent_logits",
    "response_mask",
    "grounding_logits",
    "grounding_labels",
    "grounding_mask",
)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_optd_loss_beta_matches_reference_value_and_gradient(beta):
    batch = padded_batch(seed=45, spread=1.0, dtype=F64)
    student, gold = batch["student_logits"].requires_grad_(), batch["grounding_logits"].requires_grad_()
    loss = optd_loss(**batch, settings=ObjectiveSettings(beta=beta))
    assert_parts_match(loss, reference_of(batch, beta=beta), atol=1e-10)
    grads = torch.autograd.grad(loss.total, (student, gold))
    ref_batch = {k: v.detach().requires_grad_() if v.is_floating_point() else v for k, v in batch.items()}
    ref_leaves = (ref_batch["student_logits"], ref_batch["grounding_logits"])
    want = torch.autograd.grad(torch_ref_total(*(ref_batch[k] for k in PADDED_KEYS), beta=beta), ref_leaves)
    for grad, want_grad, mask in zip(
        grads, want, (batch["response_mask"], batch["grounding_mask"]), strict=True
    ):
        torch.testing.assert_close(grad[mask], want_grad[mask], atol=1e-12, rtol=1e-10)
        assert bool((grad[~mask] == 0).all())


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_chunked_path_beta_matches_reference_value_and_gradient(beta):
    # the chunked path's gradients are written by hand: autograd of the reference through the heads
    b = hidden_batch(seed=46)
    leaves = student_leaves(b)
    chunked = hidden_path(b, chunk_size=4, settings=ObjectiveSettings(beta=beta))
    grads = torch.autograd.grad(chunked.total, leaves)

    vocab = b["vocab_size"]
    ref = {
        k: v.detach().nan_to_num(0.0) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
        for k, v in b.items()
    }
    ref_leaves = [
        ref[k].requires_grad_() for k in ("student_hidden", "grounding_hidden", "head_weight", "head_bias")
    ]
    want_total = torch_ref_total(
        project(ref["student_hidden"], ref["head_weight"], ref["head_bias"], vocab),
        project(ref["base_hidden"], ref["teacher_head_weight"], ref["teacher_head_bias"], vocab),
        project(ref["intent_hidden"], ref["teacher_head_weight"], ref["teacher_head_bias"], vocab),
        ref["response_mask"],
        project(ref["grounding_hidden"], ref["head_weight"], ref["head_bias"], vocab),
        ref["grounding_labels"],
        ref["grounding_mask"],
        beta=beta,
    )
    assert math.isclose(scalar(chunked.total), scalar(want_total), abs_tol=1e-10)
    for grad, want in zip(grads, torch.autograd.grad(want_total, ref_leaves), strict=True):
        torch.testing.assert_close(grad, want, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_chunked_path_equals_the_logits_path_at_the_endpoints(beta):
    b = hidden_batch(seed=47)
    leaves = student_leaves(b)
    settings = ObjectiveSettings(beta=beta)
    chunked, unchunked = hidden_path(b, chunk_size=3, settings=settings), logits_path(b, settings=settings)
    for name in PARTS:
        assert abs(scalar(getattr(chunked, name)) - scalar(getattr(unchunked, name))) < 1e-10, name
    for grad, want in zip(
        torch.autograd.grad(chunked.total, leaves), torch.autograd.grad(unchunked.total, leaves), strict=True
    ):
        torch.testing.assert_close(grad, want, atol=1e-10, rtol=0)
