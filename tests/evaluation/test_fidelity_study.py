"""bench/fidelity.py at its quick size: every arm trained and evaluated, the JSON in the promised shape,
the figures' intervals and the goals consistent with the figures, the HTML with its plots."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

ARMS = {"sft", "optd", "optd_no_trust_region", "optd_no_grounding", "optd_plain_teacher",
        "optd_intent_teacher", "markov", "random", "world"}  # fmt: skip
METRICS = {"F1", "Acc", "DM-JSD", "TE", "PF", "dCTR", "dACR", "T-JSD", "effect_ratio", "effect_error"}
HIGHER = {"F1", "Acc", "PF"}  # PROTOCOL §4: the others are distances, lower is better


@pytest.fixture(scope="module")
def study(prefect_harness, tmp_path_factory):
    from fidelity import QUICK, run_study

    out = tmp_path_factory.mktemp("fidelity")
    result = run_study(QUICK, out / "work", out, log=lambda _line: None)
    return result, out


@pytest.mark.slow
def test_the_quick_study_writes_every_arm_with_intervals(study):
    _result, out = study
    saved = json.loads((out / "fidelity.json").read_text())
    assert saved["users"] == 40 and saved["seeds"] == [0, 1] and saved["sessions"] == 6
    assert set(saved["simulators"]) == ARMS and set(saved["diagnostics"]) == ARMS - {
        "markov",
        "random",
        "world",
    }
    for arm, figures in saved["simulators"].items():
        assert figures.keys() >= METRICS, arm
        for metric, value in figures.items():
            assert value.keys() == {"mean", "lo", "hi"}, (arm, metric)
            if value["lo"] is not None:
                assert value["lo"] <= value["hi"], (arm, metric)
    # the world's shoppers never give an invalid answer, and random picks an executable action each time
    assert saved["simulators"]["world"]["OVA"]["mean"] == 1.0
    assert (
        saved["simulators"]["random"]["RVA"]["mean"] == 1.0
        and saved["simulators"]["world"]["RVA"]["mean"] is None
    )
    for arm in ("optd", "optd_intent_teacher"):
        diagnostics = saved["diagnostics"][arm]
        assert diagnostics.keys() == {"intent_gain_nats", "mean_lambda", "binding_share", "guidance_kl"}
        # a token-weighted mean in float32: 1 within rounding when every lambda* is 1
        assert 0.0 <= diagnostics["mean_lambda"] <= 1.0 + 1e-6 and diagnostics["guidance_kl"] <= 0.02 + 1e-6
    # without a trust region every token takes lambda = 1; a teacher without the intent adds no guidance
    assert saved["diagnostics"]["optd_no_trust_region"]["mean_lambda"] == pytest.approx(1.0, abs=1e-6)
    assert saved["diagnostics"]["optd_plain_teacher"]["guidance_kl"] == pytest.approx(0.0, abs=1e-6)


@pytest.mark.slow
def test_the_goals_follow_from_the_figures(study):
    result, _ = study
    means = {arm: {m: v["mean"] for m, v in f.items()} for arm, f in result["simulators"].items()}

    def strictly_better(a: dict, b: dict, metric: str) -> bool:
        if a[metric] is None or b[metric] is None:
            return False
        return a[metric] > b[metric] if metric in HIGHER else a[metric] < b[metric]

    paper = ("F1", "Acc", "DM-JSD", "TE", "PF", "dCTR", "dACR", "T-JSD")
    markov = sum(strictly_better(means["markov"], means["random"], m) for m in paper)
    optd = sum(
        not strictly_better(means["sft"], means["optd"], m) and means["optd"][m] is not None for m in paper
    )
    goals = result["goals"]
    assert goals["markov_beats_random"]["count"] == markov
    assert goals["optd_at_least_sft"]["count"] == optd
    error = means["optd"]["effect_error"]
    assert goals["optd_effect_error_below_paper"]["met"] == (error is not None and error < 0.287)


@pytest.mark.slow
def test_the_page_shows_the_bars_the_diagnostics_and_the_curves(study):
    _, out = study
    page = (out / "fidelity.html").read_text()
    assert page.count("data:image/png;base64,") == 2  # the figures with intervals, the learning curves
    for heading in (
        "Goals",
        "Figures (mean over seeds, 95 % interval)",
        "The privileged signal",
        "Learning curves",
    ):
        assert f"<h2>{heading}</h2>" in page
    assert all(f"<th>{arm}</th>" in page for arm in ARMS)


def frames_of(sessions: dict[str, list[tuple[str, str]]]):
    """Trace frames of sessions given as (screen, action) steps."""
    import polars as pl

    from evaluation.trace_frames import SESSION_SCHEMA, STEP_SCHEMA, TraceFrames

    rows = [{"session_id": sid, "user_id": f"u-{sid}", "terminated": True, "truncated": False,
             "termination_reason": "end", "prior_clicks": 0, "prior_buys": 0, "recent_click_categories": []}
            for sid in sessions]  # fmt: skip
    steps = [{"session_id": sid, "step": k, "screen": screen, "action": action, "accepted": True,
              "target_item_id": "i1" if action == "click" else None, "review_alias": None,
              "reject_reason": None, "item_category": "Apparel", "item_price": 10.0}
             for sid, walk in sessions.items() for k, (screen, action) in enumerate(walk, 1)]  # fmt: skip
    return TraceFrames(pl.DataFrame(rows, schema=SESSION_SCHEMA), pl.DataFrame(steps, schema=STEP_SCHEMA))


def test_a_resample_keeps_each_drawn_sessions_steps_together_and_in_order():
    """Every session drawn twice: the pooled distributions are those of the sessions once, so every figure
    is the point estimate's (a join alone interleaved a twice-drawn session's steps and broke its visits)."""
    import polars as pl
    from fidelity import headline, resampled

    click, back, cart, end = ("feed", "click"), ("ipv", "back_home"), ("ipv", "ipv_cart"), ("feed", "end")
    scroll, look = ("feed", "scroll_down"), ("ipv", "ipv_swipe_pic")
    real = frames_of({"a": [scroll, click, look, back, end], "b": [click, cart, back, click, back, end],
                      "c": [scroll, scroll, end]})  # fmt: skip
    sim = frames_of(
        {"a": [click, back, end], "b": [click, look, cart, back, end], "c": [click, look, ("ipv", "end")]}
    )
    twice = pl.DataFrame({"session_id": ["a", "b", "c", "a", "b", "c"], "draw": [f"d{k}" for k in range(6)]})
    doubled_sim = resampled(sim, twice)
    assert doubled_sim.steps.filter(pl.col("session_id") == "d1")["action"].to_list() == [
        "click", "ipv_swipe_pic", "ipv_cart", "back_home", "end"]  # fmt: skip
    point, doubled = headline(real, sim, None), headline(resampled(real, twice), doubled_sim, None)
    for metric in ("DM-JSD", "TE", "dCTR", "dACR", "T-JSD"):
        assert doubled[metric] == pytest.approx(point[metric]), metric
    assert point["DM-JSD"] > 0


@pytest.mark.slow
def test_a_resumed_study_keeps_its_finished_runs_and_their_figures(study):
    from fidelity import QUICK, train_seed

    _result, out = study
    work = out / "work"
    lake = work / "lake"
    metrics = sorted((work / "seed-0").glob("*/metrics.jsonl"))
    assert len(metrics) == 7  # sft, the intent teacher and five OPTD arms
    before = {path: path.stat().st_mtime_ns for path in metrics}
    runs = train_seed(lake, work, QUICK, seed=0, resume=True)
    assert {path: path.stat().st_mtime_ns for path in metrics} == before  # nothing trained again
    assert runs.checkpoints["optd"].startswith(str(work / "seed-0" / "optd"))
    assert runs.diagnostics["optd"]["mean_lambda"] == pytest.approx(
        json.loads((work / "seed-0" / "optd" / "summary.json").read_text())["stage_figures"]["updates_mean"][
            "mean_lambda"
        ]
    )


@pytest.mark.slow
def test_a_resumed_study_keeps_the_ab_counts_it_measured(study, monkeypatch):
    import fidelity
    import polars as pl

    result, out = study
    evaluation = out / "work" / "seed-0" / "evaluation"
    written = {path.name: pl.read_parquet(path) for path in evaluation.glob("ab-counts-*.parquet")}
    assert set(written) == {f"ab-counts-{arm}.parquet" for arm in ARMS}
    users = set(written["ab-counts-sft.parquet"]["user_id"].to_list())
    assert len(users) == result["effect_users"]

    measured: list[str] = []
    monkeypatch.setattr(fidelity, "effect_counts", lambda _lake, spec, *_: measured.append(spec))
    ab = fidelity.ABTest(None, [], None, sorted(users))
    runs = fidelity.train_seed(out / "work" / "lake", out / "work", fidelity.QUICK, seed=0, resume=True)
    sessions = json.loads((out / "fidelity.json").read_text())["sessions"]
    assert sessions == 6
    from flows.evaluate import evaluated_ids

    ids = evaluated_ids(str(out / "work" / "lake"), "test", sessions)
    traces = fidelity.evaluate_seed(
        out / "work" / "lake", out / "work", fidelity.QUICK, runs, 0, ids, ab, True
    )
    assert measured == []  # every arm's counts were kept
    assert traces.effects["optd"].equals(written["ab-counts-optd.parquet"])

    # counts over other users are measured again
    other = fidelity.ABTest(None, [], None, sorted(users)[1:])
    fidelity.evaluate_seed(out / "work" / "lake", out / "work", fidelity.QUICK, runs, 0, ids, other, True)
    assert len(measured) == len(ARMS)
