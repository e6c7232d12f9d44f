"""Per-bucket tasks (``flows.buckets``): the map on the local runner and on a local Ray cluster of two
worker processes, and the stages mapped over buckets making the same lake on either."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import polars as pl
import pytest
from prefect import task

from flows.buckets import ScaleSettings, map_buckets, scale_settings, task_runner, using_scale
from flows.chain import chain_flow
from flows.ingest import ingest_bundle_flow, parts_in_tasks
from flows.records import records_flow
from synthetic.bundle import write_bundle
from tests.flows.generated_lakes import generated_lake
from transforms.config import IngestSettings
from transforms.ingest.part_tasks import align_part_job
from transforms.lake import table_files


@task(name="probe-bucket")
def probe(bucket: int, offset: int) -> tuple[int, int]:
    """The bucket plus ``offset``, and the process that ran it."""
    if bucket < 0:
        raise ValueError(f"bucket {bucket}")
    return bucket + offset, os.getpid()


def test_local_map_keeps_the_buckets_order_and_says_a_failure(prefect_harness):
    results = map_buckets(probe, [3, 1, 2], offset=10)
    assert [value for value, _ in results] == [13, 11, 12]
    assert {pid for _, pid in results} == {os.getpid()}  # threads of this process
    with pytest.raises(ValueError, match="bucket -1"):
        map_buckets(probe, [1, -1, 2], offset=0)


def test_settings_come_from_the_environment_and_a_block_overrides_them(monkeypatch):
    monkeypatch.setenv("TRAJFORGE_TASK_RUNNER", "ray")
    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")
    chosen = scale_settings()
    assert chosen.task_runner == "ray" and chosen.address() == "ray://head:10001"
    here = "http://127.0.0.1:4200/api"  # an API on this machine: no use to a cluster's other nodes
    runner = task_runner(chosen, here)  # built, not started: nothing is contacted
    assert type(runner).__name__ == "RayTaskRunner" and runner.address == "ray://head:10001"
    assert "runtime_env" not in runner.init_kwargs
    served = task_runner(chosen, "https://prefect.example.org/api").init_kwargs["runtime_env"]
    assert served == {"env_vars": {"PREFECT_API_URL": "https://prefect.example.org/api"}}
    monkeypatch.delenv("RAY_ADDRESS")
    started_here = task_runner(ScaleSettings(task_runner="ray", ray_workers=2), here).init_kwargs
    assert (
        started_here["num_cpus"] == 2 and started_here["runtime_env"]["env_vars"]["PREFECT_API_URL"] == here
    )
    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")
    with using_scale(ScaleSettings(task_runner="local", local_workers=2)):
        assert scale_settings().task_runner == "local"
        assert task_runner(scale_settings())._max_workers == 2
    assert scale_settings().task_runner == "ray"
    monkeypatch.setenv("TRAJFORGE_TASK_RUNNER", "dask")
    with pytest.raises(ValueError, match="task_runner"):
        scale_settings()


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray instance with two CPUs: at most two worker processes run buckets at once."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def table_rows(lake: Path, name: str) -> dict[str, pl.DataFrame]:
    """Each file of a table by its path under the table, its rows sorted."""
    folder = lake / name
    return {
        str(path.relative_to(folder)): (frame := pl.read_parquet(path, hive_partitioning=False)).sort(
            frame.columns
        )
        for path in table_files(lake, name)
    }


@pytest.mark.slow
def test_ray_runs_buckets_in_two_workers_and_makes_the_local_runners_lake(
    prefect_harness, ray_cluster, tmp_path
):
    with using_scale(ScaleSettings(task_runner="ray")):
        results = map_buckets(probe, list(range(6)), offset=0)
    assert [value for value, _ in results] == list(range(6))
    workers = {pid for _, pid in results}
    assert len(workers) == 2 and os.getpid() not in workers

    lake = generated_lake(tmp_path / "local", users=120, seed=5)
    on_ray = tmp_path / "ray"
    shutil.copytree(lake, on_ray)
    assert len(list((lake / "sessions").glob("bucket=*"))) == 4  # the default four buckets
    for folder, settings in ((lake, ScaleSettings()), (on_ray, ScaleSettings(task_runner="ray"))):
        with using_scale(settings):
            chain_flow(str(folder), reuse=False)
            records_flow(str(folder), reuse=False)
    for name in ("histories", "records"):
        local, remote = table_rows(lake, name), table_rows(on_ray, name)
        assert sorted(local) == sorted(remote) and len(local) >= 4  # a file per bucket at least
        for path, rows in local.items():
            assert rows.height and rows.equals(remote[path]), f"{name}/{path}"
    # the records gate checked each bucket on a worker, and judged the table as the local gate did
    local_gate, ray_gate = (gate_verdict(folder, "records") for folder in (lake, on_ray))
    assert ray_gate == local_gate and local_gate["tables"]["records"]["rows_in"] > 0
    assert checked_parts(on_ray, "records") == [f"part{k}" for k in range(4)]
    assert checked_parts(lake, "records") == []


@pytest.mark.slow
def test_ingest_aligns_its_parts_on_ray_and_on_local_workers_into_the_same_lake(
    prefect_harness, ray_cluster, tmp_path, monkeypatch
):
    import flows.ingest

    aligned_here: list[int] = []

    def counted(job):  # the local workers' tasks run in this process: each part's task is seen
        aligned_here.append(job.part)
        return align_part_job(job)

    monkeypatch.setattr(flows.ingest, "align_part_job", counted)
    raw = tmp_path / "raw"
    write_bundle(raw, users=60, seed=7)
    # about 29,000 feed + event rows in parts of 4,000: 8 parts, spilled to disk
    settings = IngestSettings(spill_part_rows=4_000, memory_rows=0)
    runners = {
        "one": ScaleSettings(),
        "two": ScaleSettings(local_workers=2),
        "ray": ScaleSettings(task_runner="ray"),
    }
    summaries = {}
    for name, scale in runners.items():
        with using_scale(scale):
            summaries[name] = ingest_bundle_flow(str(raw), str(tmp_path / name), settings)
    ingested = ("steps", "sessions", "feed_layouts", "items", "profiles", "history", "quarantine")
    one = {table: table_rows(tmp_path / "one", table) for table in ingested}
    assert {path.split("/")[1] for path in one["steps"]} == {f"part-{p}.parquet" for p in range(8)}
    for name in ("two", "ray"):
        assert summaries[name]["counts"] == summaries["one"]["counts"]
        for table in ingested:
            other = table_rows(tmp_path / name, table)
            assert sorted(other) == sorted(one[table]), f"{name}: {table}"
            for path, rows in one[table].items():
                assert rows.equals(other[path]), f"{name}: {table}/{path}"
    assert sorted(aligned_here) == list(range(8))  # the two local workers' tasks, a part each
    with using_scale(runners["ray"]):
        assert parts_in_tasks() is not None  # the parts ran as tasks on Ray
    assert parts_in_tasks() is None  # one local worker: in the ingest's own process


def gate_verdict(lake: Path, stage: str) -> dict:
    """The last gate run of ``stage``: its tables' rows and warnings, and every check's counts."""
    runs = sorted((lake / "_runs" / "validation").glob(f"*-{stage}-*/summary.json"))
    summary = json.loads(runs[-1].read_text())
    checks = sorted((o["check"], o["success"], o["evaluated"], o["unexpected"]) for o in summary["outcomes"])
    return {"tables": summary["tables"], "checks": checks}


def checked_parts(lake: Path, table: str) -> list[str]:
    """The bucket parts whose batches the last gate's Data Docs show for ``table``."""
    docs = sorted((lake / "_docs" / "validation").iterdir())[-1] / "validations" / table
    names = {page.relative_to(docs).parts[0] for page in docs.rglob("*.html")} if docs.exists() else set()
    return sorted({name.rsplit("-", 2)[-2] for name in names if "-part" in name})


@pytest.mark.slow
def test_the_chain_command_maps_its_buckets_on_ray(prefect_harness, ray_cluster, tmp_path):
    from typer.testing import CliRunner

    from cli.app import app

    lake = generated_lake(tmp_path, users=40, seed=9)
    result = CliRunner().invoke(app, ["chain", "--lake", str(lake), "--task-runner", "ray"])
    assert result.exit_code == 0, result.output
    histories = pl.read_parquet(table_files(lake, "histories"), hive_partitioning=False)
    assert histories.height == 40 and len(table_files(lake, "histories")) == 4  # a file per bucket


def test_two_local_workers_gate_the_records_bucket_by_bucket_with_the_same_verdict(prefect_harness, tmp_path):
    lake = generated_lake(tmp_path / "one", users=40, seed=11)
    side_by_side = tmp_path / "two"
    shutil.copytree(lake, side_by_side)
    for folder, settings in ((lake, ScaleSettings()), (side_by_side, ScaleSettings(local_workers=2))):
        with using_scale(settings):
            records_flow(str(folder), reuse=False)
    assert gate_verdict(side_by_side, "records") == gate_verdict(lake, "records")
    assert checked_parts(side_by_side, "records") == [f"part{k}" for k in range(4)]
    assert checked_parts(lake, "records") == []
