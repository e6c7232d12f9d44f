"""``fidelity.html``: the fidelity study as a page a person reads (bench/fidelity.py writes it).

Per figure a bar chart of every simulator with its 95 % interval, the study's goals, the privileged
signal's diagnostics per arm, and the learning curves of each trained arm (the held-out loss and the
executable share of its sampled held-out responses, per update, for every seed).
"""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from evaluation.report import PAPER_METRICS

DIRECTION = {"RVA": "↑", "OVA": "↑", **dict(PAPER_METRICS), "effect_ratio": "→ 1", "effect_error": "↓"}
COLOURS = {
    "sft": "#4c72b0",
    "optd": "#c44e52",
    "optd_no_trust_region": "#dd8452",
    "optd_no_grounding": "#937860",
    "optd_plain_teacher": "#da8bc3",
    "optd_intent_teacher": "#8172b3",
    "markov": "#55a868",
    "random": "#8c8c8c",
    "world": "#222222",
}


def png(figure: Figure) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode()


def metric_bars(simulators: dict[str, dict[str, dict[str, float | None]]]) -> str:
    """One panel per figure: a bar per simulator at its mean over the seeds, its interval as a line."""
    metrics = [m for m in DIRECTION if any(s.get(m, {}).get("mean") is not None for s in simulators.values())]
    columns = 4
    rows = -(-len(metrics) // columns)
    figure = Figure(figsize=(4.2 * columns, 3.2 * rows))
    arms = list(simulators)
    for index, metric in enumerate(metrics):
        axes = figure.add_subplot(rows, columns, index + 1)
        for position, arm in enumerate(arms):
            value = simulators[arm].get(metric, {})
            if value.get("mean") is None:
                continue
            axes.bar(position, value["mean"], color=COLOURS.get(arm, "#999999"))
            if value.get("lo") is not None:
                axes.plot([position, position], [value["lo"], value["hi"]], color="black", linewidth=1.2)
        axes.set_title(f"{metric} ({DIRECTION[metric]})", fontsize=10)
        axes.set_xticks(
            range(len(arms)), [a.replace("optd_", "optd\n") for a in arms], fontsize=6, rotation=90
        )
        if metric == "effect_ratio":
            axes.axhline(1.0, color="black", linestyle=":", linewidth=1)
    figure.tight_layout()
    return png(figure)


def read_rows(run_dir: str) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def learning_curves(run_dirs: dict[str, dict[str, str]]) -> str:
    """Held-out loss and executable share per update of every trained arm, one line per seed; an OPTD
    arm's updates are drawn after its SFT teacher's, where they continue from."""
    figure = Figure(figsize=(12, 4.2))
    loss, share = figure.add_subplot(1, 2, 1), figure.add_subplot(1, 2, 2)
    labelled: set[str] = set()
    for runs in run_dirs.values():
        sft_rows = [r for r in read_rows(runs.get("sft", "")) if r["kind"] == "train"]
        sft_updates = max((r["step"] for r in sft_rows), default=0)
        for arm, run_dir in runs.items():
            evaluations = [r for r in read_rows(run_dir) if r["kind"] == "eval"]
            offset = 0 if arm == "sft" else sft_updates
            steps = [offset + r["step"] for r in evaluations]
            label = None if arm in labelled else arm
            labelled.add(arm)
            colour = COLOURS.get(arm, "#999999")
            loss.plot(
                steps, [r.get("held_out_loss") for r in evaluations], marker="o", color=colour, label=label
            )
            share.plot(steps, [r.get("executable_share") for r in evaluations], marker="o", color=colour)
    loss.set(title="held-out loss (gold NLL, nats/token)", xlabel="update (OPTD after its SFT teacher's)")
    share.set(title="executable share of sampled held-out responses", xlabel="update", ylim=(0, 1.02))
    figure.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
    figure.tight_layout()
    return png(figure)


def fmt(value: float | None, digits: int = 4) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def figures_table(simulators: dict[str, dict[str, dict[str, float | None]]]) -> str:
    metrics = list(DIRECTION)
    head = "".join(f"<th>{html.escape(m)} {DIRECTION[m]}</th>" for m in metrics)
    body = []
    for arm, figures in simulators.items():
        cells = []
        for m in metrics:
            v = figures.get(m, {})
            span = (
                f"<br><small>[{fmt(v.get('lo'))}, {fmt(v.get('hi'))}]</small>"
                if v.get("lo") is not None
                else ""
            )
            cells.append(f"<td>{fmt(v.get('mean'))}{span}</td>")
        body.append(f"<tr><th>{html.escape(arm)}</th>{''.join(cells)}</tr>")
    return f"<table><tr><th></th>{head}</tr>{''.join(body)}</table>"


def diagnostics_table(diagnostics: dict[str, dict[str, float | None]]) -> str:
    keys = ("intent_gain_nats", "mean_lambda", "binding_share", "guidance_kl")
    head = "".join(f"<th>{k}</th>" for k in keys)
    rows = "".join(
        f"<tr><th>{html.escape(arm)}</th>{''.join(f'<td>{fmt(d.get(k))}</td>' for k in keys)}</tr>"
        for arm, d in diagnostics.items()
    )
    return f"<table><tr><th></th>{head}</tr>{rows}</table>"


def goals_list(goals: dict[str, Any]) -> str:
    markov, optd = goals["markov_beats_random"], goals["optd_at_least_sft"]
    effect = goals["optd_effect_error_below_paper"]
    items = [
        f"markov beats random on {markov['count']} of 8 figures (goal ≥ {markov['needed']})",
        f"OPTD is at least SFT on {optd['count']} of 8 figures (goal ≥ {optd['needed']})",
        f"OPTD's effect error {fmt(effect['value'])} (goal below the paper's {effect['paper']}): "
        f"{'met' if effect['met'] else 'not met'}",
    ]
    return "<ul>" + "".join(f"<li>{html.escape(i)}</li>" for i in items) + "</ul>"


STYLE = (
    "body{font-family:sans-serif;margin:2em;max-width:1400px} table{border-collapse:collapse;font-size:12px}"
    "td,th{border:1px solid #ccc;padding:3px 6px;text-align:right} th{background:#f4f4f4} img{max-width:100%}"
)


def write_html(result: dict[str, Any], path: Path) -> Path:
    simulators = result["simulators"]
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>trajforge fidelity study</title>"
        f"<style>{STYLE}</style></head><body>",
        "<h1>What OPTD adds over SFT: the fidelity study</h1>",
        f"<p>{result['users']:,} synthetic shoppers; {result['sessions']} held-out test sessions rolled "
        f"out and replayed; {result['effect_users']} held-out users in the A/B test; "
        f"seeds {result['seeds']}; "
        f"intervals: 95 % percentile over {result['resamples']} resamples of the sessions (the A/B effect: "
        f"of the users). Machine: {html.escape(result['machine'])}; "
        f"{result['seconds']['total'] / 60:.1f} min"
        f"{' in a run resuming the runs and traces of an earlier one' if result.get('resumed') else ''}.</p>",
        "<h2>Goals</h2>",
        goals_list(result["goals"]),
        "<h2>Figures (mean over seeds, 95 % interval)</h2>",
        figures_table(simulators),
        f"<img alt='figures with intervals' src='data:image/png;base64,{metric_bars(simulators)}'>",
        "<h2>The privileged signal</h2>",
        "<p>intent gain: the teacher's gold NLL without minus with the intent on probe states no update drew "
        "(for sft: the SFT model itself); the others: means over the OPTD updates.</p>",
        diagnostics_table(result["diagnostics"]),
        "<h2>Learning curves</h2>",
        f"<img alt='learning curves' src='data:image/png;base64,{learning_curves(result['run_dirs'])}'>",
        "</body></html>",
    ]
    path.write_text("\n".join(parts), encoding="utf-8")
    return path
