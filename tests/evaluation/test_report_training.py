"""The report's Training section: the run behind a checkpoint simulator, its teacher's for an OPTD run, and
nothing for a model folder that is not a trajforge run."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pytest

from evaluation.report import training_runs, write_report
from evaluation.rollout import Rollout
from flows.score import score_files
from synthetic.bundle import write_bundle
from tests.evaluation.test_environment import session
from tests.evaluation.test_evaluate_cli import evaluate
from tests.evaluation.test_report import PNG_MAGIC, content, written
from tests.evaluation.tiny_model import save_tiny_llama
from tests.trainer.runs import optd_rows, sft_rows, write_rows, write_run
from transforms.ingest import ingest_bundle

# the first and last eval rows of sft_rows(): held-out loss 6.0 -> 3.0, parse 0 -> 0.75, and no
# executable share at step 0 (nothing judged) -> 0.5
SFT_FIGURES = "held-out loss 6.0000 → 3.0000; parse share 0.0000 → 0.7500; executable share – → 0.5000."
SFT_LINE = f"SFT, 4 updates (the checkpoint evaluated: update 4); {SFT_FIGURES}"


def report_with(tmp_path, specs):
    """A report over the tiny traces with ``specs``' training runs; returns report.json and the page."""
    traces = written(tmp_path)
    report = content(score_files(traces["real"], traces["markov"]))
    out = tmp_path / "out"
    report["training"] = training_runs(specs, out)
    paths = write_report(out, report, traces)
    return json.loads(Path(paths["json"]).read_text()), Path(paths["html"]).read_text(encoding="utf-8")


def images(page):
    return dict(re.findall(r'<img alt="([^"]+)" src="data:image/png;base64,([^"]+)"', page))


def test_an_sft_checkpoint_gets_its_runs_curves_and_summary(tmp_path):
    checkpoint = write_run(tmp_path / "runs" / "sft", sft_rows(), "sft", 4)
    spec = f"checkpoint:{checkpoint}"
    report, page = report_with(tmp_path, [spec, "markov"])
    assert list(report["training"]) == [spec]  # markov is no checkpoint: no entry
    entry = report["training"][spec]
    assert {k: v for k, v in entry.items() if k != "curves_png"} == {
        "run_dir": str(tmp_path / "runs" / "sft"), "stage": "sft", "steps": 4,
        "held_out_loss_start": 6.0, "held_out_loss_end": 3.0,
        "parse_share_start": 0.0, "parse_share_end": 0.75,
        "executable_share_start": None, "executable_share_end": 0.5,
        "checkpoint": str(checkpoint), "checkpoint_step": 4,
    }  # fmt: skip
    png = Path(entry["curves_png"])
    assert png.parent == tmp_path / "out" / "training" and png.read_bytes().startswith(PNG_MAGIC)
    assert not (tmp_path / "runs" / "sft" / "curves.png").exists()  # the run folder is only read
    assert "<h2>Training</h2>" in page and f"<h3>{spec}</h3>" in page
    assert f"<p>{SFT_LINE} Run: {tmp_path / 'runs' / 'sft'}</p>" in page
    embedded = images(page)[f"Training curves: {spec}"]
    assert base64.b64decode(embedded) == png.read_bytes()
    # after the report's other plots (no A/B effect was estimated here: no image for it)
    assert list(images(page)) == [
        "Action mix", "Session lengths", "Decision mix", "Funnel", "Cohort fidelity", f"Training curves: {spec}"
    ]  # fmt: skip


def test_an_optd_checkpoint_brings_its_teacher_from_trainer_state(tmp_path):
    teacher = write_run(tmp_path / "runs" / "sft", sft_rows(), "sft", 4)
    # the layout in which trainer.json sits under RUN/trainer_state/step-NNNNNN/, not in the checkpoint
    student = write_run(tmp_path / "runs" / "optd", optd_rows(), "optd", 2, meta_in="trainer_state",
                        teacher=str(teacher))  # fmt: skip
    spec = f"checkpoint:{student}"
    report, page = report_with(tmp_path, [spec])
    entry = report["training"][spec]
    # the OPTD eval rows' objective is the held-out loss: 0.3 -> 0.18
    assert (entry["stage"], entry["steps"], entry["held_out_loss_start"], entry["held_out_loss_end"]) == (
        "optd", 2, 0.3, 0.18,
    )  # fmt: skip
    assert (entry["parse_share_start"], entry["parse_share_end"]) == (0.5, 1.0)
    assert entry["teacher_checkpoint"] == str(teacher)
    assert entry["teacher"]["stage"] == "sft" and entry["teacher"]["run_dir"] == str(
        tmp_path / "runs" / "sft"
    )
    assert f"<h4>Its teacher: {teacher}</h4>" in page
    assert f"<p>SFT, 4 updates (the teacher checkpoint: update 4); {SFT_FIGURES} Run: " in page
    shown = images(page)
    assert {f"Training curves: {spec}", f"Training curves: {spec}, teacher"} <= set(shown)
    assert all(base64.b64decode(shown[alt]).startswith(PNG_MAGIC) for alt in shown)


def test_a_teacher_that_is_no_trajforge_run_is_named_without_curves(tmp_path):
    student = write_run(tmp_path / "optd", optd_rows(), "optd", 2, teacher=str(tmp_path / "pretrained"))
    report, page = report_with(tmp_path, [f"checkpoint:{student}"])
    entry = report["training"][f"checkpoint:{student}"]
    assert entry["teacher"] is None and entry["teacher_checkpoint"] == str(tmp_path / "pretrained")
    assert f"Its teacher, {tmp_path / 'pretrained'}, is not a trajforge run folder." in page


def test_a_plain_model_folder_gets_no_training_section(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    report, page = report_with(tmp_path, [f"checkpoint:{model}", "markov"])
    assert report["training"] == {}
    assert "<h2>Training</h2>" not in page
    assert not any(alt.startswith("Training curves") for alt in images(page))
    assert not (tmp_path / "out" / "training").exists()


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    """A small generated lake, as tests/evaluation/test_evaluate_cli.py's."""
    root = tmp_path_factory.mktemp("evaluate")
    write_bundle(root / "raw", users=120, seed=9, fmt="parquet", parts_per_table=1)
    ingest_bundle(root / "raw", root / "lake")
    return root / "lake"


def test_the_evaluate_flow_reports_the_run_behind_a_checkpoint_simulator(prefect_harness, lake, tmp_path):
    # a model folder where the trainer puts its checkpoints, metrics beside them and no trainer.json: the
    # run is found by its layout, its stage from its rows
    run = tmp_path / "run"
    prompts = [m["content"] for m in Rollout(session()).messages()]
    checkpoint = save_tiny_llama(run / "checkpoints" / "step-000004", prompts)
    write_rows(run, sft_rows())
    out = tmp_path / "eval"
    result = evaluate(lake, out, f"checkpoint:{checkpoint}", "markov")
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    entry = report["training"][f"checkpoint:{checkpoint}"]
    assert list(report["training"]) == [f"checkpoint:{checkpoint}"]
    assert (entry["stage"], entry["steps"], entry["held_out_loss_end"]) == ("sft", 4, 3.0)
    page = (out / "report.html").read_text(encoding="utf-8")
    assert f"<p>{SFT_LINE} Run: {run}</p>" in page
    assert list(images(page))[-1] == f"Training curves: checkpoint:{checkpoint}"
