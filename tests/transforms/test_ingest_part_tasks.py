"""Pass 2 as one task per part (``transforms.ingest.part_tasks``): mapped in this process, in threads or
in other processes, it writes the one-process ingest's lake byte for byte, counts the same rows, and
lands the same raw rows."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

import polars as pl
import pytest

from tests.bundles import write_bundle
from tests.transforms.test_ingest_scale import (
    TABLES,
    ThreeParts,
    ThreePartsInMemory,
    cross_part_bundle,
    grouped_feeds_bundle,
    split_feeds,
)
from transforms.ingest import ingest_bundle, part_tasks
from transforms.ingest.landed import landed_dir
from transforms.lake import table_files


def in_order(jobs):
    return [part_tasks.align_part_job(job) for job in jobs]


def in_threads(jobs):
    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(part_tasks.align_part_job, jobs))


def in_processes(jobs):
    with ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(pool.map(part_tasks.align_part_job, jobs))


def retried(jobs):
    """Every task run twice, as a retry after a lost result would: it writes the same files again."""
    in_order(jobs)
    return in_order(jobs)


def lake_bytes(lake: Path) -> dict[str, bytes]:
    return {str(p.relative_to(lake)): p.read_bytes() for t in TABLES for p in table_files(lake, t)}


def landed_rows(lake: Path) -> dict[str, pl.DataFrame]:
    """The landed rows per table and bucket folder, sorted (their file names carry a run's token)."""
    rows = {}
    for folder in sorted({p.parent for p in landed_dir(lake).rglob("*.parquet")}):
        frame = pl.read_parquet(sorted(folder.glob("*.parquet")), hive_partitioning=False)
        rows[str(folder.relative_to(landed_dir(lake)))] = frame.sort(pl.all(), nulls_last=True)
    return rows


def cross_parts(raw: Path) -> None:
    write_bundle(cross_part_bundle(), raw)


def in_place_bundle(raw: Path) -> None:
    write_bundle(grouped_feeds_bundle(), raw)
    split_feeds(raw, rows_per_file=24, row_group=7)


@pytest.mark.parametrize(
    ("bundle", "settings", "mapper"),
    [
        (cross_parts, ThreeParts(), in_order),
        (cross_parts, ThreePartsInMemory(), in_threads),
        (in_place_bundle, ThreeParts(), in_order),
        (in_place_bundle, ThreeParts(), in_processes),
        (cross_parts, ThreeParts(), retried),
    ],
    ids=["spilled", "in-memory-threads", "feeds-in-place", "other-processes", "retried"],
)
def test_parts_as_tasks_write_the_one_process_lake(tmp_path, bundle, settings, mapper):
    raw = tmp_path / "raw"
    bundle(raw)
    jobs_seen: list[int] = []

    def mapped(jobs):
        jobs_seen.extend(job.part for job in jobs)
        return mapper(jobs)

    one = ingest_bundle(raw, tmp_path / "one" / "lake", settings)
    tasks = ingest_bundle(raw, tmp_path / "tasks" / "lake", settings, map_parts=mapped)
    assert jobs_seen == list(range(len(jobs_seen))) and len(jobs_seen) >= 3  # every part, once
    assert lake_bytes(tmp_path / "tasks" / "lake") == lake_bytes(tmp_path / "one" / "lake")
    assert tasks.counts == one.counts and all(c.balanced for c in tasks.counts.values())
    assert tasks.output_rows == one.output_rows and tasks.output_rows["steps"] > 0
    assert tasks.quarantine_by_reason == one.quarantine_by_reason
    assert tasks.flagged_by_reason == one.flagged_by_reason and one.flagged_by_reason["missing_profile"] == 1
    one_landed, tasks_landed = (
        landed_rows(tmp_path / "one" / "lake"),
        landed_rows(tmp_path / "tasks" / "lake"),
    )
    assert sorted(tasks_landed) == sorted(one_landed)
    assert {"events", "feeds"} <= {folder.split("/")[0] for folder in one_landed}
    for folder, rows in one_landed.items():
        assert rows.equals(tasks_landed[folder]), folder
    assert not part_tasks._loaded  # the run's process keeps no context after it
    assert not any((tmp_path / "tasks" / "lake" / ".staging").iterdir())  # spill and context removed


def test_a_one_part_bundle_aligns_in_the_run_without_tasks(tmp_path):
    write_bundle(cross_part_bundle(), tmp_path / "raw")

    def refuse(jobs):
        raise AssertionError("a one-part bundle needs no tasks")

    result = ingest_bundle(tmp_path / "raw", tmp_path / "lake", map_parts=refuse)
    assert result.output_rows["steps"] > 0


def test_a_failing_part_task_leaves_the_previous_lake(tmp_path):
    write_bundle(cross_part_bundle(), tmp_path / "raw")
    lake = tmp_path / "lake"
    ingest_bundle(tmp_path / "raw", lake, ThreeParts())
    before = lake_bytes(lake)

    def second_fails(jobs):
        part_tasks.align_part_job(jobs[0])  # the first part's files are written, then a worker is lost
        raise OSError(f"worker lost on part {jobs[1].part}")

    with pytest.raises(OSError, match="worker lost on part 1"):
        ingest_bundle(tmp_path / "raw", lake, ThreeParts(), map_parts=second_fails)
    assert lake_bytes(lake) == before
    assert not any((lake / ".staging").iterdir()) and not part_tasks._loaded
