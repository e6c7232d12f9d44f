"""The fidelity study: what OPTD adds over SFT, its ablations and the baselines, with intervals.

    python bench/fidelity.py                       # the full study -> bench/results/fidelity.{json,html}
    python bench/fidelity.py --quick --out DIR     # the same code at toy size (the test suite runs it)

One synthetic world (its shoppers are the ground truth), one lake built by the product's pipeline
with the main job's prompts; then for each training seed:

- ``sft``: the SFT teacher (the main job's training);
- ``optd``: OPTD from it, the paper's recipe (OPTD.md);
- ``optd_no_trust_region``: lambda = 1 on every token; ``optd_no_grounding``: gamma = 0;
  ``optd_plain_teacher``: the teacher scores without the intent (self-distillation);
- ``optd_intent_teacher``: the remedy for a teacher that cannot read an intent: the SFT teacher trained
  on with the intent in a share of its prompts (``teacher_intent_share``), the student still starting
  from the plain SFT checkpoint.

Every arm, and ``markov``, ``random`` and ``world``, is rolled out and replayed on the same held-out test
sessions with the protocol's sampling, and its A/B effect measured on the same held-out users. A figure
is the mean over the seeds; its 95 % interval comes from resampling the sessions (the same resample for
every seed and arm; the A/B effect resamples the users). The privileged signal's diagnostics per arm:
the teacher's gold NLL without minus with the intent on the probe states (the intent gain, nats/token),
and the mean over updates of lambda*, the binding share and the guidance KL.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import polars as pl  # noqa: E402
from hostinfo import describe as machine  # noqa: E402 - bench/ is the script's folder

from evaluation.effect import pooled_effect_fidelity  # noqa: E402
from evaluation.executable import ScreenJudge  # noqa: E402
from evaluation.report import PAPER_METRICS, better_than  # noqa: E402
from evaluation.scorecard import score  # noqa: E402
from evaluation.simulators import Sampling, simulator_for_lake  # noqa: E402
from evaluation.traces import TraceFrames, load_replay, load_traces  # noqa: E402

TRAINED = ("sft", "optd", "optd_no_trust_region", "optd_no_grounding", "optd_plain_teacher",
           "optd_intent_teacher")  # fmt: skip
BASELINES = ("markov", "random", "world")
VARIANTS: dict[str, dict[str, Any]] = {
    "optd": {},
    "optd_no_trust_region": {"trust_region": False},
    "optd_no_grounding": {"gamma": 0.0},
    "optd_plain_teacher": {"teacher_sees_intent": False},
    "optd_intent_teacher": {},
}
METRICS = ("RVA", "OVA", *(m for m, _ in PAPER_METRICS))
EFFECT = ("effect_ratio", "effect_error")
PAPER_EFFECT_ERROR = 0.287  # UserArena Table 3: OPTD's effect ratio 0.713


@dataclass(frozen=True)
class StudySize:
    """How big the study is: the world, the evaluation, the training of every arm."""

    users: int
    sessions: int  # held-out test sessions rolled out and replayed
    effect_users: int  # held-out users in the A/B test
    seeds: tuple[int, ...]
    resamples: int
    train: dict[str, Any]  # [train] values over the main job's
    optd: dict[str, Any]  # [optd] values over the main job's
    intent_teacher: dict[str, Any]  # the remedy teacher: training on from the SFT teacher
    max_new_tokens: int = 96
    world_seed: int = 11
    sampling: dict[str, Any] = field(default_factory=lambda: {"temperature": 1.0, "top_p": 0.95, "seed": 42})


FULL = StudySize(
    users=2000,
    sessions=200,
    effect_users=40,
    seeds=(0, 1, 2),
    resamples=200,
    train={},
    # OPTD at 1e-3, where its guidance moves the student within the demo's 10 updates (the demo runs
    # it at 1e-4, where it moves the student less: bench/RESULTS.md, "tenth round")
    optd={"lr": 1e-3},
    intent_teacher={"steps": 150, "teacher_intent_share": 0.5, "warmup_steps": 0, "lr": 2e-3},
)
QUICK = StudySize(
    users=40,
    sessions=6,
    effect_users=6,
    seeds=(0, 1),
    resamples=10,
    train={
        "steps": 8,
        "eval_every": 0,
        "held_out_states": 6,
        "held_out_sampled": 3,
        "probe_states": 3,
        "tiny": {
            "vocab_size": 400,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 1,
            "num_kv_heads": 1,
            "num_layers": 1,
        },
    },
    optd={"steps": 1, "rollout_sampling": {"temperature": 0.8, "top_p": 1.0, "max_new_tokens": 16}},
    intent_teacher={"steps": 2, "teacher_intent_share": 0.5, "warmup_steps": 0},
    max_new_tokens=16,
)


def merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``extra`` over ``base``, nested tables merged key by key."""
    out = dict(base)
    for key, value in extra.items():
        out[key] = merged(out.get(key, {}), value) if isinstance(value, dict) else value
    return out


# --- the lake -------------------------------------------------------------------------------------


def build_lake(work: Path, size: StudySize) -> Path:
    """The world's logs through the product's pipeline (ingest, chain, records, extraction), with the
    main job's prompts; a lake already built there is reused."""
    from flows.main_job import demo_records
    from flows.pipeline import pipeline_flow
    from synthetic.bundle import write_bundle

    lake = work / "lake"
    if (lake / "records").is_dir():
        return lake
    write_bundle(work / "raw", users=size.users, seed=size.world_seed, fmt="parquet", overwrite=True)
    pipeline_flow(str(work / "raw"), str(lake), records=demo_records())
    return lake


# --- training ----------------------------------------------------------------------------------------


@dataclass
class SeedRuns:
    """One seed's checkpoints (arm -> folder) and the privileged signal's diagnostics (arm -> figures)."""

    checkpoints: dict[str, str]
    diagnostics: dict[str, dict[str, float | None]]
    run_dirs: dict[str, str]
    seconds: dict[str, float]


def sft_values(size: StudySize, seed: int) -> dict[str, Any]:
    from flows.main_job import DEMO_TRAINING, demo_tiny

    values = merged(merged(DEMO_TRAINING, size.train), {"seed": seed})
    return values | {"tiny": demo_tiny(size.train.get("tiny", {}))}


def diagnostics_of(summary: Any, teacher_gain: float | None) -> dict[str, float | None]:
    means = (summary.stage_figures or {}).get("updates_mean") or {}
    return {
        "intent_gain_nats": teacher_gain,
        "mean_lambda": means.get("mean_lambda"),
        "binding_share": means.get("binding_share"),
        "guidance_kl": means.get("guidance_kl"),
    }


def sft_diagnostics(summary: Any) -> dict[str, float | None]:
    """The SFT arm's figures: its own intent gain on the probe states, no OPTD updates to average."""
    gain = (summary.held_out_end or {}).get("probe_intent_gain")
    return {"intent_gain_nats": gain, "mean_lambda": None, "binding_share": None, "guidance_kl": None}


def optd_diagnostics(summary: Any) -> dict[str, float | None]:
    """An OPTD arm's figures: its teacher's intent gain, and the means over its updates."""
    return diagnostics_of(summary, (summary.held_out_start or {}).get("teacher_probe_intent_gain"))


def finished_run(folder: Path, resume: bool) -> Any:
    """With ``--resume``, the summary of a run this study finished in ``folder`` (a run writes its
    summary once, when it ends), else None: the run is trained."""
    from trainer.run import TrainSummary
    from trainer.run_folder import SUMMARY_FILE

    path = folder / SUMMARY_FILE
    return TrainSummary(**json.loads(path.read_text())) if resume and path.is_file() else None


def train_seed(lake: Path, work: Path, size: StudySize, seed: int, resume: bool = False) -> SeedRuns:
    from flows.main_job import DEMO_OPTD
    from trainer.config import TrainSettings, optd_settings
    from trainer.optd_run import run_optd
    from trainer.run import run_sft

    judge, root, seconds = ScreenJudge(lake), work / f"seed-{seed}", {}
    train = sft_values(size, seed)
    started = time.perf_counter()
    # the study's run folders are its own: a rerun replaces its runs, unless it resumes the study
    teacher = finished_run(root / "sft", resume) or run_sft(
        TrainSettings(**train), lake, root / "sft", progress=False, judge=judge, overwrite=True
    )
    intent_values = merged(train, size.intent_teacher)
    intent = finished_run(root / "intent-teacher", resume) or run_sft(
        TrainSettings(**intent_values), lake, root / "intent-teacher", base=teacher.checkpoint,
        progress=False, judge=judge, overwrite=True)  # fmt: skip
    seconds["sft"] = time.perf_counter() - started
    checkpoints, run_dirs = {"sft": teacher.checkpoint}, {"sft": str(root / "sft")}
    diagnostics = {"sft": sft_diagnostics(teacher)}
    optd = merged(DEMO_OPTD, size.optd)
    for arm, variant in VARIANTS.items():
        started = time.perf_counter()
        source = intent.checkpoint if arm == "optd_intent_teacher" else teacher.checkpoint
        settings = optd_settings(train, merged(optd, variant))
        summary = finished_run(root / arm, resume) or run_optd(
            settings, lake, root / arm, source, progress=False, judge=judge, student=teacher.checkpoint,
            overwrite=True)  # fmt: skip
        checkpoints[arm], run_dirs[arm] = summary.checkpoint, str(root / arm)
        diagnostics[arm] = optd_diagnostics(summary)
        seconds[arm] = time.perf_counter() - started
    return SeedRuns(checkpoints, diagnostics, run_dirs, seconds)


# --- evaluation --------------------------------------------------------------------------------------


@dataclass
class SeedTraces:
    """One seed's traces per simulator (rollout, replay) and its A/B counts per simulator."""

    rollouts: dict[str, str]
    replays: dict[str, str | None]
    effects: dict[str, pl.DataFrame | None]
    seconds: dict[str, float]


def specs_of(runs: SeedRuns, seed: int) -> dict[str, str]:
    """arm -> simulator spec: the checkpoints, then the baselines (random drawing from the seed)."""
    specs = {arm: f"checkpoint:{path}" for arm, path in runs.checkpoints.items()}
    return specs | {"markov": "markov", "random": f"random:{seed}", "world": "world"}


@dataclass
class ABTest:
    """The A/B test's two arms, built once for a study: every simulator and seed rolls out on them
    (the world that played the arms' real shoppers is the ``world`` simulator too)."""

    world: Any
    arms: list[Any]
    environment: Any
    users: list[str]

    @classmethod
    def build(cls, lake: Path, users: list[str]) -> ABTest:
        from worlds.shoppers import ab_arms, world_from_lake

        world = world_from_lake(lake)
        arms, environment = ab_arms(lake, world, users)
        return cls(world, arms, environment, list(users))


def effect_counts(lake: Path, spec: str, sampling: Sampling, ab: ABTest) -> pl.DataFrame | None:
    """Per-user real and simulated counts of the A/B test for one simulator."""
    from worlds.shoppers import effect_on_arms

    simulator = ab.world if spec == "world" else simulator_for_lake(spec, lake, sampling)
    try:
        return effect_on_arms(ab.arms, ab.environment, simulator).counts
    finally:
        if close := getattr(simulator, "close", None):
            close()


def kept_counts(path: Path, users: list[str]) -> pl.DataFrame | None:
    """The A/B counts a resumed study measured before in ``path``, if they cover the same users."""
    if not path.is_file():
        return None
    counts = pl.read_parquet(path)
    return counts if set(counts["user_id"].unique().to_list()) == set(users) else None


def evaluate_seed(
    lake: Path,
    work: Path,
    size: StudySize,
    runs: SeedRuns,
    seed: int,
    sessions: list[str],
    ab: ABTest,
    resume: bool = False,
) -> SeedTraces:
    """Every simulator's traces and A/B counts for one seed; each arm's counts are written beside its
    traces, and a resumed study keeps those it finished."""
    from flows.evaluate import simulate

    out = work / f"seed-{seed}" / "evaluation"
    sampling = {**size.sampling, "max_new_tokens": size.max_new_tokens}
    traces = SeedTraces({}, {}, {}, {})
    for arm, spec in specs_of(runs, seed).items():
        started = time.perf_counter()
        written = simulate.fn(str(lake), spec, str(out), sessions, sampling, 64)
        traces.rollouts[arm] = written["rollout"]["path"]
        traces.replays[arm] = written["replay"]["path"] if written["replay"] else None
        counts_path = out / f"ab-counts-{arm}.parquet"
        counts = kept_counts(counts_path, ab.users) if resume else None
        if counts is None:
            counts = effect_counts(lake, spec, Sampling(**sampling), ab)
            if counts is not None:
                counts.write_parquet(counts_path)
        traces.effects[arm] = counts
        traces.seconds[arm] = time.perf_counter() - started
    return traces


# --- figures with intervals ----------------------------------------------------------------------------


def drawn(draws: pl.DataFrame, rows: pl.DataFrame, step: str | None) -> pl.DataFrame:
    """``rows`` of the drawn sessions, each draw under its own id, in the draws' order and each draw's rows
    in step order: the scores walk a session's steps row by row, and a join alone interleaves the rows of
    a session drawn twice."""
    ordered = draws.with_row_index("draw_order").join(rows, on="session_id")
    ordered = ordered.sort(["draw_order", step] if step else "draw_order", maintain_order=True)
    return ordered.drop("session_id", "draw_order").rename({"draw": "session_id"}).select(rows.columns)


def resampled(frames: TraceFrames, draws: pl.DataFrame) -> TraceFrames:
    """The sessions of one resample (``draws``: session_id -> a new id per draw), steps with them."""
    return TraceFrames(drawn(draws, frames.sessions, None), drawn(draws, frames.steps, "step"))


def resampled_replay(replay: pl.DataFrame | None, draws: pl.DataFrame) -> pl.DataFrame | None:
    return None if replay is None else drawn(draws, replay, "step_index")


def headline(real: TraceFrames, sim: TraceFrames, replay: pl.DataFrame | None) -> dict[str, float | None]:
    figures = score(real, sim, replay, supplementary=False)
    return {m: (None if figures[m] is None else float(figures[m])) for m in METRICS}


def mean_over(values: Sequence[dict[str, float | None]]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for metric in METRICS:
        present = [v[metric] for v in values if v[metric] is not None]
        out[metric] = float(np.mean(present)) if present else None
    return out


def draws_of(session_ids: list[str], rng: np.random.Generator) -> pl.DataFrame:
    picked = rng.integers(0, len(session_ids), len(session_ids))
    return pl.DataFrame(
        {
            "session_id": [session_ids[i] for i in picked],
            "draw": [f"{session_ids[i]}#{k}" for k, i in enumerate(picked)],
        }
    )


def with_intervals(
    real: TraceFrames,
    arms: dict[str, list[tuple[TraceFrames, pl.DataFrame | None]]],
    resamples: int,
    seed: int = 0,
) -> dict[str, dict[str, dict[str, float | None]]]:
    """arm -> metric -> mean over the seeds, and the 95 % percentile interval of that mean over
    resamples of the sessions (one resample shared by every arm and seed)."""
    point = {
        arm: mean_over([headline(real, sim, replay) for sim, replay in runs]) for arm, runs in arms.items()
    }
    rng = np.random.default_rng(seed)
    session_ids = real.sessions["session_id"].to_list()
    samples: dict[str, list[dict[str, float | None]]] = {arm: [] for arm in arms}
    for _ in range(resamples):
        draws = draws_of(session_ids, rng)
        real_b = resampled(real, draws)
        for arm, runs in arms.items():
            per_seed = [
                headline(real_b, resampled(sim, draws), resampled_replay(rep, draws)) for sim, rep in runs
            ]
            samples[arm].append(mean_over(per_seed))
    return {arm: {m: interval(point[arm][m], [s[m] for s in samples[arm]]) for m in METRICS} for arm in arms}


def interval(mean: float | None, values: list[float | None]) -> dict[str, float | None]:
    present = [v for v in values if v is not None]
    if mean is None or not present:
        return {"mean": mean, "lo": None, "hi": None}
    low, high = np.quantile(present, [0.025, 0.975])
    return {"mean": mean, "lo": float(low), "hi": float(high)}


def effect_intervals(counts: list[pl.DataFrame | None], resamples: int) -> dict[str, dict[str, float | None]]:
    present = [c for c in counts if c is not None]
    if not present:
        return {key: {"mean": None, "lo": None, "hi": None} for key in EFFECT}
    pooled = pooled_effect_fidelity(present, resamples=max(resamples, 1000), seed=0)
    error_ci = pooled.error_ci or (None, None)
    return {
        "effect_ratio": {"mean": pooled.ratio, "lo": pooled.ci[0], "hi": pooled.ci[1]},
        "effect_error": {"mean": pooled.error, "lo": error_ci[0], "hi": error_ci[1]},
    }


# --- the study ----------------------------------------------------------------------------------------


def goals(simulators: dict[str, dict[str, dict[str, float | None]]]) -> dict[str, Any]:
    """The study's targets, beyond the paper: markov beats random on >= 6 of 8; OPTD is at least SFT on
    >= 6 of 8; OPTD's effect error below the paper's 0.287."""
    means = {arm: {m: v["mean"] for m, v in figures.items()} for arm, figures in simulators.items()}
    markov = better_than(means["markov"], means["random"])
    worse = better_than(means["sft"], means["optd"])  # SFT strictly better: OPTD not at least SFT
    at_least = {m: (None if v is None else not v) for m, v in worse.items()}
    error = means["optd"].get("effect_error")

    def tally(figures: dict[str, bool | None]) -> dict[str, Any]:
        return {"figures": figures, "count": sum(bool(v) for v in figures.values()), "needed": 6}

    return {
        "markov_beats_random": tally(markov),
        "optd_at_least_sft": tally(at_least),
        "optd_effect_error_below_paper": {"value": error, "paper": PAPER_EFFECT_ERROR,
                                          "met": error is not None and error < PAPER_EFFECT_ERROR},
    }  # fmt: skip


def run_study(
    size: StudySize, work: Path, out: Path, log: Callable[[str], None] = print, resume: bool = False
) -> dict[str, Any]:
    """The study; ``resume``: runs finished in ``work`` are kept and traces there continued (a study cut
    short goes on where it stopped, its A/B counts too)."""
    from flows.evaluate import evaluated_ids, real_traces
    from worlds.shoppers import held_out_users

    started = time.perf_counter()
    lake = build_lake(work, size)
    log(f"lake {lake} in {time.perf_counter() - started:.0f}s")
    sessions = evaluated_ids(str(lake), "test", size.sessions)
    users = held_out_users(str(lake), "test")[: size.effect_users]
    real = real_traces.fn(str(lake), str(work / "real"), "test", sessions)
    ab = ABTest.build(lake, users)
    per_seed: dict[int, tuple[SeedRuns, SeedTraces]] = {}
    for seed in size.seeds:
        runs = train_seed(lake, work, size, seed, resume)
        log(f"seed {seed}: trained {', '.join(f'{k} {v:.0f}s' for k, v in runs.seconds.items())}")
        traces = evaluate_seed(lake, work, size, runs, seed, sessions, ab, resume)
        log(f"seed {seed}: evaluated {', '.join(f'{k} {v:.0f}s' for k, v in traces.seconds.items())}")
        per_seed[seed] = (runs, traces)
    result = study_result(size, sessions, users, real["path"], per_seed, started)
    result["resumed"] = resume  # its seconds are then this run's, not those of the runs it kept
    write_study(result, out)
    return result


def study_result(
    size: StudySize,
    sessions: list[str],
    users: list[str],
    real: str,
    per_seed: dict[int, tuple[SeedRuns, SeedTraces]],
    started: float,
    machine_line: str | None = None,
) -> dict[str, Any]:
    """The study's figures from every seed's traces (``real``: the real traces' file): each arm's
    figures with intervals, its A/B effect, the diagnostics and the goals; ``started`` is the study's
    ``time.perf_counter()`` at its start, ``machine_line`` where it ran (default: this machine)."""
    arms = (*TRAINED, *BASELINES)
    frames = {
        arm: [(load_traces(t.rollouts[arm]), load_replay(t.replays[arm]) if t.replays[arm] else None)
              for _, t in per_seed.values()]
        for arm in arms
    }  # fmt: skip
    scoring = time.perf_counter()
    simulators = with_intervals(load_traces(real), frames, size.resamples)
    for arm in arms:
        simulators[arm] |= effect_intervals([t.effects[arm] for _, t in per_seed.values()], size.resamples)
    result = {
        "users": size.users,
        "sessions": len(sessions),
        "effect_users": len(users),
        "seeds": list(size.seeds),
        "resamples": size.resamples,
        "simulators": simulators,
        "diagnostics": {
            arm: mean_diagnostics([r.diagnostics[arm] for r, _ in per_seed.values()]) for arm in TRAINED
        },
        "goals": None,
        "size": asdict(size),
        "machine": machine_line or machine(),
        "seconds": {"total": time.perf_counter() - started, "scoring": time.perf_counter() - scoring},
        "run_dirs": {str(s): r.run_dirs for s, (r, _) in per_seed.items()},
    }
    result["goals"] = goals(simulators)
    return result


def write_study(result: dict[str, Any], out: Path, name: str = "fidelity") -> tuple[Path, Path]:
    """``OUT/NAME.json`` and the page ``OUT/NAME.html``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    from fidelity_report import write_html

    return out / f"{name}.json", write_html(result, out / f"{name}.html")


def mean_diagnostics(values: list[dict[str, float | None]]) -> dict[str, float | None]:
    keys = ("intent_gain_nats", "mean_lambda", "binding_share", "guidance_kl")
    out: dict[str, float | None] = {}
    for key in keys:
        present = [v[key] for v in values if v.get(key) is not None]
        out[key] = float(np.mean(present)) if present else None
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="toy size, minutes: the tests' run")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--work", type=Path, default=None, help="lake and runs (default: OUT/.fidelity-work)")
    parser.add_argument("--seeds", type=int, nargs="+", default=None)
    parser.add_argument("--users", type=int, default=None)
    parser.add_argument("--sessions", type=int, default=None)
    parser.add_argument("--effect-users", type=int, default=None)
    parser.add_argument("--resume", action="store_true", help="keep the runs and traces finished in --work")
    args = parser.parse_args(argv)
    size = QUICK if args.quick else FULL
    changes = {
        "seeds": tuple(args.seeds) if args.seeds else None,
        "users": args.users,
        "sessions": args.sessions,
        "effect_users": args.effect_users,
    }
    size = replace(size, **{k: v for k, v in changes.items() if v is not None})
    work = args.work or args.out / ".fidelity-work"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    result = run_study(size, work, args.out, resume=args.resume)
    print(json.dumps(result["goals"], indent=2))
    written = f"{args.out / 'fidelity.json'}, {args.out / 'fidelity.html'}"
    print(f"written: {written} in {result['seconds']['total']:.0f}s")


if __name__ == "__main__":
    main()
