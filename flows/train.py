"""The train flow: lake records -> a trained checkpoint (Hugging Face folder); paths in, path out."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from rich.console import Console

from flows.settings import load_settings
from trainer.config import TrainSettings
from trainer.optd_config import OPTDSettings

Stage = Literal["sft", "optd"]


class StageNotAvailable(RuntimeError):
    """A training stage that cannot run with the arguments given."""


@task(name="train-sft", cache_policy=NO_CACHE)
def sft_task(lake: str, out: str, base: str | None, settings: TrainSettings, resume: bool) -> dict[str, Any]:
    from trainer.run import run_sft  # torch loads when a run starts, not with the command line

    return asdict(run_sft(settings, lake, out, base=base, resume=resume))


@task(name="train-optd", cache_policy=NO_CACHE)
def optd_task(
    lake: str, out: str, base: str, settings: TrainSettings, optd: OPTDSettings | None, resume: bool
) -> dict[str, Any]:
    from trainer.optd_run import run_optd

    return asdict(run_optd(settings, optd or OPTDSettings(), lake, out, base, resume=resume))


@task(name="record-train-run", cache_policy=NO_CACHE)
def record_run(stage: str, summary: dict[str, Any]) -> None:
    create_markdown_artifact(
        key=f"train-{stage}", markdown=summary_markdown(stage, summary), description="train"
    )


def _value(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{reason} {n}" for reason, n in counts.items()) or "none"


def responses_markdown(start: dict[str, Any] | None, end: dict[str, Any] | None) -> str:
    """The sampled held-out responses (PROTOCOL §2): parse and executable shares, start -> end."""
    if not (start or end):
        return "sampled held-out responses: none"
    first, last = start or {}, end or {}
    return (
        f"sampled held-out responses: parse {_value(first.get('parse_share'))} -> "
        f"{_value(last.get('parse_share'))}, executable {_value(first.get('executable_share'))} -> "
        f"{_value(last.get('executable_share'))} ({last.get('judged', 0)} on a screen); "
        f"rejected at the end: {_counts(last.get('rejected', {}))}; "
        f"without a screen: {_counts(last.get('no_screen', {}))}"
    )


def held_out_markdown(s: dict[str, Any]) -> str:
    if "held_out_loss_start" in s:  # sft
        start, end = s["held_out_loss_start"], s["held_out_loss_end"]
        responses = responses_markdown(s.get("held_out_responses_start"), s.get("held_out_responses_end"))
        return (
            f"held-out loss ({s['held_out_states']} states): {_value(start)} -> {_value(end)}\n\n{responses}"
        )
    start, end = s["held_out_start"] or {}, s["held_out_end"] or {}
    shares = ("parse_share", "executable_share")  # on the responses' line
    measures = [k for k, v in (start | end).items() if isinstance(v, float) and k not in shares]
    rows = "\n".join(f"| {name} | {_value(start.get(name))} | {_value(end.get(name))} |" for name in measures)
    table = f"| measure | start | end |\n|---|---:|---:|\n{rows}"
    return f"held-out states: {s['held_out_states']}\n\n{table}\n\n{responses_markdown(start, end)}"


def summary_markdown(stage: str, s: dict[str, Any]) -> str:
    left_out = "\n".join(f"| {k} | {v:,} |" for k, v in s["left_out"].items()) or "| – | 0 |"
    return (
        f"# Train ({stage})\n\n"
        f"{s['steps']} updates ({s['skipped_steps']} skipped as non-finite) "
        f"on {s['train_states']:,} states\n\n"
        f"{held_out_markdown(s)}\n\n"
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
    optd: OPTDSettings | None = None,
) -> str:
    """Train ``stage`` on ``lake``'s records into ``out``; returns the final checkpoint folder.

    ``sft`` starts from ``base`` (a pretrained folder) or the tiny default; ``optd`` needs
    ``base``: the SFT checkpoint, frozen as the teacher and copied as the student's start.
    """
    settings = settings or TrainSettings()
    if stage == "sft":
        summary = sft_task(lake, out, base, settings, resume)
    elif base is None:
        raise StageNotAvailable("--stage optd needs --base: the SFT checkpoint (teacher and student start)")
    else:
        summary = optd_task(lake, out, base, settings, optd, resume)
    get_run_logger().info("%s", held_out_markdown(summary))
    record_run(stage, summary)
    return summary["checkpoint"]


def train_alongside(
    stage: Stage,
    lake: Path,
    out: Path,
    base: Path | None,
    settings: TrainSettings,
    optd: OPTDSettings | None,
    resume: bool,
) -> None:
    """A rank other than 0's part of the run: the stage's training itself, outside Prefect."""
    paths = str(lake.resolve()), str(out.resolve())
    if stage == "sft":
        sft_task.fn(*paths, str(base.resolve()) if base else None, settings, resume)
    elif base is not None:  # without it rank 0 stops the run with the reason
        optd_task.fn(*paths, str(base.resolve()), settings, optd, resume)


def train_command(
    lake: Annotated[Path, typer.Option("--lake", help="lake folder with the records table")],
    stage: Annotated[str, typer.Option("--stage", help="sft | optd")],
    out: Annotated[Path, typer.Option("--out", help="run folder: checkpoints, metrics.jsonl, summary.json")],
    base: Annotated[
        Path | None,
        typer.Option(
            "--base",
            help="sft: a pretrained model folder (default: the tiny model); optd: the SFT checkpoint",
        ),
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
    settings = load_settings(TrainSettings, "train", config)
    optd = load_settings(OPTDSettings, "optd", config) if stage == "optd" else None
    if int(os.environ.get("RANK", "0")) > 0:
        # under torchrun rank 0 runs the flow (logs, artifact, summary); the others train beside it, quietly
        try:
            train_alongside(stage, lake, out, base, settings, optd, resume)  # type: ignore[arg-type]
        except (FileNotFoundError, ValueError):
            raise typer.Exit(1) from None  # rank 0 meets the same error and says it
        return
    started = time.perf_counter()
    try:
        checkpoint = train_flow(
            str(lake.resolve()),
            str(out.resolve()),
            stage=stage,  # type: ignore[arg-type]
            base=str(base.resolve()) if base else None,
            settings=settings,
            resume=resume,
            optd=optd,
        )
    except (StageNotAvailable, FileNotFoundError, ValueError) as err:
        console.print(f"[red]stopped:[/red] {err}", soft_wrap=True)
        raise typer.Exit(1) from None
    summary = json.loads((out / "summary.json").read_text())
    console.print(summary_markdown(stage, summary), soft_wrap=True)
    console.print(f"trained in {time.perf_counter() - started:.1f}s; checkpoint: {checkpoint}")
