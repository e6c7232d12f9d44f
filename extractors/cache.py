"""A persistent, content-addressed response cache in the lake.

Key = SHA-256 of (model, sampling parameters, prompt template hash, the exact
messages, the response schema). Answers are appended, one JSON line each, to
segment files ``LAKE/_cache/extract/seg-<ns>-<pid>.jsonl`` and flushed the moment
they arrive, so an interrupted or budget-stopped run keeps everything it paid
for and a re-run pays for nothing twice. Rejected answers are cached too: the
checker is deterministic, so a re-run re-asks with the same follow-up and hits
the cache again.

Why segments and not a file per key: at 577k answers a file per key costs a
4 KiB block and a directory update each (measured ~0.1-1 ms per answer on the
dev VM's disk, the largest client-side cost per request); an append is ~2 µs.
Each process appends to its own new segment (never to an old one), so a torn
last line after a crash is simply skipped on load. The index (key -> segment,
offset, length) is built once per process and lake, then kept up to date.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, BinaryIO

CACHE_DIR = Path("_cache") / "extract"
_PREFIX = b'{"key":"'
_KEY_END = len(_PREFIX) + 64  # a SHA-256 hex key
# the last field of a line (``CachedAnswer`` order); inside the text a quote is escaped, so this
# byte string can only be the field itself
_COST = b',"cost_usd":'


def cache_key(
    params: dict[str, Any], prompt_hash: str, messages: list[dict[str, str]], schema_name: str
) -> str:
    payload = {"params": params, "prompt_hash": prompt_hash, "messages": messages, "schema": schema_name}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


@dataclass(frozen=True)
class CachedAnswer:
    text: str
    tokens_in: int
    tokens_out: int
    model: str
    cost_usd: float = 0.0  # what the answer cost when it was paid for (0 where no prices were given)


_OPEN: dict[Path, ResponseCache] = {}


class ResponseCache:
    """Answers by key, in append-only JSON-lines segments; use ``in_lake`` to share one per process."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self._segments: list[Path] = []
        self.spent_usd = 0.0  # every answer ever paid for under this cache (all runs, all processes)
        self._index: dict[str, tuple[int, int, int]] = self._load()
        self._writer: BinaryIO | None = None
        self._readers: dict[int, int] = {}  # segment -> file descriptor

    @classmethod
    def in_lake(cls, lake: str | Path) -> ResponseCache:
        """The process-wide cache of a lake (its index is read once), rebuilt if files vanished."""
        root = (Path(lake) / CACHE_DIR).resolve()
        cached = _OPEN.get(root)
        if cached is None or not all(p.exists() for p in cached._segments):
            cached = _OPEN[root] = cls(root)
        return cached

    def _load(self) -> dict[str, tuple[int, int, int]]:
        index: dict[str, tuple[int, int, int]] = {}
        for path in sorted(self.root.glob("seg-*.jsonl")) if self.root.is_dir() else []:
            seg, offset = len(self._segments), 0
            self._segments.append(path)
            with path.open("rb") as f:
                for line in f:
                    if (
                        line.endswith(b"\n")
                        and line.startswith(_PREFIX)
                        and line[_KEY_END : _KEY_END + 1] == b'"'
                    ):
                        index[line[len(_PREFIX) : _KEY_END].decode()] = (seg, offset, len(line))
                        self.spent_usd += _line_cost(line)
                    offset += len(line)
        return index

    def get(self, key: str) -> CachedAnswer | None:
        where = self._index.get(key)
        if where is None:
            return None
        seg, offset, size = where
        if seg not in self._readers:
            self._readers[seg] = os.open(self._segments[seg], os.O_RDONLY)
        data = json.loads(os.pread(self._readers[seg], size, offset))
        data.pop("key")
        return CachedAnswer(**data)

    def put(self, key: str, answer: CachedAnswer) -> None:
        if len(key) != 64:
            raise ValueError("cache keys are SHA-256 hex digests")
        line = json.dumps({"key": key, **asdict(answer)}, ensure_ascii=False, separators=(",", ":")) + "\n"
        data = line.encode()
        writer = self._writer or self._open_segment()
        offset = writer.tell()
        writer.write(data)
        writer.flush()  # in the OS now: survives a crash of this process
        self._index[key] = (len(self._segments) - 1, offset, len(data))
        self.spent_usd += answer.cost_usd

    def _open_segment(self) -> BinaryIO:
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / f"seg-{time.time_ns()}-{os.getpid()}.jsonl"
        self._segments.append(path)
        self._writer = path.open("ab")
        return self._writer

    def close(self) -> None:
        """Close the files; the index stays valid and a later ``put`` starts a new segment."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        for fd in self._readers.values():
            os.close(fd)
        self._readers.clear()

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, key: str) -> bool:
        return key in self._index


def _line_cost(line: bytes) -> float:
    """The ``cost_usd`` of one segment line; 0 for lines written before answers carried it."""
    at = line.rfind(_COST)
    if at < 0:
        return 0.0
    try:
        return float(line[at + len(_COST) :].rstrip(b"}\n"))
    except ValueError:
        return 0.0
