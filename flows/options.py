"""Command-line options several commands share, declared once so they mean one thing everywhere."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

#: where ``trajforge run`` writes its lake with the default ``--workdir``: every command's default
DEFAULT_LAKE = Path("sample/lake")

LakeOption = Annotated[Path, typer.Option("--lake", help="lake folder (tables + warehouse.duckdb)")]
