"""A/B effect fidelity on hand-made per-user counts."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from evaluation.effect import COUNTS_SCHEMA, arm_counts, effect_fidelity

# user, arm, real clicks, real views, sim clicks, sim views
ROWS = [
    ("a1", "A", 3, 2, 2, 2),
    ("a2", "A", 1, 2, 2, 2),
    ("b1", "B", 4, 2, 5, 2),
    ("b2", "B", 2, 2, 3, 2),
]


def counts(rows=ROWS) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=COUNTS_SCHEMA, orient="row")


def test_ratio_and_error_from_pooled_pv_ctr():
    # real: A (3+1)/(2+2) = 1.0, B (4+2)/4 = 1.5 -> delta 0.5
    # sim:  A (2+2)/4 = 1.0,     B (5+3)/4 = 2.0 -> delta 1.0
    # ratio 1.0 / 0.5 = 2.0, error |1 - 2| = 1.0
    effect = effect_fidelity(counts(), resamples=200, seed=3)
    assert (effect.real_delta, effect.sim_delta) == (0.5, 1.0)
    assert (effect.ratio, effect.error) == (2.0, 1.0)
    assert effect.users == {"A": 2, "B": 2}


def reference_interval(rows, resamples: int, seed: int) -> tuple[float, float]:
    """The bootstrap written out: the module's draws (arm A's users, then arm B's), sums by hand."""
    arm = {name: [r[2:] for r in rows if r[1] == name] for name in ("A", "B")}
    rng = np.random.default_rng(seed)
    draws = {name: rng.integers(0, len(arm[name]), (resamples, len(arm[name]))) for name in ("A", "B")}
    ratios = []
    for b in range(resamples):
        totals = {}
        for name in ("A", "B"):
            picked = [arm[name][i] for i in draws[name][b]]
            totals[name] = [sum(p[k] for p in picked) for k in range(4)]
        real = totals["B"][0] / totals["B"][1] - totals["A"][0] / totals["A"][1]
        sim = totals["B"][2] / totals["B"][3] - totals["A"][2] / totals["A"][3]
        if real != 0:
            ratios.append(sim / real)
    return tuple(np.quantile(ratios, [0.025, 0.975]))


def test_interval_is_the_percentile_bootstrap_over_users():
    rows = [
        *ROWS,
        ("a3", "A", 0, 1, 1, 1),
        ("a4", "A", 5, 3, 4, 3),
        ("b3", "B", 3, 1, 2, 1),
        ("b4", "B", 7, 4, 6, 4),
        ("b5", "B", 1, 2, 1, 2),
    ]
    effect = effect_fidelity(counts(rows), resamples=500, seed=11)
    assert effect.ci == pytest.approx(reference_interval(rows, 500, 11), rel=1e-12)
    assert effect.ci[0] <= effect.ratio <= effect.ci[1]


def test_identical_real_and_simulated_counts_give_ratio_one_with_no_width():
    # sim = real for every user: every resample's ratio is exactly 1
    same = [(u, arm, rc, rv, rc, rv) for u, arm, rc, rv, _, _ in ROWS]
    effect = effect_fidelity(counts(same), resamples=300, seed=0)
    assert (effect.ratio, effect.error, effect.ci) == (1.0, 0.0, (1.0, 1.0))


def test_a_missing_arm_or_no_real_effect_is_refused():
    with pytest.raises(ValueError, match="arm B has no users"):
        effect_fidelity(counts(ROWS[:2]))
    flat = [(u, arm, 1, 1, 2, 1) for u, arm, *_ in ROWS]  # real CTR 1.0 in both arms
    with pytest.raises(ValueError, match="real effect is zero"):
        effect_fidelity(counts(flat))
    with pytest.raises(ValueError, match="arms must be"):
        effect_fidelity(counts([(*ROWS[0][:1], "C", *ROWS[0][2:]), *ROWS]))


def test_arm_counts_pairs_each_user_and_counts_missing_rollouts_as_none():
    real = pl.DataFrame({"user_id": ["u1", "u2"], "clicks": [3, 0], "views": [2, 1]})
    sim = pl.DataFrame({"user_id": ["u1"], "clicks": [4], "views": [2]})
    rows = arm_counts("A", real, sim).sort("user_id").rows()
    assert rows == [("u1", "A", 3, 2, 4, 2), ("u2", "A", 0, 1, 0, 0)]


def test_pooled_runs_average_their_simulated_deltas_over_the_same_users():
    from evaluation.effect import pooled_effect_fidelity

    # a second run of the same users: sim A (1+1)/4 = 0.5, B (4+4)/4 = 2.0 -> delta 1.5
    other = [
        ("a1", "A", 3, 2, 1, 2),
        ("a2", "A", 1, 2, 1, 2),
        ("b1", "B", 4, 2, 4, 2),
        ("b2", "B", 2, 2, 4, 2),
    ]
    pooled = pooled_effect_fidelity([counts(), counts(other)], resamples=200, seed=3)
    # real delta 0.5 (as above); simulated (1.0 + 1.5) / 2 = 1.25 -> ratio 2.5, error 1.5
    assert (pooled.real_delta, pooled.sim_delta) == (0.5, 1.25)
    assert pooled.ratio == pytest.approx(2.5) and pooled.error == pytest.approx(1.5)
    # one run pooled alone is that run: the same draws (arm A's users, then B's), the same interval
    alone, single = (
        pooled_effect_fidelity([counts()], resamples=200, seed=3),
        effect_fidelity(counts(), 200, 3),
    )
    assert (alone.ratio, alone.ci, alone.error_ci) == (single.ratio, single.ci, single.error_ci)
    assert 0.0 <= single.error_ci[0] <= single.error_ci[1]
    with pytest.raises(ValueError, match="the same users in the same arms"):
        pooled_effect_fidelity([counts(), counts([*ROWS[:3], ("b3", "B", 2, 2, 3, 2)])])
