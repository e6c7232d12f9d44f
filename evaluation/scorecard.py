"""The figure set of ``trajforge score``: the ten headline figures of PROTOCOL.md §4 and the
supplementary ones, from real and simulated rollout traces and an optional replay trace."""

from __future__ import annotations

import polars as pl

from evaluation.cohorts import population_fidelity
from evaluation.metrics import (
    Side,
    decision_mix_jsd,
    macro_f1,
    non_scroll_accuracy,
    outcome_rates,
    output_validity,
    terminal_jsd,
    trajectory_error,
)
from evaluation.supplementary import supplementary_figures
from evaluation.traces import TraceFrames

HEADLINE_KEYS: tuple[str, ...] = ("RVA", "OVA", "F1", "Acc", "DM-JSD", "TE", "PF", "dCTR", "dACR", "T-JSD")


def score(
    real: TraceFrames, sim: TraceFrames, replay: pl.DataFrame | None = None, supplementary: bool = True
) -> dict[str, object]:
    """The headline figures (HEADLINE_KEYS; the replay ones are None without a replay trace) and, with
    ``supplementary``, the supplementary ones, unrounded."""
    real_side, sim_side = Side.of(real), Side.of(sim)
    scored = replay.filter(pl.col("unscored_reason").is_null()) if replay is not None else None
    real_rates, sim_rates = outcome_rates(real_side.steps), outcome_rates(sim_side.steps)
    fidelity = population_fidelity(real_side, sim_side)
    figures: dict[str, object] = {
        "RVA": output_validity(scored) if scored is not None else None,
        "OVA": output_validity(sim.steps),
        "F1": macro_f1(scored) if scored is not None else None,
        "Acc": non_scroll_accuracy(scored) if scored is not None else None,
        "DM-JSD": decision_mix_jsd(real_side.visits, sim_side.visits),
        "TE": trajectory_error(real_side.sessions, sim_side.sessions),
        "PF": fidelity["PF"],
        "dCTR": abs(sim_rates["CTR"] - real_rates["CTR"]),
        "dACR": abs(sim_rates["ACR"] - real_rates["ACR"]),
        "T-JSD": terminal_jsd(real_side.sessions, sim_side.sessions),
    }
    if supplementary:
        figures.update(supplementary_figures(real_side, sim_side))
    figures["cohorts"] = fidelity["schemes"]
    figures["replay_unscored"] = unscored_counts(replay) if replay is not None else {}
    figures["counts"] = {
        "real_sessions": real.sessions.height,
        "real_actions": real_side.steps.height,
        "sim_sessions": sim.sessions.height,
        "sim_outputs": sim.steps.height,
        "sim_actions": sim_side.steps.height,
        "replay_rows": replay.height if replay is not None else 0,
    }
    return figures


def unscored_counts(replay: pl.DataFrame) -> dict[str, int]:
    """Replay rows left unscored (their recorded state could not be rebuilt), by reason."""
    counted = replay.filter(pl.col("unscored_reason").is_not_null()).group_by("unscored_reason").len()
    return dict(sorted(zip(counted["unscored_reason"].to_list(), counted["len"].to_list(), strict=True)))


def rounded(value: object, digits: int = 4) -> object:
    """Figures for printing: floats to ``digits`` decimals, recursively through dicts and lists."""
    if isinstance(value, float):
        return round(value, digits)
    if isinstance(value, dict):
        return {key: rounded(item, 2 if key in ("TE", "ATL") else digits) for key, item in value.items()}
    if isinstance(value, list):
        return [rounded(item, digits) for item in value]
    return value
