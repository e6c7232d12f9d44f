"""SFT then OPTD on the tiny environment lake report the share of sampled held-out responses that parse
and that are executable on their records' screens (PROTOCOL.md §2), before the first update and at the end.

The lake: tests/evaluation/test_environment_loader.py's (sessions, layouts, catalog, steps) with gold
responses and, on the train split, a trajectory intent. Held out for SFT: the val split, user C's
session sC (click i02 on the feed, back home from its page, end on the feed).
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from evaluation.executable import ScreenJudge
from flows.train import summary_markdown
from tests.evaluation.test_environment_loader import write_environment_lake
from tests.trainer.conftest import answered_records
from tests.trainer.test_optd import optd_settings, train_settings
from trainer.config import TrainSettings
from trainer.optd_run import run_optd
from trainer.run import run_sft
from transforms.lake import write_table

SHARES = ("parse_share", "executable_share")


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> Path:
    path = write_environment_lake(tmp_path_factory.mktemp("envlake"))
    train = pl.col("split") == "train"
    intent = pl.when(train).then(pl.lit("wants a dress for the summer")).otherwise(None).alias("intent")
    write_table(path, "records", answered_records().with_columns(intent))
    return path


VALUES = dict(
    steps=200,  # five seeds of this setup end with 1 to 3 of the 3 held-out responses executable
    eval_split="val",
    held_out_states=3,
    held_out_sampled=3,
    held_out_sampling={"temperature": 1.0, "top_p": 0.95, "max_new_tokens": 60},
)


def settings(**overrides) -> TrainSettings:
    return train_settings(**(VALUES | overrides))


def eval_rows(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["kind"] == "eval"]


def accounted(report: dict) -> bool:
    """Every judged response is executable or has exactly one rejection reason."""
    executable = round(report["executable_share"] * report["judged"])
    return executable + sum(report["rejected"].values()) == report["judged"]


@pytest.fixture(scope="module")
def sft(lake, tmp_path_factory):
    out = tmp_path_factory.mktemp("sft")
    return run_sft(settings(), lake, out, progress=False, judge=ScreenJudge(lake)), out


def test_sft_reports_the_executable_share_before_and_after_and_it_rises(sft):
    summary, out = sft
    start, end = summary.held_out_start, summary.held_out_end
    # sC's three steps all replay onto a screen: each sampled response is judged
    assert start["judged"] == end["judged"] == 3 and start["no_screen"] == end["no_screen"] == {}
    # random weights put a '{' first with probability ~1/512 and never a whole JSON object
    assert start["parse_share"] == start["executable_share"] == 0.0
    assert start["rejected"] == {"parse_failure": 3}
    assert end["executable_share"] > start["executable_share"]
    assert end["parse_share"] >= end["executable_share"]
    assert accounted(start) and accounted(end)
    rows = eval_rows(out)
    assert [r["step"] for r in rows] == [0, 200]
    for row, report in zip(rows, (start, end), strict=True):
        assert {k: row[k] for k in report} == report and row["held_out_loss"] is not None
        assert row["sampled"] == 3
    line = f"executable {start['executable_share']:.4f} -> {end['executable_share']:.4f} (3 on a screen)"
    assert line in summary_markdown("sft", json.loads((out / "summary.json").read_text()))


def test_optd_reports_the_executable_share_before_and_after(lake, sft, tmp_path):
    sft_summary, _ = sft
    optd = optd_settings(**(VALUES | {"steps": 2, "lr": 3e-3, "probe_states": 2}))
    judge = ScreenJudge(lake)
    summary = run_optd(optd, lake, tmp_path / "optd", sft_summary.checkpoint, progress=False, judge=judge)
    start, end = summary.held_out_start, summary.held_out_end
    for report in (start, end):
        assert report["judged"] == 3 and report["no_screen"] == {} and accounted(report)
        assert {"probe_objective", *SHARES} <= report.keys()
    # the held-out states are the SFT run's: OPTD starts where its teacher ended
    assert start["executable_share"] == sft_summary.held_out_end["executable_share"]
    # the student starts from the SFT checkpoint: its responses are executable where the untrained
    # model's were not, and stay so after two small updates
    untrained = sft_summary.held_out_start["executable_share"]
    assert start["executable_share"] > untrained and end["executable_share"] > untrained
    assert [r["step"] for r in eval_rows(tmp_path / "optd")] == [0, 2]
    assert "sampled held-out responses: parse" in summary_markdown("optd", summary.__dict__)
    assert "probe states (intent-bearing, never drawn): teacher_probe_intent_gain" in summary_markdown(
        "optd", summary.__dict__
    )
