"""Training curves: a run's ``metrics.jsonl`` drawn as one figure of stacked panels, ``RUN/curves.png``.

Training rows are lines over the updates; held-out evaluations (a handful per run) are dashed lines
with a marker on every point, in the colour of the training measure they mirror. matplotlib is
imported inside the functions and used without pyplot: the trainer's modules import where it is
missing (bench/gpu_train.py needs torch and transformers alone), and no global figure state leaks.

The run-folder helpers read the layout the trainer writes (``RUN/checkpoints/step-NNNNNN/``,
``RUN/metrics.jsonl``, ``RUN/summary.json``) without importing torch, so the evaluation report can
find the run behind a checkpoint it scores.
"""

from __future__ import annotations

import json
import math
import re
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transforms.files import atomic_file

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

METRICS_FILE, CURVES_FILE = "metrics.jsonl", "curves.png"
#: the checkpoint folder name (trainer.checkpoint.FOLDER, repeated here so that reading a run needs no torch)
STEP_FOLDER = re.compile(r"^step-(\d{6,})$")
#: a loss curve with at least this many updates also gets its running mean: single updates are noisy
SMOOTH_FROM = 50


@dataclass(frozen=True)
class Series:
    kind: str  # "train" or "eval": which rows it reads
    keys: tuple[str, ...]  # the first key a row holds is its value (an older row may name it otherwise)
    label: str
    colour: str
    # held-out points: a second series of a panel gets a smaller, different marker, so that two
    # equal values (parse and executable share both 0 early on) still show both
    marker: str = "o"
    marker_size: float = 6


@dataclass(frozen=True)
class Panel:
    title: str
    ylabel: str
    series: tuple[Series, ...]
    unit_interval: bool = False  # shares: the axis spans 0..1 whatever the values


def _pair(key: str, label: str, colour: str, second: bool = False) -> tuple[Series, Series]:
    """A training measure and its held-out counterpart (older OPTD eval rows carry the parts too);
    ``second``: the panel's second measure, whose held-out markers are drawn smaller inside the first's."""
    marker = {"marker": "D", "marker_size": 4.5} if second else {"marker_size": 7}
    held_out = Series("eval", (key,), f"held-out {label}", colour, **marker)
    return Series("train", (key,), label, colour), held_out


LOSS_COLOUR, HELD_OUT_COLOUR = "#1f77b4", "#d62728"
SHARES = Panel(
    "Sampled held-out responses",
    "share of responses",
    (
        Series("eval", ("parse_share",), "parse share", "#2ca02c", marker_size=8),
        Series(
            "eval",
            ("executable_share",),
            "executable share (of those judged on a screen)",
            "#9467bd",
            marker="D",
            marker_size=4.5,
        ),
        # only where the prompts list the ids in view (PromptSettings.click_ids)
        Series(
            "eval",
            ("screen_id_mass",),
            "probability of a listed id after a click's opening",
            "#e377c2",
            marker="s",
            marker_size=4.5,
        ),
    ),
    unit_interval=True,
)


def panels(stage: str) -> tuple[Panel, ...]:
    """SFT: loss, response shares. OPTD adds the objective's two parts, the trust region, the guidance KL."""
    if stage != "optd":
        loss = Panel(
            "Training and held-out loss",
            "loss (token NLL)",
            (
                # the responses' NLL, as the held-out loss is: an update's loss adds the screen-id
                # loss's states (screen_id_weight), summed, on another scale
                Series("train", ("nll", "loss"), "training loss", LOSS_COLOUR),
                Series("eval", ("held_out_loss",), "held-out loss", HELD_OUT_COLOUR),
            ),
        )
        return loss, SHARES
    loss = Panel(
        "Training and held-out objective",
        "loss (distillation + γ · grounding)",
        (
            Series("train", ("loss",), "training loss", LOSS_COLOUR),
            # an older OPTD eval row names its held-out loss "objective"
            Series("eval", ("held_out_loss", "objective"), "held-out loss", HELD_OUT_COLOUR),
        ),
    )
    # apart: grounding (a token NLL, several nats) would flatten distillation (often 1e-3 or less) to zero
    distillation = Panel(
        "Distillation: JSD to the trust-region target",
        "per-token mean",
        _pair("distillation", "distillation", "#1f77b4"),
    )
    grounding = Panel(
        "Grounding: NLL of the gold response", "per-token mean", _pair("grounding", "grounding", "#ff7f0e")
    )
    trust = Panel(
        r"Trust region: guidance weight $\lambda^*$ and where the bound binds",
        "per-token mean / share of tokens",
        (
            *_pair("mean_lambda", r"mean $\lambda^*$", "#17becf"),
            *_pair("binding_share", r"binding share ($\lambda^* < \lambda_{max}$)", "#8c564b", second=True),
        ),
        unit_interval=True,
    )
    kl = Panel(
        r"Guidance KL: $\mathrm{KL}(q^{\lambda^*} \,\|\, q^0)$, mean over tokens",
        "KL (nats)",
        _pair("guidance_kl", "guidance KL", "#e377c2"),
    )
    return loss, SHARES, distillation, grounding, trust, kl


def _number(value: Any) -> float:
    """A row's value as a float to plot: None and non-finite values (a skipped update) leave a gap."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return math.nan
    return float(value)


def series_points(rows: Sequence[dict[str, Any]], series: Series) -> tuple[list[int], list[float]]:
    """The (update, value) points of ``series``: every row of its kind holding one of its keys."""
    steps, values = [], []
    for row in rows:
        if row.get("kind") != series.kind:
            continue
        held = [k for k in series.keys if k in row]
        if not held:
            continue
        key = next((k for k in held if row[k] is not None), held[0])
        steps.append(int(row["step"]))
        values.append(_number(row[key]))
    return steps, values


def running_mean(values: Sequence[float], window: int) -> list[float]:
    """Mean of the last ``window`` finite values at each point (fewer at the start)."""
    means, recent = [], deque(maxlen=window)
    for value in values:
        recent.append(value)
        finite = [v for v in recent if not math.isnan(v)]
        means.append(sum(finite) / len(finite) if finite else math.nan)
    return means


def draw_panel(axes: Axes, rows: Sequence[dict[str, Any]], panel: Panel) -> int:
    """Draw one panel; returns how many series had points."""
    drawn = 0
    for series in panel.series:
        steps, values = series_points(rows, series)
        if not steps:
            continue
        drawn += 1
        label = series.label if any(not math.isnan(v) for v in values) else f"{series.label} (no value yet)"
        if series.kind == "eval":
            axes.plot(steps, values, linestyle="--", marker=series.marker, markersize=series.marker_size,
                      color=series.colour, linewidth=1.2, label=label)  # fmt: skip
            continue
        smooth = "loss" in series.keys and len(values) >= SMOOTH_FROM
        style = {"marker": "o", "markersize": 3} if len(values) <= 30 else {}
        axes.plot(steps, values, color=series.colour, linewidth=0.8 if smooth else 1.5,
                  alpha=0.35 if smooth else 1.0, label=label, **style)  # fmt: skip
        if smooth:
            window = max(5, len(values) // 25)
            axes.plot(steps, running_mean(values, window), color=series.colour, linewidth=2,
                      label=f"{series.label}, mean of the last {window} updates")  # fmt: skip
    return drawn


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def plot_training_curves(
    rows: list[dict[str, Any]],
    stage: str,
    mark_step: int | None = None,
    mark_label: str = "evaluated checkpoint",
) -> Figure:
    """One panel per group of measures (``panels(stage)``), stacked over a shared update axis.

    ``mark_step`` draws a dotted line at that update on every panel (the checkpoint a report scores),
    named ``mark_label`` in the first panel's legend.
    """
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    chosen = panels(stage)
    figure = Figure(figsize=(11, 0.6 + 2.9 * len(chosen)), layout="constrained")
    grid = figure.subplots(len(chosen), 1, sharex=True, squeeze=False)[:, 0]
    train = [r for r in rows if r.get("kind") == "train"]
    evals = [r for r in rows if r.get("kind") == "eval"]
    figure.suptitle(
        f"{stage.upper()} training curves: {_count(len(train), 'update')}, "
        f"{_count(len(evals), 'held-out evaluation')}",
        fontsize=13,
    )
    last = max((int(r["step"]) for r in rows), default=0)
    # from update 0 (the evaluation before training); one update still gets whole-number ticks
    pad = max(0.5, 0.02 * last)
    for index, (axes, panel) in enumerate(zip(grid, chosen, strict=True)):
        drawn = draw_panel(axes, rows, panel)
        if mark_step is not None:
            label = f"{mark_label} (update {mark_step})" if index == 0 else None
            axes.axvline(mark_step, color="#555555", linestyle=":", linewidth=1.5, label=label)
        axes.set_title(panel.title, fontsize=11, loc="left")
        axes.set_ylabel(panel.ylabel)
        axes.set_xlabel("update")
        axes.xaxis.set_tick_params(labelbottom=True)  # sharex hides them on every panel but the last
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
        axes.yaxis.get_major_formatter().set_useMathText(True)  # a common factor as ×10⁻⁵, not 1e-5
        axes.set_xlim(-pad, max(last, 1) + pad)
        axes.grid(alpha=0.3)
        if panel.unit_interval:
            axes.set_ylim(-0.03, 1.03)  # a share of exactly 0 or 1 keeps its whole marker
        if drawn:
            # beside the axes, where it covers no line
            axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=9, frameon=False)
        else:
            held_out = all(series.kind == "eval" for series in panel.series)
            empty = "no held-out evaluation yet" if held_out else "no training rows yet"
            axes.text(0.5, 0.5, empty, transform=axes.transAxes, ha="center", va="center", color="#777777")
    return figure


# --- a run folder --------------------------------------------------------------------------------


def read_rows(run_dir: str | Path) -> list[dict[str, Any]]:
    """``RUN/metrics.jsonl`` as rows; none when the file is missing. A line cut off by a writer that is
    still appending is left out."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return [row for row in rows if isinstance(row, dict) and "step" in row]


def stage_of(rows: Sequence[dict[str, Any]], run_dir: str | Path | None = None) -> str:
    """``optd`` or ``sft``: what the run's checkpoint records, else what its rows hold."""
    if run_dir is not None:
        for meta in run_metas(Path(run_dir)):
            if meta.get("stage") in ("sft", "optd"):
                return meta["stage"]
    optd_only = ("mean_lambda", "distillation", "objective")
    return "optd" if any(key in row for row in rows for key in optd_only) else "sft"


def write_training_curves(run_dir: Path, stage: str | None = None) -> Path | None:
    """Draw ``run_dir/metrics.jsonl`` into ``run_dir/curves.png``; None when there are no rows yet."""
    run_dir = Path(run_dir)
    rows = read_rows(run_dir)
    if not rows:
        return None
    return save_png(plot_training_curves(rows, stage or stage_of(rows, run_dir)), run_dir / CURVES_FILE)


def save_png(figure: Figure, path: Path, dpi: int = 100) -> Path:
    """``figure`` as a PNG at ``path``, written under a temporary name and renamed: a reader (the
    Prefect UI, a person's viewer) never sees half a file."""
    with atomic_file(path) as temporary:
        figure.savefig(temporary, format="png", dpi=dpi)
    return path


def checkpoint_run(checkpoint: str | Path) -> Path | None:
    """The run folder of a trajforge checkpoint (``RUN/checkpoints/step-NNNNNN`` with
    ``RUN/metrics.jsonl``), or None for any other folder."""
    folder = Path(checkpoint).expanduser().resolve()
    if not (STEP_FOLDER.match(folder.name) and folder.parent.name == "checkpoints"):
        return None
    run_dir = folder.parent.parent
    return run_dir if (run_dir / METRICS_FILE).is_file() else None


def checkpoint_step(checkpoint: str | Path) -> int | None:
    match = STEP_FOLDER.match(Path(checkpoint).name)
    return int(match.group(1)) if match else None


def _json(path: Path) -> dict[str, Any]:
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def run_metas(run_dir: Path, checkpoint: Path | None = None) -> list[dict[str, Any]]:
    """What the run records about itself, the closest first: ``checkpoint``'s ``trainer.json`` (inside
    the checkpoint folder, or under ``RUN/trainer_state/<its name>/``), the run's ``summary.json``, then
    every other step's ``trainer.json`` in either place, newest first."""
    places = [run_dir / "checkpoints", run_dir / "trainer_state"]
    named = [place / checkpoint.name / "trainer.json" for place in places] if checkpoint else []
    found = (p for place in places for p in place.glob("step-*/trainer.json"))
    others = sorted((p for p in found if STEP_FOLDER.match(p.parent.name)), key=lambda p: p.parent.name)[::-1]
    paths = [*named, run_dir / "summary.json", *(p for p in others if p not in named)]
    return [meta for path in paths if path.is_file() and (meta := _json(path))]


def teacher_checkpoint(run_dir: Path, checkpoint: Path | None = None) -> Path | None:
    """The teacher an OPTD run names (key ``teacher``), if it names one."""
    for meta in run_metas(run_dir, checkpoint):
        if isinstance(meta.get("teacher"), str) and meta["teacher"]:
            return Path(meta["teacher"])
    return None


def _first_last(rows: Sequence[dict[str, Any]], keys: tuple[str, ...]) -> tuple[float | None, float | None]:
    values = []
    for row in rows:
        key = next((k for k in keys if row.get(k) is not None), keys[0])
        value = _number(row.get(key))
        values.append(None if math.isnan(value) else value)
    return (values[0], values[-1]) if values else (None, None)


def training_summary(run_dir: Path, rows: Sequence[dict[str, Any]], stage: str) -> dict[str, Any]:
    """Stage, updates, and the first and last held-out evaluation's loss, parse and executable share."""
    train = [r for r in rows if r.get("kind") == "train"]
    evals = [r for r in rows if r.get("kind") == "eval"]
    loss = _first_last(evals, ("held_out_loss", "objective"))
    parse = _first_last(evals, ("parse_share",))
    executable = _first_last(evals, ("executable_share",))
    return {
        "run_dir": str(run_dir),
        "stage": stage,
        "steps": max((int(r["step"]) for r in train), default=0),
        "held_out_loss_start": loss[0],
        "held_out_loss_end": loss[1],
        "parse_share_start": parse[0],
        "parse_share_end": parse[1],
        "executable_share_start": executable[0],
        "executable_share_end": executable[1],
    }
