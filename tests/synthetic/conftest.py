"""Shared worlds and bundles for the synthetic-world tests (built once per session)."""

from __future__ import annotations

from pathlib import Path

import pytest

from synthetic.bundle import FORMATS, write_bundle
from synthetic.world import Bundle, World

SMALL_USERS, SMALL_SEED = 300, 7
CALIBRATION_USERS, CALIBRATION_SEED = 2_000, 11


@pytest.fixture(scope="session")
def small_world() -> World:
    return World.build(SMALL_USERS, SMALL_SEED)


@pytest.fixture(scope="session")
def small_bundle(small_world: World) -> Bundle:
    return small_world.simulate(policy="ab", seed=SMALL_SEED)


@pytest.fixture(scope="session")
def calibration_bundle() -> Bundle:
    return World.build(CALIBRATION_USERS, CALIBRATION_SEED).simulate(policy="ab", seed=CALIBRATION_SEED)


@pytest.fixture(scope="session")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same small world written once per format."""
    root = tmp_path_factory.mktemp("synthetic-bundles")
    out = {}
    for fmt in FORMATS:
        out[fmt] = root / fmt.replace(".", "-")
        write_bundle(out[fmt], users=80, seed=3, fmt=fmt, parts_per_table=2)
    return out
