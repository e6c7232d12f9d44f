"""The dataset's commands: synthetic logs, ingest, chain, records, extract, validate, SQL over the lake,
and serving the pipeline's deployments."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from cli.console import (
    console,
    frame_as_csv,
    frame_as_json,
    print_bundle,
    print_chain_summary,
    print_extract_summary,
    print_frame,
    print_ingest_summary,
    print_records_summary,
    print_validation_summary,
    progress_bar,
)
from cli.options import (
    DEFAULT_LAKE,
    ExtractConfig,
    IngestConfig,
    LakeLocationOption,
    LakeOption,
    RayAddressOption,
    RecordsConfig,
    ScaleConfig,
    Split,
    TaskRunnerOption,
)
from cli.settings import load_scale, load_settings
from cli.stops import stopped
from flows.object_store import is_store_uri, worked_on_locally
from flows.preflight import InputError, check_lake, check_new_lake, check_writable_file, check_writable_folder
from transforms.config import IngestSettings


@contextmanager
def lake_here(lake: str, write: bool = True) -> Iterator[Path]:
    """``--lake`` as a local folder for the command: an object store's lake is its working copy, pulled
    before and (``write``) pushed after; the refusals of the checks inside name the URI, not the copy."""
    with worked_on_locally(lake, write=write) as here:
        try:
            yield here
        except InputError as err:
            if not is_store_uri(lake):
                raise
            raise InputError(str(err).replace(str(here.resolve()), lake).replace(str(here), lake)) from None


class BundleFormat(StrEnum):
    """The file format of a synthetic bundle's tables (``synth --file-format``)."""

    parquet = "parquet"
    jsonl = "jsonl"
    jsonl_gz = "jsonl.gz"
    csv = "csv"


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

    fmt = BundleFormat(fmt).value  # type: ignore[assignment]  # a direct call may pass a plain name
    if out.exists() and not out.is_dir():
        raise stopped(ValueError(f"--out {out} is a file, not a folder"))
    check_writable_folder(out.parent)  # the bundle is written beside it, then renamed into place
    started = time.perf_counter()
    with progress_bar(console) as bar:
        bar.add_task(f"synthesising {users} shoppers (seed {seed})", total=None)
        summary = write_bundle(out, users=users, seed=seed, fmt=fmt, overwrite=overwrite)
    print_bundle(console, out, summary)
    console.print(f"wrote {out} in {time.perf_counter() - started:.1f}s")


class SourceFormat(StrEnum):
    """What ``ingest`` reads (``--source-format``)."""

    bundle = "bundle"
    userarena = "userarena"


def ingest(
    raw: Annotated[str, typer.Argument(help="raw log bundle folder (or s3://...), or UserArena JSONL")],
    lake: LakeLocationOption = str(DEFAULT_LAKE),
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
    if not is_store_uri(raw) and not Path(raw).exists():
        raise typer.BadParameter(f"Path '{raw}' does not exist.", param_hint="'RAW'")
    with worked_on_locally(raw, write=False) as raw_here, lake_here(lake) as here:
        check_new_lake(here)
        with progress_bar(console) as bar:
            bar.add_task(f"ingesting {raw}", total=None)
            summary = ingest_flow(
                str(raw_here.resolve()),
                str(here.resolve()),
                settings=settings,
                force=force,
                source_format=SourceFormat(source_format).value,
            )
    print_ingest_summary(console, summary)


def chain(
    lake: LakeLocationOption = str(DEFAULT_LAKE),
    config: ScaleConfig = None,
    task_runner: TaskRunnerOption = None,
    ray_address: RayAddressOption = None,
) -> None:
    """Sessions -> per-user histories, with chain statistics beside the UserArena paper's."""
    from flows.buckets import using_scale
    from flows.chain import chain_flow

    scale = load_scale(config, task_runner, ray_address)
    with lake_here(lake) as here, using_scale(scale):
        result = chain_flow(str(check_lake(here, ["sessions"]).resolve()))
    print_chain_summary(console, result)


class Mode(StrEnum):
    """The records' history mode (``records --mode``)."""

    single = "single"
    cross = "cross"
    both = "both"


def records(
    lake: LakeLocationOption = str(DEFAULT_LAKE),
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
    export_tokenizer: Annotated[
        Path | None,
        typer.Option(
            "--export-tokenizer", help="a local model folder: count the export's tokens with its tokenizer"
        ),
    ] = None,
    task_runner: TaskRunnerOption = None,
    ray_address: RayAddressOption = None,
) -> None:
    """Rendered training/evaluation states (the prompt the simulator sees); optional JSONL export."""
    from flows.buckets import using_scale
    from flows.records import records_flow
    from transforms.prompts import PromptSettings
    from transforms.records import MODES, ExportSummary, NothingToTrainOn

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
    if export_jsonl is not None:
        check_writable_file(export_jsonl, "--export-jsonl")
    if export_tokenizer is not None and not (export_tokenizer / "tokenizer_config.json").is_file():
        raise typer.BadParameter(
            f"{export_tokenizer} holds no tokenizer_config.json", param_hint="'--export-tokenizer'"
        )
    scale = load_scale(config, task_runner, ray_address)
    with lake_here(lake) as here, using_scale(scale):
        check_lake(here, ["steps", "sessions", "items"])
        result = records_flow(
            str(here.resolve()),
            modes=list(MODES) if Mode(mode) is Mode.both else [Mode(mode).value],
            settings=settings,
            chunk_states=chunk_states,
            export_jsonl=str(export_jsonl.resolve()) if export_jsonl else None,
            export_splits=export_splits(export_split),
            export_tokenizer=str(export_tokenizer.resolve()) if export_tokenizer else None,
        )
    print_records_summary(console, result)
    # the flow records the run before the export's refusal is said: a clean stop, exit code 1
    if "nothing_to_train_on" in result.get("export", {}):
        exported = result["export"]
        raise NothingToTrainOn(exported["nothing_to_train_on"], ExportSummary.model_validate(exported))


def check_export_split(value: str) -> None:
    """``--export-split``: a split, a comma list of them, or ``all`` (a usage error otherwise)."""
    splits = [part.strip() for part in value.split(",") if part.strip()]
    unknown = [part for part in splits if part not in {split.value for split in Split}]
    if value != "all" and (unknown or not splits):
        shown = ", ".join(repr(part) for part in unknown) or repr(value)
        choices = ", ".join(f"'{split.value}'" for split in Split)
        raise typer.BadParameter(f"{shown}: give one of {choices}, a comma list of them, or 'all'",
                                 param_hint="'--export-split'")  # fmt: skip


def export_splits(value: str) -> list[str] | None:
    """The splits ``--export-split`` names (``all``: None, every split)."""
    return None if value == "all" else [part.strip() for part in value.split(",") if part.strip()]


class BackendName(StrEnum):
    """``--backend`` as a choice the shell completes and click checks (a usage error, exit 2)."""

    heuristic = "heuristic"
    openai = "openai"


def extract(
    lake: LakeLocationOption = str(DEFAULT_LAKE),
    backend: Annotated[
        BackendName, typer.Option("--backend", help="heuristic (offline rules) | openai")
    ] = BackendName.heuristic,
    config: ExtractConfig = None,
    base_url: Annotated[str | None, typer.Option("--base-url", help="OpenAI-compatible endpoint")] = None,
    model: Annotated[str | None, typer.Option("--model", help="model name the endpoint serves")] = None,
    api_key_env: Annotated[str | None, typer.Option("--api-key-env", help="env var holding the key")] = None,
    concurrency: Annotated[int | None, typer.Option("--concurrency", min=1)] = None,
    budget_usd: Annotated[
        float | None, typer.Option("--budget-usd", help="stop cleanly at this spend")
    ] = None,
    max_tokens: Annotated[int | None, typer.Option("--max-tokens")] = None,
    request_timeout: Annotated[float | None, typer.Option("--timeout", help="per-request seconds")] = None,
) -> None:
    """Extract intents and rationales into their tables (``trajforge records`` then renders them into
    the gold responses); exit 1 if the validation gate stops the run (the lake keeps its previous
    tables)."""
    from extractors.config import ExtractSettings
    from flows.extract import extract_stages_flow

    settings = load_settings(
        ExtractSettings,
        "extract",
        config,
        backend=BackendName(backend).value,
        base_url=base_url,
        model=model,
        api_key_env=api_key_env,
        concurrency=concurrency,
        budget_usd=budget_usd,
        max_tokens=max_tokens,
        request_timeout_s=request_timeout,
    )
    with lake_here(lake) as here:
        check_lake(here, ["records"])  # before the flow: a missing lake is one line, not a traceback
        # a stopped gate (GateError) is one of the command line's clean stops: one line, exit code 1
        summary = extract_stages_flow(str(here.resolve()), settings=settings)
    print_extract_summary(console, summary)
    console.print(f"next: trajforge records --lake {lake}   (renders them into the gold responses)")


def validate(
    lake: LakeLocationOption = str(DEFAULT_LAKE),
    table: Annotated[str | None, typer.Argument(help="one table (default: every table with a suite)")] = None,
) -> None:
    """Validate lake tables against their Great Expectations suites; Data Docs per run."""
    from validation.report import GateError

    problem = unknown_table_problem(table)
    with lake_here(lake) as here:
        check_lake(here)
        if problem:
            console.print(f"[red]{problem}[/red]")
            raise typer.Exit(2)
        from flows.validate import validate_flow  # Prefect loads once the table is known

        try:
            summary = validate_flow(str(here.resolve()), [table] if table else None)
        except GateError as err:
            console.print(f"[red]validation stopped:[/red] {escape(str(err))}", soft_wrap=True)
            raise typer.Exit(1) from None
    print_validation_summary(console, summary)


def unknown_table_problem(table: str | None) -> str | None:
    """Why ``table`` cannot be validated (no suite declares it), or None."""
    from transforms.schemas import LAKE_TABLES
    from validation.suites import all_suites

    known = [n for n in LAKE_TABLES if n in all_suites()]
    if table is not None and table not in known:
        return f"no validation suite for table {table!r}; tables with suites: {', '.join(known)}"
    return None


class SqlFormat(StrEnum):
    table = "table"
    csv = "csv"
    json = "json"


def sql(
    query: Annotated[str, typer.Argument(help="read-only SQL over the lake views")],
    lake: LakeLocationOption = str(DEFAULT_LAKE),
    limit: Annotated[int, typer.Option("--limit", help="rows printed as a table (csv and json: all)")] = 50,
    output: Annotated[
        SqlFormat, typer.Option("--format", help="csv and json: every row; in csv lists and structs are JSON")
    ] = SqlFormat.table,
) -> None:
    """Run read-only SQL against LAKE/warehouse.duckdb and print the result, every value in full; a lake
    on an object store is read there, through views over its Parquet."""
    import duckdb

    from flows.object_store import store_query
    from transforms.catalog import query as run_query

    if not is_store_uri(lake):
        check_lake(lake)
    try:
        frame = store_query(lake, query) if is_store_uri(lake) else run_query(lake, query)
    except (duckdb.Error, FileNotFoundError) as exc:
        console.print(f"[red]query failed:[/red] {exc}")
        raise typer.Exit(1) from exc
    if output is SqlFormat.table:
        print_frame(console, frame, limit)
    else:
        typer.echo(frame_as_csv(frame) if output is SqlFormat.csv else frame_as_json(frame), nl=False)


def serve(
    raw: Annotated[
        Path | None, typer.Option("--raw", help="raw log bundle the nightly run ingests (role dataset, all)")
    ] = None,
    lake: LakeOption = DEFAULT_LAKE,
    cron: Annotated[str, typer.Option("--cron", help="schedule of the nightly run (UTC)")] = "0 2 * * *",
    role: Annotated[
        str,
        typer.Option(
            "--role",
            help="dataset: the nightly run and on-demand validation; gpu: train-sft, train-optd and evaluate "
            "for a main job's hand-off ([main_job] hand_off_to = 'served'); all: both",
        ),
    ] = "dataset",
) -> None:
    """Serve deployments from this process: the pipeline's (nightly run + on-demand validation) and, on a
    GPU machine, the training and evaluation a main job hands off."""
    from prefect.client.schemas.schedules import CronSchedule
    from pydantic import ValidationError

    roles = ("dataset", "gpu", "all")
    if role not in roles:
        raise InputError(f"--role {role!r} is none of {', '.join(roles)}")
    if role != "gpu" and (raw is None or not raw.is_dir()):
        raise InputError(f"--raw {raw} is not a folder: the nightly run ingests the raw log bundle in it")
    check_writable_folder(lake, "--lake")
    try:
        CronSchedule(cron=cron)
    except ValidationError:
        raise InputError(f"--cron {cron!r} is not a cron schedule (five fields, e.g. '0 2 * * *')") from None
    from flows.deployments import serve_deployments

    serve_deployments(role, str(raw.resolve()) if raw else None, str(lake.resolve()), cron)
