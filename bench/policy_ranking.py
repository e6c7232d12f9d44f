"""Is a simulator's ranking of ranking policies right? Five policies of graded quality on a synthetic
world's held-out shoppers; each one's Δ PV-CTR against popularity from the world's own shoppers
(the truth) and from each simulator; Kendall's τ between the true and the simulated orderings, and
the effect ratio (simulated Δ / true Δ) per policy, with percentile bootstrap intervals over users.

Paired design: every policy serves the same users' sessions (the pages laid out by the environment,
``flows.abtest.serve``), so a Δ compares policies, not halves of the population. One bootstrap draw of
users is shared by every policy, source and simulator.

    python bench/policy_ranking.py --users 1500 --simulator markov [--simulator checkpoint:PATH]

Writes ``bench/results/policy_ranking.json`` and prints the table for bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

from evaluation.environment import EnvironmentSettings
from evaluation.loader import load_sessions
from evaluation.policies import policy_from_spec
from evaluation.rollout import Rollout
from evaluation.simulators import drive, simulator_for_lake
from evaluation.slate import lake_popularity
from flows.abtest import COUNTS, metrics, rollout_counts, serve, world_counts, world_policies
from flows.ingest import record_world
from flows.main_job import demo_records
from synthetic.bundle import write_bundle
from transforms.ingest import ingest_bundle
from transforms.prompts import PromptSettings
from worlds.shoppers import world_from_lake

#: the world's own arms (its popularity and its personalised ranking, from what the world knows) and
#: mixtures: graded quality the world vouches for; ``--built-ins``: the history-learnt built-ins instead
WORLD_ARMS = ("random", "mix:0.5:random:baseline", "baseline", "mix:0.5:baseline:treatment", "treatment")
BUILT_INS = (
    "random",
    "mix:0.5:random:popularity",
    "popularity",
    "mix:0.5:popularity:personalised",
    "personalised",
)
RESULTS = Path(__file__).parent / "results" / "policy_ranking.json"


def kendall_tau(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """τ-a over the last axis: (concordant − discordant pairs) / all pairs; tied pairs count neither."""
    i, j = np.triu_indices(x.shape[-1], k=1)
    sign = np.sign(x[..., i] - x[..., j]) * np.sign(y[..., i] - y[..., j])
    return sign.sum(axis=-1) / len(i)


def per_user(counts: pl.DataFrame, users: list[str]) -> np.ndarray:
    """(users, COUNTS) in ``users`` order, zeros for a user without sessions."""
    frame = pl.DataFrame({"user_id": users}).join(counts, on="user_id", how="left").fill_null(0)
    return frame.select(COUNTS).to_numpy().astype(np.float64)


def interval(values: np.ndarray, level: float = 0.95) -> list[float]:
    finite = values[np.isfinite(values)]
    tail = (1 - level) / 2
    return [float(v) for v in np.quantile(finite, [tail, 1 - tail])] if len(finite) else [None, None]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--users", type=int, default=1500, help="shoppers in the world")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--split", default="test")
    parser.add_argument("--simulator", action="append", help="repeatable (default: markov)")
    parser.add_argument("--resamples", type=int, default=2_000)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--demo-prompts",
        action="store_true",
        help="show the simulators the main job's prompts (what its checkpoint was trained on)",
    )
    parser.add_argument(
        "--built-ins", action="store_true", help="popularity, personalised (not the world's arms)"
    )
    args = parser.parse_args()
    policies = BUILT_INS if args.built_ins else WORLD_ARMS
    base = policies[2]
    specs = args.simulator or ["markov"]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="policy-ranking-") as folder:
        root = Path(folder)
        write_bundle(root / "raw", users=args.users, seed=args.seed)
        ingest_bundle(root / "raw", root / "lake")
        record_world(root / "raw", root / "lake")
        lake = root / "lake"
        world = world_from_lake(lake)
        # a checkpoint answers best in the prompts it was trained on
        environment = EnvironmentSettings(prompt=demo_records() if args.demo_prompts else PromptSettings())
        popularity = dict(lake_popularity(lake).iter_rows())
        sessions = [
            s for s in load_sessions(lake, split=args.split, settings=environment) if s.cut_reason is None
        ]
        users = sorted({s.user_id for s in sessions})
        # `world`: the world's shoppers acting in the environment on the very pages served
        simulators = {spec: None if spec == "world" else simulator_for_lake(spec, lake) for spec in specs}
        extra = world_policies(world)
        counts: dict[str, dict[str, np.ndarray]] = {"true": {}} | {spec: {} for spec in specs}
        for name in policies:
            served = serve(sessions, policy_from_spec(name, args.seed, extra), popularity, environment)
            true, shoppers = world_counts(world, served, environment)
            counts["true"][name] = per_user(true, users)
            for spec, simulator in simulators.items():
                rollouts = [Rollout(s, environment) for s in served]
                drive(rollouts, simulator or shoppers)
                counts[spec][name] = per_user(rollout_counts(rollouts), users)
            print(f"{name}: served and shopped ({time.perf_counter() - started:.0f} s)", flush=True)
    rng = np.random.default_rng(args.seed)
    draws = rng.integers(0, len(users), (args.resamples, len(users)))
    others = [p for p in policies if p != base]

    def deltas(source: str, rows: np.ndarray | None) -> np.ndarray:
        """Δ PV-CTR of every other policy against the base: (others,) or (resamples, others)."""
        ctr = {}
        for name, matrix in counts[source].items():
            totals = (
                matrix.sum(axis=0) if rows is None else np.stack([c[rows].sum(axis=1) for c in matrix.T], -1)
            )
            ctr[name] = metrics(totals)["PV-CTR"]
        return np.stack([ctr[p] - ctr[base] for p in others], axis=-1)

    true_point, true_boot = deltas("true", None), deltas("true", draws)
    report = {
        "world": {
            "users": args.users,
            "seed": args.seed,
            "split": args.split,
            "held_out_users": len(users),
            "sessions": len(sessions),
        },
        "policies": list(policies),
        "base": base,
        "true_delta": {p: float(v) for p, v in zip(others, true_point, strict=True)},
        "true_delta_ci": {p: interval(true_boot[:, k]) for k, p in enumerate(others)},
        "simulators": {},
        "seconds": round(time.perf_counter() - started, 1),
        "machine": {"nproc": os.cpu_count(), "python": platform.python_version()},
    }
    for spec in specs:
        sim_point, sim_boot = deltas(spec, None), deltas(spec, draws)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio_boot = sim_boot / true_boot
        report["simulators"][spec] = {
            "delta": {p: float(v) for p, v in zip(others, sim_point, strict=True)},
            "delta_ci": {p: interval(sim_boot[:, k]) for k, p in enumerate(others)},
            "effect_ratio": {
                p: float(s / t) if t else None for p, s, t in zip(others, sim_point, true_point, strict=True)
            },
            "effect_ratio_ci": {p: interval(ratio_boot[:, k]) for k, p in enumerate(others)},
            "kendall_tau": float(kendall_tau(true_point, sim_point)),
            "kendall_tau_ci": interval(kendall_tau(true_boot, sim_boot)),
        }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(table(report))


def table(report: dict) -> str:
    fmt = lambda v: "–" if v is None else f"{v:+.4f}"  # noqa: E731
    span = lambda ci: f"[{fmt(ci[0])}, {fmt(ci[1])}]"  # noqa: E731
    lines = [
        "| policy | true Δ PV-CTR | " + " | ".join(f"{s} Δ | {s} ratio" for s in report["simulators"]) + " |"
    ]
    lines.append("|---|---:|" + "---:|---:|" * len(report["simulators"]))
    for p, true in report["true_delta"].items():
        cells = [f"{fmt(true)} {span(report['true_delta_ci'][p])}"]
        for sim in report["simulators"].values():
            ratio = sim["effect_ratio"][p]
            shown_ratio = "–" if ratio is None else f"{ratio:.3f}"
            cells += [f"{fmt(sim['delta'][p])} {span(sim['delta_ci'][p])}",
                      f"{shown_ratio} {span(sim['effect_ratio_ci'][p])}"]  # fmt: skip
        lines.append(f"| {p} | " + " | ".join(cells) + " |")
    taus = ", ".join(
        f"{s}: τ = {v['kendall_tau']:.3f} {span(v['kendall_tau_ci'])}"
        for s, v in report["simulators"].items()
    )
    return (
        "\n".join(lines)
        + f"\n\nKendall's τ (true vs simulated order of the {len(report['true_delta'])} policies' Δ): {taus}"
    )


if __name__ == "__main__":
    main()
