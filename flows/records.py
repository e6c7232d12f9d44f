"""The records flow: lake tables -> rendered training/evaluation states (+ chat JSONL export)."""

from __future__ import annotations

import time

import polars as pl
from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows.retrying import IO_RETRIES
from flows.staged_write import Staged, StageWrite, record_manifest, write_staged
from flows.stages import EXTRACTED, INGESTED, tables
from flows.unchanged_users import render_states
from transforms.lake import recorded_settings, scan_table
from transforms.manifest import UsersDone, new_manifest
from transforms.prompts import PromptSettings
from transforms.records import (
    MODES,
    ExportSummary,
    NothingToTrainOn,
    RecordsSummary,
    export_chat_jsonl,
)

#: what the records are rendered from (the extraction's tables are optional: absent, not extracted)
RENDERED_FROM = [*INGESTED, "histories", *EXTRACTED]


def build(
    lake: str, staged: str, modes: list[str], settings: PromptSettings, chunk_states: int, reuse: bool
) -> dict:
    """Render the lake's states into ``staged``, a task per user bucket; the lake's records stay until
    the gate passes. With ``reuse``, users whose rows are unchanged since the last rendering keep
    their records."""
    return render_states(
        lake,
        stage="records",
        out=staged,
        final=lake,
        settings=settings,
        with_extraction=True,
        modes=modes,
        chunk_states=chunk_states,
        reuse=reuse,
    )


def with_lake_geometry(lake: str, settings: PromptSettings | None) -> PromptSettings:
    """The prompt settings with the geometry the lake was ingested with: one Geometry per lake."""
    settings = settings or PromptSettings()
    return settings.model_copy(update={"geometry": recorded_settings(lake).geometry})


@task(name="export-chat-jsonl", cache_policy=NO_CACHE, **IO_RETRIES)
def export(
    lake: str, path: str, splits: list[str] | None, modes: list[str] | None, tokenizer: str | None = None
) -> dict:
    """The export's summary, with its lines' token lengths under ``tokenizer`` (a local model folder)
    when given; when there is nothing to train on, its message under ``nothing_to_train_on`` (the flow
    records the run first, then stops)."""
    try:
        summary = export_chat_jsonl(lake, path, splits=splits, modes=modes).model_dump()
    except NothingToTrainOn as err:
        return {**err.summary.model_dump(), "splits": splits, "nothing_to_train_on": str(err)}
    if tokenizer is not None:
        from trainer.export_lengths import token_lengths

        summary["token_lengths"] = token_lengths(path, tokenizer).model_dump()
    return {**summary, "splits": splits}


def summary_markdown(result: dict) -> str:
    s = RecordsSummary(**result["records"])
    rows = "\n".join(f"| {k} | {v:,} |" for k, v in s.by_mode_split.items())
    bad = "\n".join(f"| {k} | {v:,} |" for k, v in s.gold_not_executable.items()) or "| – | 0 |"
    parts = [
        f"# Records (prompt {s.prompt_version})",
        f"{s.records:,} states; token estimate mean {s.token_estimate_mean:,}, max {s.token_estimate_max:,}",
        f"| mode/split | states |\n|---|---:|\n{rows}",
        f"| recorded action not executable as shown | states |\n|---|---:|\n{bad}",
    ]
    if s.gold_missing:
        parts.append(f"states without a gold response (response null), by reason: {s.gold_missing}")
    return "\n\n".join(parts) + "\n"


RECORDS = StageWrite("records", ["records"], markdown=summary_markdown)


@flow(name="records", persist_result=False)  # its tasks' results stay in memory
def records_flow(
    lake: str,
    modes: list[str] | None = None,
    settings: PromptSettings | None = None,
    chunk_states: int = 100_000,
    export_jsonl: str | None = None,
    export_splits: list[str] | None = None,
    reuse: bool = True,
    export_tokenizer: str | None = None,
) -> dict:
    """steps/sessions/items/history (+ rationales, intents when extracted) -> records; optional export
    (with nothing to train on, its reason is in ``export.nothing_to_train_on``: the command stops on it).
    The prompts use the geometry of the lake's own ingest, whatever ``settings.geometry`` says.
    Only users whose rows changed since the last rendering are rendered again (``reuse`` False:
    every user). ``export_tokenizer``: a local model folder whose tokenizer counts the export's tokens."""
    settings = with_lake_geometry(lake, settings)
    modes = modes or list(MODES)
    inputs = tables(lake, RENDERED_FROM)

    def staged_records(staged: str) -> Staged:
        rendered = build(lake, staged, modes, settings, chunk_states, reuse)
        steps = scan_table(lake, "steps").select(pl.len()).collect().item()
        users = UsersDone(read=rendered["users_rendered"], reused=rendered["users_kept"])
        return Staged({"records": rendered}, {"records": {"rows_in": steps, "rows_out": rendered["records"]}},
                      settings=rendered["settings"], users=users)  # fmt: skip

    result = write_staged(lake, RECORDS, inputs, staged_records)
    if export_jsonl:
        started = time.perf_counter()
        result["export"] = exported = export(lake, export_jsonl, export_splits, None, export_tokenizer)
        seconds = time.perf_counter() - started
        exported["manifest"] = record_export(lake, export_jsonl, export_splits, exported, seconds)
    return result


def record_export(lake: str, path: str, splits: list[str] | None, exported: dict, seconds: float) -> str:
    """The export's manifest (``LAKE/_runs/export/``): the records it read, the JSONL file it wrote with
    its hash, the splits chosen and the export's own figures, as every stage records its run."""
    inputs = tables(lake, ["records"])
    written = {"chat_jsonl": path} if "nothing_to_train_on" not in exported else {}
    manifest = new_manifest(lake, "export", seconds, inputs, written, settings={"splits": splits},
                            details=exported)  # fmt: skip
    return record_manifest(manifest, None)


def export_line(exported: dict) -> str:
    """One sentence on an export: lines written and states left out for want of a gold response."""
    summary = ExportSummary.model_validate(exported)
    line = f"exported {summary.lines:,} chat lines to {summary.path}"
    if summary.left_out:
        line = f"{line}; {summary.describe_left_out()}"
    measured = exported.get("token_lengths")
    if measured:
        return (
            f"{line}; tokens per line with {measured['tokenizer']}: median {measured['median']:,}, "
            f"99th percentile {measured['p99']:,}, longest {measured['longest']:,}: "
            f"max_length {measured['longest']:,} keeps every answer"
        )
    longest = summary.longest_token_estimate
    return (
        f"{line}; the longest is about {longest:,} tokens (bytes / 3; --export-tokenizer counts them): "
        "train with a max_length of at least that"
    )
