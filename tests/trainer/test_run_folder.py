"""The run folder: a new run refuses a folder another run left, unless told to resume or to overwrite it,
and refuses one it cannot write in, before any work."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.trainer.conftest import files
from trainer.config import OPTDSettings, TrainSettings
from trainer.optd_run import run_optd
from trainer.run import run_sft
from trainer.run_folder import check_run_folder, start_afresh


def used_folder(out: Path) -> Path:
    """A folder as an 8-update run leaves it, with a file of its owner's beside the run's outputs."""
    for kind in ("checkpoints", "trainer_state"):
        (out / kind / "step-000008").mkdir(parents=True)
    (out / "checkpoints" / "step-000008" / "config.json").write_text("{}")
    (out / "trainer_state" / "step-000008" / "trainer.json").write_text('{"step": 8}')
    (out / "metrics.jsonl").write_text('{"kind": "train", "step": 8}\n')
    (out / "summary.json").write_text('{"steps": 8}')
    (out / "curves.png").write_bytes(b"\x89PNG")
    (out / "notes.txt").write_text("the owner's, not the run's")
    return out


def test_a_folder_holding_a_run_is_refused_and_left_as_it_was(tmp_path):
    out = used_folder(tmp_path / "run")
    before = files(out)
    with pytest.raises(ValueError, match="holds another run") as refused:
        check_run_folder(out)
    assert str(out) in str(refused.value)
    assert "--resume" in str(refused.value) and "--overwrite" in str(refused.value)
    with pytest.raises(ValueError, match="holds another run"):
        start_afresh(out)
    assert files(out) == before


@pytest.mark.parametrize("left", ["checkpoints", "metrics.jsonl"])
def test_either_a_checkpoints_folder_or_a_metrics_file_is_a_run(tmp_path, left):
    if left == "checkpoints":
        (tmp_path / left).mkdir()
    else:
        (tmp_path / left).write_text("")
    with pytest.raises(ValueError, match=f"holds another run \\({left}\\)"):
        check_run_folder(tmp_path)
    check_run_folder(tmp_path, resume=True)  # continuing it is what resume is for
    check_run_folder(tmp_path, overwrite=True)


def test_overwrite_removes_the_previous_runs_outputs_and_nothing_else(tmp_path):
    out = used_folder(tmp_path / "run")
    (out / "tensorboard").mkdir()
    start_afresh(out, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "tensorboard"]
    assert (out / "notes.txt").read_text() == "the owner's, not the run's"


def test_a_missing_or_empty_folder_takes_a_new_run(tmp_path):
    check_run_folder(tmp_path / "new" / "run")
    assert (tmp_path / "new" / "run").is_dir()  # made, so that the run can write in it
    start_afresh(tmp_path / "new" / "run")
    assert list((tmp_path / "new" / "run").iterdir()) == []


def test_resume_and_overwrite_exclude_each_other(tmp_path):
    with pytest.raises(ValueError, match="pass one of them"):
        check_run_folder(tmp_path, resume=True, overwrite=True)


def test_an_out_that_is_a_file_or_lies_under_one_is_refused(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="is a file, not a folder"):
        check_run_folder(tmp_path / "file")
    with pytest.raises(ValueError, match="not a folder this process can write in"):
        check_run_folder(tmp_path / "file" / "run")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in a read-only folder")
def test_a_read_only_folder_is_refused(tmp_path):
    (tmp_path / "locked").mkdir(mode=0o555)
    try:
        with pytest.raises(ValueError, match="not a folder this process can write in"):
            check_run_folder(tmp_path / "locked")
    finally:
        (tmp_path / "locked").chmod(0o755)


@pytest.mark.parametrize("stage", ["sft", "optd"])
def test_both_stages_refuse_a_used_folder_before_reading_anything(tmp_path, stage):
    # neither the lake nor the base exists: a run that got as far as reading them would say so instead
    out = used_folder(tmp_path / "run")
    before = files(out)
    missing = tmp_path / "missing"
    with pytest.raises(ValueError, match="holds another run"):
        if stage == "sft":
            run_sft(TrainSettings(), missing, out, base=missing, progress=False)
        else:
            run_optd(OPTDSettings(), missing, out, missing, progress=False)
    assert files(out) == before
