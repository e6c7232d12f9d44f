"""The train flow: lake records -> a trained checkpoint (Hugging Face folder); paths in, path out."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, Literal

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from flows.training_artifacts import publish_training_progress
from trainer.config import OPTDSettings, TrainSettings, optd_settings

Stage = Literal["sft", "optd"]


class StageNotAvailable(RuntimeError):
    """A training stage that cannot run with the arguments given."""


def screen_judge(lake: str) -> Any:
    """The evaluation's check of sampled responses on their records' screens, for this lake."""
    from evaluation.executable import ScreenJudge  # the data stack loads with a run, not the CLI

    return ScreenJudge(lake)


def progress(out: str, stage: str) -> Callable[[dict[str, Any]], None]:
    """What the run calls after each held-out evaluation: the curves redrawn, the progress artifacts."""
    return lambda _row: publish_training_progress(out, stage)


@task(name="train-sft", cache_policy=NO_CACHE)
def sft_task(
    lake: str, out: str, base: str | None, settings: TrainSettings, resume: bool, overwrite: bool = False
) -> dict[str, Any]:
    from trainer.run import run_sft  # torch loads when a run starts, not with the command line

    summary = run_sft(
        settings,
        lake,
        out,
        base=base,
        resume=resume,
        overwrite=overwrite,
        judge=screen_judge(lake),
        on_evaluation=progress(out, "sft"),
    )
    return asdict(summary)


@task(name="train-optd", cache_policy=NO_CACHE)
def optd_task(
    lake: str, out: str, base: str, settings: OPTDSettings, resume: bool, overwrite: bool = False
) -> dict[str, Any]:
    from trainer.optd_run import run_optd

    summary = run_optd(
        settings,
        lake,
        out,
        base,
        resume=resume,
        overwrite=overwrite,
        judge=screen_judge(lake),
        on_evaluation=progress(out, "optd"),
    )
    return asdict(summary)


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
    first, last = start or {}, end or {}
    if "parse_share" not in first | last:
        return "sampled held-out responses: none"
    return (
        f"sampled held-out responses: parse {_value(first.get('parse_share'))} -> "
        f"{_value(last.get('parse_share'))}, executable {_value(first.get('executable_share'))} -> "
        f"{_value(last.get('executable_share'))} ({last.get('judged', 0)} on a screen), the recorded action "
        f"{_value(first.get('recorded_action_share'))} -> {_value(last.get('recorded_action_share'))}; "
        f"rejected at the end: {_counts(last.get('rejected', {}))}; "
        f"without a screen: {_counts(last.get('no_screen', {}))}"
    )


PROBE_KEYS = ("teacher_probe_intent_gain", "probe_intent_gain", "probe_mean_lambda", "probe_binding_share",
              "probe_guidance_kl")  # fmt: skip


def held_out_markdown(s: dict[str, Any]) -> str:
    start, end = s.get("held_out_start") or {}, s.get("held_out_end") or {}
    lines = [
        f"held-out loss ({s['held_out_states']} states of {s['held_out_users']} held-out users): "
        f"{_value(start.get('held_out_loss'))} -> {_value(end.get('held_out_loss'))}",
        responses_markdown(start, end),
    ]
    probe = [f"{k} {_value(start.get(k))} -> {_value(end.get(k))}" for k in PROBE_KEYS if k in start | end]
    if probe:
        lines.append("probe states (intent-bearing, never drawn): " + "; ".join(probe))
    means = (s.get("stage_figures") or {}).get("updates_mean") or {}
    if means:
        lines.append("mean over updates: " + ", ".join(f"{k} {v:.4f}" for k, v in means.items()))
    return "\n\n".join(lines)


def summary_markdown(stage: str, s: dict[str, Any]) -> str:
    left_out = "\n".join(f"| {k} | {v:,} |" for k, v in s["left_out"].items()) or "| – | 0 |"
    seconds = s.get("seconds") or {}
    timing = ", ".join(f"{k.replace('_', '-')} {v:.1f}s" for k, v in seconds.items())
    return (
        f"# Train ({stage})\n\n"
        f"{s['steps']} updates ({s['skipped_steps']} skipped as non-finite) drawing from "
        f"{s['train_states']:,} states ({s['prepared_states']:,} prepared); {timing}\n\n"
        f"{held_out_markdown(s)}\n\n"
        f"| left out | records |\n|---|---:|\n{left_out}\n\n"
        f"checkpoint: `{s['checkpoint']}`, data hash `{s['data_hash'][:16]}`\n"
    )


@flow(name="train", persist_result=False)  # its tasks' results stay in memory
def train_flow(
    lake: str,
    out: str,
    stage: Stage = "sft",
    base: str | None = None,
    settings: TrainSettings | OPTDSettings | None = None,
    resume: bool = False,
    overwrite: bool = False,
) -> str:
    """Train ``stage`` on ``lake``'s records into ``out``; returns the final checkpoint folder.

    ``sft`` starts from ``base`` (a pretrained folder) or the tiny default; ``optd`` needs
    ``base``: the SFT checkpoint or run folder, frozen as the teacher and copied as the student's
    start. ``settings``: ``TrainSettings`` for sft, ``OPTDSettings`` for optd. An ``out`` holding
    another run is refused unless ``resume`` continues it or ``overwrite`` replaces it.
    """
    if stage == "sft":
        summary = sft_task(lake, out, base, settings or TrainSettings(), resume, overwrite)
    elif base is None:
        raise StageNotAvailable("--stage optd needs --base: the SFT checkpoint (teacher and student start)")
    else:
        chosen = (
            settings
            if isinstance(settings, OPTDSettings)
            else optd_settings(settings.model_dump() if settings else None)
        )
        summary = optd_task(lake, out, base, chosen, resume, overwrite)
    get_run_logger().info("%s", held_out_markdown(summary))
    record_run(stage, summary)
    return summary["checkpoint"]


def train_alongside(
    stage: Stage,
    lake: Path,
    out: Path,
    base: Path | None,
    settings: TrainSettings,
    resume: bool,
    overwrite: bool,
) -> None:
    """A rank other than 0's part of the run: the stage's training itself, outside Prefect."""
    paths = str(lake.resolve()), str(out.resolve())
    if stage == "sft":
        sft_task.fn(*paths, str(base.resolve()) if base else None, settings, resume, overwrite)
    elif base is not None:  # without it rank 0 stops the run with the reason
        optd_task.fn(*paths, str(base.resolve()), settings, resume, overwrite)
