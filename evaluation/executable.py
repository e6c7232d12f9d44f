"""Whether a response is executable on its record's screen (PROTOCOL.md §2), for reports on sampled responses.

A record is one recorded step of one session (``record_id`` = ``<session_id>:<step>``). The replay
cursor places the session's screen at each recorded step exactly as replay does (feed offset and
cards in view, open item, page offset and panel), and that step's own ``judge`` decides, so there is
one implementation of legality: the environment's. The screen is the step's whatever the record's
mode: a cross-session record differs from the single-session one by its history window only, and
legality depends on the screen alone.

A record whose screen cannot be placed is counted apart with its reason (``NO_SCREEN_REASONS``),
never judged and never dropped from the count.

Placing screens reads the lake (polars); judging on screens already placed does not, so a trainer on a
machine without polars judges with screens placed elsewhere and carried to it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evaluation.environment import EnvironmentSettings
from evaluation.replay import SKIP_REASONS, ReplayCursor, ScoredStep
from transforms.prompts import REJECT_REASONS, Accepted, Rejected, parse_response

NO_RECORDED_STEPS = "no_recorded_steps"  # the lake holds records but no steps or sessions to replay
RECORD_NOT_IN_LAKE = "record_not_in_lake"
SESSION_NOT_IN_LAKE = "session_not_in_lake"
STEP_NOT_IN_SESSION = "step_not_in_session"
NO_SCREEN_REASONS: tuple[str, ...] = (
    NO_RECORDED_STEPS,
    RECORD_NOT_IN_LAKE,
    SESSION_NOT_IN_LAKE,
    STEP_NOT_IN_SESSION,
    *SKIP_REASONS,  # a recorded step the replay cursor could not rebuild
)


def lake_environment(lake: str | Path) -> EnvironmentSettings:
    """The environment as the lake's records show it: their prompt settings, the ingest's geometry."""
    from transforms.records import recorded_prompt_settings

    return EnvironmentSettings(prompt=recorded_prompt_settings(lake))


@dataclass(frozen=True)
class RecordScreens:
    """The recorded screens of some records (by ``record_id``), and why the others have none."""

    steps: dict[str, ScoredStep]
    unplaced: dict[str, str]  # record_id -> one of NO_SCREEN_REASONS

    def judge(self, record_id: str, text: str) -> Accepted | Rejected | None:
        """``text`` checked on the record's screen; None when the record has no screen."""
        step = self.steps.get(record_id)
        if step is None and record_id not in self.unplaced:
            raise KeyError(f"record {record_id!r} was not among the records whose screens were placed")
        return None if step is None else step.judge(text)


def record_sessions(lake: str | Path, record_ids: Sequence[str]) -> dict[str, tuple[str, int]]:
    """record_id -> (session_id, step) for the ids the records table holds."""
    import polars as pl

    from transforms.lake import scan_table

    rows = (
        scan_table(lake, "records", ["record_id", "session_id", "step"])
        .filter(pl.col("record_id").is_in(list(record_ids)))
        .unique("record_id")
        .collect()
    )
    return {r: (s, step) for r, s, step in rows.iter_rows()}


def record_screens(
    lake: str | Path, record_ids: Sequence[str], settings: EnvironmentSettings | None = None
) -> RecordScreens:
    """Each record's screen, placed by replaying its session up to its step (``settings``: the lake's)."""
    from evaluation.loader import load_sessions
    from transforms.lake import table_files

    if not (table_files(lake, "steps") and table_files(lake, "sessions")):
        return RecordScreens({}, dict.fromkeys(record_ids, NO_RECORDED_STEPS))
    settings = settings or lake_environment(lake)
    located = record_sessions(lake, record_ids)
    session_ids = sorted({session_id for session_id, _ in located.values()})
    cursors = [ReplayCursor(s, settings) for s in load_sessions(lake, session_ids, settings=settings)]
    scored = {(c.session.session_id, s.recorded.step): s for c in cursors for s in c}
    skipped = {(c.session.session_id, step): why for c in cursors for step, why in c.skipped_steps}
    replayed = {c.session.session_id for c in cursors}
    steps, unplaced = {}, {}
    for record_id in record_ids:
        where = located.get(record_id)
        if where in scored:
            steps[record_id] = scored[where]
        elif where is None:
            unplaced[record_id] = RECORD_NOT_IN_LAKE
        elif where[0] not in replayed:
            unplaced[record_id] = SESSION_NOT_IN_LAKE
        else:
            unplaced[record_id] = skipped.get(where, STEP_NOT_IN_SESSION)
    return RecordScreens(steps, unplaced)


@dataclass
class ResponseReport:
    """Responses to some records, parsed and judged on their screens (PROTOCOL.md §2).

    ``parse_share`` is over every response; ``executable_share`` over those whose record has a
    screen (``judged``), where ``rejected`` counts each reason and the rest were executable;
    ``no_screen`` counts the others by why. ``executable_share`` is None when none was judged.
    ``recorded_action_share``: of the judged responses, those executable as the action the shopper
    took there (its type): a simulator can be executable at every step and still never click.
    """

    responses: int = 0
    parsed: int = 0
    judged: int = 0
    executable: int = 0
    as_recorded: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    no_screen: Counter[str] = field(default_factory=Counter)

    def as_json(self) -> dict[str, Any]:
        return {
            "parse_share": self.parsed / self.responses if self.responses else 0.0,
            "executable_share": self.executable / self.judged if self.judged else None,
            "recorded_action_share": self.as_recorded / self.judged if self.judged else None,
            "judged": self.judged,
            "rejected": {reason: self.rejected[reason] for reason in REJECT_REASONS if self.rejected[reason]},
            "no_screen": dict(sorted(self.no_screen.items())),
        }


def judge_responses(
    screens: RecordScreens, record_ids: Sequence[str], texts: Sequence[str]
) -> ResponseReport:
    """The report over ``texts``, the i-th a response to ``record_ids[i]``."""
    report = ResponseReport(responses=len(texts))
    for record_id, text in zip(record_ids, texts, strict=True):
        report.parsed += not isinstance(parse_response(text), Rejected)
        verdict = screens.judge(record_id, text)
        if verdict is None:
            report.no_screen[screens.unplaced[record_id]] += 1
            continue
        report.judged += 1
        if isinstance(verdict, Rejected):
            report.rejected[verdict.reason] += 1
        else:
            report.executable += 1
            report.as_recorded += verdict.type == screens.steps[record_id].gold.type
    return report


class ScreenJudge:
    """The trainer's response judge for a lake: each record's screen placed the first time it is asked
    for, then every response to it judged there (``trainer.run.ResponseJudge``)."""

    def __init__(self, lake: str | Path, settings: EnvironmentSettings | None = None) -> None:
        self.lake, self.settings = lake, settings
        self.screens = RecordScreens({}, {})

    def __call__(self, record_ids: Sequence[str], texts: Sequence[str]) -> dict[str, Any]:
        missing = [
            r
            for r in dict.fromkeys(record_ids)
            if r not in self.screens.steps and r not in self.screens.unplaced
        ]
        if missing:
            placed = record_screens(self.lake, missing, self.settings)
            self.screens = RecordScreens(
                {**self.screens.steps, **placed.steps}, {**self.screens.unplaced, **placed.unplaced}
            )
        return judge_responses(self.screens, record_ids, texts).as_json()
