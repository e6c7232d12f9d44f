"""The ingest's writer thread: pseudonyms and file writes overlap the next computation."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

WRITER_QUEUE = 2  # jobs in flight in the writer thread (each holds about a part's frames)


class Writer:
    """One worker thread for pseudonyms and file writes, so they overlap the next computation
    (Polars and its Parquet writer release the GIL). Jobs run in submission order; at most
    ``WRITER_QUEUE`` are in flight, so memory stays bounded."""

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ingest-writer")
        self.pending: deque[Future] = deque()

    def submit(self, job: Callable[..., object], *args: object) -> Future:
        while len(self.pending) >= WRITER_QUEUE:
            self.pending.popleft().result()  # a failed job fails the run here
        future = self.pool.submit(job, *args)
        self.pending.append(future)
        return future

    def wait(self) -> None:
        while self.pending:
            self.pending.popleft().result()

    def close(self) -> None:
        """Let the queued jobs end (they must not write into staging that is being removed)."""
        self.pool.shutdown(wait=True)
