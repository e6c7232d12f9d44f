"""Rendering the lake's states again after the lake grew: only the users whose rows changed.

Both renderings of the states (before extraction, for extraction's prompts; and the records, after
it) go through ``render_states``: the users whose inputs are unchanged since the last rendering made
with the same settings and code keep their rows, the others are rendered afresh
(``transforms.increments``). The table is the one a full rendering would write.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import polars as pl
from prefect import get_run_logger
from prefect.exceptions import MissingContextError

from flows.caching import code_version, fingerprint
from transforms.increments import RenderedInputs, changed_users, rendering_digests
from transforms.lake import RUNS, table_dir
from transforms.prompts import PromptSettings
from transforms.records import MODES, KeptRendering, RecordsSummary, write_records


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
    inputs = RenderedInputs(runs_folder(lake, stage))
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
    summary: RecordsSummary = write_records(
        lake,
        modes=modes,
        settings=settings,
        chunk_states=chunk_states,
        out=out,
        with_extraction=with_extraction,
        only_users=only,
        keep=keep,
    )
    # the fingerprint of a folder is its files' relative paths and bytes: the staged table's is the
    # one it has once swapped into ``final``
    inputs.record(key, fingerprint(table_dir(out, "records")), digests, summary.not_executable_by_user())
    rendered = digests.height if only is None else int(digests["user_id"].is_in(only.implode()).sum())
    return {**summary.model_dump(), "users_rendered": rendered, "users_kept": digests.height - rendered}
