"""A training run's progress as Prefect artifacts, refreshed while it trains (at each held-out evaluation).

Two stable keys per stage, a new version of each per call (the UI shows the latest, and the history):

- ``train-<stage>-progress``, markdown: the latest training row's loss and its parts, the latest
  held-out evaluation's loss and response shares, each with its update, and the curves embedded as a
  ``data:image/png`` URI. This is the one that shows the figure: both Prefect UIs render the data URI
  (the React UI's markdown view passes ``data:image/`` sources through, the Vue UI's sanitiser allows
  data URIs on images; both seen rendered with Prefect 3.9);
- ``train-<stage>-curves``, an image artifact: the ``file://`` URL of ``RUN/curves.png``, rewritten at
  each call. A browser does not load a file URL into a page served over HTTP, so the UI shows the
  link, not the image: it says where the full-size figure is on the machine that trains.
"""

from __future__ import annotations

import base64
import io
import math
import warnings
from pathlib import Path
from typing import Any

from prefect.artifacts import create_image_artifact, create_markdown_artifact

from trainer.curves import CURVES_FILE, plot_training_curves, read_rows, save_png

#: the embedded copy is drawn smaller than curves.png (every call stores one more version of it in the
#: Prefect database), large enough that its legends read at the UI's width (880 px wide)
EMBEDDED_DPI = 80
TRAIN_MEASURES: dict[str, tuple[tuple[str, str], ...]] = {
    "sft": (("loss", "training loss"), ("nll", "token NLL")),
    "optd": (
        ("loss", "training loss"),
        ("distillation", "distillation"),
        ("grounding", "grounding"),
        ("mean_lambda", "mean λ*"),
        ("binding_share", "binding share"),
        ("guidance_kl", "guidance KL"),
    ),
}
EVAL_MEASURES = (
    (("held_out_loss", "objective"), "held-out loss"),  # an older OPTD eval row says "objective"
    (("parse_share",), "parse share"),
    (("executable_share",), "executable share"),
)


def progress_key(stage: str) -> str:
    return f"train-{stage}-progress"


def curves_key(stage: str) -> str:
    return f"train-{stage}-curves"


def _value(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "–"
    return f"{value:.4f}" if math.isfinite(value) else str(value)


def _latest(rows: list[dict[str, Any]], kind: str) -> dict[str, Any] | None:
    return next((row for row in reversed(rows) if row.get("kind") == kind), None)


def progress_rows(rows: list[dict[str, Any]], stage: str) -> list[tuple[str, str, str]]:
    """(measure, update, value) of the latest training row and the latest held-out evaluation."""
    table = []
    if train := _latest(rows, "train"):
        measures = TRAIN_MEASURES.get(stage, TRAIN_MEASURES["sft"])
        table += [(label, str(train["step"]), _value(train[key])) for key, label in measures if key in train]
    if held_out := _latest(rows, "eval"):
        for keys, label in EVAL_MEASURES:
            value = next((held_out[k] for k in keys if held_out.get(k) is not None), None)
            table.append((label, str(held_out["step"]), _value(value)))
    return table


def progress_markdown(run_dir: Path, stage: str, rows: list[dict[str, Any]], png: bytes | None) -> str:
    """The markdown artifact: the latest values as a table, then the curves (``png``) inline."""
    lines = [f"# Training progress ({stage})", "", f"run: `{run_dir}`", ""]
    table = progress_rows(rows, stage)
    if not table:
        return "\n".join([*lines, "no metrics rows yet"])
    train_steps = [row["step"] for row in rows if row.get("kind") == "train"]
    lines += [f"{len(train_steps)} updates so far", "", "| latest | update | value |", "|---|---:|---:|"]
    lines += [f"| {measure} | {step} | {value} |" for measure, step, value in table]
    if png is not None:
        lines += ["", f"![training curves](data:image/png;base64,{base64.b64encode(png).decode('ascii')})"]
    return "\n".join(lines)


def publish_training_progress(run_dir: str, stage: str) -> None:
    """Redraw ``RUN/curves.png`` from ``RUN/metrics.jsonl`` and publish the stage's progress artifacts.

    Call it where the metrics are written (rank 0), in a Prefect flow or task run (the artifacts are
    then that run's) or outside one. A failure to reach the Prefect API is a warning, not an error:
    the artifacts are a view of the run, and the run must not stop for them."""
    folder = Path(run_dir).resolve()
    rows = read_rows(folder)
    png, curves = None, None
    if rows:
        figure = plot_training_curves(rows, stage)
        curves = save_png(figure, folder / CURVES_FILE)
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=EMBEDDED_DPI)
        png = buffer.getvalue()
    markdown = progress_markdown(folder, stage, rows, png)
    try:
        create_markdown_artifact(
            markdown=markdown, key=progress_key(stage), description=f"{stage} training progress: {folder}"
        )
        if curves is not None:
            create_image_artifact(
                image_url=curves.as_uri(), key=curves_key(stage), description=f"{stage} curves: {curves}"
            )
    except Exception as err:  # the API unreachable, a server error: reported, the run goes on
        warnings.warn(f"training progress not published to Prefect: {err}", stacklevel=2)
