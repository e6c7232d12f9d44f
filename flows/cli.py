"""``trajforge``: the command line of the pipeline."""

from __future__ import annotations

import json
import logging
import sys
import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from flows.interrupt import InterruptibleGroup
from flows.options import DEFAULT_LAKE, LakeOption
from flows.preflight import (
    InputError,
    check_lake,
    check_new_lake,
    check_sessions,
    check_writable_file,
    check_writable_folder,
)
from flows.settings import load_settings, toml_section
from flows.summary import print_ingest_summary, progress_bar
from transforms.config import IngestSettings

#: errors that stop a command cleanly: one line, exit code 1 (a ValueError is a bad value given, a
#: missing file a path given); any other error keeps its traceback, for it is a bug to report
STOPS: tuple[type[BaseException], ...] = (ValueError, FileNotFoundError, NotADirectoryError,
                                          IsADirectoryError, PermissionError, FileExistsError)  # fmt: skip
#: the stage errors that stop cleanly too, by module: looked up only once their module is imported
STOPS_BY_MODULE = {
    "transforms.readers": "BundleError",
    "validation.report": "GateError",
    "flows.train": "StageNotAvailable",
    "trainer.pretrained": "ModelUnavailable",
}
USAGE_EXIT_CODE = 2  # click's, for a command line it cannot parse
#: what typer raises for a command line it cannot parse (its own click, whose module is not public)
UsageError = next(kind for kind in typer.BadParameter.__mro__ if kind.__name__ == "UsageError")


def clean_stops() -> tuple[type[BaseException], ...]:
    """``STOPS`` and those of ``STOPS_BY_MODULE`` already imported (an error of a module never
    imported cannot have been raised)."""
    loaded = (getattr(sys.modules[m], name, None) for m, name in STOPS_BY_MODULE.items() if m in sys.modules)
    return STOPS + tuple(kind for kind in loaded if isinstance(kind, type))


def one_line(err: BaseException) -> str:
    """An error's message as one line (a pydantic error: each refused field with its reason)."""
    from pydantic import ValidationError

    from flows.settings import validation_line

    text = validation_line(err) if isinstance(err, ValidationError) else str(err)
    if isinstance(err, OSError) and err.filename is not None and err.strerror:
        text = f"{err.filename}: {err.strerror}"
    return " ".join(part.strip() for part in text.splitlines() if part.strip()) or type(err).__name__


class QuietCleanStops(logging.Filter):
    """Prefect's run loggers print the traceback of a failed task or flow; for a clean stop the
    command prints its own line, so the record keeps its message and loses the traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], clean_stops()):
            record.exc_info, record.exc_text = None, None
        return True


def quiet_clean_stops() -> None:
    """Install ``QuietCleanStops`` on Prefect's flow- and task-run loggers (idempotent)."""
    for name in ("prefect.flow_runs", "prefect.task_runs"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, QuietCleanStops) for f in logger.filters):
            logger.addFilter(QuietCleanStops())


class CommandLine(InterruptibleGroup):
    """The command group: beside Ctrl-C's line, a usage error is one line (exit code 2) and a clean
    stop (a bad input, a stage's refusal) one line (exit code 1), never a traceback."""

    errors = Console(stderr=True, soft_wrap=True, highlight=False, emoji=False)  # a spec like "a:x:" is text

    def resolve_command(self, ctx: typer.Context, args: list[str]) -> tuple[str | None, Any, list[str]]:
        resolved = super().resolve_command(ctx, args)
        quiet_clean_stops()  # after Prefect is imported: its logging setup comes first
        return resolved

    def invoke(self, ctx: typer.Context) -> Any:
        try:
            return super().invoke(ctx)
        except UsageError as err:
            command = (err.ctx or ctx).command_path
            # typer's coercion prefixes its reason with "Value error, "
            reason = " ".join(err.format_message().replace("Value error, ", "").split())
            self.errors.print(f"[red]error:[/red] {escape(reason)} (see {escape(command)} --help)")
            raise typer.Exit(USAGE_EXIT_CODE) from None
        except clean_stops() as err:
            raise stopped(err) from None


app = typer.Typer(
    cls=CommandLine,
    help="Build faithful shopper-simulator datasets from interaction logs.",
    no_args_is_help=True,
)
console = Console()


def print_version(asked: bool) -> None:
    if asked:
        from importlib.metadata import version

        typer.echo(f"trajforge {version('trajforge')}")
        raise typer.Exit()


@app.callback()
def main(
    show_version: Annotated[
        bool,
        typer.Option("--version", callback=print_version, is_eager=True, help="print the version and exit"),
    ] = False,
) -> None:
    """Build faithful shopper-simulator datasets from interaction logs."""


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
RecordsConfig = Annotated[Path | None, config_option("records")]
RunConfig = Annotated[Path | None, config_option("ingest", "records", "extract", "train", "optd", "main_job")]


def stopped(err: BaseException) -> typer.Exit:
    """Print a clean stop (a bad input, a gate, a bundle problem) as one line on stderr, no traceback."""
    CommandLine.errors.print(f"[red]stopped:[/red] {escape(one_line(err))}")
    return typer.Exit(1)


class BundleFormat(StrEnum):
    """The file format of a synthetic bundle's tables (``synth --file-format``)."""

    parquet = "parquet"
    jsonl = "jsonl"
    jsonl_gz = "jsonl.gz"
    csv = "csv"


class SourceFormat(StrEnum):
    """What ``ingest`` reads (``--source-format``)."""

    bundle = "bundle"
    userarena = "userarena"


class Mode(StrEnum):
    """The records' history mode (``records --mode``)."""

    single = "single"
    cross = "cross"
    both = "both"


@app.command()
def synth(
    out: Annotated[Path, typer.Option("--out", help="folder for the raw log bundle")] = Path("sample/raw"),
    users: Annotated[int, typer.Option("--users", min=1, help="number of shoppers")] = 300,
    seed: Annotated[int, typer.Option("--seed")] = 7,
    fmt: Annotated[
        BundleFormat, typer.Option("--file-format", help="tables' file format")
    ] = BundleFormat.parquet,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="replace what --out holds (refused otherwise)")
    ] = False,
) -> None:
    """Generate a raw log bundle from the synthetic shopping world."""
    from synthetic.bundle import write_bundle

    fmt = BundleFormat(fmt).value  # type: ignore[assignment]  # `run` calls this with a plain name
    if out.exists() and not out.is_dir():
        raise stopped(ValueError(f"--out {out} is a file, not a folder"))
    check_writable_folder(out.parent)  # the bundle is written beside it, then renamed into place
    started = time.perf_counter()
    with progress_bar(console) as bar:
        bar.add_task(f"synthesising {users} shoppers (seed {seed})", total=None)
        summary = write_bundle(out, users=users, seed=seed, fmt=fmt, overwrite=overwrite)
    print_bundle(out, summary)
    console.print(f"wrote {out} in {time.perf_counter() - started:.1f}s")


def print_bundle(out: Path, summary: dict) -> None:
    table = Table(title=f"raw bundle {out}")
    table.add_column("table")
    table.add_column("rows", justify="right")
    for name, rows in summary.get("counts", {}).items():
        table.add_row(name, f"{rows:,}")
    console.print(table)


@app.command()
def ingest(
    raw: Annotated[Path, typer.Argument(help="raw log bundle folder, or UserArena JSONL", exists=True)],
    lake: LakeOption = DEFAULT_LAKE,
    config: IngestConfig = None,
    buckets: Annotated[int | None, typer.Option("--buckets", help="user-hash partitions")] = None,
    force: Annotated[bool, typer.Option("--force", help="re-run even if the bundle is unchanged")] = False,
    source_format: Annotated[
        SourceFormat,
        typer.Option("--source-format", help="bundle (raw log bundle folder) | userarena (release JSONL)"),
    ] = SourceFormat.bundle,
) -> None:
    """Raw log bundle (or UserArena release) -> step-aligned lake tables, quarantine, DuckDB catalog."""
    from flows.ingest import ingest_flow

    settings = load_settings(IngestSettings, "ingest", config, buckets=buckets)
    check_new_lake(lake)
    with progress_bar(console) as bar:
        bar.add_task(f"ingesting {raw}", total=None)
        summary = ingest_flow(
            str(raw.resolve()),
            str(lake.resolve()),
            settings=settings,
            force=force,
            source_format=SourceFormat(source_format).value,
        )
    print_ingest_summary(console, summary)


@app.command()
def chain(lake: LakeOption = DEFAULT_LAKE) -> None:
    """Sessions -> per-user histories, with chain statistics beside the UserArena paper's."""
    from flows.chain import chain_command

    chain_command(str(check_lake(lake, ["sessions"])))


@app.command()
def records(
    lake: LakeOption = DEFAULT_LAKE,
    config: RecordsConfig = None,
    mode: Annotated[Mode, typer.Option("--mode", help="history: the session's, across sessions")] = Mode.both,
    window_single: Annotated[
        int | None, typer.Option("--window-single", help="past steps shown, single mode (10)")
    ] = None,
    window_cross: Annotated[
        int | None, typer.Option("--window-cross", help="past steps shown, cross mode (20)")
    ] = None,
    recent_clicks: Annotated[int | None, typer.Option("--recent-clicks", help="(20)")] = None,
    recent_buys: Annotated[int | None, typer.Option("--recent-buys", help="(20)")] = None,
    chunk_states: Annotated[int, typer.Option("--chunk-states", help="states rendered per batch")] = 100_000,
    export_jsonl: Annotated[
        Path | None,
        typer.Option("--export-jsonl", help="chat-format JSONL of the states with a gold response"),
    ] = None,
    export_split: Annotated[
        str, typer.Option("--export-split", help="train | val | test | a,b | all")
    ] = "train",
) -> None:
    """Rendered training/evaluation states (the prompt the simulator sees); optional JSONL export."""
    from flows.records import records_command
    from transforms.prompts import PromptSettings

    settings = load_settings(
        PromptSettings,
        "records",
        config,
        window_single=window_single,
        window_cross=window_cross,
        recent_clicks=recent_clicks,
        recent_buys=recent_buys,
    )
    check_export_split(export_split)
    check_lake(lake, ["steps", "sessions", "items"])
    if export_jsonl is not None:
        check_writable_file(export_jsonl, "--export-jsonl")
    records_command(
        str(lake),
        Mode(mode).value,
        settings,
        chunk_states,
        str(export_jsonl) if export_jsonl else None,
        export_split,
    )


def check_export_split(value: str) -> None:
    """``--export-split``: a split, a comma list of them, or ``all`` (a usage error otherwise)."""
    splits = [part.strip() for part in value.split(",") if part.strip()]
    unknown = [part for part in splits if part not in {split.value for split in Split}]
    if value != "all" and (unknown or not splits):
        shown = ", ".join(repr(part) for part in unknown) or repr(value)
        choices = ", ".join(f"'{split.value}'" for split in Split)
        raise typer.BadParameter(f"{shown}: give one of {choices}, a comma list of them, or 'all'",
                                 param_hint="'--export-split'")  # fmt: skip


def _register_extract() -> None:
    from flows.extract import extract_command

    app.command(name="extract")(extract_command)


_register_extract()


def _register_train() -> None:
    from flows.train import train_command

    app.command(name="train")(train_command)


_register_train()


@app.command()
def validate(
    lake: LakeOption = DEFAULT_LAKE,
    table: Annotated[str | None, typer.Argument(help="one table (default: every table with a suite)")] = None,
) -> None:
    """Validate lake tables against their Great Expectations suites; Data Docs per run."""
    from flows.validate import validate_command

    validate_command(str(check_lake(lake)), table)


class SqlFormat(StrEnum):
    table = "table"
    csv = "csv"
    json = "json"


@app.command()
def sql(
    query: Annotated[str, typer.Argument(help="read-only SQL over the lake views")],
    lake: LakeOption = DEFAULT_LAKE,
    limit: Annotated[int, typer.Option("--limit", help="rows printed as a table (csv and json: all)")] = 50,
    output: Annotated[
        SqlFormat, typer.Option("--format", help="csv and json: every row; in csv lists and structs are JSON")
    ] = SqlFormat.table,
) -> None:
    """Run read-only SQL against LAKE/warehouse.duckdb and print the result, every value in full."""
    import duckdb

    from flows.summary import frame_as_csv, frame_as_json, print_frame
    from transforms.catalog import query as run_query

    check_lake(lake)
    try:
        frame = run_query(lake, query)
    except (duckdb.Error, FileNotFoundError) as exc:
        console.print(f"[red]query failed:[/red] {exc}")
        raise typer.Exit(1) from exc
    if output is SqlFormat.table:
        print_frame(console, frame, limit)
    else:
        typer.echo(frame_as_csv(frame) if output is SqlFormat.csv else frame_as_json(frame), nl=False)


@app.command()
def run(
    workdir: Annotated[Path, typer.Option("--workdir", help="where raw/ and lake/ are written")] = Path(
        "sample"
    ),
    users: Annotated[int, typer.Option("--users", min=1)] = 300,
    seed: Annotated[int, typer.Option("--seed")] = 7,
    config: RunConfig = None,
) -> None:
    """The main job on the embedded default: synthetic logs -> the end-to-end pipeline flow (ingest,
    chain, records, offline extraction, every stage validated) -> SFT, then OPTD -> the checkpoint's
    evaluation report against the world, markov and random."""
    from extractors.config import ExtractSettings
    from flows.chain import print_chain_summary
    from flows.extract import print_summary as print_extract_summary
    from flows.main_job import MainJobSettings, demo_optd, demo_records, demo_training, main_job_flow
    from flows.records import print_records_summary
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
    check_writable_folder(workdir, "--workdir")
    raw, lake = workdir / "raw", workdir / "lake"
    try:
        with progress_bar(console) as bar:
            bar.add_task("main job: logs -> pipeline (gated) -> train sft -> optd -> evaluate", total=None)
            result = main_job_flow(str(workdir.resolve()), users=users, seed=seed, **stages)
    except (BundleError, GateError, ValueError) as err:
        raise stopped(err) from None
    print_bundle(raw, result["synthesise"])
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


def print_stage_times(console: Console, stages: dict[str, dict]) -> None:
    """Each stage's seconds, and those Prefect's cache served because nothing they read changed."""
    table = Table(title="the main job's stages")
    for column in ("stage", "seconds", "from the cache"):
        table.add_column(column, justify="left" if column == "stage" else "right")
    for name, timing in stages.items():
        table.add_row(name, f"{timing['seconds']:.1f}", "✓" if timing["reused"] else "")
    console.print(table)
    reused = [name for name, timing in stages.items() if timing["reused"]]
    if reused:
        console.print(f"unchanged since the last run, served from Prefect's cache: {', '.join(reused)}")


def print_checkpoint_figures(console: Console, workdir: Path, report: dict, checkpoint: str) -> None:
    """The trained checkpoint beside ``random``: its held-out responses, its rollouts' OVA, and the
    paper's eight figures, each marked where the checkpoint does better."""
    from evaluation.report import PAPER_METRICS, better_than

    summary = json.loads((workdir / "train" / "optd" / "summary.json").read_text())
    end = summary.get("held_out_end") or {}
    shares = (end.get("parse_share"), end.get("executable_share"), end.get("recorded_action_share"))
    console.print(
        f"[bold]checkpoint's held-out responses[/bold] ({end.get('sampled', 0)} sampled, "
        f"{summary['held_out_users']} held-out users): parse {fmt(shares[0])}, executable {fmt(shares[1])}, "
        f"the shopper's own action {fmt(shares[2])}"
    )
    ours = report["simulators"][f"checkpoint:{checkpoint}"]
    chance = report["simulators"].get("random") or {}
    verdicts = better_than(ours, chance) if chance else {}
    table = Table(title="the checkpoint beside random (Table 2)")
    for column in ("figure", "checkpoint", "random", "better"):
        table.add_column(column, justify="left" if column == "figure" else "right")
    table.add_row("OVA ↑", fmt(ours.get("OVA")), fmt(chance.get("OVA")), "")
    for metric, direction in PAPER_METRICS:
        mark = {True: "✓", False: "", None: "n/a"}[verdicts.get(metric)]
        table.add_row(f"{metric} {direction}", fmt(ours.get(metric)), fmt(chance.get(metric)), mark)
    console.print(table)
    if chance:
        wins = sum(bool(v) for v in verdicts.values())
        console.print(f"the checkpoint beats random on {wins} of {len(PAPER_METRICS)} figures")


def fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


@app.command()
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
    from flows.score import score_command

    if real.is_dir():
        check_lake(real, ["steps", "items"], "--real")
        check_sessions(real, Split(split).value)
    score_command(real, sim, replay, Split(split).value, strict=not lenient)


@app.command()
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


@app.command()
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


@app.command()
def serve(
    raw: Annotated[Path, typer.Option("--raw", help="raw log bundle the nightly run ingests")],
    lake: LakeOption = DEFAULT_LAKE,
    cron: Annotated[str, typer.Option("--cron", help="schedule of the nightly run (UTC)")] = "0 2 * * *",
) -> None:
    """Serve the pipeline's deployments (nightly run + on-demand validation) from this process."""
    from prefect.client.schemas.schedules import CronSchedule
    from pydantic import ValidationError

    if not raw.is_dir():
        raise InputError(f"--raw {raw} is not a folder: the nightly run ingests the raw log bundle in it")
    check_writable_folder(lake, "--lake")
    try:
        CronSchedule(cron=cron)
    except ValidationError:
        raise InputError(f"--cron {cron!r} is not a cron schedule (five fields, e.g. '0 2 * * *')") from None
    from flows.deployments import serve_deployments

    serve_deployments(str(raw.resolve()), str(lake.resolve()), cron)


if __name__ == "__main__":
    app()
