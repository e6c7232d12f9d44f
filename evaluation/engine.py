"""The rollout engine: many sessions at once through one simulator, one trace line per finished episode.

A pool of live episodes (``batch_size``) is stepped together: each round asks the simulator for every
live prompt in one call, and a finished episode is written to the trace file at once and its place
taken by the next session. A simulator that answers prompts one at a time with many in flight (a
remote endpoint, :class:`~evaluation.simulators.ConcurrentSimulator`) drives its episodes
independently instead, so none waits for the slowest answer of a round.

A killed evaluation resumes from its trace file: the sessions already written there are skipped,
and a half-written last line is cut away first; a session that lost a request (an episode ended by
``error``, a replayed session with a step left without a prediction) is no result to keep, so it is
taken out of the file and asked again. A small run manifest
beside the traces records the simulator, its seed and sampling parameters and the environment's
settings; resuming under other parameters is refused, so one file never mixes two runs. The manifest
also adds up the simulator's traffic (HTTP requests, retries, errors by status) over every call that
wrote the file, for the report's L0 accounting.

Replay runs the simulator over each session's recorded states (``evaluation.replay``) and writes one
row per recorded step, the unscored ones with their reason; it resumes the same way, by session.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from evaluation.environment import EnvironmentSettings
from evaluation.replay import ReplayCursor, ScoredStep
from evaluation.rollout import Rollout
from evaluation.session import Session
from evaluation.simulators import (
    ConcurrentSimulator,
    NoAnswer,
    Simulator,
    answer_keyed,
    ask,
    deliver,
    rollout_key,
    step_all,
)
from evaluation.traces import ReplayStep, Trace, TraceProfile, TraceStep
from transforms.prompts import Accepted

DEFAULT_BATCH = 64
REPLAY_ERROR = "error"  # a replayed step's reason when the simulator gave no answer (its request failed)


class ManifestMismatch(ValueError):
    """A trace file was begun by a run with other parameters: resuming would mix two runs."""


@dataclass(frozen=True)
class RolloutSummary:
    """What one call wrote: sessions written now, sessions found finished and skipped, outputs asked
    (answered or not), those of them that got no answer, and the simulator's traffic meanwhile (None
    for a simulator that sends no requests)."""

    path: str
    written: int
    resumed: int
    outputs: int
    unanswered: int = 0
    traffic: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "written": self.written,
            "resumed": self.resumed,
            "outputs": self.outputs,
            "unanswered": self.unanswered,
            "traffic": self.traffic,
        }


def simulator_parameters(simulator: Simulator) -> dict[str, Any]:
    """The seed and sampling parameters a simulator declares (``parameters``), {} when it has none."""
    return dict(getattr(simulator, "parameters", None) or {})


def simulator_traffic(simulator: Simulator) -> dict[str, Any] | None:
    """The simulator's traffic counters so far (``traffic()``: nested counts), None when it has none."""
    traffic = getattr(simulator, "traffic", None)
    return traffic() if callable(traffic) else None


def counted(after: Any, before: Any) -> Any:
    """``after - before`` through nested dicts of counts (a key missing before counts 0); a count that
    did not change is left out, so an error this call never met is not listed."""
    if isinstance(after, dict):
        before = before or {}
        differences = {key: counted(value, before.get(key)) for key, value in after.items()}
        return {key: value for key, value in differences.items() if value != 0}
    return after - (before or 0)


def added(total: Any, more: Any) -> Any:
    """``total + more`` through nested dicts of counts (a key missing on one side counts 0)."""
    if isinstance(total, dict) or isinstance(more, dict):
        total, more = total or {}, more or {}
        return {key: added(total.get(key), more.get(key)) for key in {**total, **more}}
    return (total or 0) + (more or 0)


# --- resuming -----------------------------------------------------------------------------------


def lost_a_request(record: dict[str, Any]) -> bool:
    """A trace line written without one of its answers: an episode ended by ``error``, or a replayed
    step whose request failed."""
    return record.get("termination_reason") == "error" or record.get("reject_reason") == REPLAY_ERROR


def finished_sessions(path: Path) -> set[str]:
    """Session ids already written to ``path``, resumed as they are. A last line cut short by a kill is
    removed from the file, and so are the lines of every session that lost a request: it is asked
    again."""
    if not path.exists():
        return set()
    data = path.read_bytes()
    lines = [line for line in data[: data.rfind(b"\n") + 1].splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]
    redo = {record["session_id"] for record in records if lost_a_request(record)}
    kept = [line for line, record in zip(lines, records, strict=True) if record["session_id"] not in redo]
    complete = b"".join(line + b"\n" for line in kept)
    if complete != data:
        path.write_bytes(complete)
    return {record["session_id"] for record in records} - redo


def traces_manifest_path(traces: Path) -> Path:
    return traces.with_name(traces.stem + ".manifest.json")


def claim_manifest(traces: Path, run: dict[str, Any], sessions: int) -> dict[str, Any]:
    """Write (or, resuming, check and update) the manifest of ``traces``; returns what was written."""
    path = traces_manifest_path(traces)
    previous = json.loads(path.read_text()) if path.exists() and traces.exists() else None
    if previous is not None and previous["run"] != run:
        raise ManifestMismatch(
            f"{traces} was begun with {previous['run']}, not {run}: use another output folder"
        )
    now = datetime.now(UTC).isoformat()
    manifest = {
        "run": run,
        "sessions": sessions,
        "started_at": previous["started_at"] if previous else now,
        "resumed_at": [*previous.get("resumed_at", []), now] if previous else [],
        "traffic": previous.get("traffic") if previous else None,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def add_traffic(traces: Path, traffic: dict[str, Any] | None) -> None:
    """Add one call's traffic to the manifest's running total (nothing for a simulator without any)."""
    if traffic is None:
        return
    path = traces_manifest_path(traces)
    manifest = json.loads(path.read_text())
    manifest["traffic"] = added(manifest.get("traffic"), traffic)
    path.write_text(json.dumps(manifest, indent=2) + "\n")


def recorded_traffic(traces: str | Path) -> dict[str, Any] | None:
    """The traffic a trace file's manifest adds up over every call that wrote it (None: none sent)."""
    path = traces_manifest_path(Path(traces))
    return json.loads(path.read_text()).get("traffic") if path.exists() else None


def run_description(
    kind: str, source: str, simulator: Simulator, settings: EnvironmentSettings
) -> dict[str, Any]:
    return {
        "kind": kind,
        "source": source,
        "simulator": simulator_parameters(simulator),
        "environment": settings.model_dump(mode="json"),
    }


def begin(
    kind: str,
    sessions: Iterable[Session],
    simulator: Simulator,
    path: str | Path,
    source: str,
    settings: EnvironmentSettings | None,
) -> tuple[EnvironmentSettings, Path, list[Session], set[str]]:
    """Claim the manifest of a rollout or replay file; returns the settings, the path, the sessions
    and the ids of those the file already holds."""
    s, path, sessions = settings or EnvironmentSettings(), Path(path), list(sessions)
    claim_manifest(path, run_description(kind, source, simulator, s), len(sessions))
    return s, path, sessions, finished_sessions(path)


# --- rollout ------------------------------------------------------------------------------------


def trace_of(rollout: Rollout, source: str) -> Trace:
    """A finished episode as its trace line: every output with its verdict."""
    session = rollout.session
    return Trace(
        session_id=session.session_id,
        user_id=session.user_id or session.session_id,
        source=source,
        terminated=rollout.terminated,
        truncated=rollout.truncated,
        termination_reason=rollout.termination_reason,
        profile=TraceProfile(
            prior_clicks=session.prior_clicks,
            prior_buys=session.prior_buys,
            recent_click_categories=[c for c in session.recent_click_categories if c is not None],
        ),
        steps=[TraceStep.model_validate(a, from_attributes=True) for a in rollout.attempts],
        error=rollout.error,
    )


class TraceWriter:
    """Appends each finished episode to the trace file at once (a kill loses only those in flight)."""

    def __init__(self, handle: IO[str], source: str) -> None:
        self.handle, self.source, self.written, self.unanswered = handle, source, 0, 0

    def write(self, rollout: Rollout) -> None:
        self.handle.write(trace_of(rollout, self.source).model_dump_json() + "\n")
        self.handle.flush()
        self.written += 1
        # an episode ends at its first unanswered request: one per episode ended by error
        self.unanswered += rollout.termination_reason == "error"


def roll_out(
    sessions: Iterable[Session],
    simulator: Simulator,
    path: str | Path,
    *,
    source: str,
    settings: EnvironmentSettings | None = None,
    batch_size: int = DEFAULT_BATCH,
) -> RolloutSummary:
    """Roll every session out with ``simulator`` into the trace file ``path`` (appending, resumable).

    A :class:`ConcurrentSimulator` drives up to its concurrency of episodes independently; any other
    is asked for ``batch_size`` live episodes at a time.
    """
    s, path, sessions, done = begin("rollout", sessions, simulator, path, source, settings)
    waiting = deque(x for x in sessions if x.session_id not in done)
    resumed = len(sessions) - len(waiting)
    before = simulator_traffic(simulator)
    with path.open("a", encoding="utf-8") as handle:
        writer = TraceWriter(handle, source)
        try:
            if isinstance(simulator, ConcurrentSimulator):
                longest_first = deque(sorted(waiting, key=lambda x: len(x.steps), reverse=True))
                outputs = simulator.run(drive_concurrently(longest_first, s, simulator, writer))
            else:
                outputs = drive_in_batches(waiting, s, simulator, writer, batch_size)
        finally:  # a killed call's traffic still counts for the episodes it wrote
            traffic = counted(simulator_traffic(simulator), before) if before is not None else None
            add_traffic(path, traffic)
    return RolloutSummary(str(path), writer.written, resumed, outputs, writer.unanswered, traffic)


def drive_in_batches(
    waiting: deque[Session],
    settings: EnvironmentSettings,
    simulator: Simulator,
    writer: TraceWriter,
    size: int,
) -> int:
    """Rounds of up to ``size`` live episodes, a finished one replaced by the next; returns outputs."""
    live: list[Rollout] = []
    outputs = 0
    while waiting or live:
        while waiting and len(live) < size:
            live.append(Rollout(waiting.popleft(), settings))
        outputs += step_all(live, simulator)
        for rollout in (r for r in live if r.done):
            writer.write(rollout)
        live = [r for r in live if not r.done]
    return outputs


async def drive_concurrently(
    waiting: deque[Session],
    settings: EnvironmentSettings,
    simulator: ConcurrentSimulator,
    writer: TraceWriter,
) -> int:
    """As many episodes in flight as the simulator's concurrency, each stepping on its own answer.

    ``waiting`` comes longest recorded session first: a long episode started last would run on alone
    at the end, with the endpoint's other slots idle (its real length is the best guess of its
    simulated one)."""
    outputs = 0

    async def episodes() -> None:
        nonlocal outputs
        while waiting:
            rollout = Rollout(waiting.popleft(), settings)
            while not rollout.done:
                try:
                    output = await answer_keyed(simulator, rollout.messages(), rollout_key(rollout))
                except Exception as error:  # recorded in the episode, never raised past it
                    output = NoAnswer(f"{type(error).__name__}: {error}")
                deliver(rollout, output)
                outputs += 1
            writer.write(rollout)

    await asyncio.gather(*(episodes() for _ in range(simulator.concurrency)))
    return outputs


# --- replay -------------------------------------------------------------------------------------


def gold_columns(session_id: str, scored: ScoredStep) -> dict[str, Any]:
    gold, recorded = scored.gold, scored.recorded
    return {
        "session_id": session_id,
        "step_index": recorded.step,
        "screen": recorded.screen,
        "gt_action": gold.type,
        "gt_target_item_id": gold.target_item_id,
        "gt_target_title": gold.target_title,
        "gt_review_alias": gold.review_alias,
    }


def replay_row(session_id: str, scored: ScoredStep, output: str | NoAnswer) -> ReplayStep:
    """One scored recorded step beside the simulator's prediction there."""
    gold = gold_columns(session_id, scored)
    if isinstance(output, NoAnswer):
        return ReplayStep(**gold, accepted=False, reject_reason=REPLAY_ERROR, error=output.error)
    verdict = scored.judge(output)
    if not isinstance(verdict, Accepted):
        return ReplayStep(**gold, pred_action=verdict.type, accepted=False, reject_reason=verdict.reason,
                          detail=verdict.detail, raw_output=output)  # fmt: skip
    return ReplayStep(
        **gold,
        pred_action=verdict.type,
        pred_target_item_id=verdict.target_item_id,
        pred_target_title=verdict.target_title,
        pred_review_alias=verdict.review_alias,
        accepted=True,
        raw_output=output,
    )


def unscored_rows(cursor: ReplayCursor) -> list[ReplayStep]:
    """The recorded steps whose state could not be rebuilt: counted with their reason, not scored."""
    recorded = {step.step: step for step in cursor.session.steps}
    return [
        ReplayStep(
            session_id=cursor.session.session_id,
            step_index=index,
            screen=recorded[index].screen,
            gt_action=recorded[index].action,
            accepted=False,
            unscored_reason=reason,
        )
        for index, reason in cursor.skipped_steps
    ]


def replay(
    sessions: Iterable[Session],
    simulator: Simulator,
    path: str | Path,
    *,
    source: str,
    settings: EnvironmentSettings | None = None,
    batch_size: int = DEFAULT_BATCH,
) -> RolloutSummary:
    """Predict every recorded step of every session into the replay file ``path`` (appending, resumable).

    Sessions are taken a batch at a time and their scored steps asked together; a session's rows are
    written in one piece once all of them are predicted.
    """
    s, path, sessions, done = begin("replay", sessions, simulator, path, source, settings)
    waiting = [x for x in sessions if x.session_id not in done and x.steps]
    written = outputs = unanswered = 0
    before = simulator_traffic(simulator)
    with path.open("a", encoding="utf-8") as out:
        try:
            for start in range(0, len(waiting), batch_size):
                cursors = [ReplayCursor(x, s) for x in waiting[start : start + batch_size]]
                asked = [(c.session.session_id, step) for c in cursors for step in c]
                keys = [(session_id, step.recorded.step) for session_id, step in asked]
                answers = ask(simulator, [step.messages() for _, step in asked], keys) if asked else []
                outputs += len(asked)
                unanswered += sum(isinstance(answer, NoAnswer) for answer in answers)
                rows: dict[str, list[ReplayStep]] = {c.session.session_id: unscored_rows(c) for c in cursors}
                for (session_id, step), answer in zip(asked, answers, strict=True):
                    rows[session_id].append(replay_row(session_id, step, answer))
                for session_rows in rows.values():
                    ordered = sorted(session_rows, key=lambda row: row.step_index)
                    out.write("".join(row.model_dump_json() + "\n" for row in ordered))
                out.flush()
                written += len(cursors)
        finally:
            traffic = counted(simulator_traffic(simulator), before) if before is not None else None
            add_traffic(path, traffic)
    resumed = sum(x.session_id in done for x in sessions)
    return RolloutSummary(str(path), written, resumed, outputs, unanswered, traffic)
