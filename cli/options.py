"""Command-line options several commands share, declared once so they mean one thing everywhere."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

#: where ``trajforge run`` writes its lake with the default ``--workdir``: every command's default
DEFAULT_LAKE = Path("sample/lake")

LakeOption = Annotated[Path, typer.Option("--lake", help="lake folder (tables + warehouse.duckdb)")]
#: the dataset commands' lake: a folder, or one on an object store (transforms/object_store.py)
LakeLocationOption = Annotated[
    str, typer.Option("--lake", help="lake folder, or s3://bucket/prefix (worked on in a local copy)")
]


class Split(StrEnum):
    """A lake's session split (``--split``): a choice the shell completes and click checks."""

    train = "train"
    val = "val"
    test = "test"


def config_option(*sections: str) -> object:
    """``--config``, naming the TOML sections the command reads (escaped: Rich would read ``[ingest]``
    as markup and print nothing in its place)."""
    named = " ".join(f"\\[{section}]" for section in sections)
    return typer.Option("--config", help=f"TOML file with {named} settings", exists=True, dir_okay=False)


IngestConfig = Annotated[Path | None, config_option("ingest")]
RecordsConfig = Annotated[Path | None, config_option("records", "scale")]
ExtractConfig = Annotated[Path | None, config_option("extract")]
RunConfig = Annotated[
    Path | None, config_option("ingest", "records", "extract", "train", "optd", "main_job", "scale")
]
ScaleConfig = Annotated[Path | None, config_option("scale")]


class TaskRunner(StrEnum):
    """Where the per-bucket tasks run (``--task-runner``; ``flows.buckets``)."""

    local = "local"
    ray = "ray"


TaskRunnerOption = Annotated[
    TaskRunner | None,
    typer.Option(
        "--task-runner",
        help="per-bucket tasks: local threads, or a Ray cluster (TRAJFORGE_TASK_RUNNER; default local)",
    ),
]
RayAddressOption = Annotated[
    str | None,
    typer.Option(
        "--ray-address", help="the Ray cluster with --task-runner ray (RAY_ADDRESS; else a local one)"
    ),
]
