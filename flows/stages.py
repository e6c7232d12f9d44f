"""The pipeline's and the main job's stages as Prefect-cached tasks (``flows.caching``).

Each stage says what it reads (the key: lake tables and folders by content, its settings) and what it
writes (checked before a cached summary is served). The functions themselves are the stage flows,
run with ``force``/``overwrite``: whether a stage runs at all is the cache's decision, not theirs.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from flows.caching import cached_stage, fingerprint
from transforms.lake import quarantine_dir, recorded_settings, table_dir, world_path

#: what ingest writes, and what the stages after it read of it
INGESTED = ("steps", "sessions", "feed_layouts", "items", "profiles", "history")
EXTRACTED = ("intents", "rationales")


def settings_json(settings: BaseModel | dict[str, Any] | None) -> Any:
    """Settings as they enter a key; a string that never appears in output (a key for pseudonyms)
    enters as its hash."""
    if settings is None or isinstance(settings, dict):
        return settings
    values = settings.model_dump(mode="json")
    for name, info in type(settings).model_fields.items():
        if info.repr is False and isinstance(values.get(name), str):
            values[name] = hashlib.sha256(values[name].encode()).hexdigest()
    return values


def tables(lake: str | Path, names: tuple[str, ...] | list[str]) -> dict[str, str | None]:
    return {name: fingerprint(table_dir(lake, name)) for name in names}


def lake_outputs(lake: str | Path, names: tuple[str, ...] | list[str]) -> list[Path]:
    return [table_dir(lake, name) for name in names]


# --- synthetic logs ---------------------------------------------------------------------------


@cached_stage(
    "synthesise",
    reads=lambda raw, users, seed: {"users": users, "seed": seed},
    writes=lambda raw, users, seed: [Path(raw)],
)
def synthesise_stage(raw: str, users: int, seed: int) -> dict[str, Any]:
    from synthetic.bundle import write_bundle

    return write_bundle(raw, users=users, seed=seed, fmt="parquet", overwrite=True)


# --- the dataset ------------------------------------------------------------------------------


@cached_stage(
    "ingest",
    reads=lambda raw, lake, settings, source_format, reuse=True: {
        "raw": fingerprint(raw), "settings": settings_json(settings), "format": source_format
    },
    writes=lambda raw, lake, settings, source_format, reuse=True: [
        *lake_outputs(lake, INGESTED), quarantine_dir(lake, "ingest"), world_path(lake)
    ],
)  # fmt: skip
def ingest_stage(
    raw: str, lake: str, settings: Any, source_format: str, reuse: bool = True
) -> dict[str, Any]:
    """``reuse``: a bundle grown by new files is ingested from those files (``transforms.ingest``)."""
    from flows.ingest import ingest_bundle_flow

    return ingest_bundle_flow(raw, lake, settings=settings, source_format=source_format, new_files_only=reuse)


@cached_stage(
    "chain",
    reads=lambda lake, reuse: tables(lake, ["sessions"]),
    writes=lambda lake, reuse: lake_outputs(lake, ["histories"]),
)
def chain_stage(lake: str, reuse: bool) -> dict[str, Any]:
    """``reuse``: users whose sessions are unchanged since the last chain keep their histories."""
    from flows.chain import chain_flow

    return chain_flow(lake, reuse=reuse)


def states_folder(lake: str | Path) -> Path:
    """Where the pipeline keeps the states as rendered before any extraction: extraction's input,
    lake-shaped (``records/bucket=K``), not a table of the lake."""
    return Path(lake) / "_extraction_states"


def rendering_reads(lake: str, settings: Any) -> dict[str, Any]:
    return {
        **tables(lake, [*INGESTED, "histories"]),
        "geometry": recorded_settings(lake).geometry.model_dump(mode="json"),
        "settings": settings_json(settings),
    }


@cached_stage(
    "extraction-states",
    reads=lambda lake, settings, reuse: rendering_reads(lake, settings),
    writes=lambda lake, settings, reuse: [table_dir(states_folder(lake), "records")],
)
def extraction_states_stage(lake: str, settings: Any, reuse: bool) -> dict[str, Any]:
    """``reuse``: users whose rows are unchanged since the last rendering keep their states."""
    from flows.records import with_lake_geometry
    from flows.unchanged_users import render_states

    folder = states_folder(lake)
    chosen = with_lake_geometry(lake, settings)
    return render_states(lake, stage="extraction-states", out=folder, final=folder, settings=chosen,
                         with_extraction=False, reuse=reuse)  # fmt: skip


@cached_stage(
    "records",
    reads=lambda lake, settings, reuse: {
        **rendering_reads(lake, settings), **tables(lake, EXTRACTED),
        "extract_quarantine": fingerprint(quarantine_dir(lake, "extract")),
    },
    writes=lambda lake, settings, reuse: lake_outputs(lake, ["records"]),
)  # fmt: skip
def records_stage(lake: str, settings: Any, reuse: bool) -> dict[str, Any]:
    from flows.records import records_flow

    return records_flow(lake, settings=settings, reuse=reuse)


@cached_stage(
    "extract",
    reads=lambda lake, settings, reuse: {
        **tables(lake, INGESTED), "states": fingerprint(states_folder(lake)),
        "settings": settings_json(settings),
    },
    writes=lambda lake, settings, reuse: [*lake_outputs(lake, EXTRACTED), quarantine_dir(lake, "extract")],
)  # fmt: skip
def extract_stage(lake: str, settings: Any, reuse: bool) -> dict[str, Any]:
    """``reuse``: users whose states and rows are unchanged since the last extraction keep theirs."""
    from flows.extract import extract_flow

    return extract_flow(lake, settings=settings, states=str(states_folder(lake)), reuse=reuse)


# --- the simulator ----------------------------------------------------------------------------

#: what training and evaluation read of a lake: the states, and the screens their responses are judged on
TRAINED_ON = ("records", *INGESTED, "histories")


@cached_stage(
    "train",
    reads=lambda lake, out, stage, base, settings, deployment: {
        **tables(lake, TRAINED_ON), "stage": stage, "base": base and fingerprint(base),
        "settings": settings_json(settings),
    },  # where it trains (``deployment``) is no part of what it makes
    writes=lambda lake, out, stage, base, settings, deployment: [Path(out)],
)  # fmt: skip
def train_stage(
    lake: str, out: str, stage: str, base: str | None, settings: Any, deployment: str | None
) -> dict[str, Any]:
    """Train in this process, or hand the run to ``deployment`` (a GPU pool's) and wait for it."""
    if deployment:
        from flows.handoff import run_and_wait, trained_checkpoint

        parameters = {"lake": lake, "out": out, "stage": stage, "base": base, "settings": settings,
                      "resume": False, "overwrite": True}  # fmt: skip
        run_and_wait(deployment, parameters)
        return {"checkpoint": trained_checkpoint(out)}
    from flows.train import train_flow

    checkpoint = train_flow(lake, out, stage=stage, base=base, settings=settings, overwrite=True)  # type: ignore[arg-type]
    return {"checkpoint": checkpoint}


def simulator_reads(simulators: list[str]) -> dict[str, str | None]:
    """A checkpoint simulator enters the key by its folder's content, not only by its path."""
    prefix = "checkpoint:"
    return {s: fingerprint(s[len(prefix) :]) for s in simulators if s.startswith(prefix)}


@cached_stage(
    "evaluate",
    reads=lambda lake, simulators, out, settings, deployment: {
        **tables(lake, TRAINED_ON), "world": fingerprint(world_path(lake)),
        "simulators": simulators, "checkpoints": simulator_reads(simulators), "settings": settings,
    },
    writes=lambda lake, simulators, out, settings, deployment: [Path(out)],
)  # fmt: skip
def evaluate_stage(
    lake: str, simulators: list[str], out: str, settings: dict[str, Any], deployment: str | None
) -> dict[str, Any]:
    """Evaluate in this process, or hand the run to ``deployment`` and read back its report."""
    from flows.evaluate import evaluate_flow
    from flows.evaluate_folder import read_run, run_settings, start_evaluation

    # the same evaluation asked again (one killed before it finished, its checkpoints' content the
    # same) keeps the sessions it finished; anything else is evaluated afresh, never mixed with them
    asked = run_settings(lake, simulators, **settings, checkpoints=simulator_reads(simulators))
    start_evaluation(out, asked, overwrite=read_run(Path(out)) != asked)
    if deployment:
        from flows.handoff import evaluation_written, run_and_wait

        run_and_wait(deployment, {"lake": lake, "simulators": simulators, "out": out, **settings})
        return evaluation_written(out)
    return evaluate_flow(lake, simulators, out, **settings)
