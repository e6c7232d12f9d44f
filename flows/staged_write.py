"""The one way a stage puts tables into the lake: write them into a staging folder, gate them, swap
them in, refresh the catalog, then record the run's manifest (``transforms.manifest``) and publish it
as a Prefect table artifact beside the stage's own summary. A failed gate leaves the lake as it was.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from flows.catalog import refresh_catalog_task
from flows.retrying import IO_RETRIES
from flows.validate import gate_task, staging, swap_staged
from transforms.config import IngestSettings
from transforms.lake import quarantine_dir, table_dir
from transforms.manifest import StageManifest, UsersDone, new_manifest, write_manifest


@dataclass
class Staged:
    """What a stage wrote into its staging folder: its own figures, the row accounting its gate checks
    (``rows_in``/``rows_out`` per table), its settings, and for a stage that redoes only changed users
    how many it read and kept."""

    details: dict[str, Any]
    accounting: dict[str, dict[str, int]]
    settings: dict[str, Any] | None = None
    users: UsersDone | None = None
    reused: list[str] = field(default_factory=list)  # inputs the stage did not read again
    raw_files: list[str] | None = None  # the raw bundle's files it read, when not all of them


@dataclass(frozen=True)
class StageWrite:
    """How one stage writes: its name, the tables it gates and swaps in, its other outputs (files or
    folders beside the tables), and the gate's options (``raw``, ``settings`` for ingest)."""

    stage: str
    tables: list[str]
    extra_outputs: dict[str, str] = field(default_factory=dict)
    gate_raw: str | None = None
    gate_settings: IngestSettings | None = None
    markdown: Callable[[dict[str, Any]], str] | None = None


def outputs_of(lake: str, spec: StageWrite) -> dict[str, str]:
    written = {name: str(table_dir(lake, name)) for name in spec.tables}
    quarantined = quarantine_dir(lake, spec.stage)
    if quarantined.exists():
        written["quarantine"] = str(quarantined)
    return {**written, **{name: path for name, path in spec.extra_outputs.items() if Path(path).exists()}}


@task(name="record-stage-manifest", cache_policy=NO_CACHE, **IO_RETRIES)
def record_manifest(manifest: StageManifest, markdown: str | None) -> str:
    """``LAKE/_runs/<stage>/manifest.json`` (and its history copy); the manifest as a Prefect table
    artifact, and the stage's own summary as a markdown artifact."""
    path = write_manifest(manifest)
    create_table_artifact(
        key=f"{manifest.stage}-manifest",
        table=manifest.rows(),
        description=f"{manifest.stage} of {manifest.lake}: inputs read or reused, outputs written",
    )
    if markdown:
        key = f"{manifest.stage}-summary"
        create_markdown_artifact(key=key, markdown=markdown, description=manifest.stage)
    return str(path)


def write_staged(
    lake: str,
    spec: StageWrite,
    inputs: dict[str, str | None],
    write: Callable[[str], Staged],
    after_swap: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Stage -> gate -> swap -> catalog -> manifest. ``inputs``: what the stage reads, hashed before it
    writes; ``write(staged)`` writes the stage's tables into the staging folder ``staged``;
    ``after_swap`` runs once the tables are in place (what the stage records beside them). Returns the
    stage's figures, with ``validation``, ``seconds`` and the ``manifest`` path."""
    started = time.perf_counter()
    with staging(lake) as staged:
        work = write(staged)
        gate = gate_task(
            lake, spec.tables, stage=spec.stage, raw=spec.gate_raw, staged=staged,
            settings=spec.gate_settings, accounting=work.accounting, raw_files=work.raw_files,
        )  # fmt: skip
        swap_staged(lake, staged)
    if after_swap is not None:
        after_swap()
    refresh_catalog_task(lake)
    validation = {"run_id": gate["run_id"], "docs": gate["docs_index"]}
    seconds = time.perf_counter() - started
    details = {**work.details, "validation": validation, "seconds": round(seconds, 3)}
    manifest = new_manifest(
        lake, spec.stage, seconds, inputs, outputs_of(lake, spec), reused=work.reused, users=work.users,
        settings=work.settings, validation=validation, details=details,
    )  # fmt: skip
    details["manifest"] = record_manifest(manifest, spec.markdown(details) if spec.markdown else None)
    return details
