"""Writing files and folders so that a reader sees the old one or the new one, never half of one.

Dependency-free, so that the trainer (on a GPU machine without the data stack) writes the same way.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def atomic_file(path: str | Path, suffix: str = "") -> Iterator[Path]:
    """A temporary path beside ``path`` to write; renamed onto ``path`` when the block ends cleanly,
    removed otherwise. ``suffix`` ends the temporary's name for writers that read it (DuckDB's
    ``.duckdb``, matplotlib's format from the name)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}{suffix}")
    try:
        yield temporary
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def write_json_atomic(path: str | Path, payload: Any) -> Path:
    """``payload`` as indented JSON at ``path``, atomically (values JSON cannot hold as strings)."""
    with atomic_file(path) as temporary:
        temporary.write_text(json.dumps(payload, indent=2, default=str))
    return Path(path)


def swap_into_place(staged: Path, target: Path) -> None:
    """Replace the folder ``target`` by ``staged`` with two renames; the old copy is removed last."""
    target.parent.mkdir(parents=True, exist_ok=True)
    old = target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:8]}")
    if target.exists():
        os.replace(target, old)
    os.replace(staged, target)
    shutil.rmtree(old, ignore_errors=True)


def link_tree(source: Path, target: Path, skip: tuple[str, ...] = ()) -> None:
    """Every Parquet file under ``source`` (but the relative paths in ``skip``) hard-linked at the same
    place under ``target``, copied where a link cannot be made: files written once and never changed
    are shared instead of rewritten."""
    for path in sorted(source.rglob("*.parquet")):
        relative = path.relative_to(source)
        if relative.as_posix() in skip:
            continue
        linked = target / relative
        linked.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, linked)
        except OSError:
            shutil.copy2(path, linked)
