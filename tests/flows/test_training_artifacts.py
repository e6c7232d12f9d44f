"""Training progress artifacts (flows/training_artifacts.py), published from a flow and a task run and read
back through the Prefect client."""

from __future__ import annotations

import base64
import re

import pytest
from prefect import flow, task
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey
from prefect.context import get_run_context

from flows.training_artifacts import progress_markdown, publish_training_progress
from tests.trainer.runs import optd_rows, sft_rows, write_rows

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def artifacts(key, flow_run_id):
    """Every version of ``key`` made by that flow run, oldest first."""
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(
                key=ArtifactFilterKey(any_=[key]), flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])
            )
        )
    return sorted(found, key=lambda a: a.created)


def embedded_png(markdown):
    found = re.search(r"!\[training curves\]\(data:image/png;base64,([A-Za-z0-9+/=]+)\)", markdown)
    assert found, "no embedded curves"
    return base64.b64decode(found.group(1))


def test_progress_is_published_from_a_flow_and_the_latest_version_has_the_latest_rows(
    prefect_harness, tmp_path
):
    run = tmp_path / "sft"

    @flow(name="training-progress-test")
    def training() -> str:
        write_rows(run, sft_rows()[:4])  # up to the evaluation after update 2
        publish_training_progress(str(run), "sft")
        write_rows(run, sft_rows())  # two more updates and the evaluation after update 4
        publish_training_progress(str(run), "sft")
        return str(get_run_context().flow_run.id)

    flow_run = training()
    progress = artifacts("train-sft-progress", flow_run)
    assert [a.type for a in progress] == ["markdown", "markdown"]  # one version per evaluation
    first, latest = progress[0].data, progress[-1].data
    assert "| held-out loss | 2 | 4.5000 |" in first
    for line in [
        "| training loss | 4 | 2.7000 |",  # the last train row
        "| token NLL | 4 | 2.7000 |",
        "| held-out loss | 4 | 3.0000 |",  # the last eval row
        "| parse share | 4 | 0.7500 |",
        "| executable share | 4 | 0.5000 |",
    ]:
        assert line in latest.splitlines()
    assert embedded_png(latest).startswith(PNG_MAGIC)
    (image,) = artifacts("train-sft-curves", flow_run)[-1:]
    assert image.type == "image" and image.data == (run / "curves.png").resolve().as_uri()
    assert (run / "curves.png").read_bytes().startswith(PNG_MAGIC)


def test_optd_progress_from_a_task_shows_the_parts(prefect_harness, tmp_path):
    run = tmp_path / "optd"
    write_rows(run, optd_rows())

    @task
    def evaluate_and_publish() -> None:
        publish_training_progress(str(run), "optd")

    @flow(name="training-progress-task-test")
    def training() -> str:
        evaluate_and_publish()
        return str(get_run_context().flow_run.id)

    flow_run = training()
    (progress,) = artifacts("train-optd-progress", flow_run)
    assert progress.task_run_id is not None  # made inside the task run
    lines = progress.data.splitlines()
    for line in [
        "| training loss | 2 | 0.2400 |",  # 0.15 + 0.1 x 0.9
        "| distillation | 2 | 0.1500 |",
        "| grounding | 2 | 0.9000 |",
        "| mean λ* | 2 | 0.6000 |",
        "| binding share | 2 | 0.5000 |",
        "| guidance KL | 2 | 0.0170 |",
        "| held-out loss | 2 | 0.1800 |",  # the OPTD eval row's objective
        "| parse share | 2 | 1.0000 |",
        "| executable share | 2 | 0.7500 |",
    ]:
        assert line in lines
    assert len(artifacts("train-optd-curves", flow_run)) == 1


def test_before_any_row_the_markdown_says_so_and_no_image_is_made(tmp_path):
    assert progress_markdown(tmp_path, "sft", [], None).endswith("no metrics rows yet")


def test_an_unreachable_api_is_a_warning_not_an_error(tmp_path, monkeypatch):
    import flows.training_artifacts as artifacts_module

    def refused(**_):
        raise ConnectionError("connection refused")

    monkeypatch.setattr(artifacts_module, "create_markdown_artifact", refused)
    write_rows(tmp_path, sft_rows())
    with pytest.warns(UserWarning, match="not published to Prefect: connection refused"):
        publish_training_progress(str(tmp_path), "sft")
    assert (tmp_path / "curves.png").read_bytes().startswith(PNG_MAGIC)  # the figure is still redrawn
