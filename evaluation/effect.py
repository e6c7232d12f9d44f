"""A/B effect fidelity (PROTOCOL.md §4, the paper's Table 3): does a policy comparison in simulation
agree with the real one?

Held-out users are split in two arms: arm ``A`` browses feeds ranked by policy A, arm ``B`` by
policy B. The effect is Δ PV-CTR = clicks / feed page views of arm B − the same of arm A, pooled
over each arm's users. The real Δ comes from the real sessions (in the synthetic world, its
ground-truth shoppers), the simulated Δ from the simulator rolled out on the same users' sessions.
Effect ratio = simulated Δ / real Δ (1 is perfect), effect error = |1 − ratio|, and a percentile
bootstrap over users gives the ratio's interval: each resample draws every arm's users with
replacement (first arm ``A``: ``rng.integers(0, n_A, (resamples, n_A))``, then arm ``B`` likewise),
keeping each user's real and simulated counts together.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from evaluation.rollout import Rollout

ARM_A, ARM_B = "A", "B"
COUNT_COLUMNS = ("real_clicks", "real_views", "sim_clicks", "sim_views")
COUNTS_SCHEMA = pl.Schema({"user_id": pl.String, "arm": pl.String} | dict.fromkeys(COUNT_COLUMNS, pl.Int64))
PER_USER_SCHEMA = pl.Schema({"user_id": pl.String, "clicks": pl.Int64, "views": pl.Int64})


@dataclass(frozen=True)
class EffectFidelity:
    ratio: float
    error: float
    ci: tuple[float, float]  # percentile bootstrap interval of the ratio
    real_delta: float
    sim_delta: float
    users: dict[str, int]  # per arm
    resamples: int
    seed: int
    counts: pl.DataFrame | None = field(default=None, repr=False, compare=False)  # COUNTS_SCHEMA rows
    error_ci: tuple[float, float] | None = None  # percentile interval of |1 - ratio| over the resamples

    def as_dict(self) -> dict[str, object]:
        return {
            "effect_ratio": self.ratio,
            "effect_error": self.error,
            "effect_ci": list(self.ci),
            "real_delta": self.real_delta,
            "sim_delta": self.sim_delta,
            "users": self.users,
            "resamples": self.resamples,
            "seed": self.seed,
        }


def rollout_counts(rollouts: Iterable[Rollout]) -> pl.DataFrame:
    """Per user of the rollouts: accepted clicks and feed page views (one per session rolled out)."""
    rows = [
        (r.session.user_id, sum(a.accepted and a.action == "click" for a in r.attempts)) for r in rollouts
    ]
    frame = pl.DataFrame(rows, schema={"user_id": pl.String, "clicks": pl.Int64}, orient="row")
    per_user = frame.group_by("user_id").agg(pl.col("clicks").sum(), pl.len().cast(pl.Int64).alias("views"))
    return per_user.select(PER_USER_SCHEMA.names()).cast(PER_USER_SCHEMA)  # type: ignore[arg-type]


def arm_counts(arm: str, real: pl.DataFrame, sim: pl.DataFrame) -> pl.DataFrame:
    """COUNTS_SCHEMA rows of one arm from per-user (user_id, clicks, views) of real and simulated
    sessions; a user without simulated sessions counts none."""
    joined = real.join(sim, on="user_id", how="left", suffix="_sim")
    return joined.select(
        "user_id",
        pl.lit(arm).alias("arm"),
        pl.col("clicks").alias("real_clicks"),
        pl.col("views").alias("real_views"),
        pl.col("clicks_sim").fill_null(0).alias("sim_clicks"),
        pl.col("views_sim").fill_null(0).alias("sim_views"),
    ).cast(COUNTS_SCHEMA)  # type: ignore[arg-type]


def pv_ctr_delta(totals_a: np.ndarray, totals_b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(real Δ, simulated Δ) from per-arm totals ``(..., 4)`` in COUNT_COLUMNS order."""

    def ctr(totals: np.ndarray, clicks: int) -> np.ndarray:
        return totals[..., clicks] / totals[..., clicks + 1]

    return ctr(totals_b, 0) - ctr(totals_a, 0), ctr(totals_b, 2) - ctr(totals_a, 2)


def _arm_matrix(counts: pl.DataFrame, arm: str) -> np.ndarray:
    matrix = counts.filter(pl.col("arm") == arm).select(COUNT_COLUMNS).to_numpy().astype(np.float64)
    if len(matrix) == 0:
        raise ValueError(f"arm {arm} has no users: the effect needs both arms")
    if (matrix[:, [1, 3]].sum(axis=0) == 0).any():
        raise ValueError(f"arm {arm} has no real or no simulated page views")
    return matrix


def _resampled_totals(matrix: np.ndarray, draws: np.ndarray) -> np.ndarray:
    """Column totals ``(resamples, 4)`` of each resample's users, one column at a time (a
    ``(resamples, users, 4)`` gather would hold every resample's rows at once)."""
    return np.stack([column[draws].sum(axis=1) for column in matrix.T], axis=-1)


def effect_fidelity(
    counts: pl.DataFrame, resamples: int = 2_000, seed: int = 0, level: float = 0.95
) -> EffectFidelity:
    """Effect ratio, error and the ``level`` bootstrap interval from per-user counts (COUNTS_SCHEMA)."""
    unknown = set(counts["arm"].unique().to_list()) - {ARM_A, ARM_B}
    if unknown:
        raise ValueError(f"arms must be {ARM_A!r} and {ARM_B!r}, not {sorted(unknown)}")
    a, b = _arm_matrix(counts, ARM_A), _arm_matrix(counts, ARM_B)
    real, sim = (float(d) for d in pv_ctr_delta(a.sum(axis=0), b.sum(axis=0)))
    if real == 0:
        raise ValueError("the real effect is zero: an effect ratio is undefined")
    rng = np.random.default_rng(seed)
    draws_a = rng.integers(0, len(a), (resamples, len(a)))
    draws_b = rng.integers(0, len(b), (resamples, len(b)))
    real_b, sim_b = pv_ctr_delta(_resampled_totals(a, draws_a), _resampled_totals(b, draws_b))
    with np.errstate(divide="ignore", invalid="ignore"):  # an empty resampled arm gives nan, dropped
        ratios = sim_b / real_b
    ratios = ratios[np.isfinite(ratios)]
    ratio = sim / real
    return EffectFidelity(
        ratio=ratio,
        error=abs(1 - ratio),
        ci=_interval(ratios, level),
        real_delta=real,
        sim_delta=sim,
        users={ARM_A: len(a), ARM_B: len(b)},
        resamples=resamples,
        seed=seed,
        counts=counts,
        error_ci=_interval(np.abs(1 - ratios), level),
    )


def _interval(values: np.ndarray, level: float) -> tuple[float, float]:
    tail = (1 - level) / 2
    low, high = np.quantile(values, [tail, 1 - tail])
    return float(low), float(high)


def pooled_effect_fidelity(
    runs: list[pl.DataFrame], resamples: int = 2_000, seed: int = 0, level: float = 0.95
) -> EffectFidelity:
    """The effect fidelity of several simulated runs on the same users (e.g. a model trained from
    several seeds): the simulated Δ is the mean of the runs' Δ, the real Δ is the users' own, and each
    resample draws the users once for every run, so the interval covers the users' sampling and the
    runs' spread together."""
    if not runs:
        raise ValueError("no runs to pool")
    ordered = [run.sort("arm", "user_id") for run in runs]
    keys = [run.select("arm", "user_id") for run in ordered]
    if any(not k.equals(keys[0]) for k in keys[1:]):
        raise ValueError("the runs must count the same users in the same arms")
    arms = [(_arm_matrix(run, ARM_A), _arm_matrix(run, ARM_B)) for run in ordered]
    a0, b0 = arms[0]
    real = float(pv_ctr_delta(a0.sum(axis=0), b0.sum(axis=0))[0])
    if real == 0:
        raise ValueError("the real effect is zero: an effect ratio is undefined")
    sim = float(np.mean([pv_ctr_delta(a.sum(axis=0), b.sum(axis=0))[1] for a, b in arms]))
    rng = np.random.default_rng(seed)
    draws_a = rng.integers(0, len(a0), (resamples, len(a0)))
    draws_b = rng.integers(0, len(b0), (resamples, len(b0)))
    real_b = pv_ctr_delta(_resampled_totals(a0, draws_a), _resampled_totals(b0, draws_b))[0]
    sim_b = np.mean(
        [pv_ctr_delta(_resampled_totals(a, draws_a), _resampled_totals(b, draws_b))[1] for a, b in arms],
        axis=0,
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = sim_b / real_b
    ratios = ratios[np.isfinite(ratios)]
    ratio = sim / real
    return EffectFidelity(
        ratio=ratio,
        error=abs(1 - ratio),
        ci=_interval(ratios, level),
        real_delta=real,
        sim_delta=sim,
        users={ARM_A: len(a0), ARM_B: len(b0)},
        resamples=resamples,
        seed=seed,
        error_ci=_interval(np.abs(1 - ratios), level),
    )
