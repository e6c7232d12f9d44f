"""The train flow: lake records -> a trained checkpoint (Hugging Face folder); paths in, path out."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from rich.console import Console

from trainer.config import TrainSettings, load_train_settings

Stage = Literal["sft", "optd"]


class StageNotAvailable(RuntimeError):
    """A training stage this build cannot run yet."""


@task(name="train-sft", cache_policy=NO_CACHE)
def sft_task(lake: str, out: str, base: str | None, settings: TrainSettings, resume: bool) -> dict[str, Any]:
    from trainer.run import run_sft  # torch loads when a run starts, not with the command line

    return asdict(run_sft(settings, lake, out, base=base, resume=resume))


@task(name="record-train-run", cache_policy=NO_CACHE)
def record_run(stage: str, summary: dict[str, Any]) -> None:
    create_markdown_artifact(
        key=f"train-{stage}", markdown=summary_markdown(stage, summary), description="train"
    )


def summary_markdown(stage: str, s: dict[str, Any]) -> str:
    def loss(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.4f}"

    left_out = "\n".join(f"| {k} | {v:,} |" for k, v in s["left_out"].items()) or "| – | 0 |"
    return (
        f"# Train ({stage})\n\n"
        f"{s['steps']} updates ({s['skipped_steps']} skipped as non-finite) "
        f"on {s['train_states']:,} states\n\n"
        f"held-out loss ({s['held_out_states']} states): {loss(s['held_out_loss_start'])} -> "
        f"{loss(s['held_out_loss_end'])}\n\n"
        f"| left out | records |\n|---|---:|\n{left_out}\n\n"
        f"checkpoint: `{s['checkpoint']}`, data hash `{s['data_hash'][:16]}`\n"
    )


@flow(name="train")
def train_flow(
    lake: str,
    out: str,
    stage: Stage = "sft",
    base: str | None = None,
    settings: TrainSettings | None = None,
    resume: bool = False,
) -> str:
    """Train ``stage`` on ``lake``'s records into ``out``; returns the final checkpoint folder."""
    if stage != "sft":
        raise StageNotAvailable(f"the {stage} stage is not available yet: only --stage sft can be trained")
    summary = sft_task(lake, out, base, settings or TrainSettings(), resume)
    get_run_logger().info(
        "held-out loss %s -> %s", summary["held_out_loss_start"], summary["held_out_loss_end"]
    )
    record_run(stage, summary)
    return summary["checkpoint"]


def train_command(
    lake: Annotated[Path, typer.Option("--lake", help="lake folder with the records table")],
    stage: Annotated[str, typer.Option("--stage", help="sft | optd")],
    out: Annotated[Path, typer.Option("--out", help="run folder: checkpoints, metrics.jsonl, summary.json")],
    base: Annotated[
        Path | None, typer.Option("--base", help="model folder to start from (default: the tiny model)")
    ] = None,
    config: Annotated[
        Path | None,
        # escaped: Rich would read [train] as markup and print nothing in its place
        typer.Option("--config", help="TOML file with \\[train] settings", exists=True, dir_okay=False),
    ] = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="continue from the newest checkpoint in --out")
    ] = False,
) -> None:
    """Train the simulator on the lake's records: SFT warm-up (sft) or on-policy distillation (optd)."""
    console = Console()
    if stage not in ("sft", "optd"):
        console.print(f"[red]stopped:[/red] unknown stage {stage!r}: sft | optd")
        raise typer.Exit(1)
    settings = load_train_settings(config)
    started = time.perf_counter()
    try:
        checkpoint = train_flow(
            str(lake.resolve()),
            str(out.resolve()),
            stage=stage,  # type: ignore[arg-type]
            base=str(base.resolve()) if base else None,
            settings=settings,
            resume=resume,
        )
    except (StageNotAvailable, FileNotFoundError, ValueError) as err:
        console.print(f"[red]stopped:[/red] {err}", soft_wrap=True)
        raise typer.Exit(1) from None
    summary = json.loads((out / "summary.json").read_text())
    console.print(summary_markdown(stage, summary), soft_wrap=True)
    console.print(f"trained in {time.perf_counter() - started:.1f}s; checkpoint: {checkpoint}")
