"""Content fingerprints of files and folders, and the version of the code that writes a lake: what a
stage's cache key and its manifest record of what it read, ran and wrote."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable
from pathlib import Path

#: the packages a stage's run executes; not ``cli``, which only reads settings and inputs before a
#: stage starts and prints its result (the settings it passes enter the cache key themselves)
CODE_PACKAGES = (
    "synthetic", "transforms", "extractors", "trainer", "evaluation", "validation", "worlds", "flows"
)  # fmt: skip
ROOT = Path(__file__).resolve().parents[1]


@functools.cache
def code_version() -> str:
    """Hash of every source file of the packages a stage can run: any change there is a new version."""
    digest = hashlib.blake2b(digest_size=16)
    for package in CODE_PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            digest.update(path.relative_to(ROOT).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


@functools.lru_cache(maxsize=65_536)
def _file_hash(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def visible_files(folder: Path) -> list[Path]:
    """The files under ``folder`` a fingerprint covers, sorted: names starting with a dot (half-written
    temporaries, staging) are left out."""
    return sorted(
        p for p in folder.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    )  # fmt: skip


def fingerprint(path: str | Path) -> str | None:
    """Content fingerprint of a file or a folder (its files' relative paths and bytes); None when the
    path is absent."""
    path = Path(path)
    if path.is_file():
        stat = path.stat()
        return _file_hash(str(path), stat.st_size, stat.st_mtime_ns)
    if not path.is_dir():
        return None
    digest = hashlib.blake2b(digest_size=16)
    for file in visible_files(path):
        digest.update(file.relative_to(path).as_posix().encode())
        digest.update((fingerprint(file) or "").encode())
    return digest.hexdigest()


def fingerprints(paths: Iterable[str | Path]) -> dict[str, str | None]:
    return {str(p): fingerprint(p) for p in paths}


def file_fingerprints(folder: str | Path) -> dict[str, str]:
    """Every file of ``folder`` a fingerprint covers, by its relative path, with its own fingerprint."""
    folder = Path(folder)
    return {f.relative_to(folder).as_posix(): fingerprint(f) or "" for f in visible_files(folder)}
