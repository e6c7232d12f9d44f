"""The report: figures printed as the paper's tables, every plot an inline PNG, the effect when present."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

from evaluation.report import comparison_markdown, figure_text, table2_rows, write_report
from evaluation.traces import write_jsonl
from flows.score import score_files
from tests.evaluation.tiny import population

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def written(tmp_path):
    records = population()
    write_jsonl(tmp_path / "real.jsonl", [r for r in records if r.source == "real"])
    write_jsonl(tmp_path / "sim.jsonl", [r for r in records if r.source != "real"])
    return {"real": tmp_path / "real.jsonl", "markov": tmp_path / "sim.jsonl"}


def content(figures, **effect):
    simulators = {
        "markov": {**figures, "effect_ratio": None, "effect_error": None, "effect_ci": None, **effect}
    }
    real = {"path": "real.jsonl", "sessions": 6, "cut_sessions_left_out": {}}
    return {"lake": "lake", "split": "test", "real": real, "simulators": simulators}


def test_figures_print_with_four_decimals_and_te_with_two():
    assert [figure_text("F1", 0.41784), figure_text("TE", 1.7249), figure_text("PF", None)] == [
        "0.4178",
        "1.72",
        "–",
    ]
    row = table2_rows({"m": {"RVA": 1.0, "TE": 3.0, "dCTR": 0.00261}})[0]
    # columns: simulator, RVA, OVA, F1, Acc, DM-JSD, TE, PF, dCTR, dACR, T-JSD
    assert row[:2] == ["m", "1.0000"] and row[6] == "3.00" and row[8] == "0.0026" and row[2] == "–"


def test_the_page_embeds_every_plot_and_the_effect_when_estimated(tmp_path):
    traces = written(tmp_path)
    figures = score_files(traces["real"], traces["markov"])
    paths = write_report(tmp_path / "out", content(figures, effect_ratio=0.8, effect_error=0.2,
                                                   effect_ci=[0.7, 0.9]), traces)  # fmt: skip
    page = Path(paths["html"]).read_text(encoding="utf-8")
    images = re.findall(r'<img alt="([^"]+)" src="data:image/png;base64,([^"]+)"', page)
    assert [alt for alt, _ in images] == [
        "Action mix", "Session lengths", "Decision mix", "Funnel", "Cohort fidelity", "A/B effect ratio"
    ]  # fmt: skip
    assert all(base64.b64decode(data).startswith(PNG_MAGIC) for _, data in images)
    assert "<td>0.8000</td><td>0.2000</td><td>[0.7000, 0.9000]</td>" in page
    assert json.loads(Path(paths["json"]).read_text())["simulators"]["markov"]["effect_ci"] == [0.7, 0.9]


def test_the_artifact_is_table_2_with_where_the_report_is(tmp_path):
    markdown = comparison_markdown(
        {"simulators": {"markov": {"RVA": 0.5, "TE": 2.0}}}, tmp_path / "report.html"
    )
    lines = markdown.splitlines()
    assert lines[1].startswith(
        "| simulator | L0 RVA ↑ | L0 OVA ↑ | L1 F1 ↑ | L1 Acc ↑ | L2 DM-JSD ↓ | L2 TE ↓"
    )
    assert lines[3].startswith("| markov | 0.5000 | – | – | – | – | 2.00 |")
    assert lines[-1] == f"Full report: `{(tmp_path / 'report.html').resolve()}`"
    assert "alignment" not in markdown  # a lake without a world: no alignment table


def test_the_artifact_has_the_decision_alignment_when_the_lake_has_a_world(tmp_path):
    def rates(decision, purchase, idle, bought, without):
        return {"decision_alignment": decision, "purchase_alignment": purchase,
                "no_purchase_alignment": idle, "purchase_sessions": bought, "no_purchase_sessions": without}  # fmt: skip

    report = {
        "simulators": {"markov": {"RVA": 1.0, "decision_alignment": rates(0.25, None, 0.25, 0, 4)}},
        "decision_alignment": {"real": rates(0.5, 1.0, 1 / 3, 1, 3), "acceptable": "a", "shown": "s"},
    }
    lines = comparison_markdown(report, tmp_path / "report.html").splitlines()
    start = lines.index("| source | decision alignment ↑ | purchase alignment ↑ | no purchase alignment ↑ "
                        "| sessions with a purchase | sessions without |")  # fmt: skip
    # the real sessions first, then each simulator; a rate over no sessions prints as a dash
    assert lines[start + 2 : start + 4] == [
        "| real | 0.5000 | 1.0000 | 0.3333 | 1 | 3 |",
        "| markov | 0.2500 | – | 0.2500 | 0 | 4 |",
    ]


def test_the_sessions_left_out_are_counted_in_words():
    from evaluation.report import left_out_text

    assert left_out_text({}) == "none"
    # 3 + 1200 = 1,203 sessions, reasons in alphabetical order
    assert left_out_text({"truncated": 3, "after_rejected_event": 1200}) == (
        "1,203 (after_rejected_event 1,200, truncated 3)"
    )


def test_the_report_says_what_each_figure_rests_on_and_when_an_interval_cannot_rank(tmp_path):
    traces = written(tmp_path)
    figures = score_files(traces["real"], traces["markov"])
    wide = {
        "effect_ratio": 0.4,
        "effect_error": 0.6,
        "effect_ci": [-2.5, 3.0],
        "effect_users": {"A": 8, "B": 7},
    }
    report = content(figures, **wide)
    report["simulators"]["random"] = {**figures, "effect_ratio": 0.9, "effect_error": 0.1,
                                      "effect_ci": [0.6, 1.2], "effect_users": {"A": 8, "B": 7}}  # fmt: skip
    paths = write_report(tmp_path / "out", report, traces)
    page = Path(paths["html"]).read_text(encoding="utf-8")
    counts = figures["counts"]
    # the tiny population's cohorts are under 30 sessions a side: no PF scheme counts
    assert all(s["counted_cohorts"] < 2 for s in figures["cohorts"].values())
    row = f"<td>markov</td><td>{counts['real_sessions']}</td><td>{counts['sim_sessions']}</td><td>–</td>"
    assert f"{row}<td>none</td><td>8 + 7</td>" in page
    assert "<td>[-2.5000, 3.0000]</td><td>8 + 7</td><td>too wide to rank" in page
    assert "<td>[0.6000, 1.2000]</td><td>8 + 7</td><td></td>" in page  # excludes 0: it may rank
    markdown = comparison_markdown(report, paths["html"])
    assert "## What each figure rests on" in markdown and "too wide to rank" in markdown
