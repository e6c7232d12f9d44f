"""The simulator's commands: train it, score traces, evaluate simulators, A/B-test ranking policies in
them, and ``run``, the main job from synthetic logs to the trained checkpoint's evaluation."""

from __future__ import annotations

import json
import os
import sys
import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from cli.console import (
    console,
    print_bundle,
    print_chain_summary,
    print_checkpoint_figures,
    print_extract_summary,
    print_ingest_summary,
    print_records_summary,
    print_stage_times,
    progress_bar,
)
from cli.options import DEFAULT_LAKE, LakeOption, RayAddressOption, RunConfig, Split, TaskRunnerOption
from cli.settings import load_scale, load_settings, toml_section
from cli.stops import stopped
from flows.preflight import check_lake, check_model_folder, check_sessions, check_writable_folder
from transforms.config import IngestSettings


class StageName(StrEnum):
    """``--stage`` as a choice the shell completes and click checks."""

    sft = "sft"
    optd = "optd"


def train(
    stage: Annotated[StageName, typer.Option("--stage", help="sft: SFT warm-up | optd: distillation")],
    out: Annotated[Path, typer.Option("--out", help="run folder: checkpoints, metrics.jsonl, summary.json")],
    lake: Annotated[Path, typer.Option("--lake", help="lake folder with the records table")] = DEFAULT_LAKE,
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
        typer.Option(
            "--config",
            help="TOML file with \\[train] settings (optd: \\[optd] on top of them)",
            exists=True,
            dir_okay=False,
        ),
    ] = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="continue from the newest checkpoint in --out")
    ] = False,
    overwrite: Annotated[
        bool,
        typer.Option(
            "--overwrite",
            help="replace the run in --out: its checkpoints, trainer_state, metrics, curves and summary "
            "are removed first",
        ),
    ] = False,
) -> None:
    """Train the simulator on the lake's records: SFT warm-up (sft) or on-policy distillation (optd)."""
    from flows.train import StageNotAvailable, summary_markdown, train_alongside, train_flow
    from trainer.config import TrainSettings, optd_settings
    from trainer.distributed import shutdown
    from trainer.run_folder import check_run_folder

    stage = StageName(stage).value  # type: ignore[assignment]
    if stage == "sft":
        settings: TrainSettings = load_settings(TrainSettings, "train", config)
    else:
        settings = optd_settings(toml_section(config, "train"), toml_section(config, "optd"))
    if int(os.environ.get("RANK", "0")) > 0:
        # under torchrun rank 0 runs the flow (logs, artifact, summary); the others train beside it, quietly
        try:
            train_alongside(stage, lake, out, base, settings, resume, overwrite)  # type: ignore[arg-type]
        except (FileNotFoundError, ValueError):
            raise typer.Exit(1) from None  # rank 0 meets the same error and says it
        shutdown()
        return
    started = time.perf_counter()
    try:
        if getattr(settings, "generator", "hf") == "vllm":  # a missing engine first: no path can fix it
            from trainer.generation import require_generator

            require_generator("vllm")
        check_lake(lake, ["records"])  # these before Prefect and torch start: said in a second
        if base is not None:
            check_model_folder(base)
        elif stage == "optd":
            raise StageNotAvailable("--stage optd needs --base: the SFT checkpoint (teacher, student start)")
        check_run_folder(out, resume, overwrite)
        checkpoint = train_flow(
            str(lake.resolve()),
            str(out.resolve()),
            stage=stage,  # type: ignore[arg-type]
            base=str(base.resolve()) if base else None,
            settings=settings,
            resume=resume,
            overwrite=overwrite,
        )
        shutdown()  # under torchrun: with the other ranks, once the run's model is gone
    except (StageNotAvailable, FileNotFoundError, ValueError) as err:
        console.print(f"[red]stopped:[/red] {escape(str(err))}", soft_wrap=True)
        raise typer.Exit(1) from None
    summary = json.loads((out / "summary.json").read_text())
    console.print(summary_markdown(stage, summary), soft_wrap=True)
    console.print(f"trained in {time.perf_counter() - started:.1f}s; checkpoint: {checkpoint}")


def score(
    real: Annotated[
        Path,
        typer.Option("--real", help="real traces (JSONL, ours or reference), or a lake folder", exists=True),
    ],
    sim: Annotated[Path, typer.Option("--sim", help="simulated rollout traces (JSONL)", exists=True)],
    replay: Annotated[
        Path | None, typer.Option("--replay", help="replay predictions (JSONL): RVA, F1, Acc", exists=True)
    ] = None,
    split: Annotated[Split, typer.Option("--split", help="sessions of a lake --real")] = Split.test,
    lenient: Annotated[
        bool,
        typer.Option(
            "--lenient", help="read past keys a trace format does not declare, counting those dropped"
        ),
    ] = False,
) -> None:
    """Score simulated traces against real ones: RVA, OVA, F1, Acc, DM-JSD, TE, PF, dCTR, dACR, T-JSD
    and the supplementary figures, printed as one JSON object. A key that a trace format does not
    declare (a misspelt one would read as missing) stops it, naming the line, unless --lenient."""
    from evaluation.trace_frames import named_counts
    from flows.score import score_files

    if real.is_dir():
        check_lake(real, ["steps", "items"], "--real")
        check_sessions(real, Split(split).value)
    figures = score_files(real, sim, replay, Split(split).value, strict=not lenient)
    # stdout holds the JSON object alone, to be piped; what a lenient read dropped goes to stderr
    for side, keys in figures["counts"].get("dropped_keys", {}).items():
        if keys:
            print(f"lenient: {side} traces: dropped unknown keys {named_counts(keys)}", file=sys.stderr)
    print(json.dumps(figures, indent=2))


def evaluate(
    simulator: Annotated[
        list[str],
        typer.Option(
            "--simulator",
            help="simulator spec, repeatable: world, markov, random[:SEED], checkpoint:PATH, "
            "openai:MODEL@BASE_URL",
        ),
    ],
    out: Annotated[Path, typer.Option("--out", help="folder for the traces, report.json and report.html")],
    lake: LakeOption = DEFAULT_LAKE,
    split: Annotated[Split, typer.Option("--split", help="sessions evaluated")] = Split.test,
    sessions: Annotated[
        int | None, typer.Option("--sessions", min=1, help="evaluate only the first N sessions")
    ] = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", min=1, help="language models")] = 512,
    temperature: Annotated[float, typer.Option("--temperature", min=0.0)] = 1.0,
    top_p: Annotated[float, typer.Option("--top-p", min=0.0, max=1.0)] = 0.95,
    seed: Annotated[int, typer.Option("--seed")] = 42,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="sessions stepped together")] = 64,
    effect: Annotated[
        bool, typer.Option("--effect/--no-effect", help="A/B effect fidelity (lakes generated from a world)")
    ] = True,
    effect_users: Annotated[
        int | None, typer.Option("--effect-users", min=2, help="held-out users in the A/B test (all)")
    ] = None,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume", help="continue the evaluation in --out with these settings (its traces kept)"
        ),
    ] = False,
    overwrite: Annotated[
        bool,
        typer.Option("--overwrite", help="replace the evaluation in --out (its traces and reports removed)"),
    ] = False,
    max_unanswered: Annotated[
        float,
        typer.Option(
            "--max-unanswered",
            min=0.0,
            max=1.0,
            help="share of a phase's requests left unanswered after retries that stops the run",
        ),
    ] = 0.2,
) -> None:
    """Roll out and replay each simulator on the lake's sessions, score them against the real ones, and
    write report.json and report.html. Run again as it was, a killed run resumes from its traces; an
    --out holding another evaluation is refused unless told --resume or --overwrite."""
    from flows.evaluate_folder import check_evaluation_folder, run_settings, start_evaluation

    split = Split(split).value  # type: ignore[assignment]
    check_lake(lake, ["steps", "sessions", "feed_layouts", "items"])
    check_sessions(lake, split)
    sampling = {"max_new_tokens": max_new_tokens, "temperature": temperature, "top_p": top_p, "seed": seed}
    asked = run_settings(lake, simulator, split=split, sessions=sessions, sampling=sampling,
                         batch_size=batch_size, effect=effect, effect_users=effect_users)  # fmt: skip
    from evaluation.simulators import Sampling
    from flows.evaluate import check_flow_specs, evaluate_flow  # the data stack loads with a run

    # a spec that cannot work (an endpoint that does not answer, a folder without weights) is said
    # before anything is written, --out included
    check_flow_specs(simulator, lake, Sampling(**sampling))
    check_evaluation_folder(out, asked, resume, overwrite)
    start_evaluation(out, asked, overwrite)
    result = evaluate_flow(str(lake.resolve()), simulator, str(out.resolve()), split, sessions,
                           sampling, batch_size, effect, effect_users, max_unanswered)  # fmt: skip
    console.print(f"[bold]report:[/bold] {result['html']}", soft_wrap=True)
    console.print(f"[bold]figures:[/bold] {result['json']}", soft_wrap=True)


def abtest(
    policy_a: Annotated[
        str,
        typer.Option(
            "--policy-a",
            help="popularity | personalised | random | mix:W:A:B | module:object "
            "(on a world's lake also baseline | treatment)",
        ),
    ],
    policy_b: Annotated[str, typer.Option("--policy-b", help="the other arm's policy, named as --policy-a")],
    simulator: Annotated[
        str,
        typer.Option("--simulator", help="world, markov, random[:SEED], checkpoint:PATH, openai:MODEL@URL"),
    ],
    out: Annotated[
        Path, typer.Option("--out", help="folder for counts.parquet, report.json and report.html")
    ],
    lake: LakeOption = DEFAULT_LAKE,
    users: Annotated[int | None, typer.Option("--users", min=2, help="first N held-out users (all)")] = None,
    split: Annotated[str, typer.Option("--split", help="the held-out split")] = "test",
    seed: Annotated[int, typer.Option("--seed", help="the split into arms, the policies' noise")] = 0,
) -> None:
    """Two ranking policies on the lake's held-out users split in halves, the simulator shopping in the
    feeds each serves: per-arm PV-CTR, ACR, CVR, session length, and the Δ with 95 % intervals."""
    from evaluation.policies import policy_from_spec
    from flows.abtest import WORLD_POLICY_NAMES, abtest_flow

    check_lake(lake, ["steps", "sessions", "feed_layouts", "items"])
    # the names are checked before any work; the world's own policies are built inside the flow, from its
    # world, so here any stand-in under their names will do
    world_names = {name: (lambda seed: lambda context, candidates: candidates) for name in WORLD_POLICY_NAMES}
    for spec in (policy_a, policy_b):
        policy_from_spec(spec, seed, world_names)

    result = abtest_flow(str(lake.resolve()), policy_a, policy_b, simulator, str(out.resolve()),
                         users, split, seed)  # fmt: skip
    console.print(f"[bold]report:[/bold] {result['html']}", soft_wrap=True)
    console.print(f"[bold]figures:[/bold] {result['json']}", soft_wrap=True)


def run(
    workdir: Annotated[Path, typer.Option("--workdir", help="where raw/ and lake/ are written")] = Path(
        "sample"
    ),
    users: Annotated[int, typer.Option("--users", min=1)] = 300,
    seed: Annotated[int, typer.Option("--seed")] = 7,
    config: RunConfig = None,
    task_runner: TaskRunnerOption = None,
    ray_address: RayAddressOption = None,
) -> None:
    """The main job on the embedded default: synthetic logs -> the end-to-end pipeline flow (ingest,
    chain, records, offline extraction, every stage validated) -> SFT, then OPTD -> the checkpoint's
    evaluation report against the world, markov and random."""
    from extractors.config import ExtractSettings
    from flows.buckets import using_scale
    from flows.main_job import MainJobSettings, demo_optd, demo_records, demo_training, main_job_flow
    from transforms.readers import BundleError
    from validation.report import GateError

    started = time.perf_counter()
    stages = {
        "settings": load_settings(IngestSettings, "ingest", config),
        "records": demo_records(toml_section(config, "records")),
        "extract": load_settings(ExtractSettings, "extract", config),
        "train": demo_training(toml_section(config, "train")),
        "optd": demo_optd(toml_section(config, "train"), toml_section(config, "optd")),
        "job": load_settings(MainJobSettings, "main_job", config),
    }
    scale = load_scale(config, task_runner, ray_address)
    check_writable_folder(workdir, "--workdir")
    raw, lake = workdir / "raw", workdir / "lake"
    try:
        with using_scale(scale), progress_bar(console) as bar:
            bar.add_task("main job: logs -> pipeline (gated) -> train sft -> optd -> evaluate", total=None)
            result = main_job_flow(str(workdir.resolve()), users=users, seed=seed, **stages)
    except (BundleError, GateError, ValueError) as err:
        raise stopped(err) from None
    print_bundle(console, raw, result["synthesise"])
    print_ingest_summary(console, result["ingest"])
    print_chain_summary(console, result["chain"])
    print_extract_summary(console, result["extract"])
    print_records_summary(console, result["records"])
    catalog = (lake / "warehouse.duckdb").resolve()
    console.print(f"\n[bold]lake:[/bold] {lake.resolve()}   [bold]catalog:[/bold] {catalog}", soft_wrap=True)
    console.print(f'try: trajforge sql --lake {lake} "SELECT * FROM action_mix()"')
    console.print(f"[bold]SFT teacher:[/bold] {result['teacher']}")
    console.print(f"[bold]checkpoint (OPTD):[/bold] {result['checkpoint']}")
    evaluation = result["evaluation"]
    # paths on lines of their own, never wrapped: a terminal narrower than a path must not break it
    console.print(f"[bold]evaluation report:[/bold] {evaluation['html']}", soft_wrap=True)
    console.print(f"[bold]figures:[/bold] {evaluation['json']}", soft_wrap=True)
    print_checkpoint_figures(console, workdir, evaluation["report"], result["checkpoint"])
    print_stage_times(console, result["stages"])
    console.print(f"main job finished in {time.perf_counter() - started:.1f}s")
