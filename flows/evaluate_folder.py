"""An evaluation's ``--out`` holds one evaluation; a new one never mixes with, or writes over, another's.

A run writes ``run.json`` (what it was asked: the lake, split, sessions, sampling, simulators) before
any trace. Run again with the same settings it resumes: the engine skips the sessions its trace files
hold. Asked anything else, an ``--out`` holding another evaluation (or outputs without a ``run.json``)
is refused before any work, unless told to continue it with the new settings (``resume``: its traces
are kept and extended, its lake must be the same) or to replace it (``overwrite``: the evaluation's
outputs are removed first, and nothing else in the folder). Either way only the traces of the sessions
being scored are scored (``scored_traces``). Like trainer.run_folder, this needs neither torch nor
Prefect, so the command line makes the check in a second.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainer.run_folder import check_writable, discard

RUN_FILE = "run.json"
SCORED_DIR = "scored"  # copies of trace files cut to the sessions scored, when a file holds more
#: what an evaluation leaves in its folder (globs); any of them there means an evaluation was here
OUTPUTS = (RUN_FILE, "real.jsonl", "*.rollout.jsonl", "*.replay.jsonl", "*.manifest.json", "report.json",
           "report.html", "training", SCORED_DIR)  # fmt: skip


def evaluation_outputs(out: str | Path) -> list[Path]:
    """What an evaluation left in ``out``, in ``OUTPUTS`` order (none: no evaluation was here)."""
    out = Path(out)
    return [path for pattern in OUTPUTS for path in sorted(out.glob(pattern))] if out.is_dir() else []


def lake_identity(lake: str | Path) -> dict[str, Any]:
    """The lake as a run records it: its folder and the fingerprint of the bundle it was ingested from
    (None for a lake written without the ingest flow)."""
    from transforms.manifest import read_manifest

    manifest = read_manifest(lake, "ingest")
    return {"path": str(Path(lake).resolve()), "fingerprint": manifest and manifest.inputs.get("raw")}


def run_settings(lake: str | Path, simulators: Sequence[str], **settings: Any) -> dict[str, Any]:
    """What ``run.json`` records: the lake's identity, the simulators and every other setting given."""
    return json.loads(json.dumps({"lake": lake_identity(lake), "simulators": list(simulators), **settings}))


def differences(recorded: dict[str, Any], asked: dict[str, Any]) -> list[str]:
    """The settings in which ``asked`` differs from ``recorded``, each as ``name was -> now``."""
    names = [*recorded, *(k for k in asked if k not in recorded)]
    return [
        f"{name} {json.dumps(recorded.get(name))} -> {json.dumps(asked.get(name))}"
        for name in names
        if recorded.get(name) != asked.get(name)
    ]


def check_evaluation_folder(
    out: str | Path, settings: dict[str, Any], resume: bool = False, overwrite: bool = False
) -> None:
    """Refuse, before any work, an ``out`` the evaluation cannot use as asked (ValueError): one it
    cannot write in, or one holding another evaluation when told neither to ``resume`` it nor to
    ``overwrite`` it; ``resume`` never continues an evaluation of another lake."""
    out = Path(out)
    if resume and overwrite:
        raise ValueError("--resume continues the evaluation in --out, --overwrite replaces it: pass one")
    check_writable(out)
    found = evaluation_outputs(out)
    if not found or overwrite:
        return
    recorded = read_run(out)
    if recorded is None:
        if resume:
            return
        names = ", ".join(sorted({p.name for p in found})[:4])
        raise ValueError(
            f"--out {out} holds evaluation outputs of an unknown run ({names}; no {RUN_FILE}): pass "
            "--resume to keep and extend them or --overwrite to replace them"
        )
    changed = differences(recorded, settings)
    if not changed:
        return
    if resume and recorded.get("lake") != settings.get("lake"):
        raise ValueError(
            f"--out {out} holds an evaluation of another lake ({changed[0]}): --resume cannot continue "
            "it; pass --overwrite to replace it or choose another --out"
        )
    if not resume:
        raise ValueError(
            f"--out {out} holds another evaluation ({'; '.join(changed)}): pass --resume to continue "
            "it with these settings or --overwrite to replace it"
        )


def read_run(out: Path) -> dict[str, Any] | None:
    path = out / RUN_FILE
    try:
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    except (OSError, ValueError):
        return {"unreadable": str(path)}  # differs from any settings asked: refused unless told


def start_evaluation(out: str | Path, settings: dict[str, Any], overwrite: bool = False) -> None:
    """Make ``out`` ready once ``check_evaluation_folder`` has passed: with ``overwrite`` the previous
    evaluation's outputs are removed, then ``run.json`` records the settings of this one."""
    out = Path(out)
    if overwrite:
        for output in evaluation_outputs(out):
            if output.is_dir():
                discard(output)
            else:
                output.unlink()
    out.mkdir(parents=True, exist_ok=True)
    (out / RUN_FILE).write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")


def scored_traces(path: str, session_ids: Sequence[str]) -> str:
    """``path`` when its trace file holds only sessions of ``session_ids``; otherwise a copy of it cut
    to them under ``SCORED_DIR`` beside it (the file itself keeps every trace, for a later resume)."""
    source = Path(path)
    wanted = set(session_ids)
    lines = [line for line in source.read_text(encoding="utf-8").splitlines() if line.strip()]
    kept = [line for line in lines if json.loads(line).get("session_id") in wanted]
    if len(kept) == len(lines):
        return path
    copy = source.parent / SCORED_DIR / source.name
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
    return str(copy)


def scored_run(written: dict[str, Any], session_ids: Sequence[str]) -> dict[str, Any]:
    """A simulate task's result with its rollout and replay paths those of ``scored_traces``."""
    return {
        **written,
        **{
            kind: {**summary, "path": scored_traces(summary["path"], session_ids)}
            for kind in ("rollout", "replay")
            if (summary := written.get(kind))
        },
    }
