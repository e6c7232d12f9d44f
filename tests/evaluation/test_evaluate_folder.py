"""``trajforge evaluate`` into a used ``--out``: another evaluation is refused with its files untouched
unless told --resume or --overwrite, and only the sessions being scored are scored."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.app import app
from evaluation.traces import read_traces
from flows.evaluate_folder import RUN_FILE, check_evaluation_folder, differences, scored_traces
from synthetic.bundle import write_bundle
from transforms.ingest import ingest_bundle

runner = CliRunner()


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    root = tmp_path_factory.mktemp("evaluate-folder")
    write_bundle(root / "raw", users=120, seed=9, fmt="parquet", parts_per_table=1)
    ingest_bundle(root / "raw", root / "lake")
    return root / "lake"


def evaluate(lake, out, sessions, *specs, extra=()):
    args = ["evaluate", "--lake", str(lake), "--out", str(out), "--sessions", str(sessions), "--no-effect"]
    for spec in specs:
        args += ["--simulator", spec]
    return runner.invoke(app, [*args, *extra])


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``folder`` with its bytes and modification time."""
    return {
        str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in folder.rglob("*")
        if p.is_file()
    }


def test_a_used_out_is_refused_with_its_files_untouched(prefect_harness, lake, tmp_path):
    out = tmp_path / "eval"
    assert evaluate(lake, out, 4, "random").exit_code == 0
    before = snapshot(out)
    assert {"run.json", "real.jsonl", "report.json", "report.html"} <= set(before)
    for changed, fact in (
        ((3, "random"), "sessions 4 -> 3"),
        ((4, "markov"), 'simulators ["random"] -> ["markov"]'),
        ((4, "random", ("--temperature", "0.5")), '"temperature": 0.5'),
        ((4, "random", ("--split", "val")), 'split "test" -> "val"'),
    ):
        result = evaluate(lake, out, *changed[:2], extra=changed[2] if len(changed) > 2 else ())
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert result.exit_code == 1, result.output
        assert len(lines) == 1 and "holds another evaluation" in lines[0] and fact in lines[0], lines
        assert "--resume" in lines[0] and "--overwrite" in lines[0]
        assert snapshot(out) == before  # not a byte, not a timestamp changed


def test_the_same_settings_resume_and_resume_scores_only_the_sessions_chosen(prefect_harness, lake, tmp_path):
    out = tmp_path / "eval"
    assert evaluate(lake, out, 5, "random").exit_code == 0
    again = evaluate(lake, out, 5, "random")
    assert again.exit_code == 0, again.output
    assert json.loads((out / "report.json").read_text())["runs"]["random"]["rollout"]["resumed"] == 5
    # fewer sessions, kept traces: the 5 rolled out stay in the trace file, only the first 2 are scored
    fewer = evaluate(lake, out, 2, "random", extra=["--resume"])
    assert fewer.exit_code == 0, fewer.output
    report = json.loads((out / "report.json").read_text())
    assert report["real"]["sessions"] == 2
    rollout = report["runs"]["random"]["rollout"]
    scored = {t.session_id for t in read_traces(rollout["path"])}
    assert scored == {t.session_id for t in read_traces(out / "real.jsonl")} and len(scored) == 2
    kept = next(out.glob("random-*.rollout.jsonl"))
    assert len(read_traces(kept)) == 5 and (rollout["written"], rollout["resumed"]) == (0, 2)
    assert json.loads((out / RUN_FILE).read_text())["sessions"] == 2  # the run now recorded


def test_overwrite_replaces_the_evaluation_and_nothing_else(prefect_harness, lake, tmp_path):
    out = tmp_path / "eval"
    assert evaluate(lake, out, 3, "random").exit_code == 0
    (out / "notes.txt").write_text("mine")
    replaced = evaluate(lake, out, 2, "markov", extra=["--overwrite"])
    assert replaced.exit_code == 0, replaced.output
    assert not list(out.glob("random-*")) and list(out.glob("markov-*.rollout.jsonl"))
    assert list(json.loads((out / "report.json").read_text())["simulators"]) == ["markov"]
    assert (out / "notes.txt").read_text() == "mine"


def test_outputs_without_a_run_record_are_another_evaluation(tmp_path, lake):
    out = tmp_path / "eval"
    out.mkdir()
    (out / "real.jsonl").write_text("")
    settings = {"lake": {"path": str(lake)}, "sessions": 2}
    with pytest.raises(ValueError, match=r"unknown run \(real.jsonl; no run.json\)"):
        check_evaluation_folder(out, settings)
    check_evaluation_folder(out, settings, resume=True)
    check_evaluation_folder(out, settings, overwrite=True)
    with pytest.raises(ValueError, match="pass one"):
        check_evaluation_folder(out, settings, resume=True, overwrite=True)


def test_resume_never_continues_another_lakes_evaluation(tmp_path):
    out = tmp_path / "eval"
    out.mkdir()
    (out / RUN_FILE).write_text(json.dumps({"lake": {"path": "/a"}, "sessions": 2}))
    with pytest.raises(ValueError, match="another lake"):
        check_evaluation_folder(out, {"lake": {"path": "/b"}, "sessions": 2}, resume=True)
    check_evaluation_folder(out, {"lake": {"path": "/a"}, "sessions": 3}, resume=True)


def test_differences_name_each_setting_changed():
    recorded = {"split": "test", "sessions": 4, "simulators": ["random"]}
    asked = {"split": "test", "sessions": None, "simulators": ["random", "markov"]}
    assert differences(recorded, asked) == [
        "sessions 4 -> null",
        'simulators ["random"] -> ["random", "markov"]',
    ]


def test_scored_traces_copies_only_when_the_file_holds_other_sessions(tmp_path):
    path = tmp_path / "x.rollout.jsonl"
    path.write_text("".join(json.dumps({"session_id": s}) + "\n" for s in ("a", "b", "c")))
    assert scored_traces(str(path), ["a", "b", "c"]) == str(path)  # nothing else there: the file itself
    copy = Path(scored_traces(str(path), ["b"]))
    assert copy == tmp_path / "scored" / "x.rollout.jsonl"
    assert [json.loads(line)["session_id"] for line in copy.read_text().splitlines()] == ["b"]
    assert len(path.read_text().splitlines()) == 3  # the trace file keeps every session
