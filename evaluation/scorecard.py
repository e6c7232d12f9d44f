"""The figure set of ``trajforge score``: the ten headline figures of PROTOCOL.md §4 and the
supplementary ones, from real and simulated rollout traces and an optional replay trace; and the L0
accounting of an evaluation's traces (:func:`accounting`): every output by its verdict and every
episode by its ending.

A request that got no answer after its retries produced no output: RVA and OVA both leave it out
(PROTOCOL §4 counts outputs), and the accounting counts it as ``unanswered``. A rollout episode ends at
its first unanswered request (ending ``error``); a replayed step without an answer is a row with reason
``error`` (the reference's ``prediction_present: false``, ``missing_prediction``), which L1 counts as
a miss, as it does any step without an accepted prediction.
"""

from __future__ import annotations

from typing import Any

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
from evaluation.traces import REJECT_REASONS, TraceFrames

HEADLINE_KEYS: tuple[str, ...] = ("RVA", "OVA", "F1", "Acc", "DM-JSD", "TE", "PF", "dCTR", "dACR", "T-JSD")
#: a replayed step's reasons when no prediction came at all (ours, the reference's)
UNANSWERED_REASONS: tuple[str, ...] = ("error", "missing_prediction")
ENDINGS: tuple[str, ...] = ("end", "budget", "invalid_retry_exhausted", "error")


def answered(replay: pl.DataFrame) -> pl.DataFrame:
    """The replay rows that got an output (any verdict): those RVA is a share of."""
    return replay.filter(~pl.col("reject_reason").is_in(UNANSWERED_REASONS).fill_null(False))


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
        "RVA": output_validity(answered(scored)) if scored is not None else None,
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


def counts_of(column: pl.Series, support: tuple[str, ...]) -> dict[str, int]:
    """How often each value of ``support`` occurs in ``column`` (0 for one that does not), then any
    other non-null value found, by name."""
    found = dict(column.drop_nulls().value_counts().iter_rows())
    others = {name: n for name, n in sorted(found.items()) if name not in support}
    return {**{name: found.get(name, 0) for name in support}, **others}


def verdicts(outputs: pl.DataFrame) -> dict[str, Any]:
    """Outputs judged, accepted, and rejected by reason (the four of PROTOCOL §2 always listed)."""
    rejected = outputs.filter(~pl.col("accepted"))["reject_reason"]
    return {
        "outputs_judged": outputs.height,
        "accepted": int(outputs["accepted"].sum()),
        "rejected": counts_of(rejected, REJECT_REASONS),
    }


def rollout_accounting(sim: TraceFrames) -> dict[str, Any]:
    """L0 accounting of rollout traces: requests asked (one per output, and one per episode ended by
    an unanswered request), those unanswered, the outputs' verdicts, the episodes by ending."""
    episodes = counts_of(sim.sessions["termination_reason"], ENDINGS)
    unanswered = episodes["error"]
    return {
        "requests": sim.steps.height + unanswered,
        "unanswered": unanswered,
        **verdicts(sim.steps),
        "episodes": episodes,
    }


def replay_accounting(replay: pl.DataFrame) -> dict[str, Any]:
    """L0 accounting of a replay trace: requests asked (one per scored recorded step), those
    unanswered, the answered outputs' verdicts, and the recorded steps left unscored."""
    scored = replay.filter(pl.col("unscored_reason").is_null())
    outputs = answered(scored)
    return {
        "requests": scored.height,
        "unanswered": scored.height - outputs.height,
        **verdicts(outputs),
        "unscored": replay.height - scored.height,
    }


def accounting(sim: TraceFrames, replay: pl.DataFrame | None) -> dict[str, dict[str, Any] | None]:
    """Per phase (rollout, replay: None without a replay trace), its L0 accounting."""
    return {
        "rollout": rollout_accounting(sim),
        "replay": replay_accounting(replay) if replay is not None else None,
    }


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
