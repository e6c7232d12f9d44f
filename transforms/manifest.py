"""The one manifest every stage that writes lake tables records: ``LAKE/_runs/<stage>/manifest.json``
(the last run) and ``LAKE/_runs/<stage>/history/<finished_at>.json`` (every run).

A manifest says what the run read (its inputs with their content hashes; which of them it **read**
and which it **reused**: kept its earlier results for without reading them again), how (settings,
code version), what it wrote (each output with its row count and hash), the gate that passed it, and
the stage's own figures (``details``). ``rows`` renders it as one table, the same for the console and
for the Prefect table artifact.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from pydantic import BaseModel, Field

from transforms.files import write_json_atomic
from transforms.fingerprints import code_version, fingerprint

RUNS = "_runs"  # what the stages record beside the tables
MANIFEST_FILE = "manifest.json"


class Output(BaseModel):
    """One folder a stage wrote: its rows (Parquet metadata, summed over its files) and content hash."""

    path: str
    rows: int | None  # None for a file that is not a table
    hash: str | None


class UsersDone(BaseModel):
    """For a stage that redoes only changed users: how many it read again and how many kept their rows."""

    read: int
    reused: int


class StageManifest(BaseModel):
    model_config = {"extra": "forbid"}

    stage: str
    lake: str
    finished_at: str
    seconds: float
    code_version: str
    settings: dict[str, Any] | None = None
    inputs: dict[str, str | None] = Field(description="what the run depends on, by name, with content hashes")
    read: list[str] = Field(description="inputs this run read")
    reused: list[str] = Field(description="inputs whose earlier results were kept without reading them")
    users: UsersDone | None = None
    outputs: dict[str, Output]
    validation: dict[str, Any] | None = Field(None, description="the gate's run id and Data Docs")
    details: dict[str, Any] = Field(default_factory=dict, description="the stage's own figures")

    def rows(self) -> list[dict[str, Any]]:
        """The manifest as one table: its inputs (those under one folder on one row, counted read or
        reused), then an output per row."""
        table = [{"kind": "input", "name": name, "status": status, "rows": None, "hash": digest}
                 for name, (status, digest) in self.input_groups().items()]  # fmt: skip
        if self.users is not None:
            table.append({"kind": "users", "name": "users", "status": f"{self.users.reused:,} reused",
                          "rows": self.users.read, "hash": None})  # fmt: skip
        table += [
            {"kind": "output", "name": name, "status": "written", "rows": out.rows, "hash": short(out.hash)}
            for name, out in self.outputs.items()
        ]
        return table

    def input_groups(self) -> dict[str, tuple[str, str | None]]:
        """Each input, or each folder of inputs named ``folder/file``: its status and short hash."""
        groups: dict[str, list[str]] = {}
        for name in self.inputs:
            groups.setdefault(name.rsplit("/", 1)[0] if "/" in name else name, []).append(name)
        shown = {}
        for group, names in groups.items():
            if len(names) == 1 and names[0] == group:
                status = "reused" if group in self.reused else "read"
                shown[group] = (status, short(self.inputs[group]))
            else:
                reused = sum(name in self.reused for name in names)
                shown[group] = (f"{len(names) - reused:,} files read, {reused:,} reused", None)
        return shown


def short(digest: str | None) -> str | None:
    return digest[:12] if digest else None


def parquet_rows(folder: Path) -> int:
    """Rows of every Parquet file under ``folder`` (from the files' footers: nothing is decoded)."""
    return sum(pq.ParquetFile(f).metadata.num_rows for f in sorted(folder.rglob("*.parquet")))


def output(path: str | Path) -> Output:
    path = Path(path)
    rows = parquet_rows(path) if path.is_dir() else None
    return Output(path=str(path), rows=rows, hash=fingerprint(path))


def manifest_path(lake: str | Path, stage: str) -> Path:
    return Path(lake) / RUNS / stage / MANIFEST_FILE


def new_manifest(
    lake: str | Path,
    stage: str,
    seconds: float,
    inputs: dict[str, str | None],
    outputs: dict[str, str | Path],
    *,
    reused: list[str] | None = None,
    users: UsersDone | None = None,
    settings: dict[str, Any] | None = None,
    validation: dict[str, Any] | None = None,
    details: dict[str, Any] | None = None,
) -> StageManifest:
    """The manifest of a run that has just written ``outputs`` (name -> folder); every input not in
    ``reused`` was read."""
    kept = list(reused or [])
    return StageManifest(
        stage=stage,
        lake=str(lake),
        finished_at=datetime.now(UTC).isoformat(),
        seconds=round(seconds, 3),
        code_version=code_version(),
        settings=settings,
        inputs=inputs,
        read=[name for name in inputs if name not in kept],
        reused=kept,
        users=users,
        outputs={name: output(path) for name, path in outputs.items()},
        validation=validation,
        details=json.loads(json.dumps(details or {}, default=str)),
    )


def write_manifest(manifest: StageManifest) -> Path:
    """The manifest as the stage's last run, and a copy in its history; returns the last run's path."""
    payload = manifest.model_dump(mode="json")
    stamp = manifest.finished_at.replace(":", "-")
    write_json_atomic(
        manifest_path(manifest.lake, manifest.stage).parent / "history" / f"{stamp}.json", payload
    )
    return write_json_atomic(manifest_path(manifest.lake, manifest.stage), payload)


#: what a stage recorded before manifests: a lake with one of these and no manifest was written by an
#: earlier trajforge, and its recorded settings cannot be read (taking the defaults would misread it)
EARLIER_RUN_FILES = ("latest.json", "summary.json")


class ManifestError(ValueError):
    """A stage's run record cannot be read as a manifest."""


def read_manifest(lake: str | Path, stage: str) -> StageManifest | None:
    """The last run's manifest of ``stage`` in ``lake``; None when that stage has not run there."""
    path = manifest_path(lake, stage)
    if not path.is_file():
        earlier = [path.parent / name for name in EARLIER_RUN_FILES if (path.parent / name).is_file()]
        if earlier:
            raise ManifestError(
                f"{earlier[0]} was recorded by an earlier trajforge, which wrote no {MANIFEST_FILE}: "
                f"run the {stage} stage again (or the pipeline with force) to record its manifest"
            )
        return None
    try:
        return StageManifest.model_validate_json(path.read_text())
    except ValueError as err:
        raise ManifestError(f"{path} is not a stage manifest ({err.__class__.__name__}): run the "
                            f"{stage} stage again to rewrite it") from None  # fmt: skip
