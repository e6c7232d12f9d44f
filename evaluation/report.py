"""The evaluation report: ``report.json`` (every figure of every simulator) and a self-contained
``report.html`` a person reads (matplotlib figures embedded as PNG, the comparison tables in the shape
of the paper's Table 2 and Table 3).

The report holds, per simulator, exactly the figures ``trajforge score`` prints plus the A/B effect
(``EFFECT_KEYS``, null where no effect was estimated) and, on a lake generated from a world, its
decision alignment (``decision_alignment``; the real sessions' row and what its terms mean sit under
the report's own ``decision_alignment``, or the reason a lake has none). The plots are drawn from the
trace files themselves: action mix, session lengths and decision mix per source; the funnel, cohort
fidelity and decision alignment come from the scored figures.

Beside the figures, ``accounting`` is the L0 account of every simulator's rollout and replay: the
requests asked, those unanswered after retries (and what they failed with), the outputs judged by
verdict (accepted and each of the four rejection reasons), the episodes by how they ended, and the
HTTP traffic (requests, retries, errors by status); the page and the Prefect artifact table it.

A ``checkpoint:PATH`` simulator whose PATH is a trajforge run's checkpoint also gets its training run
in the report (``training``: the run's curves and its held-out figures at the start and the end), and
an OPTD run its teacher's run beside it.
"""

from __future__ import annotations

import base64
import hashlib
import html
import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.colors import to_hex
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from evaluation.metrics import DECISIONS, Side
from evaluation.scorecard import ENDINGS
from evaluation.traces import REJECT_REASONS, load_traces
from trainer.curves import (
    checkpoint_run,
    checkpoint_step,
    plot_training_curves,
    read_rows,
    save_png,
    stage_of,
    teacher_checkpoint,
    training_summary,
)
from transforms.schemas import ACTIONS

EFFECT_KEYS: tuple[str, ...] = ("effect_ratio", "effect_error", "effect_ci", "effect_users")
REPORT_FILES: tuple[str, str] = ("report.json", "report.html")
HIGHER, LOWER = "↑", "↓"
#: Table 2 of the paper: (level, figure, direction)
TABLE2: tuple[tuple[str, str, str], ...] = (
    ("L0", "RVA", HIGHER),
    ("L0", "OVA", HIGHER),
    ("L1", "F1", HIGHER),
    ("L1", "Acc", HIGHER),
    ("L2", "DM-JSD", LOWER),
    ("L2", "TE", LOWER),
    ("L3", "PF", HIGHER),
    ("L4", "dCTR", LOWER),
    ("L4", "dACR", LOWER),
    ("L4", "T-JSD", LOWER),
)
LEVELS = ("L0", "L1", "L2", "L3", "L4")
#: the eight fidelity figures of Table 2 (L1-L4), each with its direction
PAPER_METRICS: tuple[tuple[str, str], ...] = tuple((m, d) for level, m, d in TABLE2 if level != "L0")


def better_than(figures: Mapping[str, Any], reference: Mapping[str, Any]) -> dict[str, bool | None]:
    """Per paper figure, whether ``figures`` is strictly better than ``reference`` (None when either is
    missing): a tie is not a win, so a figure both leave at 0 (PF without cohorts) counts for neither."""
    verdicts: dict[str, bool | None] = {}
    for metric, direction in PAPER_METRICS:
        ours, theirs = figures.get(metric), reference.get(metric)
        if ours is None or theirs is None:
            verdicts[metric] = None
        else:
            verdicts[metric] = ours > theirs if direction == HIGHER else ours < theirs
    return verdicts


FUNNEL_STAGES = (
    ("click_share", "clicked"),
    ("detail_page_share", "opened a detail page"),
    ("cart_share", "carted"),
    ("buy_share", "bought"),
)
REAL = "real"
#: decision alignment (SalesSim): (figure, what it is the share of)
ALIGNMENT: tuple[tuple[str, str], ...] = (
    ("decision_alignment", "all sessions"),
    ("purchase_alignment", "sessions with a purchase"),
    ("no_purchase_alignment", "sessions without"),
)
LONGEST_SHOWN = 45  # session lengths above this are drawn in the last bin


def figure_text(key: str, value: object) -> str:
    """A figure as the tables print it: 4 decimals (TE 2), a dash where there is none."""
    if value is None:
        return "–"
    if isinstance(value, float | int) and not isinstance(value, bool):
        return f"{value:.2f}" if key == "TE" else f"{value:.4f}"
    return str(value)


def ci_text(ci: object) -> str:
    if not ci:
        return "–"
    low, high = ci  # type: ignore[misc]
    return f"[{low:.4f}, {high:.4f}]"


# --- what the plots show ------------------------------------------------------------------------


@dataclass(frozen=True)
class Distributions:
    """One source's shares: executed actions (over the 13), session lengths, visit decisions."""

    actions: np.ndarray
    lengths: np.ndarray
    decisions: np.ndarray

    @classmethod
    def of(cls, traces: str | Path) -> Distributions:
        side = Side.of(load_traces(traces))
        action_counts = side.steps.group_by("action").len()
        decision_counts = side.visits.group_by("decision").len()
        return cls(
            actions=_shares(action_counts, "action", ACTIONS),
            lengths=side.sessions["length"].to_numpy(),
            decisions=_shares(decision_counts, "decision", DECISIONS),
        )


def _shares(counts: pl.DataFrame, column: str, support: tuple[str, ...]) -> np.ndarray:
    found = dict(counts.iter_rows())
    values = np.array([found.get(name, 0) for name in support], dtype=float)
    return values / values.sum() if values.sum() else values


# --- figures ------------------------------------------------------------------------------------


def canvas(width: float, height: float) -> tuple[Figure, Axes]:
    """A figure drawn off screen (no pyplot, so no display backend and no global figure state)."""
    figure = Figure(figsize=(width, height))
    return figure, figure.subplots()


def left_out_text(left_out: Mapping[str, int]) -> str:
    """``{"truncated": 3}`` as "3 (truncated 3)"; nothing left out as "none"."""
    if not left_out:
        return "none"
    reasons = ", ".join(f"{reason} {count:,}" for reason, count in sorted(left_out.items()))
    return f"{sum(left_out.values()):,} ({reasons})"


def png(figure: Figure) -> str:
    """The figure as a base64 PNG."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def colours(sources: list[str]) -> dict[str, str]:
    palette = colormaps["tab10"].colors
    sims = [s for s in sources if s != REAL]
    return {REAL: "#333333", **{s: to_hex(palette[i % 10]) for i, s in enumerate(sims)}}


def grouped_bars(
    labels: tuple[str, ...] | list[str],
    values: Mapping[str, np.ndarray],
    *,
    title: str,
    ylabel: str,
    horizontal: bool = False,
) -> str:
    sources = list(values)
    colour = colours(sources)
    width = 0.8 / len(sources)
    positions = np.arange(len(labels))
    figure, axes = canvas(10, 6.5 if horizontal else 4.5)
    for i, source in enumerate(sources):
        offset = positions - 0.4 + width * (i + 0.5)
        draw = axes.barh if horizontal else axes.bar
        draw(offset, values[source], width, label=source, color=colour[source])
    if horizontal:
        axes.set_yticks(positions, labels)
        axes.invert_yaxis()
        axes.set_xlabel(ylabel)
    else:
        axes.set_xticks(positions, labels)
        axes.set_ylabel(ylabel)
    axes.set_title(title)
    # beside the axes, not on them: with several sources a legend inside covers the tallest bars
    axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1))
    axes.grid(axis="x" if horizontal else "y", alpha=0.3)
    return png(figure)


def action_mix_figure(dists: Mapping[str, Distributions]) -> str:
    shares = {source: d.actions for source, d in dists.items()}
    return grouped_bars(
        ACTIONS, shares, title="Action mix: share of executed actions", ylabel="share", horizontal=True
    )


def length_figure(dists: Mapping[str, Distributions]) -> str:
    colour = colours(list(dists))
    bins = np.arange(-0.5, LONGEST_SHOWN + 1.5)  # from 0: an episode may end before any executed action
    figure, axes = canvas(10, 4.5)
    for source, d in dists.items():
        lengths = np.minimum(d.lengths, LONGEST_SHOWN)
        weights = np.full(len(lengths), 1 / len(lengths)) if len(lengths) else None
        mean = f"mean {d.lengths.mean():.2f}" if len(d.lengths) else "no sessions"
        axes.hist(lengths, bins, weights=weights, histtype="step", linewidth=2, color=colour[source],
                  label=f"{source} ({mean})")  # fmt: skip
    axes.set_xlabel(f"executed actions per session (≥ {LONGEST_SHOWN} in the last bin)")
    axes.set_ylabel("share of sessions")
    axes.set_title("Session length distribution")
    axes.legend()
    axes.grid(alpha=0.3)
    return png(figure)


def decision_figure(dists: Mapping[str, Distributions]) -> str:
    shares = {source: d.decisions for source, d in dists.items()}
    return grouped_bars(
        DECISIONS, shares, title="Decision mix: how detail-page visits end", ylabel="share of visits"
    )


def funnel_figure(simulators: Mapping[str, Mapping[str, Any]]) -> str:
    first = next(iter(simulators.values()))
    funnels = {REAL: first["funnel"]["real"], **{spec: f["funnel"]["sim"] for spec, f in simulators.items()}}
    shares = {source: np.array([f[key] for key, _ in FUNNEL_STAGES]) for source, f in funnels.items()}
    labels = [label for _, label in FUNNEL_STAGES]
    return grouped_bars(labels, shares, title="Funnel: share of sessions that …", ylabel="share of sessions")


def cohort_figure(simulators: Mapping[str, Mapping[str, Any]]) -> str:
    """Per cohort, each simulator's fidelity; a cohort under the size rule is drawn pale."""
    first = next(iter(simulators.values()))["cohorts"]
    labels = [(scheme, label) for scheme, entry in first.items() for label in entry["cohorts"]]
    colour = colours([REAL, *simulators])
    width = 0.8 / len(simulators)
    figure, axes = canvas(11, 4.8)
    handles: list[Patch] = []
    for i, (spec, figures) in enumerate(simulators.items()):
        cohorts = [figures["cohorts"][scheme]["cohorts"][label] for scheme, label in labels]
        heights = [c.get("fidelity", 0.0) for c in cohorts]
        alphas = [1.0 if c.get("counted") else 0.3 for c in cohorts]
        offsets = np.arange(len(labels)) - 0.4 + width * (i + 0.5)
        for x, height, alpha in zip(offsets, heights, alphas, strict=True):
            axes.bar(x, height, width, color=colour[spec], alpha=alpha)
        key = Patch(color=colour[spec], label=f"{spec} (PF {figure_text('PF', figures['PF'])})")
        handles.append(key)
    names = [f"{scheme.replace('_', ' ')}:\n{label.replace('_', ' ')}" for scheme, label in labels]
    axes.set_xticks(np.arange(len(labels)), names, fontsize=8, rotation=30, ha="right")
    axes.set_ylim(0, 1)
    axes.set_ylabel("fidelity (1 − mean block distance)")
    axes.set_title("Cohort fidelity (pale: fewer than 30 sessions on a side, not counted in PF)")
    axes.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1))
    axes.grid(axis="y", alpha=0.3)
    return png(figure)


def effect_figure(simulators: Mapping[str, Mapping[str, Any]]) -> str | None:
    """Each simulator's effect ratio with its 95 % interval; None when no simulator has one."""
    estimated = {s: f for s, f in simulators.items() if f.get("effect_ratio") is not None}
    if not estimated:
        return None
    colour = colours([REAL, *estimated])
    figure, axes = canvas(10, 0.8 + 0.7 * len(estimated))
    for row, (spec, f) in enumerate(estimated.items()):
        low, high = f["effect_ci"] or (f["effect_ratio"], f["effect_ratio"])
        error = [[f["effect_ratio"] - low], [high - f["effect_ratio"]]]
        axes.errorbar(f["effect_ratio"], row, xerr=error, fmt="o", capsize=6, color=colour[spec])
    axes.axvline(1.0, color="#333333", linestyle="--", label="true effect (ratio 1)")
    axes.set_yticks(range(len(estimated)), list(estimated))
    axes.invert_yaxis()  # in the order of the tables
    axes.set_xlabel("effect ratio: simulated Δ PV-CTR / true Δ PV-CTR (95 % interval)")
    axes.set_title("A/B effect fidelity")
    axes.legend()
    axes.grid(axis="x", alpha=0.3)
    return png(figure)


def alignment_sources(report: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """Decision alignment per source, the real sessions first; empty for a lake without a world."""
    reference = report.get("decision_alignment") or {}
    if "real" not in reference:
        return {}
    simulators = report["simulators"].items()
    return {REAL: reference["real"], **{spec: f["decision_alignment"] for spec, f in simulators}}


ALIGNMENT_HEAD = (
    *(f"{key.replace('_', ' ')} {HIGHER}" for key, _ in ALIGNMENT),
    "sessions with a purchase",
    "sessions without",
)


def alignment_rows(sources: Mapping[str, Mapping[str, Any]]) -> list[list[str]]:
    """One row per source: its alignment rates (4 decimals) and its two session counts."""
    return [
        [
            source,
            *(figure_text(key, f[key]) for key, _ in ALIGNMENT),
            str(f["purchase_sessions"]),
            str(f["no_purchase_sessions"]),
        ]
        for source, f in sources.items()
    ]


def alignment_figure(sources: Mapping[str, Mapping[str, Any]]) -> str:
    shares = {source: np.array([f[key] for key, _ in ALIGNMENT]) for source, f in sources.items()}
    labels = [f"{key.replace('_', ' ')}\n({what})" for key, what in ALIGNMENT]
    return grouped_bars(labels, shares, title="Decision alignment (SalesSim)", ylabel="share aligned")


# --- the training runs behind checkpoint simulators ---------------------------------------------

CHECKPOINT_SPEC = "checkpoint:"
TRAINING_DIR = "training"


def training_entry(checkpoint: Path, out: Path, teacher_of: bool = False) -> dict[str, Any] | None:
    """The run behind ``checkpoint``: its summary, and its curves (the checkpoint's update marked) drawn
    into ``out/training/``, not into the run folder, which the evaluation only reads. For an OPTD run,
    its teacher's entry under ``teacher`` when the teacher is a trajforge run too (``teacher_of``: this
    is that teacher's entry). None for a folder that is not a trajforge checkpoint."""
    run_dir = checkpoint_run(checkpoint)
    if run_dir is None:
        return None
    checkpoint = checkpoint.expanduser().resolve()
    rows = read_rows(run_dir)
    stage = stage_of(rows, run_dir)
    step = checkpoint_step(checkpoint)
    digest = hashlib.sha256(str(checkpoint).encode()).hexdigest()[:8]
    (out / TRAINING_DIR).mkdir(parents=True, exist_ok=True)
    png_path = out / TRAINING_DIR / f"{run_dir.name}-{checkpoint.name}-{digest}.png"
    mark = "teacher checkpoint" if teacher_of else "evaluated checkpoint"
    save_png(plot_training_curves(rows, stage, mark_step=step, mark_label=mark), png_path)
    entry = {
        **training_summary(run_dir, rows, stage),
        "checkpoint": str(checkpoint),
        "checkpoint_step": step,
        "curves_png": str(png_path),
    }
    if not teacher_of and stage == "optd":
        teacher = teacher_checkpoint(run_dir, checkpoint)
        entry["teacher_checkpoint"] = str(teacher) if teacher else None
        entry["teacher"] = training_entry(teacher, out, teacher_of=True) if teacher else None
    return entry


def training_runs(specs: Sequence[str], out: str | Path) -> dict[str, dict[str, Any]]:
    """``report.json``'s ``training``: an entry per ``checkpoint:PATH`` spec whose PATH is a trajforge
    run's checkpoint (``RUN/checkpoints/step-NNNNNN`` with ``RUN/metrics.jsonl``); other specs, and
    other model folders, have none."""
    found = {}
    for spec in specs:
        if spec.startswith(CHECKPOINT_SPEC):
            entry = training_entry(Path(spec.removeprefix(CHECKPOINT_SPEC)), Path(out))
            if entry is not None:
                found[spec] = entry
    return found


TRAINING_FIGURES = (
    ("held_out_loss", "held-out loss"),
    ("parse_share", "parse share"),
    ("executable_share", "executable share"),
)


def training_line(entry: Mapping[str, Any], checkpoint: str = "the checkpoint evaluated") -> str:
    """One run in a sentence: stage, updates, and the held-out figures at the first and last evaluation."""
    figures = "; ".join(
        f"{label} {figure_text(key, entry[f'{key}_start'])} → {figure_text(key, entry[f'{key}_end'])}"
        for key, label in TRAINING_FIGURES
    )
    step = entry.get("checkpoint_step")
    at = f" ({checkpoint}: update {step})" if step is not None else ""
    return f"{entry['stage'].upper()}, {entry['steps']} updates{at}; {figures}. Run: {entry['run_dir']}"


def _embedded(path: str, alt: str) -> str:
    image = Path(path)
    if not image.is_file():
        return f'<p class="note">The curves are no longer at {html.escape(path)}.</p>'
    data = base64.b64encode(image.read_bytes()).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def training_html(training: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The Training section: per checkpoint simulator, its run's summary line and curves, then its
    teacher's when it has one."""
    if not training:
        return []
    parts = [
        "<h2>Training</h2>",
        '<p class="note">The training run behind each checkpoint simulator, from its metrics.jsonl; '
        "start and end are its first and last held-out evaluation; the dotted line marks the "
        "checkpoint evaluated (in a teacher's run, the teacher checkpoint).</p>",
    ]
    for spec, entry in training.items():
        parts += [
            f"<h3>{html.escape(spec)}</h3>",
            f"<p>{html.escape(training_line(entry))}</p>",
            _embedded(entry["curves_png"], f"Training curves: {spec}"),
        ]
        if teacher := entry.get("teacher"):
            parts += [
                f"<h4>Its teacher: {html.escape(teacher['checkpoint'])}</h4>",
                f"<p>{html.escape(training_line(teacher, 'the teacher checkpoint'))}</p>",
                _embedded(teacher["curves_png"], f"Training curves: {spec}, teacher"),
            ]
        elif entry.get("teacher_checkpoint"):
            teacher_path = html.escape(entry["teacher_checkpoint"])
            parts.append(f'<p class="note">Its teacher, {teacher_path}, is not a trajforge run folder.</p>')
    return parts


# --- tables -------------------------------------------------------------------------------------

#: the L0 account in two tables, each narrow enough to read: what became of the requests, and how the
#: episodes ended with the traffic they made
ACCOUNTING_KEYS = ("simulator", "phase")
VERDICTS_HEAD = (
    *ACCOUNTING_KEYS,
    "requests",
    "unanswered",
    "outputs judged",
    "accepted",
    *(reason.replace("_", " ") for reason in REJECT_REASONS),
)
ENDINGS_HEAD = (
    *ACCOUNTING_KEYS,
    *(f"ended: {ending.replace('_', ' ')}" for ending in ENDINGS),
    "HTTP requests",
    "retries",
    "HTTP errors",
    "transport errors",
)


def counts_text(counts: Mapping[str, int] | None) -> str:
    """``{"500": 3, "429": 1}`` as "429 ×1, 500 ×3"; none as "0"; no such counts at all as a dash."""
    if counts is None:
        return "–"
    return ", ".join(f"{key} ×{n}" for key, n in sorted(counts.items())) or "0"


def accounting_rows(accounting: Mapping[str, Mapping[str, Any]]) -> list[list[str]]:
    """One row per simulator and phase: its requests, verdicts, endings and traffic (a dash where a
    phase has no such count: a replay has no episodes, a local simulator no HTTP traffic)."""
    rows = []
    for spec, phases in accounting.items():
        for phase, a in phases.items():
            if a is None:
                continue
            episodes = a.get("episodes")
            traffic = a.get("traffic")
            http = traffic or {}
            rows.append([
                spec,
                phase,
                str(a["requests"]),
                str(a["unanswered"]),
                str(a["outputs_judged"]),
                str(a["accepted"]),
                *(str(a["rejected"].get(reason, 0)) for reason in REJECT_REASONS),
                *(str(episodes[ending]) if episodes else "–" for ending in ENDINGS),
                str(http.get("http_requests", 0)) if traffic is not None else "–",
                str(sum(http.get("retries", {}).values())) if traffic is not None else "–",
                counts_text(http.get("http_errors", {}) if traffic is not None else None),
                counts_text(http.get("transport_errors", {}) if traffic is not None else None),
            ])  # fmt: skip
    return rows


def accounting_tables(accounting: Mapping[str, Mapping[str, Any]]) -> list[tuple[list[str], list[list[str]]]]:
    """``accounting_rows`` as the two tables (head, rows) the report shows: verdicts, then endings
    and traffic."""
    rows = accounting_rows(accounting)
    keys, verdicts = len(ACCOUNTING_KEYS), len(VERDICTS_HEAD)
    return [
        (list(VERDICTS_HEAD), [row[:verdicts] for row in rows]),
        (list(ENDINGS_HEAD), [row[:keys] + row[verdicts:] for row in rows]),
    ]


def unanswered_notes(accounting: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """A sentence per phase that lost requests: how many, and what they failed with."""
    notes = []
    for spec, phases in accounting.items():
        for phase, a in phases.items():
            if a and a["unanswered"]:
                why = "; ".join(f"{n} × {text}" for text, n in a["unanswered_errors"].items())
                notes.append(f"{spec}, {phase}: {a['unanswered']} unanswered ({why})")
    return notes


ACCOUNTING_NOTE = (
    "A request unanswered after its retries produced no output: RVA and OVA leave it out, and it is "
    "counted here. HTTP counts add up every call that wrote the traces, resumed ones included."
)


def table2_rows(simulators: Mapping[str, Mapping[str, Any]]) -> list[list[str]]:
    return [[spec, *(figure_text(key, f.get(key)) for _, key, _ in TABLE2)] for spec, f in simulators.items()]


def table3_rows(simulators: Mapping[str, Mapping[str, Any]]) -> list[list[str]]:
    return [
        [
            spec,
            figure_text("effect_ratio", f.get("effect_ratio")),
            figure_text("effect_error", f.get("effect_error")),
            ci_text(f.get("effect_ci")),
            users_text(f.get("effect_users")),
            interval_verdict(f.get("effect_ci")),
        ]
        for spec, f in simulators.items()
    ]


TABLE3_HEAD = ("simulator", "effect ratio (1 is perfect)", f"effect error {LOWER}", "95 % interval",
               "A/B users", "")  # fmt: skip
TOO_WIDE = "too wide to rank: holds both no effect (0) and the true one (1)"
EFFECT_NOTE = (
    "Two simulators' effects rank only where their intervals do not overlap; an interval holding both 0 "
    "and 1 cannot tell a faithful simulator from one that shows no effect at all."
)


def interval_verdict(ci: object) -> str:
    """Whether an effect-ratio interval can rank simulators at all (empty where it may)."""
    if not ci:
        return ""
    low, high = ci  # type: ignore[misc]
    return TOO_WIDE if low <= 0 <= high and low <= 1 <= high else ""


def users_text(users: object) -> str:
    """Users behind an effect, arm by arm (``12 + 11``)."""
    if not users:
        return "–"
    return " + ".join(str(n) for n in users.values()) if isinstance(users, Mapping) else str(users)


BASIS_HEAD = ("simulator", "real sessions", "rollouts", "replayed steps scored", "PF schemes counted",
              "A/B users")  # fmt: skip
BASIS_NOTE = (
    "RVA, F1 and Acc rest on the replayed steps scored; OVA and the L2–L4 figures on the rollouts "
    "against the real sessions; PF on the schemes with two cohorts of at least 30 sessions a side (PF "
    "is 0 without one); the effect on the A/B users."
)


def basis_rows(simulators: Mapping[str, Mapping[str, Any]]) -> list[list[str]]:
    """How many sessions, steps, schemes and users each simulator's figures rest on."""
    rows = []
    for spec, f in simulators.items():
        counts = f.get("counts") or {}
        replayed = counts.get("replay_rows", 0) - sum((f.get("replay_unscored") or {}).values())
        schemes = [name for name, s in (f.get("cohorts") or {}).items() if s.get("counted_cohorts", 0) >= 2]
        rows.append([
            spec,
            str(counts.get("real_sessions", "–")),
            str(counts.get("sim_sessions", "–")),
            str(replayed) if counts.get("replay_rows") else "–",
            ", ".join(schemes) or "none",
            users_text(f.get("effect_users")),
        ])  # fmt: skip
    return rows


def markdown_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def comparison_markdown(report: Mapping[str, Any], html_path: str | Path) -> str:
    """Tables 2 and 3 and, on a lake with a world, the decision alignment, as markdown, with where the
    full report is (the Prefect artifact)."""
    simulators = report["simulators"]
    table2 = markdown_table(
        ["simulator", *(f"{level} {key} {arrow}" for level, key, arrow in TABLE2)], table2_rows(simulators)
    )
    table3 = markdown_table(list(TABLE3_HEAD), table3_rows(simulators))
    basis = ["## What each figure rests on", *markdown_table(BASIS_HEAD, basis_rows(simulators)), "",
             BASIS_NOTE, ""]  # fmt: skip
    alignment = []
    if sources := alignment_sources(report):
        alignment = [*markdown_table(["source", *ALIGNMENT_HEAD], alignment_rows(sources)), ""]
    accounting = report.get("accounting") or {}
    l0 = ["## L0 accounting"]
    for head, rows in accounting_tables(accounting):
        l0 += [*markdown_table(head, rows), ""]
    l0 += [*(f"- {note}" for note in unanswered_notes(accounting)), ACCOUNTING_NOTE, ""]
    full = f"Full report: `{Path(html_path).resolve()}`"
    return "\n".join(
        ["# Evaluation", *table2, "", *basis, *table3, "", EFFECT_NOTE, "", *alignment, *l0, full]
    )


def _html_table(head: list[str], rows: list[list[str]], header_rows: str = "") -> str:
    cells = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in rows
    )
    return f"<table><thead>{header_rows}<tr>{cells}</tr></thead><tbody>{body}</tbody></table>"


def table2_html(simulators: Mapping[str, Mapping[str, Any]]) -> str:
    spans = "".join(
        f'<th colspan="{sum(level == lvl for lvl, _, _ in TABLE2)}">{level}</th>' for level in LEVELS
    )
    levels = f"<tr><th></th>{spans}</tr>"
    head = ["simulator", *(f"{key} {arrow}" for _, key, arrow in TABLE2)]
    return _html_table(head, table2_rows(simulators), levels)


def table3_html(simulators: Mapping[str, Mapping[str, Any]]) -> str:
    table = _html_table(list(TABLE3_HEAD), table3_rows(simulators))
    return table + f'<p class="note">{html.escape(EFFECT_NOTE)}</p>'


def basis_html(simulators: Mapping[str, Mapping[str, Any]]) -> str:
    table = _html_table(list(BASIS_HEAD), basis_rows(simulators))
    return table + f'<p class="note">{html.escape(BASIS_NOTE)}</p>'


def accounting_html(report: Mapping[str, Any]) -> str:
    """The L0 accounting table, with a line per phase that lost requests."""
    accounting = report.get("accounting") or {}
    table = "".join(_html_table(head, rows) for head, rows in accounting_tables(accounting))
    notes = "".join(f'<p class="note">{html.escape(note)}</p>' for note in unanswered_notes(accounting))
    return table + notes + f'<p class="note">{html.escape(ACCOUNTING_NOTE)}</p>'


def alignment_html(report: Mapping[str, Any]) -> str:
    """The decision alignment table with what its terms mean, or why the lake has none."""
    reference = report.get("decision_alignment") or {}
    sources = alignment_sources(report)
    if not sources:
        reason = reference.get("unavailable", "no decision alignment was computed")
        return f'<p class="note">No decision alignment: {html.escape(reason)}</p>'
    note = (
        f"A purchase (a cart or a buy) is aligned when the item is acceptable, a session without one when "
        f"nothing acceptable was shown; {reference['acceptable']}; shown: {reference['shown']}. The real "
        "sessions are the world's own shoppers: the row to reach."
    )
    table = _html_table(["source", *ALIGNMENT_HEAD], alignment_rows(sources))
    return table + f'<p class="note">{html.escape(note)}</p>'


STYLE = """
body { font-family: sans-serif; max-width: 1100px; margin: 2em auto; color: #222; }
table { border-collapse: collapse; margin: 1em 0; font-size: 14px; }
th, td { border: 1px solid #bbb; padding: 4px 8px; text-align: right; }
th:first-child, td:first-child { text-align: left; }
thead th { background: #eee; }
img { max-width: 100%; display: block; margin: 0.5em 0 1.5em; }
p.note { color: #555; }
"""


def render_html(report: Mapping[str, Any], dists: Mapping[str, Distributions]) -> str:
    """The whole report page: tables, then one figure per section, every image inline."""
    simulators = report["simulators"]
    real = report["real"]
    sections = [
        ("Action mix", action_mix_figure(dists)),
        ("Session lengths", length_figure(dists)),
        ("Decision mix", decision_figure(dists)),
        ("Funnel", funnel_figure(simulators)),
        ("Cohort fidelity", cohort_figure(simulators)),
    ]
    effect = effect_figure(simulators)
    parts = [
        f"<h1>Simulator evaluation: {html.escape(str(report['lake']))}</h1>",
        f"<p>Split: {html.escape(report['split'])}.</p>",
        f"<p>{real['sessions']} real sessions; cut sessions left out: "
        f"{html.escape(left_out_text(real['cut_sessions_left_out']))}. "
        f"Directions: {HIGHER} higher is better, {LOWER} lower is better; 4 decimals, TE 2.</p>",
        "<h2>Comparison (Table 2)</h2>",
        table2_html(simulators),
        "<h2>What each figure rests on</h2>",
        basis_html(simulators),
        "<h2>L0 accounting</h2>",
        accounting_html(report),
        "<h2>A/B effect fidelity (Table 3)</h2>",
        table3_html(simulators),
        "<h2>Decision alignment (SalesSim)</h2>",
        alignment_html(report),
    ]
    if aligned := alignment_sources(report):
        sections.append(("Decision alignment", alignment_figure(aligned)))
    for title, image in sections:
        parts += [f"<h2>{title}</h2>", f'<img alt="{title}" src="data:image/png;base64,{image}">']
    parts.append("<h2>A/B effect ratio</h2>")
    if effect is None:
        parts.append('<p class="note">No simulator has an A/B effect estimate in this evaluation.</p>')
    else:
        parts.append(f'<img alt="A/B effect ratio" src="data:image/png;base64,{effect}">')
    parts += training_html(report.get("training") or {})
    body = "\n".join(parts)
    return f'<!doctype html><html><head><meta charset="utf-8"><title>Simulator evaluation</title>' \
        f"<style>{STYLE}</style></head><body>\n{body}\n</body></html>\n"  # fmt: skip


def write_report(
    out: str | Path, report: Mapping[str, Any], traces: Mapping[str, str | Path]
) -> dict[str, str]:
    """Write ``report.json`` and ``report.html`` under ``out``; ``traces`` maps each source (``real``
    and every simulator spec) to its rollout trace file. Returns both paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    json_path, html_path = (out / name for name in REPORT_FILES)
    json_path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    dists = {source: Distributions.of(path) for source, path in traces.items()}
    html_path.write_text(render_html(report, dists), encoding="utf-8")
    return {"json": str(json_path), "html": str(html_path)}
