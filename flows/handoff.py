"""Work handed to a deployment (a GPU pool's worker) and awaited: ``run_deployment``, then the paths
the run wrote. Stages exchange paths, so the worker needs only the same filesystem, never a result
sent back through the server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prefect import get_run_logger
from prefect.deployments import run_deployment

#: the deployments of prefect.yaml the main job hands its GPU stages to (``flow/deployment``)
TRAIN_SFT_DEPLOYMENT = "train/train-sft"
TRAIN_OPTD_DEPLOYMENT = "train/train-optd"
EVALUATE_DEPLOYMENT = "evaluate/evaluate"
#: the same stages served from a GPU machine's own process (``trajforge serve --role gpu``)
SERVED_TRAIN_SFT = "train/train-sft-served"
SERVED_TRAIN_OPTD = "train/train-optd-served"
SERVED_EVALUATE = "evaluate/evaluate-served"
HAND_OFF_TO = {
    "pool": (TRAIN_SFT_DEPLOYMENT, TRAIN_OPTD_DEPLOYMENT, EVALUATE_DEPLOYMENT),
    "served": (SERVED_TRAIN_SFT, SERVED_TRAIN_OPTD, SERVED_EVALUATE),
}


class HandOffFailed(RuntimeError):
    """A deployment run the main job waited for did not complete."""


def run_and_wait(deployment: str, parameters: dict[str, Any]) -> None:
    """Run ``deployment`` with ``parameters`` as a subflow of the current run and wait for its end;
    anything but Completed stops the caller with the run's name and state."""
    logger = get_run_logger()
    logger.info("handing %s to its work pool", deployment)
    run = run_deployment(deployment, parameters=parameters, timeout=None)
    if not (run.state and run.state.is_completed()):
        state = run.state.name if run.state else "no state"
        raise HandOffFailed(f"{deployment}: flow run {run.name} ended {state}; its logs are on the server")
    logger.info("%s: flow run %s completed", deployment, run.name)


def trained_checkpoint(out: str | Path) -> str:
    """The final checkpoint a train run in ``out`` recorded in its summary."""
    return json.loads((Path(out) / "summary.json").read_text())["checkpoint"]


def evaluation_written(out: str | Path) -> dict[str, Any]:
    """What ``evaluate_flow`` returns, read back from the report files it wrote in ``out``."""
    out = Path(out)
    return {
        "html": str(out / "report.html"),
        "json": str(out / "report.json"),
        "report": json.loads((out / "report.json").read_text()),
    }
