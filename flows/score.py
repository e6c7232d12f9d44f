"""The UserArena figures of simulated traces against real ones (what ``trajforge score`` prints).

Scoring is local and takes seconds, so these are plain functions rather than a Prefect flow: a flow
run would add its start-up and its log lines to a command whose stdout is meant to be piped.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import polars as pl

from evaluation.scorecard import rounded, score
from evaluation.traces import dropped_keys, load_replay, load_traces, real_trace_frame
from transforms.lake import read_lake_table, table_files
from transforms.schemas import LAKE_TABLES

STEP_COLUMNS = ["session_id", "user_id", "step", "ts", "screen", "action", "target_item_id", "review_alias",
                "ipv_item_id", "split"]  # fmt: skip
HISTORY_COLUMNS = ["user_id", "ts", "kind", "category"]
SESSION_COLUMNS = ["session_id", "split", "cut_reason"]  # cut_reason: ingest cut the session at a bad event


def present_columns(lake: str | Path, table: str, wanted: list[str]) -> list[str]:
    """Those of ``wanted`` that the table declares and its files hold (a lake written before a column
    existed still reads)."""
    on_disk = pl.read_parquet_schema(table_files(lake, table)[0])
    return [name for name in wanted if name in on_disk and name in LAKE_TABLES[table].names]


def score_files(
    real: str | Path,
    sim: str | Path,
    replay: str | Path | None = None,
    split: str = "test",
    strict: bool = True,
) -> dict[str, object]:
    """Every figure of ``sim`` against ``real`` (either trace format), rounded for reporting.

    ``real`` may also be a lake folder: its sessions of ``split`` are exported as real traces first, and
    the cut sessions left out are counted beside the figures. ``strict=False`` reads files with keys
    their format does not declare, and counts what it left unread under ``counts.dropped_keys``.
    """
    replay_frame = load_replay(replay, strict) if replay is not None else None
    if not Path(real).is_dir():
        figures = score(load_traces(real, strict), load_traces(sim, strict), replay_frame)
    else:
        with tempfile.TemporaryDirectory() as folder:
            exported = export_real_traces(real, Path(folder) / "real.jsonl", [split])
            figures = score(load_traces(Path(folder) / "real.jsonl"), load_traces(sim, strict), replay_frame)
        figures["counts"]["real_cut_sessions_left_out"] = exported["cut_sessions_left_out"]
    if not strict:
        figures["counts"]["dropped_keys"] = dropped_by_file(real, sim, replay)
    return rounded(figures)


def dropped_by_file(
    real: str | Path, sim: str | Path, replay: str | Path | None
) -> dict[str, dict[str, int]]:
    """What a lenient read left unread, per file given (a lake's own export leaves nothing out)."""
    rollouts = {"real": None if Path(real).is_dir() else real, "sim": sim}
    dropped = {side: dropped_keys(path, "rollout") for side, path in rollouts.items() if path is not None}
    if replay is not None:
        dropped["replay"] = dropped_keys(replay, "replay")
    return dropped


def export_real_traces(
    lake: str | Path, out: str | Path, splits: list[str] | None = None
) -> dict[str, object]:
    """Write the lake's sessions (of ``splits``, default all) as real traces to ``out``; returns the
    sessions written and the cut sessions left out, by reason."""
    steps = read_lake_table(lake, "steps", STEP_COLUMNS)
    if splits:
        steps = steps.filter(pl.col("split").is_in(splits))
    history = sessions = None
    if table_files(lake, "history"):
        history = read_lake_table(lake, "history", present_columns(lake, "history", HISTORY_COLUMNS))
    if table_files(lake, "sessions"):
        sessions = read_lake_table(lake, "sessions", present_columns(lake, "sessions", SESSION_COLUMNS))
    if splits and sessions is not None:
        sessions = sessions.filter(pl.col("split").is_in(splits))
    items = read_lake_table(lake, "items", ["item_id", "category", "price"])
    traces, left_out = real_trace_frame(steps, items, history, sessions)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    traces.write_ndjson(out)
    return {"sessions": traces.height, "cut_sessions_left_out": left_out}
