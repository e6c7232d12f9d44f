"""Per-bucket work: a stage's task mapped over the lake's user buckets, on the task runner chosen.

A user's rows all lie in one bucket (``rekey.bucket_of``), so what a stage does user by user (chain
sessions into histories, render states into records) is done bucket by bucket, each bucket one Prefect
task run, and reduced once at the end where a table needs it (statistics, a summary, the swap). The
validation gate follows the same runner: where it runs buckets side by side, the gate checks each
bucket of a partitioned table in a task of its own (``flows.validate.spread_parts``), and ingest
aligns each part of a bundle read in several in a task of its own (``flows.ingest.parts_in_tasks``:
its parts follow page views, the unit its checks work on, and write into every user bucket).
The tasks exchange paths and small summaries, never the tables, so they can run in other processes:

- ``local`` (the default): Prefect's thread pool in this process, ``local_workers`` buckets at a time
  (one: the memory of one bucket at a time, as a single task would use);
- ``ray``: prefect-ray's ``RayTaskRunner`` on the Ray cluster at ``ray_address`` (``RAY_ADDRESS``
  when unset), or on a local Ray instance started for the stage when there is none. Every worker
  must reach the lake's path and import this package (the same image or environment on every node).

The choice comes from the environment (``TRAJFORGE_TASK_RUNNER``, ``TRAJFORGE_RAY_ADDRESS``,
``TRAJFORGE_LOCAL_WORKERS``), a run's ``[scale]`` TOML section, or the commands' ``--task-runner``
(``scale_settings`` inside a ``using_scale`` block); it never enters a stage's cache key: it says where
buckets run, not what they make.
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Literal
from urllib.parse import urlsplit

from prefect import Task, unmapped
from prefect.task_runners import TaskRunner, ThreadPoolTaskRunner
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

TaskRunnerName = Literal["local", "ray"]


class ScaleSettings(BaseSettings):
    """Where a stage's per-bucket tasks run."""

    model_config = SettingsConfigDict(env_prefix="TRAJFORGE_", extra="forbid")

    task_runner: TaskRunnerName = Field("local", description="local (threads here) or ray")
    ray_address: str | None = Field(
        None, description="a Ray cluster (ray://host:10001, or host:6379 on a node); RAY_ADDRESS when unset"
    )
    ray_workers: int | None = Field(
        None, ge=1, description="CPUs of the local Ray instance started when no cluster is given"
    )
    local_workers: int = Field(1, ge=1, description="buckets at a time with the local runner")

    def address(self) -> str | None:
        return self.ray_address or os.environ.get("RAY_ADDRESS") or None


_chosen: ContextVar[ScaleSettings | None] = ContextVar("trajforge_scale", default=None)


@contextmanager
def using_scale(settings: ScaleSettings) -> Iterator[None]:
    """Within the block, every per-bucket map runs where ``settings`` says."""
    token = _chosen.set(settings)
    try:
        yield
    finally:
        _chosen.reset(token)


def side_by_side(settings: ScaleSettings) -> bool:
    """Whether ``settings`` run more than one task at a time (Ray, or several local workers)."""
    return not (settings.task_runner == "local" and settings.local_workers == 1)


def scale_settings() -> ScaleSettings:
    """The ``using_scale`` block's settings, else the environment's."""
    return _chosen.get() or ScaleSettings()


def task_runner(settings: ScaleSettings, prefect_api: str | None = None) -> TaskRunner:
    """The runner ``settings`` name. ``prefect_api``: the Prefect API this process reports to, given
    to the workers of a Ray instance started here (without it each worker would start an ephemeral
    API of its own), or of a cluster when it is not this machine's loopback address."""
    if settings.task_runner == "local":
        return ThreadPoolTaskRunner(max_workers=settings.local_workers)
    try:
        from prefect_ray import RayTaskRunner
    except ImportError as err:  # the optional extra
        raise RuntimeError("--task-runner ray needs the scale extra: pip install 'trajforge[scale]'") from err
    address = settings.address()
    init_kwargs: dict[str, Any] = {"include_dashboard": False}
    if address is None and settings.ray_workers is not None:
        init_kwargs["num_cpus"] = settings.ray_workers
    if prefect_api and (address is None or not _loopback(prefect_api)):
        init_kwargs["runtime_env"] = {"env_vars": {"PREFECT_API_URL": prefect_api}}
    return RayTaskRunner(address=address, init_kwargs=init_kwargs)


def start_local_ray(init_kwargs: dict[str, Any]) -> None:
    """A Ray instance on this machine, started once and kept until the process exits: every map of a
    run shares it (the runner would otherwise start and stop one per stage, seconds each)."""
    import ray

    if not ray.is_initialized():
        ray.init(**init_kwargs)
        atexit.register(ray.shutdown)


def _loopback(url: str) -> bool:
    return urlsplit(url).hostname in ("127.0.0.1", "localhost", "::1")


def prefect_api_url() -> str | None:
    """The Prefect API this process reports to: the configured one, or its ephemeral server's."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        return PREFECT_API_URL.value()
    with get_client(sync_client=True) as client:
        return str(client.api_url).rstrip("/")


def map_buckets(task: Task, buckets: Sequence[Any], /, mapped_as: str = "bucket", **shared: Any) -> list[Any]:
    """``task(bucket, **shared)`` for every bucket (passed as the parameter ``mapped_as``), on the
    chosen task runner; the results in the buckets' order. Any bucket failing fails the map, after
    every bucket has finished."""
    settings = scale_settings()
    api = prefect_api_url() if settings.task_runner == "ray" else None
    runner = task_runner(settings, api)
    if settings.task_runner == "ray" and settings.address() is None:
        start_local_ray(runner.init_kwargs)  # type: ignore[attr-defined]
    with runner:
        parameters = {mapped_as: list(buckets), **{name: unmapped(value) for name, value in shared.items()}}
        futures = runner.map(task, parameters)
        futures.wait()
        return [future.result() for future in futures]


def per_bucket(name: str, fn: Callable[..., Any]) -> Task:
    """``fn(bucket, ...)`` as the Prefect task ``map_buckets`` maps: retried once on a transient I/O
    error (``flows.retrying``), never cached (the stage around it is)."""
    from prefect import task
    from prefect.cache_policies import NO_CACHE

    from flows.retrying import IO_RETRIES

    return task(name=name, cache_policy=NO_CACHE, **IO_RETRIES)(fn)
