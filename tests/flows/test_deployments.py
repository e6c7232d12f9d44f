"""Deployments as served by ``trajforge serve`` and declared in prefect.yaml."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from flows.deployments import deployments, served
from flows.handoff import EVALUATE_DEPLOYMENT, HAND_OFF_TO, TRAIN_OPTD_DEPLOYMENT, TRAIN_SFT_DEPLOYMENT
from flows.main_job import MainJobSettings

ROOT = Path(__file__).resolve().parents[2]


def test_served_deployments_carry_schedule_and_parameters():
    nightly, on_demand = deployments("/logs", "/lake", cron="30 1 * * *")
    assert (nightly.name, nightly.flow_name) == ("nightly-served", "pipeline")
    assert nightly.parameters == {"raw": "/logs", "lake": "/lake"}
    assert [s.schedule.cron for s in nightly.schedules] == ["30 1 * * *"]
    assert (on_demand.flow_name, on_demand.parameters, on_demand.schedules) == (
        "validate",
        {"lake": "/lake"},
        [],
    )


def test_prefect_yaml_entrypoints_exist():
    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    for deployment in spec["deployments"]:
        module, function = deployment["entrypoint"].split(":")
        assert f"def {function}(" in (ROOT / module).read_text(), deployment["entrypoint"]


def test_served_names_never_overwrite_the_work_pool_deployments():
    # a deployment is identified by (flow, name): serving must not reuse a name prefect.yaml declares
    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    flow_of = {
        "flows/pipeline.py:pipeline_flow": "pipeline",
        "flows/validate.py:validate_flow": "validate",
        "flows/train.py:train_flow": "train",
        "flows/abtest.py:abtest_flow": "abtest",
        "flows/evaluate.py:evaluate_flow": "evaluate",
    }
    declared = {(flow_of[d["entrypoint"]], d["name"]) for d in spec["deployments"]}
    from_process = {(d.flow_name, d.name) for d in served("all", "/logs", "/lake", None)}
    assert {flow for flow, _ in from_process} == {"pipeline", "validate", "train", "evaluate"}
    assert {flow for flow, _ in declared} == {"pipeline", "validate", "train", "abtest", "evaluate"}
    assert from_process.isdisjoint(declared)


def test_the_gpu_role_serves_what_a_served_hand_off_runs():
    gpu = served("gpu", None, "/lake", None)
    names = [f"{d.flow_name}/{d.name}" for d in gpu]
    assert names == list(HAND_OFF_TO["served"])  # train-sft, train-optd, evaluate, as the main job names them
    assert [d.parameters for d in gpu] == [
        {"lake": "/lake", "stage": "sft"},
        {"lake": "/lake", "stage": "optd"},
        {"lake": "/lake"},
    ]
    assert all(d.schedules == [] for d in gpu)  # run when a main job hands work over, never on a clock
    assert MainJobSettings().hand_off_to == "pool" and HAND_OFF_TO["pool"] == (
        TRAIN_SFT_DEPLOYMENT, TRAIN_OPTD_DEPLOYMENT, EVALUATE_DEPLOYMENT,
    )  # fmt: skip
    with pytest.raises(ValueError, match="raw bundle"):
        served("dataset", None, "/lake", None)
    with pytest.raises(ValueError, match="none of"):
        served("trainer", None, "/lake", None)


def test_the_main_jobs_hand_off_names_gpu_pool_deployments_that_bake_no_local_path():
    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    pools = {f"{d['entrypoint'].split(':')[1].removesuffix('_flow')}/{d['name']}": d["work_pool"]["name"]
             for d in spec["deployments"]}  # fmt: skip
    for name in (TRAIN_SFT_DEPLOYMENT, TRAIN_OPTD_DEPLOYMENT, EVALUATE_DEPLOYMENT):
        assert pools[name] == "gpu", name
    assert pools["pipeline/nightly"] == "trajforge"
    # the worker's own checkout, read on the worker when a run starts
    (step,) = spec["pull"]
    assert step == {"prefect.deployments.steps.set_working_directory": {"directory": "{{ $TRAJFORGE_CODE }}"}}
