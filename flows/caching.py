"""Stages served from Prefect's cache.

A stage runs again only when something it depends on changed: what it reads (content fingerprints),
its settings, or the code. Its cache key (``StageInputs``, a Prefect cache policy) is made of exactly
those; the cached result (a Prefect result record under ``LAKE/_cache``, so the cache travels and goes
with its lake) is the stage's summary together with the fingerprints of what it wrote. A record counts
only while those outputs are on disk as the stage left them: a table rewritten since by another
command, a run folder removed, and ``run_stage`` asks Prefect to refresh the cache instead of
returning a summary that no longer describes the files.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefect import Task, get_run_logger, task
from prefect.cache_policies import CachePolicy
from prefect.context import TaskRunContext
from prefect.filesystems import LocalFileSystem
from prefect.results import ResultStore
from prefect.utilities.hashing import hash_objects

from transforms.fingerprints import code_version, fingerprint, fingerprints

CACHE_FOLDER = "_cache"  # under the lake: the stages' Prefect result records


def still_written(written: dict[str, str | None]) -> bool:
    """Whether every output is on disk exactly as the stage wrote it."""
    return all(fingerprint(path) == recorded for path, recorded in written.items())


@dataclass
class StageInputs(CachePolicy):
    """Prefect cache policy: the stage's name, the code version and ``reads(**parameters)`` (content
    fingerprints of what the stage reads, its settings as JSON)."""

    stage: str = ""
    reads: Callable[..., dict[str, Any]] = field(default=lambda **_: {})

    def compute_key(
        self,
        task_ctx: TaskRunContext | None,
        inputs: dict[str, Any],
        flow_parameters: dict[str, Any],
        **kwargs: Any,
    ) -> str:
        parts = {"stage": self.stage, "code": code_version(), "reads": self.reads(**inputs)}
        return f"{self.stage}-{hash_objects(parts, raise_on_failure=True)}"


def cached_stage(
    name: str, reads: Callable[..., dict[str, Any]], writes: Callable[..., list[Path]]
) -> Callable[[Callable[..., Any]], Task]:
    """Decorator: the stage function becomes a Prefect task keyed by ``StageInputs`` whose persisted
    result is ``{"summary": what it returned, "written": fingerprints of writes(**parameters)}``.
    Call it through ``run_stage``, every parameter given."""

    def decorate(fn: Callable[..., Any]) -> Task:
        @functools.wraps(fn)
        def body(*args: Any, **kwargs: Any) -> dict[str, Any]:
            parameters = inspect.signature(fn).bind(*args, **kwargs).arguments
            summary = fn(*args, **kwargs)
            return {"summary": summary, "written": fingerprints(writes(**parameters))}

        policy = StageInputs(stage=name, reads=reads)
        return task(name=name, cache_policy=policy, persist_result=True)(body)

    return decorate


@dataclass(frozen=True)
class StageOutcome:
    summary: Any
    reused: bool  # served from Prefect's cache: the stage did not run
    seconds: float  # wall time, the cache check included

    def timing(self) -> dict[str, Any]:
        return {"seconds": round(self.seconds, 2), "reused": self.reused}


def records_in(folder: Path) -> set[Path]:
    return set(folder.iterdir()) if folder.is_dir() else set()


def run_stage(stage: Task, lake: str | Path, refresh: bool = False, /, **parameters: Any) -> StageOutcome:
    """Run ``stage`` (a ``cached_stage`` task) with ``parameters``, or return its cached summary when
    the key matches and its outputs are as it wrote them; ``refresh`` runs it whatever the cache holds.
    The cache is kept under ``lake``, positional: a stage's own ``lake`` is among ``parameters``."""
    started = time.perf_counter()
    folder = Path(lake) / CACHE_FOLDER
    key = stage.cache_policy.compute_key(None, parameters, {})
    store = ResultStore(result_storage=LocalFileSystem(basepath=str(folder)))
    valid = not refresh and store.exists(key) and still_written(store.read(key).result["written"])
    # a path, not a block: Prefect keeps unsaved blocks out of task options
    configured = stage.with_options(result_storage=folder, refresh_cache=not valid)
    before = records_in(folder)
    state = configured(**parameters, return_state=True)
    if state.is_failed():
        error = state.result(raise_on_failure=False)
        # Prefect persists a failed run's exception beside the results: the cache keeps only results
        for record in records_in(folder) - before:
            record.unlink(missing_ok=True)
        if isinstance(error, BaseException):
            raise error
    result = state.result()
    reused = state.name == "Cached"
    if reused:
        get_run_logger().info("%s: unchanged since its last run, served from the cache", stage.name)
    return StageOutcome(result["summary"], reused, time.perf_counter() - started)
