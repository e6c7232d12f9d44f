"""Deployments as served by ``trajforge serve`` and declared in prefect.yaml."""

from __future__ import annotations

from pathlib import Path

import yaml

from flows.deployments import deployments
from flows.handoff import EVALUATE_DEPLOYMENT, TRAIN_OPTD_DEPLOYMENT, TRAIN_SFT_DEPLOYMENT

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
    served = {(d.flow_name, d.name) for d in deployments("/logs", "/lake")}
    assert {flow for flow, _ in served} == {"pipeline", "validate"}
    assert {flow for flow, _ in declared} == {"pipeline", "validate", "train", "abtest", "evaluate"}
    assert served.isdisjoint(declared)


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
