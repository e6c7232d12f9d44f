"""``trajforge abtest``: two ranking policies, the lake's held-out shoppers split in halves, a simulator
shopping in the feeds each policy serves, and the per-arm outcomes with the Δ between arms.

Arms: the held-out users ordered by a seeded hash of their id, the first half served by policy A,
the second by policy B (``split_by_hash``). Each of a user's sessions is served one feed page laid
out by the environment from the policy's slate of the session's candidates (``evaluation.slate``),
and the simulator rolls it out. Per arm: PV-CTR (clicks / feed page views), ACR (carts / clicks),
CVR (buys / feed page views) and session length (accepted actions per session); Δ = B − A with a
percentile bootstrap over users (each resample draws every arm's users with replacement). On a lake
generated from a synthetic world, the world's own shoppers are run through the very pages served —
in the world's state machine, not the environment — which gives the true Δ, and the simulated effect
ratio (simulated Δ / true Δ). The world's arms ``baseline`` and ``treatment`` are policies there too,
ranking as the world does from what it knows of its shoppers.
"""

from __future__ import annotations

import copy
import hashlib
import html
import json
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from evaluation.environment import EnvironmentSettings
from evaluation.loader import load_sessions
from evaluation.policies import Context, RankFunction, policy_from_spec, ranked, session_context, session_rng
from evaluation.rollout import Rollout
from evaluation.session import Session
from evaluation.simulators import Simulator, drive
from evaluation.slate import lake_popularity, lay_out, logged_candidates
from flows.evaluate import lake_simulator
from synthetic import taxonomy as tx
from synthetic.behaviour import simulate_steps
from synthetic.feeds import PAD_Y, Feeds, policy_score, price_misfit
from synthetic.world import Run
from transforms.lake import world_path
from transforms.rekey import Pseudonymizer
from transforms.schemas import ACTIONS
from worlds.shoppers import WorldSimulator, held_out_users, world_from_lake

ARMS = ("a", "b")
METRICS = ("PV-CTR", "ACR", "CVR", "session_length")
COUNTS = ("views", "clicks", "carts", "buys", "steps")
COUNTS_SCHEMA = pl.Schema({"user_id": pl.String} | dict.fromkeys(COUNTS, pl.Int64))
#: metric -> (numerator, denominator) among COUNTS
RATIOS = {
    "PV-CTR": ("clicks", "views"),
    "ACR": ("carts", "clicks"),
    "CVR": ("buys", "views"),
    "session_length": ("steps", "views"),
}
REPORT_JSON, REPORT_HTML, COUNTS_FILE = "report.json", "report.html", "counts.parquet"


# --- arms ------------------------------------------------------------------------------------


def split_by_hash(users: Sequence[str], seed: int) -> tuple[list[str], list[str]]:
    """Users ordered by sha256 of ``seed:user`` and cut in halves (A gets the extra one of an odd count)."""
    order = sorted(users, key=lambda u: hashlib.sha256(f"{seed}:{u}".encode()).hexdigest())
    half = (len(order) + 1) // 2
    return sorted(order[:half]), sorted(order[half:])


def metrics(totals: np.ndarray) -> dict[str, float]:
    """The METRICS of count totals in COUNTS order (a zero denominator gives 0)."""
    index = {name: k for k, name in enumerate(COUNTS)}
    out = {}
    for metric, (top, bottom) in RATIOS.items():
        denominator = totals[..., index[bottom]]
        with np.errstate(divide="ignore", invalid="ignore"):
            out[metric] = np.where(denominator > 0, totals[..., index[top]] / denominator, 0.0)
    return out  # type: ignore[return-value]


def arm_summary(counts: pl.DataFrame) -> dict[str, float | int]:
    totals = counts.select(COUNTS).sum().to_numpy()[0].astype(np.float64)
    shown = {metric: float(value) for metric, value in metrics(totals).items()}
    return shown | {"users": counts.height, "sessions": int(totals[0])}


def bootstrap_delta(
    a: pl.DataFrame, b: pl.DataFrame, resamples: int = 2_000, seed: int = 0, level: float = 0.95
) -> dict[str, dict[str, float]]:
    """Δ = B − A of every metric, with the ``level`` percentile interval over user resamples."""
    matrix_a, matrix_b = (arm.select(COUNTS).to_numpy().astype(np.float64) for arm in (a, b))
    if len(matrix_a) == 0 or len(matrix_b) == 0:
        raise ValueError("an A/B test needs users in both arms")
    rng = np.random.default_rng(seed)
    draws_a = rng.integers(0, len(matrix_a), (resamples, len(matrix_a)))
    draws_b = rng.integers(0, len(matrix_b), (resamples, len(matrix_b)))
    totals = lambda m, d: np.stack([column[d].sum(axis=1) for column in m.T], axis=-1)  # noqa: E731
    point_a, point_b = metrics(matrix_a.sum(axis=0)), metrics(matrix_b.sum(axis=0))
    boot_a, boot_b = metrics(totals(matrix_a, draws_a)), metrics(totals(matrix_b, draws_b))
    tail = (1 - level) / 2
    out = {}
    for metric in METRICS:
        low, high = np.quantile(boot_b[metric] - boot_a[metric], [tail, 1 - tail])
        out[metric] = {"mean": float(point_b[metric] - point_a[metric]), "lo": float(low), "hi": float(high)}
    return out


# --- serving and shopping --------------------------------------------------------------------


def serve(
    sessions: Sequence[Session],
    policy: RankFunction,
    popularity: dict[str, int],
    environment: EnvironmentSettings,
) -> list[Session]:
    """Each session showing ``policy``'s order of its logged feed's items, in its logged geometry."""
    served = []
    for session in sessions:
        slate = ranked(policy, session_context(session), logged_candidates(session, popularity))
        served.append(
            lay_out(
                session,
                [c["item_id"] for c in slate],
                default_height=environment.default_card_height,
                viewport=environment.geometry.feed_viewport,
            )
        )
    return served


def rollout_counts(rollouts: Sequence[Rollout]) -> pl.DataFrame:
    """Per user: feed page views (sessions), accepted clicks, carts, buys and actions."""
    rows = [
        (r.session.user_id, r.session.session_id, a.action)
        for r in rollouts
        for a in r.attempts
        if a.accepted
    ]
    steps = pl.DataFrame(rows, schema={"user_id": pl.String, "session_id": pl.String, "action": pl.String},
                         orient="row")  # fmt: skip
    users = pl.DataFrame(
        [(r.session.user_id, r.session.session_id) for r in rollouts],
        schema={"user_id": pl.String, "session_id": pl.String},
        orient="row",
    )
    return per_user_counts(users, steps)


def per_user_counts(sessions: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """COUNTS_SCHEMA rows from (user_id, session_id) of every session and (session_id, action) steps."""
    action = pl.col("action")
    per_user = steps.group_by("user_id").agg(
        (action == "click").sum().alias("clicks"),
        (action == "ipv_cart").sum().alias("carts"),
        (action == "ipv_buy").sum().alias("buys"),
        pl.len().alias("steps"),
    )
    views = sessions.group_by("user_id").agg(pl.col("session_id").n_unique().alias("views"))
    joined = views.join(per_user, on="user_id", how="left").fill_null(0)
    return joined.select(COUNTS_SCHEMA.names()).cast(COUNTS_SCHEMA).sort("user_id")  # type: ignore[arg-type]


# --- the world: its arms as policies, its shoppers on the served pages -------------------------


#: the names of the world's own ranking policies (``world_policies``), beside the built-in ones
WORLD_POLICY_NAMES = ("baseline", "treatment")


def world_policies(world: WorldSimulator) -> dict[str, Callable[[int], RankFunction]]:
    """The world's ``baseline`` and ``treatment`` as ranking policies: the world's own scores from
    its catalog's popularity and the shopper's latent traits, with noise of their own."""
    users = {u: k for k, u in enumerate(world.user_ids.to_list())}
    items = {i: k for k, i in enumerate(world.item_ids.to_list())}
    w = world.world

    def arm(treatment: bool) -> Callable[[int], RankFunction]:
        def build(seed: int) -> RankFunction:
            def rank(context: Context, candidates: list[dict]) -> list[dict]:
                shopper = users[context["user_id"]]
                item = np.array([items[c["item_id"]] for c in candidates])
                l1 = w.catalog.l1[item].astype(np.int64)
                log_aff = np.log(w.shoppers.affinity[shopper, l1] / tx.L1_SHARES[l1])
                misfit = price_misfit(w.catalog, item, w.shoppers.price_level[shopper])
                noise = session_rng(seed, context.get("session_id")).normal(size=len(item))
                log_pop = np.log(w.catalog.popularity[item])
                score = policy_score(treatment, log_aff, misfit, log_pop, noise, w.params.feed)
                return [candidates[k] for k in np.argsort(-score, kind="stable")]

            return rank

        return build

    return dict(zip(WORLD_POLICY_NAMES, (arm(False), arm(True)), strict=True))


def served_run(world: WorldSimulator, served: Sequence[Session]) -> tuple[Run, dict[str, int]]:
    """The lake's logged run with the served sessions' feeds replaced by the pages served (each card
    keeping the shopper's appeal of its item), and where each served session is in it."""
    run = world.world.run(policy="ab", seed=world.seed, keyed_draws=world.stepwise_seed)
    lake_ids = Pseudonymizer(world.rekey_key).column(run.pv_ids, "session").to_list()
    position = {session: k for k, session in enumerate(lake_ids)}
    items = {i: k for k, i in enumerate(world.item_ids.to_list())}
    f = run.feeds
    item, appeal = f.item.copy(), f.appeal.copy()
    y, height, x = f.y.copy(), f.height.copy(), f.x.copy()
    n_cards, feed_height = f.n_cards.copy(), f.feed_height.copy()
    for session in served:
        row = position[session.session_id]
        shown = np.array([items[c.item_id] for c in session.cards], dtype=np.int64)
        column = {int(i): k for k, i in enumerate(f.item[row]) if i >= 0}
        if any(int(i) not in column for i in shown):
            raise ValueError(f"session {session.session_id} serves items its logged feed did not offer")
        source = np.array([column[int(i)] for i in shown], dtype=np.int64)
        k = len(shown)
        item[row], appeal[row], height[row], y[row] = -1, -np.inf, 0, PAD_Y
        item[row, :k], appeal[row, :k] = shown, f.appeal[row, source]
        y[row, :k] = [c.y for c in session.cards]
        height[row, :k] = [c.height for c in session.cards]
        x[row, :k] = f.x[row, :k]  # the slot's column: the slots are the logged feed's
        n_cards[row], feed_height[row] = k, session.feed_height
    feeds = Feeds(item, x, y, height, n_cards, feed_height, appeal, f.card_width)
    return replace(run, feeds=feeds), position


def world_counts(
    world: WorldSimulator, served: Sequence[Session], environment: EnvironmentSettings
) -> tuple[pl.DataFrame, Simulator]:
    """Per user, what the world's own shoppers did on the served pages (in the world's state machine,
    their first ``budget_single`` actions: as many as an episode allows), and the same shoppers as a
    simulator that acts in exactly those pages."""
    run, position = served_run(world, served)
    w = world.world
    keyed = (w.seed, run.seed, world.stepwise_seed)
    steps = simulate_steps(np.random.default_rng(0), run.plan.budget, run.feeds, w.catalog, run.traits,
                           w.params, w.geometry, keyed)  # fmt: skip
    by_row = {position[s.session_id]: s for s in served}
    rows = np.array(sorted(by_row))
    lake_session = pl.Series([by_row[r].session_id for r in rows])
    user = pl.Series([by_row[r].user_id for r in rows])
    keep = np.isin(steps.session, rows) & (steps.step < environment.budget_single)
    action = pl.Series("action", ACTIONS).gather(steps.action[keep].astype(np.int64))
    taken = pl.DataFrame({"row": steps.session[keep]}).with_columns(action)
    lookup = pl.DataFrame({"row": rows, "session_id": lake_session, "user_id": user})
    frame = taken.join(lookup, on="row")
    simulator = copy.copy(world)
    simulator._known, simulator._session_run = [], {}
    simulator.know(run)
    return per_user_counts(lookup.select("user_id", "session_id"), frame), simulator


# --- the test ----------------------------------------------------------------------------------


def shop_arm(
    sessions: Sequence[Session],
    policy: RankFunction,
    simulator: Simulator | None,
    popularity: dict[str, int],
    environment: EnvironmentSettings,
    world: WorldSimulator | None,
) -> dict[str, pl.DataFrame]:
    """One arm's per-user counts: ``sim`` from the simulator (``None``: the world's own shoppers) on
    the pages ``policy`` serves, and ``true`` from the world's shoppers where there is a world."""
    served = serve(sessions, policy, popularity, environment)
    out = {}
    if world is not None:
        out["true"], world_shoppers = world_counts(world, served, environment)
        simulator = simulator or world_shoppers
    if simulator is None:
        raise ValueError("the world's shoppers need a lake generated from a world")
    rollouts = [Rollout(session, environment) for session in served]
    drive(rollouts, simulator)
    out["sim"] = rollout_counts(rollouts)
    return out


@task(cache_policy=NO_CACHE)
def split_arms(lake: str, split: str, users: int | None, seed: int) -> dict[str, list[str]]:
    held_out = held_out_users(lake, split)
    chosen = held_out[:users] if users else held_out
    if len(chosen) < 2:
        raise ValueError(f"an A/B test needs at least 2 held-out users; split {split!r} has {len(chosen)}")
    return dict(zip(ARMS, split_by_hash(chosen, seed), strict=True))


@task(cache_policy=NO_CACHE)
def shop_arms(
    lake: str,
    arms: dict[str, list[str]],
    policies: dict[str, str],
    simulator_spec: str,
    out: str,
    split: str,
    seed: int,
) -> str:
    """Every arm served by its policy and shopped by the simulator; per-user counts written to
    ``OUT/counts.parquet`` (arm, source ``sim`` | ``true``, user, counts)."""
    has_world = world_path(lake).is_file()
    world = world_from_lake(lake) if has_world else None
    extra = world_policies(world) if world is not None else {}
    built = {arm: policy_from_spec(spec, seed, extra) for arm, spec in policies.items()}
    simulator = None if simulator_spec == "world" else lake_simulator(simulator_spec, lake)
    if simulator_spec == "world" and world is None:
        raise ValueError(f"the simulator `world` needs a lake generated from a world; {lake} has none")
    environment = EnvironmentSettings()
    popularity = dict(lake_popularity(lake).iter_rows())
    sessions = load_sessions(lake, split=split, settings=environment)
    frames = []
    for arm, users in arms.items():
        chosen = set(users)
        mine = [s for s in sessions if s.user_id in chosen and s.cut_reason is None]
        counts = shop_arm(mine, built[arm], simulator, popularity, environment, world)
        frames += [
            c.with_columns(pl.lit(arm).alias("arm"), pl.lit(source).alias("source"))
            for source, c in counts.items()
        ]
    path = Path(out) / COUNTS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    pl.concat(frames).select("arm", "source", *COUNTS_SCHEMA.names()).write_parquet(path)
    return str(path)


def abtest_report(counts: pl.DataFrame, resamples: int, seed: int) -> dict[str, Any]:
    """report.json's figures from the per-user counts of both arms."""
    part = lambda arm, source: counts.filter((pl.col("arm") == arm) & (pl.col("source") == source))  # noqa: E731
    report: dict[str, Any] = {
        "arms": {arm: arm_summary(part(arm, "sim")) for arm in ARMS},
        "delta": bootstrap_delta(part("a", "sim"), part("b", "sim"), resamples, seed),
    }
    if counts.filter(pl.col("source") == "true").height:
        true = {arm: arm_summary(part(arm, "true")) for arm in ARMS}
        report["true_arms"] = true
        report["true_delta"] = {m: float(true["b"][m]) - float(true["a"][m]) for m in METRICS}
        report["effect_ratio"] = {
            m: (report["delta"][m]["mean"] / d if d else None) for m, d in report["true_delta"].items()
        }
    return report


def report_html(report: dict[str, Any]) -> str:
    """The A/B test as an HTML section, a table per arm metric with the Δ and its interval."""
    arms, delta = report["arms"], report["delta"]
    true = report.get("true_delta", {})
    ratio = report.get("effect_ratio", {})
    cell = lambda v: "–" if v is None else f"{v:.4f}"  # noqa: E731
    rows = "".join(
        f"<tr><td>{m}</td><td>{cell(arms['a'][m])}</td><td>{cell(arms['b'][m])}</td>"
        f"<td>{cell(delta[m]['mean'])} [{cell(delta[m]['lo'])}, {cell(delta[m]['hi'])}]</td>"
        f"<td>{cell(true.get(m))}</td><td>{cell(ratio.get(m))}</td></tr>"
        for m in METRICS
    )
    meta = html.escape(f"A = {report['policy_a']}, B = {report['policy_b']}, simulator {report['simulator']}")
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>trajforge abtest</title><style>"
        "body{font-family:system-ui,sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:4px 10px;text-align:right}td:first-child{text-align:left}"
        "</style></head><body><section><h2>A/B test of two ranking policies</h2>"
        f"<p>{meta}; users A {arms['a']['users']}, B {arms['b']['users']}; "
        "Δ = B − A with its 95 % bootstrap interval over users.</p><table>"
        "<tr><th>metric</th><th>A</th><th>B</th><th>Δ [95 %]</th><th>true Δ</th><th>effect ratio</th></tr>"
        f"{rows}</table></section></body></html>"
    )


@task(cache_policy=NO_CACHE)
def write_abtest_report(
    counts_path: str, out: str, meta: dict[str, Any], resamples: int, seed: int
) -> dict[str, str]:
    report = meta | abtest_report(pl.read_parquet(counts_path), resamples, seed)
    folder = Path(out)
    (folder / REPORT_JSON).write_text(json.dumps(report, indent=2, sort_keys=True))
    (folder / REPORT_HTML).write_text(report_html(report))
    return {"json": str(folder / REPORT_JSON), "html": str(folder / REPORT_HTML)}


@flow(name="abtest")
def abtest_flow(
    lake: str,
    policy_a: str,
    policy_b: str,
    simulator: str,
    out: str,
    users: int | None = None,
    split: str = "test",
    seed: int = 0,
    resamples: int = 2_000,
) -> dict[str, str]:
    """Two ranking policies on the lake's held-out users split in halves, the simulator shopping."""
    arms = split_arms(lake, split, users, seed)
    counts = shop_arms(lake, arms, {"a": policy_a, "b": policy_b}, simulator, out, split, seed)
    meta = {"lake": lake, "policy_a": policy_a, "policy_b": policy_b, "simulator": simulator, "split": split,
            "seed": seed, "resamples": resamples}  # fmt: skip
    return write_abtest_report(counts, out, meta, resamples, seed)
