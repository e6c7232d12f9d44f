"""Checks the command line makes before any work: the lake, the folders written, the checkpoints read
and the sessions chosen. Each failure is one ``InputError`` line naming the option and what to do.

Made before a flow starts, a bad input is said in a second, without Prefect's server, its log lines
or a traceback. None of them import torch or Prefect; the lake checks read only folder listings and,
for a selection of sessions, two columns of the sessions table.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from trainer.run_folder import check_writable

if TYPE_CHECKING:
    from evaluation.simulators import Sampling

WAREHOUSE = "warehouse.duckdb"  # transforms.catalog.WAREHOUSE, without importing DuckDB
#: weights a model folder may hold (transformers' names): one file, or an index of shards
WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
SAFETENSORS_HEADER_LIMIT = 100 * 2**20  # transformers' own ceiling on a header's length


class InputError(ValueError):
    """An input a command cannot use, said in one line."""


def lake_tables(lake: Path) -> list[str]:
    """The lake tables ``lake`` holds files of (Parquet under the table's folder)."""
    from transforms.schemas import LAKE_TABLES

    return [name for name in LAKE_TABLES if any((lake / name).rglob("*.parquet"))]


def check_lake(lake: str | Path, needs: Iterable[str] = (), option: str = "--lake") -> Path:
    """``lake`` is a lake folder holding the tables ``needs``; else one InputError naming ``option``
    and saying which stage writes what is missing."""
    lake = Path(lake)
    if not lake.exists():
        raise InputError(f"{option} {lake} does not exist: `trajforge ingest RAW --lake {lake}` makes one")
    if not lake.is_dir():
        raise InputError(f"{option} {lake} is a file, not a lake folder")
    held = lake_tables(lake)
    if not held and not (lake / WAREHOUSE).is_file():
        raise InputError(
            f"{option} {lake} is not a lake (no lake tables, no {WAREHOUSE}): "
            f"`trajforge ingest RAW --lake {lake}` makes one"
        )
    missing = [name for name in needs if name not in held]
    if missing:
        stage = WRITTEN_BY.get(missing[0], "ingest")
        raise InputError(
            f"{option} {lake} has no {missing[0]!r} table: run `trajforge {stage} --lake {lake}` first"
        )
    return lake


#: the command that writes each table a later command reads
WRITTEN_BY = {"histories": "chain", "records": "records", "intents": "extract", "rationales": "extract"}


def check_new_lake(lake: str | Path) -> Path:
    """A folder ingest may write a lake into: a lake already, or a folder it can make or write in that
    holds nothing else (a lake written into another folder's files would be hard to tell apart)."""
    lake = Path(lake)
    check_writable_folder(lake, "--lake")
    if any(lake.iterdir()) and not lake_tables(lake) and not (lake / WAREHOUSE).is_file():
        raise InputError(f"--lake {lake} holds files but is not a lake: pass an empty or new folder")
    return lake


def check_writable_folder(folder: str | Path, option: str = "--out") -> Path:
    """``folder`` exists or can be made, and this process can write in it (InputError otherwise)."""
    folder = Path(folder)
    try:
        check_writable(folder)
    except ValueError as err:
        raise InputError(str(err).replace("--out", option, 1)) from None
    return folder


def check_writable_file(path: str | Path, option: str) -> Path:
    """``path`` can be written: its folder is writable and it is not a folder itself."""
    path = Path(path)
    if path.is_dir():
        raise InputError(f"{option} {path} is a folder, not a file")
    check_writable_folder(path.parent, option)
    return path


def newest_checkpoint(run: Path) -> Path | None:
    """A run folder's newest ``checkpoints/step-N`` (trainer.checkpoint.latest, without torch)."""
    steps = [p for p in (run / "checkpoints").glob("step-*") if p.name[5:].isdigit() and p.is_dir()]
    return max(steps, key=lambda p: int(p.name[5:])) if steps else None


def check_model_folder(path: str | Path, option: str = "--base", run_folder: bool = True) -> Path:
    """The model folder ``path`` names (a run folder: its newest checkpoint, when ``run_folder``),
    checked whole: its config, its tokenizer, and weights that are all there; else one InputError
    starting with ``option`` and the path (``--base /x``, ``--simulator checkpoint:/x``)."""
    path = Path(path)
    named = f"{option}{path}" if option.endswith(":") else f"{option} {path}"
    if not path.exists():
        raise InputError(f"{named} does not exist (a local model folder is expected)")
    if not path.is_dir():
        raise InputError(f"{named} is a file, not a model folder")
    if not (path / "config.json").is_file():
        newest = newest_checkpoint(path) if run_folder else None
        if newest is None:
            run = " nor a run folder (no checkpoints/step-*)" if run_folder else ""
            raise InputError(f"{named} is not a model folder (no config.json){run}")
        path = newest
    try:
        json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        raise InputError(f"{named}: {path / 'config.json'} is not readable JSON") from None
    weights = next((path / name for name in WEIGHTS if (path / name).is_file()), None)
    if weights is None:
        raise InputError(f"{named}: {path} has no weights (none of {', '.join(WEIGHTS)})")
    if weights.name == "model.safetensors":
        check_safetensors(weights, named)
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise InputError(f"{named}: {path} has no tokenizer (none of {', '.join(TOKENIZER_FILES)})")
    return path


def check_safetensors(path: Path, named: str) -> None:
    """A safetensors file whose header reads and whose tensors all lie inside the file: a file cut
    short (a copy or a save killed half-way) is refused here rather than deep inside transformers."""
    size = path.stat().st_size
    try:
        with path.open("rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            if length > min(size - 8, SAFETENSORS_HEADER_LIMIT):
                raise ValueError
            header = json.loads(handle.read(length))
        end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    except (struct.error, ValueError, KeyError, TypeError, IndexError, UnicodeDecodeError):
        raise InputError(f"{named}: {path} is not a readable safetensors file") from None
    if 8 + length + end > size:
        raise InputError(
            f"{named}: {path} is cut short: its tensors need {8 + length + end:,} bytes, it has {size:,}"
        )


def checkpoint_spec_problem(argument: str, lake: Path, sampling: Sampling) -> str | None:
    """What is wrong with ``checkpoint:PATH`` for an evaluation: the folder's files
    (``evaluation.preflight``), then its weights read whole, so a copy cut short is refused before
    the run rather than deep inside transformers."""
    from evaluation.preflight import checkpoint_problem

    problem = checkpoint_problem(argument, lake, sampling)
    weights = Path(argument).expanduser() / "model.safetensors"
    if problem is None and weights.is_file():
        try:
            check_safetensors(weights, f"checkpoint:{argument}")
        except InputError as err:
            return str(err).split(": ", 1)[1]
    return problem


def count_sessions(lake: str | Path, split: str) -> tuple[int, int]:
    """The sessions of ``split``: (all, uncut), from the sessions table, or from the steps of a lake
    written without one (whose sessions are all uncut)."""
    import polars as pl

    from transforms.lake import scan_table, table_files

    if not table_files(lake, "sessions"):
        steps = scan_table(lake, "steps", ["session_id", "split"]).filter(pl.col("split") == split)
        every = steps.select(pl.col("session_id").n_unique()).collect().item()
        return every, every
    frame = scan_table(lake, "sessions", ["split", "cut_reason"]).filter(pl.col("split") == split)
    uncut = pl.col("cut_reason").is_null().sum().alias("uncut")
    counts = frame.select(pl.len().alias("all"), uncut).collect()
    return int(counts["all"][0]), int(counts["uncut"][0])


def check_sessions(lake: str | Path, split: str) -> int:
    """The uncut sessions of ``split`` (those evaluated); none is an InputError, not a report of zeros."""
    every, uncut = count_sessions(lake, split)
    if uncut == 0:
        cut = f" ({every} sessions, every one cut at a bad event)" if every else ""
        raise InputError(f"--split {split} of {lake} has no session to evaluate{cut}")
    return uncut
