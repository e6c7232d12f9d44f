"""The ingest flow: raw log bundle -> staged lake tables -> validation gate -> lake -> DuckDB catalog."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from flows.buckets import map_buckets, per_bucket, scale_settings, side_by_side
from flows.caching import run_stage
from flows.retrying import IO_RETRIES
from flows.staged_write import Staged, StageWrite, write_staged
from flows.validate import quiet_tracebacks
from transforms.config import IngestSettings
from transforms.fingerprints import file_fingerprints, fingerprint
from transforms.ingest import ingest_bundle
from transforms.ingest.landed import commit_landed, discard_sealed, landed_dir
from transforms.ingest.part_tasks import AlignMap, PartJob, PartOutcome, align_part_job
from transforms.lake import world_path
from transforms.manifest import UsersDone
from transforms.readers import BundleError

quiet_tracebacks(BundleError)  # a bundle problem is a clean stop: Prefect logs its message only

GENERATED_BY = "trajforge.synthetic"  # the ``generator`` of a synthetic bundle's manifest
INGESTED_TABLES = ("steps", "sessions", "feed_layouts", "items", "profiles", "history")


def parts_in_tasks() -> AlignMap | None:
    """How a bundle read in several parts aligns them: one task each, as the other stages run their
    buckets, when the task runner runs more than one at a time (Ray, or several local workers); None
    (the parts in the ingest's own process) otherwise."""
    if not side_by_side(scale_settings()):
        return None
    align = per_bucket("ingest-align-part", align_part_job)

    def in_tasks(jobs: list[PartJob]) -> list[PartOutcome]:
        return map_buckets(align, jobs, mapped_as="job")

    return in_tasks


@task(name="ingest-tables", cache_policy=NO_CACHE, **IO_RETRIES)
def ingest_tables(
    raw: str,
    lake: str,
    staged: str,
    settings: IngestSettings,
    source_format: str,
    new_files_only: bool = True,
) -> dict:
    """Ingest ``raw`` into the staging folder ``staged``; the lake is untouched until the gate passes."""
    logger = get_run_logger()
    result = ingest_bundle(
        raw,
        lake,
        settings,
        progress=lambda phase: logger.info("ingest: %s", phase),
        source_format=source_format,
        staging=staged,
        new_files_only=new_files_only,
        map_parts=parts_in_tasks(),
    )
    return result.to_json()


def record_world(raw: str | Path, lake: str | Path) -> dict | None:
    """Keep a generated bundle's manifest (seed, users, geometry, generator version: enough to rebuild
    its world) beside the lake; a bundle of real logs leaves the lake without one (a world kept from an
    earlier ingest is removed)."""
    manifest_file = Path(raw) / "manifest.json"
    manifest = json.loads(manifest_file.read_text()) if manifest_file.is_file() else {}
    target = world_path(lake)
    if manifest.get("generator") != GENERATED_BY:
        target.unlink(missing_ok=True)
        return None
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


@task(name="record-world", cache_policy=NO_CACHE)
def record_world_task(raw: str, lake: str) -> bool:
    """A generated bundle's world travels with its lake; real logs have none."""
    return record_world(raw, lake) is not None


def summary_markdown(summary: dict) -> str:
    columns = ("rows_in", "rows_out", "quarantined", "duplicates", "dropped", "flagged")
    rows = "\n".join(
        f"| {t} | " + " | ".join(str(c.get(k, 0)) for k in columns) + " |"
        for t, c in summary["counts"].items()
    )
    reasons = "\n".join(f"| {r} | {n} |" for r, n in summary["quarantine_by_reason"].items()) or "| – | 0 |"
    return (
        f"# Ingest of `{summary['raw']}`\n\nLake: `{summary['lake']}`\n\n"
        "| table | rows in | rows out | quarantined | duplicates merged | dropped | flagged (kept) |\n"
        f"|---|---|---|---|---|---|---|\n{rows}\n\n| quarantine reason | rows |\n|---|---|\n{reasons}\n"
    )


@flow(name="ingest-bundle", persist_result=False)  # its tasks' results stay in memory
def ingest_bundle_flow(
    raw: str,
    lake: str,
    settings: IngestSettings | None = None,
    source_format: str = "bundle",
    new_files_only: bool = True,
) -> dict:
    """Raw bundle (or UserArena release JSONL) -> steps, sessions, feed_layouts, items, profiles,
    history, quarantine: staged, gated, swapped in, recorded. Always ingests: whether to is the
    ingest stage's cache's decision (``ingest_flow``). ``new_files_only``: a bundle grown by new files
    is ingested from those files (False: the whole bundle is read)."""
    settings = settings or IngestSettings()
    spec = StageWrite(
        "ingest", list(INGESTED_TABLES),
        extra_outputs={"world": str(world_path(lake)), "landed": str(landed_dir(lake))},
        gate_raw=raw if source_format == "bundle" else None, gate_settings=settings,
        markdown=summary_markdown,
    )  # fmt: skip

    def staged_tables(staged: str) -> Staged:
        summary = ingest_tables(raw, lake, staged, settings, source_format, new_files_only)
        summary_of.update(summary)  # the landed rows it left staged are placed after the swap
        increment = summary["increment"]
        if "files_read" not in increment:
            return Staged(summary, summary["counts"], settings=summary["settings"])
        read = set(increment["files_read"])
        return Staged(
            summary, summary["counts"], settings=summary["settings"],
            users=UsersDone(read=increment["users_read"], reused=increment["users_reused"]),
            reused=[name for name in inputs if name.startswith("bundle/") and name[7:] not in read],
            raw_files=sorted(read),
        )  # fmt: skip

    def after_swap() -> None:
        place_landed(summary_of["increment"], lake)
        record_world_task(raw, lake)

    summary_of: dict = {}
    inputs = bundle_inputs(raw)
    try:
        return write_staged(lake, spec, inputs, staged_tables, after_swap)
    finally:  # a stopped gate leaves the landed rows as they were
        if "landed_staged" in summary_of.get("increment", {}):
            discard_sealed(summary_of["increment"]["landed_staged"])


def place_landed(increment: dict, lake: str) -> None:
    """The landed rows of the ingest just swapped in take their place beside the lake; an ingest that
    landed none removes any an earlier one left (they would describe another lake)."""
    staged = increment.pop("landed_staged", None)
    if staged is not None:
        commit_landed(staged, lake)
    elif not increment:
        shutil.rmtree(landed_dir(lake), ignore_errors=True)


def bundle_inputs(raw: str | Path) -> dict[str, str | None]:
    """The bundle as a whole (``raw``: the fingerprint the stage's cache key holds, memoized, so the
    bundle is read for hashing once) and each of its files (``bundle/<path>``)."""
    files = file_fingerprints(raw) if Path(raw).is_dir() else {}
    return {"raw": fingerprint(raw), **{f"bundle/{name}": digest for name, digest in files.items()}}


@flow(name="ingest")
def ingest_flow(
    raw: str,
    lake: str,
    settings: IngestSettings | None = None,
    force: bool = False,
    source_format: str = "bundle",
) -> dict:
    """The ingest stage: served from Prefect's cache when the bundle's content, the settings and the
    code are those of the lake's last ingest and its tables are as that ingest wrote them
    (``skipped`` True); ``force`` ingests whatever the cache holds."""
    from flows.stages import ingest_stage

    outcome = run_stage(
        ingest_stage,
        lake,
        force,
        raw=raw,
        lake=lake,
        settings=settings,
        source_format=source_format,
        reuse=not force,
    )
    if outcome.reused:
        get_run_logger().info("bundle unchanged since the last ingest; nothing to do")
    return {**outcome.summary, "skipped": outcome.reused, "seconds": round(outcome.seconds, 3)}
