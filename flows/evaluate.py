"""The evaluate flow: real traces from the lake, then per simulator a rollout and a replay, scored, and
the report (``report.json``, ``report.html``, a Prefect artifact) over all of them.

Every task takes paths and small settings and returns paths and small summaries; the traces stay on
disk under the output folder, so a killed evaluation run again with the same arguments resumes where
it stopped (the engine skips the sessions its trace files already hold).

Before anything is written every simulator spec is checked (``evaluation.preflight``: an endpoint
answers, a checkpoint folder holds a model). A phase (rollout or replay) whose requests mostly went
unanswered (more than ``max_unanswered_share`` of them, after retries) stops the run with
:class:`TooManyUnanswered`: its figures would describe the failures, not the simulator, so no report is
left behind; the traces stay, and the same command run again resumes, asking the lost requests again.
Every simulator, language models and the A/B effect's arms alike, answers with the one ``sampling``.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from evaluation.engine import DEFAULT_BATCH, recorded_traffic, replay, roll_out
from evaluation.environment import EnvironmentSettings
from evaluation.loader import load_sessions
from evaluation.preflight import check_specs
from evaluation.report import EFFECT_KEYS, REPORT_FILES, comparison_markdown, training_runs, write_report
from evaluation.scorecard import replay_accounting, rollout_accounting
from evaluation.simulators import Sampling, Simulator, StateSimulator, simulator_for_lake
from evaluation.trace_frames import load_replay, load_traces, unanswered_errors
from flows.evaluate_folder import scored_run
from flows.preflight import checkpoint_spec_problem
from flows.score import export_real_traces, score_files
from transforms.lake import world_path
from transforms.records import recorded_prompt_settings
from worlds.alignment import alignment_report
from worlds.shoppers import effect_for_lake, held_out_users, world_from_lake


def world_problem(argument: str, lake: Path, sampling: Sampling) -> str | None:
    if not world_path(lake).is_file():
        return f"{lake} was not generated from a synthetic world (it has no {world_path(lake).name})"
    return None


#: the synthetic world's shoppers, handed to the evaluation where it builds a spec's simulator
#: (evaluation/ never imports synthetic/), and the flows' checks of the specs over its own
WORLD_SIMULATORS = {"world": world_from_lake}
FLOW_SPEC_CHECKS = {"world": world_problem, "checkpoint": checkpoint_spec_problem}


def lake_simulator(spec: str, lake: str | Path, sampling: Sampling | None = None) -> Simulator:
    """The simulator ``spec`` names for an evaluation of ``lake``, the world's shoppers included."""
    return simulator_for_lake(spec, lake, sampling, WORLD_SIMULATORS)


def check_flow_specs(specs: list[str], lake: str | Path, sampling: Sampling) -> None:
    """Every spec checked as ``evaluation.preflight.check_specs`` does, the world's included."""
    check_specs(specs, lake, sampling, WORLD_SIMULATORS, FLOW_SPEC_CHECKS)


REAL_TRACES = "real.jsonl"
MAX_UNANSWERED_SHARE = 0.2  # more of a phase's requests unanswered than this stops the run
COMMON_ERRORS = 3  # error texts named when a run stops


class TooManyUnanswered(ValueError):
    """A phase of one simulator got no answer to too many of its requests to be scored."""


def close(simulator: Simulator) -> None:
    """Release what a simulator holds (an HTTP client, a model's memory); nothing for one without."""
    if closer := getattr(simulator, "close", None):
        closer()


def no_effect(lake: str, spec: str, out: str) -> dict[str, object]:
    """No A/B effect estimate: effect_ratio, effect_error and effect_ci stay null."""
    return dict.fromkeys(EFFECT_KEYS)


def world_effect(
    lake: str, spec: str, split: str, users: int | None, sampling: Sampling | None = None
) -> dict[str, object]:
    """The A/B effect fidelity of ``spec`` answering with ``sampling`` on a lake generated from a world
    (the first ``users`` held-out users split in halves under the two ranking policies); null figures
    for a lake of real logs, whose true effect no one knows."""
    if not world_path(lake).is_file():
        return no_effect(lake, spec, "")
    held_out = held_out_users(lake, split)
    world = world_from_lake(lake, sampling)
    # the world as the simulator must be the world that plays the arms: it learns each arm's sessions
    simulator = world if spec == "world" else lake_simulator(spec, lake, sampling)
    chosen = held_out[:users] if users else held_out
    try:
        result = effect_for_lake(lake, simulator, world, split=split, users=chosen)
    finally:
        close(simulator)
    return {key: {**result.as_dict(), "effect_users": result.users}[key] for key in EFFECT_KEYS}


def trace_name(spec: str) -> str:
    """A file-name stem for a spec: its readable characters, and a hash so two specs never share one."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", spec).strip("_")[:60]
    return f"{readable}-{hashlib.sha256(spec.encode()).hexdigest()[:8]}"


def evaluated_ids(lake: str, split: str, sessions: int | None) -> list[str]:
    """The sessions of ``split`` rolled out: uncut ones (a cut session is no whole-session reference),
    the first ``sessions`` of them by id when a number is given."""
    found = load_sessions(lake, split=split)
    ids = [s.session_id for s in found if s.cut_reason is None]
    return ids[:sessions] if sessions is not None else ids


def keep_sessions(path: Path, session_ids: list[str]) -> int:
    """Rewrite a trace file with only the lines of ``session_ids``; returns the lines kept."""
    wanted = set(session_ids)
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    kept = [line for line in lines if json.loads(line)["session_id"] in wanted]
    path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
    return len(kept)


def phase_accounting(kind: str, path: str) -> dict[str, Any]:
    """The L0 accounting of one trace file (``kind`` rollout or replay): its outputs by verdict, its
    episodes by ending, its unanswered requests with what they failed with, and the simulator's
    traffic over every call that wrote the file (None for a simulator that sends no requests)."""
    counts = (
        rollout_accounting(load_traces(path)) if kind == "rollout" else replay_accounting(load_replay(path))
    )
    return {**counts, "unanswered_errors": unanswered_errors(path, kind), "traffic": recorded_traffic(path)}


def discard_report(out: str) -> None:
    """Remove the report files of ``out`` (an earlier run's), so none is read as this run's result."""
    for name in REPORT_FILES:
        (Path(out) / name).unlink(missing_ok=True)


def stop_if_unanswered(spec: str, kind: str, counts: dict[str, Any], share: float, out: str) -> None:
    """Stop the run when more than ``share`` of a phase's requests went unanswered, naming how many and
    the most common errors, and leaving no report."""
    requests, unanswered = counts["requests"], counts["unanswered"]
    if not requests or unanswered / requests <= share:
        return
    discard_report(out)
    common = list(counts["unanswered_errors"].items())[:COMMON_ERRORS]
    why = "; ".join(f"{n} × {text}" for text, n in common)
    raise TooManyUnanswered(
        f"{spec}: {unanswered} of {requests} {kind} requests got no answer after retries ({why}), more "
        f"than {share:.0%}: no report written; the traces stay in {out}, and the same command run again "
        "resumes, asking the unanswered requests again"
    )


@task(name="check-simulators", cache_policy=NO_CACHE)
def check_simulators(lake: str, simulators: list[str], sampling: dict[str, Any]) -> None:
    """Every spec parsed and its endpoint or checkpoint checked, before a trace is written."""
    check_flow_specs(simulators, lake, Sampling(**sampling))


@task(name="export-real-traces", cache_policy=NO_CACHE)
def real_traces(lake: str, out: str, split: str, session_ids: list[str]) -> dict[str, Any]:
    path = Path(out) / REAL_TRACES
    exported = export_real_traces(lake, path, [split])
    return {**exported, "path": str(path), "sessions": keep_sessions(path, session_ids)}


@task(name="simulate", cache_policy=NO_CACHE)
def simulate(
    lake: str,
    spec: str,
    out: str,
    session_ids: list[str],
    sampling: dict[str, Any],
    batch_size: int,
    max_unanswered_share: float = MAX_UNANSWERED_SHARE,
) -> dict[str, Any]:
    """Rollout and replay traces of one simulator over the chosen sessions (resuming what is there), in
    prompts the lake's records were rendered with (the ones a trained simulator was shown) and the
    geometry the lake was ingested with; each phase's L0 accounting, the run stopped after a phase
    that went mostly unanswered."""
    settings = EnvironmentSettings(prompt=recorded_prompt_settings(lake))
    sessions = load_sessions(lake, session_ids, settings=settings)
    simulator = lake_simulator(spec, lake, Sampling(**sampling))
    stem = Path(out) / trace_name(spec)
    summaries, accounts = {}, {}
    try:
        summaries["rollout"] = roll_out(sessions, simulator, f"{stem}.rollout.jsonl", source=spec,
                                        settings=settings, batch_size=batch_size)  # fmt: skip
        accounts["rollout"] = phase_accounting("rollout", f"{stem}.rollout.jsonl")
        stop_if_unanswered(spec, "rollout", accounts["rollout"], max_unanswered_share, out)
        # a simulator that reads the environment's state (the world) has no answer for a replayed prompt
        if not isinstance(simulator, StateSimulator):
            summaries["replay"] = replay(sessions, simulator, f"{stem}.replay.jsonl", source=spec,
                                         settings=settings, batch_size=batch_size)  # fmt: skip
            accounts["replay"] = phase_accounting("replay", f"{stem}.replay.jsonl")
            stop_if_unanswered(spec, "replay", accounts["replay"], max_unanswered_share, out)
    finally:
        close(simulator)
    written = {
        kind: summaries[kind].as_dict() if kind in summaries else None for kind in ("rollout", "replay")
    }
    return {**written, "accounting": {kind: accounts.get(kind) for kind in ("rollout", "replay")}}


@task(name="score-simulator", cache_policy=NO_CACHE)
def score_simulator(real: str, traces: dict[str, Any]) -> dict[str, Any]:
    replayed = traces["replay"]["path"] if traces["replay"] else None
    return score_files(real, traces["rollout"]["path"], replayed)


@task(name="estimate-effect", cache_policy=NO_CACHE)
def estimate_effect(
    lake: str, spec: str, split: str, users: int | None, sampling: dict[str, Any]
) -> dict[str, object]:
    return world_effect(lake, spec, split, users, Sampling(**sampling))


@task(name="align-decisions", cache_policy=NO_CACHE)
def align_decisions(lake: str, real: str, simulators: dict[str, str]) -> dict[str, Any]:
    return alignment_report(lake, real, simulators)


@task(name="training-runs", cache_policy=NO_CACHE)
def training(simulators: list[str], out: str) -> dict[str, Any]:
    """The training run behind each checkpoint simulator that is a trajforge run, its curves drawn."""
    return training_runs(simulators, out)


@task(name="write-report", cache_policy=NO_CACHE)
def report(out: str, content: dict[str, Any], traces: dict[str, str]) -> dict[str, str]:
    paths = write_report(out, content, traces)
    create_markdown_artifact(
        key="evaluation-report",
        markdown=comparison_markdown(content, paths["html"]),
        description=f"evaluation report: {paths['html']}",
    )
    return paths


@flow(name="evaluate", persist_result=False)  # its tasks' results stay in memory
def evaluate_flow(
    lake: str,
    simulators: list[str],
    out: str,
    split: str = "test",
    sessions: int | None = None,
    sampling: dict[str, Any] | None = None,
    batch_size: int = DEFAULT_BATCH,
    effect: bool = True,
    effect_users: int | None = None,
    max_unanswered_share: float = MAX_UNANSWERED_SHARE,
) -> dict[str, Any]:
    """Every simulator against the real sessions of ``split``: traces, report.json, report.html; on a
    lake generated from a world, each simulator's decision alignment and, with ``effect``, its A/B effect
    fidelity over the first ``effect_users`` held-out users (all by default). A simulator with more
    than ``max_unanswered_share`` of a phase's requests unanswered stops the run, leaving no report."""
    sampling = Sampling(**(sampling or {})).model_dump()
    check_simulators(lake, simulators, sampling)
    chosen = evaluated_ids(lake, split, sessions)
    real = real_traces(lake, out, split, chosen)
    written, figures, effects = {}, {}, {}
    for spec in simulators:
        written[spec] = scored_run(
            simulate(lake, spec, out, chosen, sampling, batch_size, max_unanswered_share), chosen
        )
        figures[spec] = score_simulator(real["path"], written[spec])
        effects[spec] = (
            estimate_effect(lake, spec, split, effect_users, sampling)
            if effect
            else no_effect(lake, spec, out)
        )
    alignment = align_decisions(
        lake, real["path"], {spec: w["rollout"]["path"] for spec, w in written.items()}
    )
    scored = {
        spec: {**figures[spec], **alignment["simulators"].get(spec, {}), **effects[spec]}
        for spec in simulators
    }
    content = {
        "lake": lake,
        "split": split,
        "real": {key: real[key] for key in ("path", "sessions", "cut_sessions_left_out")},
        "simulators": scored,
        "decision_alignment": alignment["reference"],
        "traces": {
            spec: {kind: w[kind]["path"] for kind in ("rollout", "replay") if w[kind]}
            for spec, w in written.items()
        },
        "accounting": {spec: w["accounting"] for spec, w in written.items()},
        "runs": {spec: {kind: w[kind] for kind in ("rollout", "replay")} for spec, w in written.items()},
        "training": training(simulators, out),
    }
    rollouts = {"real": real["path"], **{spec: w["rollout"]["path"] for spec, w in written.items()}}
    return {**report(out, content, rollouts), "report": content}
