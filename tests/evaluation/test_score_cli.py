"""``trajforge score``: one JSON object with exactly the headline keys and the supplementary figures."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from cli.app import app
from evaluation.traces import dropped_keys, write_jsonl
from flows.score import export_real_traces
from tests.evaluation.tiny import (
    as_reference,
    as_reference_replay,
    our_replay,
    population,
    write_reference,
)
from tests.extractors.tinylake import write_tiny_lake

runner = CliRunner()
HEADLINE = ["RVA", "OVA", "F1", "Acc", "DM-JSD", "TE", "PF", "dCTR", "dACR", "T-JSD"]  # the key list
SUPPLEMENTARY = ["action_JSD", "funnel", "RecVerse", "HCO", "cohorts", "replay_unscored", "counts"]


def write_pair(tmp_path):
    records = population()
    write_jsonl(tmp_path / "real.jsonl", [r for r in records if r.source == "real"])
    write_jsonl(tmp_path / "sim.jsonl", [r for r in records if r.source != "real"])
    write_jsonl(tmp_path / "replay.jsonl", our_replay())
    return records


def test_score_prints_exactly_the_figure_keys(tmp_path):
    write_pair(tmp_path)
    args = ["score", "--real", str(tmp_path / "real.jsonl"), "--sim", str(tmp_path / "sim.jsonl")]
    result = runner.invoke(app, [*args, "--replay", str(tmp_path / "replay.jsonl")])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.stdout)
    assert list(figures) == HEADLINE + SUPPLEMENTARY
    # replay of five rows: three accepted -> RVA 3/5; rounded to 4 decimals
    assert figures["RVA"] == 0.6
    assert figures["OVA"] == round(42 / 44, 4)
    # population(): real sessions 1, 3, ..., 11 output 6 + 7 + 5 (5 lost its end) + 6 + 7 + 6 = 37 steps, of
    # which 3 and 9 each reject a buy -> 35 actions; simulated: 44 outputs, 42 actions (see test_traces)
    assert figures["counts"] == {
        "real_sessions": 6,
        "real_actions": 35,
        "sim_sessions": 6,
        "sim_outputs": 44,
        "sim_actions": 42,
        "replay_rows": 5,
    }


def test_score_without_replay_prints_null_replay_figures(tmp_path):
    write_pair(tmp_path)
    result = runner.invoke(
        app, ["score", "--real", str(tmp_path / "real.jsonl"), "--sim", str(tmp_path / "sim.jsonl")]
    )
    figures = json.loads(result.stdout)
    assert [figures[key] for key in ("RVA", "F1", "Acc")] == [None, None, None]


def test_reference_files_print_the_same_object(tmp_path):
    records = write_pair(tmp_path)
    write_reference(tmp_path / "real_ref.jsonl", [as_reference(r) for r in records if r.source == "real"])
    write_reference(tmp_path / "sim_ref.jsonl", [as_reference(r) for r in records if r.source != "real"])
    write_reference(tmp_path / "replay_ref.jsonl", [as_reference_replay(r) for r in our_replay()])
    ours = runner.invoke(
        app,
        ["score", "--real", str(tmp_path / "real.jsonl"), "--sim", str(tmp_path / "sim.jsonl"),
         "--replay", str(tmp_path / "replay.jsonl")],
    )  # fmt: skip
    theirs = runner.invoke(
        app,
        ["score", "--real", str(tmp_path / "real_ref.jsonl"), "--sim", str(tmp_path / "sim_ref.jsonl"),
         "--replay", str(tmp_path / "replay_ref.jsonl")],
    )  # fmt: skip
    assert json.loads(theirs.stdout) == json.loads(ours.stdout)


def test_a_file_of_neither_format_stops_cleanly(tmp_path):
    write_pair(tmp_path)
    (tmp_path / "odd.jsonl").write_text(json.dumps({"id": 1}) + "\n")
    result = runner.invoke(
        app, ["score", "--real", str(tmp_path / "odd.jsonl"), "--sim", str(tmp_path / "sim.jsonl")]
    )
    assert result.exit_code == 1
    assert "stopped" in result.output and "neither user_id" in result.output


def test_a_lake_as_the_real_side(tmp_path):
    lake = write_tiny_lake(tmp_path / "lake").path
    export_real_traces(lake, tmp_path / "train.jsonl", splits=["train"])
    args = ["score", "--real", str(lake), "--split", "train", "--sim", str(tmp_path / "train.jsonl")]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    figures = json.loads(result.stdout)
    # the lake's train sessions against themselves: no distance, and nothing cut in this lake
    assert [figures[k] for k in ("DM-JSD", "TE", "dCTR", "dACR", "T-JSD")] == [0.0] * 5
    assert figures["counts"]["real_sessions"] == 3
    assert figures["counts"]["real_cut_sessions_left_out"] == {}
    assert dropped_keys(tmp_path / "train.jsonl", "rollout") == {}  # the export declares every key it writes


def misspell_profiles(path, sessions: int) -> None:
    """Rename ``prior_clicks`` to ``clicks`` in the profiles of the first ``sessions`` lines."""
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for line in lines[:sessions]:
        line["profile"]["clicks"] = line["profile"].pop("prior_clicks")
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_an_unknown_key_stops_with_one_line_naming_it(tmp_path):
    write_pair(tmp_path)
    misspell_profiles(tmp_path / "sim.jsonl", 2)
    result = runner.invoke(
        app, ["score", "--real", str(tmp_path / "real.jsonl"), "--sim", str(tmp_path / "sim.jsonl")]
    )
    assert result.exit_code == 1
    # the whole output: one line, no traceback (both profiles hold the key; the first line is named)
    where = tmp_path / "sim.jsonl"
    assert (
        result.output
        == f"stopped: {where}:1: unknown key 'clicks' in profile (did you mean 'prior_clicks'?)\n"
    )


def test_lenient_scores_and_says_what_it_dropped(tmp_path):
    write_pair(tmp_path)
    misspell_profiles(tmp_path / "sim.jsonl", 2)
    args = ["score", "--real", str(tmp_path / "real.jsonl"), "--sim", str(tmp_path / "sim.jsonl")]
    result = runner.invoke(app, [*args, "--replay", str(tmp_path / "replay.jsonl"), "--lenient"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.stdout)
    # two simulated profiles held 'clicks': both counted, nothing dropped from the other files
    assert figures["counts"]["dropped_keys"] == {"real": {}, "sim": {"profile.clicks": 2}, "replay": {}}
    assert result.stderr == "lenient: sim traces: dropped unknown keys profile.clicks (2)\n"
    assert figures["OVA"] == round(42 / 44, 4)  # the steps read as before
