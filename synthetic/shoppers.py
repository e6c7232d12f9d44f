"""Shoppers: latent traits (the ground truth) and the profile attributes they show.

Traits drive everything the simulator does (see ``synthetic.behaviour``):
category affinities (Dirichlet around the population shares, tilted by gender),
price sensitivity and preferred price level, review-reading propensity,
patience (session length), purchase and click propensities, scroll speed,
and activity (one session vs. many). Profile attributes are noisy, coarse
read-outs of those traits, with a few nulls per field.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import polars as pl

from synthetic import taxonomy as tx
from synthetic.ids import hex_ids, salt

MULTI_SESSION_SHARE = 5_768 / 11_010  # cross-session shoppers in UserArena
EXTRA_SESSIONS_MEAN = 59_378 / 5_768 - 2  # cross-session users: 10.29 sessions on average
EXTRA_SESSIONS_DISPERSION = 1.6  # negative-binomial size: long tail of very active shoppers
MAX_SESSIONS = 80
AFFINITY_CONCENTRATION = 6.0
FEMALE_SHARE = 0.58
# Coverage per profile field, inside UserArena's 99.0-99.9 %.
PROFILE_COVERAGE = {
    "age_band": 0.996,
    "gender": 0.999,
    "city_tier": 0.990,
    "purchase_power": 0.993,
    "member_level": 0.998,
    "lifecycle": 0.995,
}
AGE_BANDS = ("18-24", "25-29", "30-34", "35-39", "40-49", "50+")
MEMBER_LEVELS = ("regular", "silver", "gold", "platinum")
LIFECYCLES = ("new", "growing", "mature", "loyal")
_FEMALE_TILT = {
    "Apparel": 1.25,
    "Jewellery": 1.8,
    "Bags": 1.6,
    "Beauty": 2.0,
    "Baby": 1.4,
    "Home": 1.2,
    "Electronics": 0.5,
    "Computers": 0.4,
    "Games": 0.4,
    "Tools": 0.4,
    "Automotive": 0.4,
    "Phones": 0.7,
    "Cameras": 0.6,
    "Sports": 0.7,
    "Watches": 0.7,
}


@dataclass(frozen=True)
class Shoppers:
    """Per-user trait arrays; row i is user i."""

    seed: int
    female: np.ndarray  # bool
    age: np.ndarray  # int8 index into AGE_BANDS
    affinity: np.ndarray  # float64 (users, 41), rows sum to 1
    price_sensitivity: np.ndarray  # > 0, mean about 1: how much a price away from one's level hurts
    price_level: np.ndarray  # > 0: preferred price relative to the category median
    review_propensity: np.ndarray  # > 0, mean about 1: reading params/reviews on detail pages
    patience: np.ndarray  # > 0, mean 1: scales the session action budget
    purchase_propensity: np.ndarray  # > 0, mean about 1: cart and buy
    click_propensity: np.ndarray  # > 0, mean about 1: opening cards
    scroll_px: np.ndarray  # typical feed scroll distance px
    multi_session: np.ndarray  # bool: a returning shopper (several sessions)
    n_sessions: np.ndarray  # int32 sessions in the log window
    treatment: np.ndarray  # bool: A/B arm of the "real" logs (hash split of the user id)

    @property
    def size(self) -> int:
        return len(self.female)

    def ids(self) -> pl.Series:
        return hex_ids("usr-", self.size, salt("user", self.seed))


def ab_arm_is_treatment(user_ids: pl.Series) -> np.ndarray:
    """A/B arm by a hash of the user id: treatment when blake2b(user_id)'s first byte is odd."""
    return np.array([hashlib.blake2b(u.encode(), digest_size=8).digest()[0] & 1 == 1 for u in user_ids])


def _tilts() -> tuple[np.ndarray, np.ndarray]:
    tilt = np.array([_FEMALE_TILT.get(n, 1.0) for n in tx.L1_NAMES])
    female = tx.L1_SHARES * tilt
    male = tx.L1_SHARES / tilt
    # Rescale both so the gender mix reproduces the base shares on average.
    mix = FEMALE_SHARE * female / female.sum() + (1 - FEMALE_SHARE) * male / male.sum()
    correction = tx.L1_SHARES / mix
    return female * correction / (female * correction).sum(), male * correction / (male * correction).sum()


def build_shoppers(n_users: int, seed: int) -> Shoppers:
    rng = np.random.default_rng([seed, 3])
    female = rng.random(n_users) < FEMALE_SHARE
    age = rng.choice(len(AGE_BANDS), n_users, p=[0.16, 0.24, 0.22, 0.15, 0.15, 0.08]).astype(np.int8)
    base_f, base_m = _tilts()
    base = np.where(female[:, None], base_f, base_m) * AFFINITY_CONCENTRATION
    affinity = rng.gamma(base)
    affinity = (affinity + 1e-6) / (affinity + 1e-6).sum(axis=1, keepdims=True)
    # Exactly the UserArena share of returning shoppers, at any scale.
    multi = rng.permutation(n_users) < round(MULTI_SESSION_SHARE * n_users)
    # Stratified quantiles of a negative binomial: the mean is right at any scale, the tail is long.
    size = EXTRA_SESSIONS_DISPERSION
    pool = np.sort(rng.negative_binomial(size, size / (size + EXTRA_SESSIONS_MEAN), 200_000))
    k = int(multi.sum())
    n_sessions = np.ones(n_users, dtype=np.int32)
    n_sessions[multi] = 2 + pool[((rng.permutation(k) + rng.random(k)) / k * len(pool)).astype(np.int64)]
    n_sessions = np.minimum(n_sessions, MAX_SESSIONS)
    older = age >= 3
    return Shoppers(
        seed=seed,
        female=female,
        age=age,
        affinity=affinity,
        price_sensitivity=rng.lognormal(np.where(older, 0.1, -0.1), 0.4),
        price_level=rng.lognormal(np.where(older, 0.15, -0.05), 0.35),
        review_propensity=rng.lognormal(-0.18, 0.6, n_users),
        patience=rng.lognormal(-0.02, 0.2, n_users),
        purchase_propensity=rng.lognormal(-0.32, 0.8, n_users),
        click_propensity=rng.lognormal(-0.045, 0.3, n_users),
        scroll_px=rng.uniform(280, 560, n_users),
        multi_session=multi,
        n_sessions=n_sessions,
        treatment=ab_arm_is_treatment(hex_ids("usr-", n_users, salt("user", seed))),
    )


def traits_frame(s: Shoppers) -> pl.DataFrame:
    """One row per shopper with every latent trait (affinity as a list in ``taxonomy.L1_NAMES`` order)."""
    return pl.DataFrame(
        {
            "user_id": s.ids(),
            "ab_arm": np.where(s.treatment, "treatment", "baseline"),
            "multi_session": s.multi_session,
            "n_sessions": s.n_sessions,
            "female": s.female,
            "age_band": np.array(AGE_BANDS)[s.age],
            "patience": s.patience,
            "price_sensitivity": s.price_sensitivity,
            "price_level": s.price_level,
            "review_propensity": s.review_propensity,
            "purchase_propensity": s.purchase_propensity,
            "click_propensity": s.click_propensity,
            "scroll_px": s.scroll_px,
            "top_category": np.array(tx.L1_NAMES)[s.affinity.argmax(axis=1)],
            "affinity": s.affinity,
        }
    )


def _band(rng: np.random.Generator, signal: np.ndarray, labels: tuple[str, ...], noise: float) -> np.ndarray:
    """Noisy quantile bands of a trait signal: correlated with the trait, not a copy of it."""
    z = np.log(signal) + rng.normal(0, noise, len(signal))
    edges = np.quantile(z, np.linspace(0, 1, len(labels) + 1)[1:-1])
    return np.array(labels)[np.searchsorted(edges, z)]


def profiles_frame(s: Shoppers) -> pl.DataFrame:
    """The ``profiles`` table: six attributes derived from traits, a few nulls, plus the ``ab_arm`` extra."""
    rng = np.random.default_rng([s.seed, 4])
    spend = s.price_level * s.purchase_propensity**0.3
    columns = {
        "age_band": np.array(AGE_BANDS)[s.age],
        "gender": np.where(s.female, "female", "male"),
        "city_tier": _band(rng, spend, ("tier5", "tier4", "tier3", "tier2", "tier1"), 0.5),
        "purchase_power": _band(rng, spend, ("low", "medium", "high", "very_high"), 0.2),
        "member_level": _band(rng, s.purchase_propensity * s.n_sessions, MEMBER_LEVELS, 0.4),
        "lifecycle": _band(rng, s.n_sessions + rng.random(s.size), LIFECYCLES, 0.3),
    }
    frame = pl.DataFrame({"user_id": s.ids()})
    for name, values in columns.items():
        missing = rng.random(s.size) >= PROFILE_COVERAGE[name]
        frame = frame.with_columns(pl.Series(name, np.where(missing, None, values), dtype=pl.String))
    return frame.with_columns(pl.Series("ab_arm", np.where(s.treatment, "treatment", "baseline")))
