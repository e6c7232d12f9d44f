"""``trajforge evaluate``: traces per simulator, report.json with exactly the figure keys, report.html."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from cli.app import app
from evaluation.rollout import Rollout
from evaluation.traces import read_replay, read_traces
from synthetic.bundle import write_bundle
from tests.evaluation.test_environment import session
from tests.evaluation.tiny_model import save_tiny_llama
from tests.flows.generated_lakes import generated_lake
from transforms.ingest import ingest_bundle

runner = CliRunner()
HEADLINE = ["RVA", "OVA", "F1", "Acc", "DM-JSD", "TE", "PF", "dCTR", "dACR", "T-JSD"]
SUPPLEMENTARY = ["action_JSD", "funnel", "RecVerse", "HCO", "cohorts", "replay_unscored", "counts"]
EFFECT = ["effect_ratio", "effect_error", "effect_ci", "effect_users"]
ALIGNMENT = ["decision_alignment", "purchase_alignment", "no_purchase_alignment", "purchase_sessions",
             "no_purchase_sessions"]  # fmt: skip
SESSIONS = 6


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    root = tmp_path_factory.mktemp("evaluate")
    write_bundle(root / "raw", users=120, seed=9, fmt="parquet", parts_per_table=1)
    ingest_bundle(root / "raw", root / "lake")
    return root / "lake"


def evaluate(lake, out, *specs, extra=()):
    args = ["evaluate", "--lake", str(lake), "--out", str(out), "--sessions", str(SESSIONS)]
    args += ["--max-new-tokens", "4", *extra]
    for spec in specs:
        args += ["--simulator", spec]
    return runner.invoke(app, args)


def test_evaluate_writes_traces_report_json_and_html(prefect_harness, lake, tmp_path):
    model = save_tiny_llama(tmp_path / "tiny", [m["content"] for m in Rollout(session()).messages()])
    out = tmp_path / "eval"
    specs = ["markov", "random", f"checkpoint:{model}"]
    result = evaluate(lake, out, *specs)
    assert result.exit_code == 0, result.output
    assert f"report: {out / 'report.html'}" in " ".join(result.output.split())
    report = json.loads((out / "report.json").read_text())
    assert list(report["simulators"]) == specs
    for figures in report["simulators"].values():
        assert list(figures) == HEADLINE + SUPPLEMENTARY + EFFECT
        assert [figures[key] for key in EFFECT] == [None] * len(EFFECT)  # no effect estimate here
    assert report["real"]["sessions"] == SESSIONS and len(read_traces(out / "real.jsonl")) == SESSIONS
    for spec in specs:
        paths = report["traces"][spec]
        assert {t.source for t in read_traces(paths["rollout"])} == {spec}
        assert len(read_traces(paths["rollout"])) == SESSIONS
        assert {r.session_id for r in read_replay(paths["replay"])} <= {
            t.session_id for t in read_traces(out / "real.jsonl")
        }
    page = (out / "report.html").read_text()
    images = re.findall(r'<img alt="([^"]+)" src="data:image/png;base64,', page)
    assert images == ["Action mix", "Session lengths", "Decision mix", "Funnel", "Cohort fidelity"]
    assert "Comparison (Table 2)" in page and "DM-JSD ↓" in page and "PF ↑" in page
    assert "No simulator has an A/B effect estimate" in page
    # a lake of real logs has no ground-truth shoppers: no alignment figures, and the reason instead
    assert list(report["decision_alignment"]) == ["unavailable"]
    assert "has no world" in report["decision_alignment"]["unavailable"]
    assert "No decision alignment: the lake" in page


def test_evaluate_on_a_world_reports_decision_alignment(prefect_harness, tmp_path):
    lake = generated_lake(tmp_path / "world", users=60, seed=5)
    out = tmp_path / "eval"
    result = evaluate(lake, out, "world", "random", extra=["--no-effect"])
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    for figures in report["simulators"].values():
        assert list(figures) == [*HEADLINE, *SUPPLEMENTARY, "decision_alignment", *EFFECT]
        assert list(figures["decision_alignment"]) == ALIGNMENT
        aligned = figures["decision_alignment"]
        assert aligned["purchase_sessions"] + aligned["no_purchase_sessions"] == SESSIONS
    reference = report["decision_alignment"]
    assert list(reference) == ["acceptable", "shown", "real"] and list(reference["real"]) == ALIGNMENT
    page = (out / "report.html").read_text()
    assert "Decision alignment (SalesSim)" in page and "purchase alignment ↑" in page
    images = re.findall(r'<img alt="([^"]+)" src="data:image/png;base64,', page)
    assert images[-1] == "Decision alignment"


def test_evaluate_run_again_resumes_without_redoing_sessions(prefect_harness, lake, tmp_path):
    out = tmp_path / "eval"
    assert evaluate(lake, out, "random").exit_code == 0
    first = (out / "report.json").read_text()
    again = evaluate(lake, out, "random")
    assert again.exit_code == 0, again.output
    runs = json.loads((out / "report.json").read_text())["runs"]["random"]
    assert (runs["rollout"]["written"], runs["rollout"]["resumed"]) == (0, SESSIONS)
    assert (runs["replay"]["written"], runs["replay"]["resumed"]) == (0, SESSIONS)
    assert json.loads(first)["simulators"] == json.loads((out / "report.json").read_text())["simulators"]


def test_an_unknown_simulator_stops_with_its_name(prefect_harness, lake, tmp_path):
    result = evaluate(lake, tmp_path / "eval", "oracle")
    assert result.exit_code == 1
    assert "unknown simulator 'oracle'" in result.output
