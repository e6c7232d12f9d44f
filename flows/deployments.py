"""Deployments of the pipeline: served from this process (``trajforge serve``) or
declared in ``prefect.yaml`` for a work pool (``prefect deploy --all``).

The served ones carry names of their own: a deployment is identified by flow and name,
so serving under the work pool's names would overwrite those deployments' parameters
and schedules on the server.
"""

from __future__ import annotations

from prefect import serve
from prefect.deployments.runner import RunnerDeployment

from flows.pipeline import pipeline_flow
from flows.validate import validate_flow

SERVED_NIGHTLY = "nightly-served"
SERVED_ON_DEMAND = "on-demand-served"


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


def serve_deployments(raw: str, lake: str, cron: str | None) -> None:
    """Register the deployments and run their schedules from this process until interrupted."""
    serve(*deployments(raw, lake, cron))
