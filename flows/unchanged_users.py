"""The stages that work user by user, run again after the lake grew: only the users whose rows changed.

Both renderings of the states (before extraction, for extraction's prompts; and the records, after
it) go through ``render_states``, extraction through ``plan_extraction``/``record_extraction``: the
users whose inputs are unchanged since the last run made with the same settings and code keep their
rows, the others are done afresh (``transforms.increments``). The tables are those a full run writes.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.exceptions import MissingContextError

from extractors.config import ExtractSettings
from extractors.pipeline import STAGE as EXTRACT_STAGE
from extractors.pipeline import KeptExtraction
from flows.buckets import map_buckets, per_bucket
from flows.caching import code_version, fingerprint
from flows.retrying import IO_RETRIES
from transforms.chain import SUMMARY_HELPERS
from transforms.files import atomic_file
from transforms.increments import (
    RecordedInputs,
    changed_users,
    empty_not_executable,
    extraction_digests,
    rendering_digests,
    session_digests,
)
from transforms.lake import STAGING, bucket_files, quarantine_dir, read_lake_table, table_dir
from transforms.manifest import RUNS
from transforms.prompts import PromptSettings
from transforms.records import (
    MODES,
    KeptRendering,
    RecordsRendering,
    RecordsSummary,
    finish_records,
    records_staging,
    render_bucket,
)


def rendering_key(settings: PromptSettings, modes: list[str], with_extraction: bool) -> str:
    """What a rendering's rows depend on besides the lake: settings, modes, the code (and the Polars
    version, whose hashes the digests are)."""
    parts = {
        "settings": settings.model_dump(mode="json"),
        "modes": sorted(modes),
        "with_extraction": with_extraction,
        "code": code_version(),
        "polars": pl.__version__,
    }
    return json.dumps(parts, sort_keys=True)


def runs_folder(lake: str | Path, stage: str) -> Path:
    return Path(lake) / RUNS / stage


def _say(message: str, *args: Any) -> None:
    with contextlib.suppress(MissingContextError):  # called outside a flow: nobody to tell
        get_run_logger().info(message, *args)


render_records_bucket = per_bucket("render-records-bucket", render_bucket)


@task(name="finish-records", cache_policy=NO_CACHE, **IO_RETRIES)
def finish_rendering(
    rendering: RecordsRendering, parts: list[RecordsSummary], keep: KeptRendering | None
) -> RecordsSummary:
    """The rendering's reduce: one summary, the kept users' files, the staged table swapped in."""
    return finish_records(rendering, parts, keep)


def render_states(
    lake: str | Path,
    *,
    stage: str,
    out: str | Path,
    final: str | Path,
    settings: PromptSettings,
    with_extraction: bool,
    modes: list[str] | None = None,
    chunk_states: int = 100_000,
    reuse: bool = True,
) -> dict[str, Any]:
    """Render ``lake``'s states into the lake-shaped folder ``out``, whose ``records`` table will be
    ``final``'s (the same folder, or a staging folder swapped in after its gate). ``reuse`` False
    renders every user. Returns the summary with ``users_rendered`` and ``users_kept``."""
    modes = modes or list(MODES)
    inputs = RecordedInputs(runs_folder(lake, stage))
    key = rendering_key(settings, modes, with_extraction)
    digests = rendering_digests(lake, with_extraction=with_extraction)
    previous = inputs.previous(key, fingerprint(table_dir(final, "records"))) if reuse else None
    only, keep = None, None
    if previous is not None:
        before, not_executable = previous
        only = changed_users(before, digests)
        keep = KeptRendering(table_dir(final, "records"), not_executable)
        _say("%s: %d users changed since the last rendering, the others kept", stage, only.len())
    inputs.forget()  # until this rendering is recorded, nothing describes the table
    rendering = RecordsRendering(
        lake=str(lake), staged=str(records_staging(Path(out))), modes=modes, settings=settings,
        chunk_states=chunk_states, with_extraction=with_extraction, only_users=only,
    )  # fmt: skip
    try:
        parts = map_buckets(render_records_bucket, bucket_files(lake, "steps"), rendering=rendering)
        summary = finish_rendering(rendering, parts, keep)
    finally:
        shutil.rmtree(rendering.staged, ignore_errors=True)
    # the fingerprint of a folder is its files' relative paths and bytes: the staged table's is the
    # one it has once swapped into ``final``
    inputs.record(key, fingerprint(table_dir(out, "records")), digests, summary.not_executable_by_user())
    rendered = digests.height if only is None else int(digests["user_id"].is_in(only.implode()).sum())
    return {**summary.model_dump(), "users_rendered": rendered, "users_kept": digests.height - rendered}


# --- extraction ---------------------------------------------------------------------------------


def extraction_outputs(lake: str | Path) -> list[Path]:
    return [table_dir(lake, "intents"), table_dir(lake, "rationales"), quarantine_dir(lake, EXTRACT_STAGE)]


def outputs_fingerprint(paths: list[Path]) -> str | None:
    """One fingerprint of several folders; None unless every one of them is there."""
    parts = [fingerprint(path) for path in paths]
    return None if None in parts else "+".join(parts)  # type: ignore[arg-type]


def extraction_key(settings: ExtractSettings) -> str:
    """What an extraction's rows depend on besides the lake and its states: settings and code."""
    parts = {"settings": settings.model_dump(mode="json"), "code": code_version(), "polars": pl.__version__}
    return json.dumps(parts, sort_keys=True)


@dataclass(frozen=True)
class ExtractionPlan:
    """Who an extraction extracts: every user (``replaced`` None), or the users whose inputs changed
    since the recorded run, the others keeping that run's rows."""

    key: str
    digests: pl.DataFrame
    replaced: pl.Series | None

    def write_replaced(self, folder: str | Path) -> str | None:
        """The replaced users as a file in ``folder`` (tasks exchange paths), None for every user."""
        if self.replaced is None:
            return None
        path = Path(folder) / STAGING / "extract-replaced-users.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        self.replaced.to_frame("user_id").write_parquet(path)
        return str(path)


def plan_extraction(
    lake: str | Path, states: str | Path, settings: ExtractSettings, reuse: bool
) -> ExtractionPlan:
    inputs = RecordedInputs(runs_folder(lake, EXTRACT_STAGE))
    key = extraction_key(settings)
    digests = extraction_digests(lake, states)
    previous = inputs.previous(key, outputs_fingerprint(extraction_outputs(lake))) if reuse else None
    replaced = None if previous is None else changed_users(previous[0], digests)
    if replaced is not None:
        _say("extract: %d users changed since the last extraction, the others keep theirs", replaced.len())
    inputs.forget()  # until this extraction is recorded, nothing describes the tables
    return ExtractionPlan(key, digests, replaced)


def record_extraction(lake: str | Path, plan: ExtractionPlan, pending_users: list[str]) -> None:
    """After the swap: the digests of the users whose extraction is complete (a user with a job left
    pending, a budget stop, is extracted again next time)."""
    done = plan.digests.filter(~pl.col("user_id").is_in(pl.Series(pending_users, dtype=pl.String).implode()))
    inputs = RecordedInputs(runs_folder(lake, EXTRACT_STAGE))
    inputs.record(plan.key, outputs_fingerprint(extraction_outputs(lake)), done, empty_not_executable())


def kept_extraction(lake: str | Path, replaced_file: str | None) -> KeptExtraction | None:
    if replaced_file is None:
        return None
    return KeptExtraction(Path(lake), pl.read_parquet(replaced_file)["user_id"])


# --- chain --------------------------------------------------------------------------------------


def chain_key() -> str:
    return json.dumps({"code": code_version(), "polars": pl.__version__}, sort_keys=True)


@dataclass(frozen=True)
class ChainPlan:
    """Who a chain chains: every user (``changed`` None), or those whose sessions changed since the
    recorded run, the others keeping that run's histories (``kept``, with their summary helpers)."""

    digests: pl.DataFrame
    changed: pl.Series | None
    kept: pl.DataFrame | None


def helpers_file(lake: str | Path) -> Path:
    return runs_folder(lake, "chain") / "summary_helpers.parquet"


def plan_chain(lake: str | Path, reuse: bool) -> ChainPlan:
    inputs = RecordedInputs(runs_folder(lake, "chain"))
    digests = session_digests(lake)
    histories = table_dir(lake, "histories")
    # the record names the histories table it describes: once a chain swaps in another, it matches no
    # more until that chain records its own (a chain stopped at its gate leaves both as they were)
    previous = inputs.previous(chain_key(), fingerprint(histories)) if reuse else None
    if previous is None or not helpers_file(lake).is_file():
        return ChainPlan(digests, None, None)
    changed = changed_users(previous[0], digests)
    kept = read_lake_table(lake, "histories").join(pl.read_parquet(helpers_file(lake)), on="user_id")
    _say("chain: %d users' sessions changed since the last chain, the others keep theirs", changed.len())
    return ChainPlan(digests, changed, kept)


def record_chain(lake: str | Path, plan: ChainPlan, histories_with_helpers: pl.DataFrame) -> None:
    """After the swap: the sessions' digests and the summary helpers of every history."""
    helpers = histories_with_helpers.select("user_id", *SUMMARY_HELPERS)
    with atomic_file(helpers_file(lake)) as temporary:
        helpers.write_parquet(temporary)
    inputs = RecordedInputs(runs_folder(lake, "chain"))
    inputs.record(
        chain_key(), fingerprint(table_dir(lake, "histories")), plan.digests, empty_not_executable()
    )
