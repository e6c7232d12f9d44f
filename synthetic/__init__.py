"""A synthetic shopping world that writes raw log bundles with a known ground truth.

    from synthetic import World, write_bundle
    world = World.build(users=2_000, seed=7)          # catalog + shoppers with latent traits
    world.traits_frame()                              # the ground truth per shopper
    bundle = world.simulate(policy="ab", seed=7)      # raw tables + per-session truth
    world.ab_effect(seed=7)                           # true PV-CTR under each ranking policy
    write_bundle("raw/", users=300, seed=7, fmt="parquet")   # the DATA.md input contract on disk

Modules: ``taxonomy`` (categories, words), ``catalog`` (items), ``shoppers`` (traits,
profiles), ``feeds`` (ranking policies, masonry layout), ``behaviour`` (the stochastic
13-action policy), ``stepwise`` (the same shoppers acting one step at a time inside
another environment), ``timing`` (dwell, session gaps), ``world`` (API), ``bundle``
(writers, CLI: ``python -m synthetic.bundle OUT --users 300``), ``calibration``
(statistics vs. UserArena: ``python -m synthetic.calibration --users 11010``).
Nothing outside ``synthetic/`` and its tests imports this package (ARCHITECTURE.md).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__all__ = ["Bundle", "World", "write_bundle"]
_HOME = {"Bundle": "synthetic.world", "World": "synthetic.world", "write_bundle": "synthetic.bundle"}


def __getattr__(name: str) -> Any:
    # Lazy, so ``python -m synthetic.bundle`` does not import itself twice.
    if name in _HOME:
        return getattr(import_module(_HOME[name]), name)
    raise AttributeError(f"module 'synthetic' has no attribute {name!r}")
