"""Deployments of the pipeline: served from this process (``trajforge serve``) or
declared in ``prefect.yaml`` for a work pool (``prefect deploy --all``).

The served ones carry names of their own: a deployment is identified by flow and name,
so serving under the work pool's names would overwrite those deployments' parameters
and schedules on the server. ``trajforge serve --role gpu`` on the GPU machine serves the
training and evaluation deployments a main job hands its GPU stages to
(``[main_job] hand_off = true, hand_off_to = "served"``); ``--role dataset`` (the default) the
nightly run and the on-demand validation, ``--role all`` both from one process.
"""

from __future__ import annotations

from prefect import serve
from prefect.deployments.runner import RunnerDeployment

from flows.evaluate import evaluate_flow
from flows.handoff import SERVED_EVALUATE, SERVED_TRAIN_OPTD, SERVED_TRAIN_SFT
from flows.pipeline import pipeline_flow
from flows.train import train_flow
from flows.validate import validate_flow

SERVED_NIGHTLY = "nightly-served"
SERVED_ON_DEMAND = "on-demand-served"
ROLES = ("dataset", "gpu", "all")


def deployments(raw: str, lake: str, cron: str | None = "0 2 * * *") -> list[RunnerDeployment]:
    """The nightly end-to-end run over ``raw`` and an on-demand validation of ``lake``."""
    return [
        pipeline_flow.to_deployment(
            name=SERVED_NIGHTLY,
            cron=cron,
            parameters={"raw": raw, "lake": lake},
            description="raw log bundle -> lake -> histories -> records, gated after every stage",
            tags=["trajforge"],
        ),
        validate_flow.to_deployment(
            name=SERVED_ON_DEMAND,
            parameters={"lake": lake},
            description="re-validate every lake table; Data Docs per run",
            tags=["trajforge"],
        ),
    ]


def gpu_deployments(lake: str) -> list[RunnerDeployment]:
    """Training (SFT, OPTD) and evaluation, served for the main job's hand-off; the run it hands over
    gives every parameter (its lake, run folders, base and settings), these are only the defaults."""
    name_of = {"sft": SERVED_TRAIN_SFT, "optd": SERVED_TRAIN_OPTD}
    trains = [
        train_flow.to_deployment(
            name=name_of[stage].split("/", 1)[1],
            parameters={"lake": lake, "stage": stage},
            description=f"lake records -> {stage.upper()} checkpoint, on this (GPU) machine",
            tags=["trajforge", "train"],
        )
        for stage in ("sft", "optd")
    ]
    judge = evaluate_flow.to_deployment(
        name=SERVED_EVALUATE.split("/", 1)[1],
        parameters={"lake": lake},
        description="simulators rolled out and replayed on the lake's held-out sessions, on this machine",
        tags=["trajforge", "evaluate"],
    )
    return [*trains, judge]


def served(role: str, raw: str | None, lake: str, cron: str | None) -> list[RunnerDeployment]:
    """The deployments ``role`` serves (``ROLES``); the dataset role needs ``raw``."""
    if role not in ROLES:
        raise ValueError(f"role {role!r} is none of {', '.join(ROLES)}")
    chosen = []
    if role in ("dataset", "all"):
        if raw is None:
            raise ValueError("the dataset deployments need the raw bundle the nightly run ingests")
        chosen += deployments(raw, lake, cron)
    if role in ("gpu", "all"):
        chosen += gpu_deployments(lake)
    return chosen


def serve_deployments(role: str, raw: str | None, lake: str, cron: str | None) -> None:
    """Register the deployments of ``role`` and run them (and their schedules) from this process until
    interrupted."""
    serve(*served(role, raw, lake, cron))
