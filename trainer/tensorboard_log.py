"""TensorBoard event files beside ``metrics.jsonl``: each metrics row mirrored as scalars.

A train row's numbers become ``train/<name>`` at its step, an eval row's ``eval/<name>``; a dict of
numbers (seconds per phase, rejection reasons counted) becomes ``<kind>/<name>/<key>``. The mirror
needs the optional ``tensorboard`` package (``pip install trajforge[tensorboard]``); without it the
mirror writes nothing and says so once, in a warning, so a run never fails for the want of it.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

TENSORBOARD_DIR = "tensorboard"
EVENT_FILES = "events.out.tfevents.*"
NOT_SCALARS = ("kind", "step")


def scalars(row: dict[str, Any]) -> dict[str, float]:
    """A row's numbers by tag: ``<kind>/<name>``, and ``<kind>/<name>/<key>`` for a dict of numbers.

    None (no value, e.g. no executable share when nothing was judged) is left out; a non-finite loss
    is kept, TensorBoard draws it as such; a flag (``skipped``) counts as 0 or 1."""
    kind = row.get("kind", "train")
    found: dict[str, float] = {}
    for name, value in row.items():
        if name in NOT_SCALARS:
            continue
        if isinstance(value, dict):
            for key, inner in value.items():
                if _is_number(inner):
                    found[f"{kind}/{name}/{key}"] = float(inner)
        elif _is_number(value):
            found[f"{kind}/{name}"] = float(value)
    return found


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float)  # a bool is an int: a flag is drawn as 0 or 1


class TensorBoardMirror:
    """Mirror of a run's metrics rows into ``run_dir/tensorboard/``; ``available`` says whether it writes.

    ``resume_from`` is the step a resumed run restarts after (as ``MetricsLog``'s): TensorBoard hides
    the earlier run's events past it, as the metrics file drops its rows. A fresh run
    (``resume_from=None``) removes the event files an earlier run left there, as ``MetricsLog``
    empties the metrics file, so one run's curves never mix with another's."""

    def __init__(self, run_dir: str | Path, resume_from: int | None = None) -> None:
        self.log_dir = Path(run_dir) / TENSORBOARD_DIR
        self.writer: Any = None
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            warnings.warn(
                "tensorboard is not installed: no TensorBoard events are written "
                "(metrics.jsonl and curves.png still are; pip install 'trajforge[tensorboard]')",
                stacklevel=2,
            )
            return
        if resume_from is None:
            for old in self.log_dir.glob(EVENT_FILES):
                old.unlink()
        purge = None if resume_from is None else resume_from + 1
        self.writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=purge)

    @property
    def available(self) -> bool:
        return self.writer is not None

    def write(self, row: dict[str, Any]) -> None:
        if self.writer is None:
            return
        step = int(row["step"])
        for tag, value in scalars(row).items():
            self.writer.add_scalar(tag, value, global_step=step)
        # written through at once: a run that is killed, or never closes its log, keeps every row
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def tensorboard_mirrors(run_dir: str | Path, resume_from: int | None = None) -> tuple[TensorBoardMirror, ...]:
    """``MetricsLog``'s ``mirrors`` for a run: the TensorBoard mirror, none where tensorboard is missing."""
    mirror = TensorBoardMirror(run_dir, resume_from)
    return (mirror,) if mirror.available else ()
