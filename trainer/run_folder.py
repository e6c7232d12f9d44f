"""A run folder (``--out``) holds one training run; a new run never writes over another's.

A run writes ``checkpoints/``, ``trainer_state/``, ``metrics.jsonl``, ``curves.png`` and
``summary.json`` into its folder. A new run into a folder that holds those of another run would
truncate that run's metrics and prune its checkpoints beside its own, so it is refused unless told to
continue that run (``resume``) or to replace it (``overwrite``: those outputs are removed first, and
nothing else in the folder). The checks are cheap and write nothing but a probe file, so the command
line makes them before any work; this module needs neither torch nor the data stack.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from trainer.curves import CURVES_FILE, METRICS_FILE

CHECKPOINTS_DIR, STATES_DIR, SUMMARY_FILE = "checkpoints", "trainer_state", "summary.json"
#: what a run leaves in its folder; any of them there means another run was here
RUN_OUTPUTS = (CHECKPOINTS_DIR, STATES_DIR, METRICS_FILE, CURVES_FILE, SUMMARY_FILE)


def run_outputs(out: str | Path) -> list[Path]:
    """The outputs of a run already in ``out``, in ``RUN_OUTPUTS`` order (none: no run was here)."""
    return [Path(out) / name for name in RUN_OUTPUTS if (Path(out) / name).exists()]


def check_writable(out: Path) -> None:
    """``out`` is a folder this process can write in (made if missing), or one clear ValueError."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file, not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as err:
        raise ValueError(f"--out {out} is not a folder this process can write in ({err.strerror})") from None


def check_run_folder(out: str | Path, resume: bool = False, overwrite: bool = False) -> None:
    """Refuse, before any work, a folder the run cannot use as asked: one it cannot write in, or one
    holding another run when told neither to ``resume`` it nor to ``overwrite`` it (ValueError)."""
    out = Path(out)
    if resume and overwrite:
        raise ValueError("--resume continues the run in --out, --overwrite replaces it: pass one of them")
    check_writable(out)
    found = run_outputs(out)
    if found and not (resume or overwrite):
        raise ValueError(
            f"--out {out} holds another run ({', '.join(p.name for p in found)}): pass --resume to "
            "continue it or --overwrite to replace it"
        )


def start_afresh(out: str | Path, overwrite: bool = False) -> None:
    """Make ``out`` ready for a new run: refused while it holds another run, unless ``overwrite``, which
    removes that run's outputs (``RUN_OUTPUTS``) and leaves the rest of the folder as it is."""
    check_run_folder(out, overwrite=overwrite)
    for output in run_outputs(out):
        if output.is_dir():
            discard(output)
        else:
            output.unlink()


def discard(folder: Path) -> None:
    """Remove ``folder`` by first renaming it out of sight: a half-removed folder is never taken for one."""
    if folder.exists():
        gone = folder.with_name(f".{folder.name}.old")
        shutil.rmtree(gone, ignore_errors=True)
        os.replace(folder, gone)
        shutil.rmtree(gone, ignore_errors=True)
