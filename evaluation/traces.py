"""Evaluation traces: one session per JSONL line, in our format or the reference implementation's.

A *rollout trace* is a session as a simulator (or a real shopper) played it: every output, accepted or
rejected with its reason. A *replay trace* is one line per recorded step: the recorded (ground-truth)
action beside the simulator's prediction at that state.

The records below are for writing and for small reads; they need pydantic alone, so the rollout
engine writes traces where polars and duckdb are missing (a GPU machine). Scoring reads files straight
into Polars frames (:func:`load_traces`, :func:`load_replay`, in :mod:`evaluation.trace_frames` and
reachable from here as before) so that hundreds of thousands of steps never become Python objects;
both formats land in the same columns, so a figure does not depend on the tool that wrote the file.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

Screen = Literal["feed", "ipv"]
TraceFormat = Literal["ours", "reference"]

REJECT_REASONS: tuple[str, ...] = ("parse_failure", "unknown_action", "illegal_in_state", "target_unresolved")
TerminationReason = Literal["end", "budget", "invalid_retry_exhausted", "error"]


class TraceProfile(BaseModel):
    """What the simulator knew of the shopper before the session."""

    prior_clicks: int = Field(0, ge=0, description="clicks in the shopper's history before this session")
    prior_buys: int = Field(0, ge=0, description="purchases in the shopper's history before this session")
    recent_click_categories: list[str] = Field(
        default_factory=list, description="categories of the recent clicks, newest first"
    )


class TraceStep(BaseModel):
    """One simulator output (or one real action) and what the environment made of it.

    Built from any object with these attributes too (``TraceStep.model_validate(attempt,
    from_attributes=True)``), so an environment's own attempt records need no copying by hand.
    """

    screen: Screen
    action: str | None = Field(None, description="the action type as output (may be unknown when rejected)")
    target_item_id: str | None = Field(None, description="clicked card, or the item of the detail page")
    review_alias: str | None = Field(None, description="C1, C2... for ipv_click_comment")
    accepted: bool = True
    reject_reason: str | None = Field(None, description="one of REJECT_REASONS when not accepted")
    item_category: str | None = Field(None, description="category path of the step's item, '-'-separated")
    item_price: float | None = None
    raw_output: str | None = None


class Trace(BaseModel):
    """A whole session: who, from which source, how it ended, and its steps."""

    session_id: str
    user_id: str
    source: str = Field(description="'real' or the simulator spec")
    terminated: bool
    truncated: bool
    termination_reason: TerminationReason | None = Field(None, description="None: a real session without end")
    profile: TraceProfile = Field(default_factory=TraceProfile)
    steps: list[TraceStep] = Field(default_factory=list)


class ReplayStep(BaseModel):
    """One recorded state: the recorded action and the simulator's prediction there."""

    session_id: str
    step_index: int = Field(ge=0, description="position of the recorded step in its session")
    screen: Screen
    gt_action: str
    gt_target_item_id: str | None = None
    gt_target_title: str | None = None
    gt_review_alias: str | None = None
    pred_action: str | None = Field(None, description="None when the simulator gave no usable output")
    pred_target_item_id: str | None = None
    pred_target_title: str | None = None
    pred_review_alias: str | None = None
    accepted: bool
    reject_reason: str | None = None
    raw_output: str | None = None
    unscored_reason: str | None = Field(
        None, description="why the recorded state could not be rebuilt; such a row is counted, not scored"
    )


def write_jsonl(path: str | Path, records: Iterable[BaseModel]) -> int:
    """Write one record per line; returns the number written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with path.open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(record.model_dump_json() + "\n")
            count += 1
    return count


def read_traces(path: str | Path) -> list[Trace]:
    """Our-format rollout traces as records (for small files; scoring uses :func:`load_traces`)."""
    with Path(path).open(encoding="utf-8") as handle:
        return [Trace.model_validate_json(line) for line in handle if line.strip()]


def read_replay(path: str | Path) -> list[ReplayStep]:
    """Our-format replay steps as records (for small files; scoring uses :func:`load_replay`)."""
    with Path(path).open(encoding="utf-8") as handle:
        return [ReplayStep.model_validate_json(line) for line in handle if line.strip()]


class TraceFormatError(ValueError):
    """A trace file that is neither our format nor the reference's."""


# the frames half (polars, duckdb), imported the first time one of its names is asked for here
FRAME_NAMES = frozenset(
    {
        "SESSION_SCHEMA",
        "STEP_SCHEMA",
        "REPLAY_SCHEMA",
        "REPLAY_TARGETS",
        "REFERENCE_TERMINATION",
        "RECENT_CLICKS",
        "TraceFrames",
        "detect_rollout_format",
        "detect_replay_format",
        "duckdb_type",
        "read_jsonl",
        "price_from_text",
        "load_traces",
        "load_replay",
        "real_trace_frame",
    }
)


def __getattr__(name: str) -> Any:
    if name in FRAME_NAMES:
        from evaluation import trace_frames

        return getattr(trace_frames, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
