"""A lake ingested from a generated world, its world kept beside it as the ingest flow keeps it."""

from __future__ import annotations

from pathlib import Path

from flows.ingest import record_world
from synthetic.bundle import write_bundle
from transforms.ingest import ingest_bundle


def generated_lake(root: Path, users: int, seed: int) -> Path:
    write_bundle(root / "raw", users=users, seed=seed)
    ingest_bundle(root / "raw", root / "lake")
    record_world(root / "raw", root / "lake")
    return root / "lake"
