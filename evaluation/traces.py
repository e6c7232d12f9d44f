"""Evaluation traces: one session per JSONL line, in our format or the reference implementation's.

A *rollout trace* is a session as a simulator (or a real shopper) played it: every output, accepted or
rejected with its reason. A *replay trace* is one line per recorded step: the recorded (ground-truth)
action beside the simulator's prediction at that state.

The records below are for writing and for small reads; they need pydantic alone, so the rollout
engine writes traces where polars and duckdb are missing (a GPU machine). Scoring reads files straight
into Polars frames (:func:`load_traces`, :func:`load_replay`, in :mod:`evaluation.trace_frames` and
reachable from here as before) so that hundreds of thousands of steps never become Python objects;
both formats land in the same columns, so a figure does not depend on the tool that wrote the file.

Both readers refuse a key that a format does not declare, at every level of a line (session, profile,
step), naming the line and the nearest declared key: a misspelt ``clicks`` for ``prior_clicks`` would
otherwise read as a profile of zero clicks and move PF without a word. ``strict=False`` reads on
without such keys, and :func:`evaluation.trace_frames.dropped_keys` counts what that leaves out.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

Screen = Literal["feed", "ipv"]
TraceFormat = Literal["ours", "reference"]

REJECT_REASONS: tuple[str, ...] = ("parse_failure", "unknown_action", "illegal_in_state", "target_unresolved")
TerminationReason = Literal["end", "budget", "invalid_retry_exhausted", "error"]


class TraceProfile(BaseModel):
    """What the simulator knew of the shopper before the session."""

    model_config = ConfigDict(extra="forbid")

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

    model_config = ConfigDict(extra="forbid")  # from attributes, the object's other ones are not read

    screen: Screen
    action: str | None = Field(None, description="the action type as output (may be unknown when rejected)")
    target_item_id: str | None = Field(None, description="clicked card, or the item of the detail page")
    review_alias: str | None = Field(None, description="C1, C2... for ipv_click_comment")
    accepted: bool = True
    reject_reason: str | None = Field(None, description="one of REJECT_REASONS when not accepted")
    detail: str | None = Field(None, description="what exactly the rejection found, for a person reading")
    item_category: str | None = Field(None, description="category path of the step's item, '-'-separated")
    item_price: float | None = None
    raw_output: str | None = None


class Trace(BaseModel):
    """A whole session: who, from which source, how it ended, and its steps."""

    model_config = ConfigDict(extra="forbid")

    session_id: str
    user_id: str
    source: str = Field(description="'real' or the simulator spec")
    terminated: bool
    truncated: bool
    termination_reason: TerminationReason | None = Field(None, description="None: a real session without end")
    error: str | None = Field(None, description="what the simulator failed with, when it ended with 'error'")
    profile: TraceProfile = Field(default_factory=TraceProfile)
    steps: list[TraceStep] = Field(default_factory=list)


class ReplayStep(BaseModel):
    """One recorded state: the recorded action and the simulator's prediction there."""

    model_config = ConfigDict(extra="forbid")

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
    detail: str | None = Field(None, description="what exactly the rejection found, for a person reading")
    error: str | None = Field(None, description="why no prediction came: the request's failure")
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


class TraceFormatError(ValueError):
    """A trace file that is neither our format nor the reference's, or a line that its format refuses."""


@dataclass(frozen=True)
class KeyLevel:
    """One kind of object in a trace line (the line itself, its profile, its steps) and its keys."""

    name: str  # as a message names it: 'session', 'profile', 'step'
    keys: frozenset[str]
    under: str | None = None  # the line's key holding the objects; None: the line itself
    many: bool = False  # a list of them under that key (the steps)

    def objects(self, record: dict) -> list[dict]:
        """The objects of this level in one parsed line (none where the line has no such key)."""
        if not isinstance(record, dict):
            return []
        if self.under is None:
            return [record]
        held = record.get(self.under)
        items = (held if isinstance(held, list) else []) if self.many else [held]
        return [item for item in items if isinstance(item, dict)]

    @property
    def json_path(self) -> str:
        if self.under is None:
            return "$"
        return f"$.{self.under}[*]" if self.many else f"$.{self.under}"

    def path_of(self, key: str) -> str:
        """A key's place in a line, as counts name it: ``clicks``, ``profile.clicks``, ``steps[].clicks``."""
        if self.under is None:
            return key
        return f"{self.under}[].{key}" if self.many else f"{self.under}.{key}"


def model_keys(model: type[BaseModel]) -> frozenset[str]:
    return frozenset(model.model_fields)


OUR_ROLLOUT_KEYS = (
    KeyLevel("session", model_keys(Trace)),
    KeyLevel("profile", model_keys(TraceProfile), under="profile"),
    KeyLevel("step", model_keys(TraceStep), under="steps", many=True),
)
OUR_REPLAY_KEYS = (KeyLevel("replay step", model_keys(ReplayStep)),)


def unknown_key_message(level: KeyLevel, key: str) -> str:
    """``unknown key 'clicks' in profile (did you mean 'prior_clicks'?)``; no guess when none is close."""
    nearest = difflib.get_close_matches(key, sorted(level.keys), n=1)
    guess = f" (did you mean {nearest[0]!r}?)" if nearest else ""
    return f"unknown key {key!r} in {level.name}{guess}"


def unknown_key_in(record: dict, levels: Iterable[KeyLevel]) -> str | None:
    """The message for the first key of one parsed line that its level does not declare; None if none."""
    for level in levels:
        for item in level.objects(record):
            for key in item:
                if key not in level.keys:
                    return unknown_key_message(level, key)
    return None


def numbered_records(path: Path) -> Iterator[tuple[int, dict]]:
    """(line number from 1, parsed object) for every non-blank line of a JSONL file."""
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise TraceFormatError(f"{path}:{number}: not JSON ({err.msg})") from None
            yield number, record


def first_unknown_key(path: Path, levels: Iterable[KeyLevel]) -> str | None:
    """``path:LINE: unknown key ...`` for the first line holding an undeclared key; None when none does."""
    levels = tuple(levels)
    for number, record in numbered_records(path):
        if problem := unknown_key_in(record, levels):
            return f"{path}:{number}: {problem}"
    return None


Record = TypeVar("Record", bound=BaseModel)


def read_records(path: str | Path, model: type[Record], levels: Iterable[KeyLevel]) -> list[Record]:
    """Every line of ``path`` as ``model``; a line it does not fit stops the read with its number."""
    path, levels, records = Path(path), tuple(levels), []
    for number, record in numbered_records(path):
        if problem := unknown_key_in(record, levels):
            raise TraceFormatError(f"{path}:{number}: {problem}")
        try:
            records.append(model.model_validate(record))
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            raise TraceFormatError(f"{path}:{number}: {where}: {first['msg']}") from None
    return records


def read_traces(path: str | Path) -> list[Trace]:
    """Our-format rollout traces as records (for small files; scoring uses :func:`load_traces`)."""
    return read_records(path, Trace, OUR_ROLLOUT_KEYS)


def read_replay(path: str | Path) -> list[ReplayStep]:
    """Our-format replay steps as records (for small files; scoring uses :func:`load_replay`)."""
    return read_records(path, ReplayStep, OUR_REPLAY_KEYS)


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
        "dropped_keys",
        "real_trace_frame",
    }
)


def __getattr__(name: str) -> Any:
    if name in FRAME_NAMES:
        from evaluation import trace_frames

        return getattr(trace_frames, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
