"""Every command meets a bad input with one line, exit code 1 (2 for a command line it cannot parse),
and no traceback: a missing or foreign lake, a bad choice, a bad config, a missing or corrupt
checkpoint, an --out it cannot write in, an empty selection of sessions."""

from __future__ import annotations

import json
import logging
import os
import struct
import subprocess
import sys

import polars as pl
import pytest
from typer.testing import CliRunner

from cli.app import app
from cli.stops import QuietCleanStops
from flows.preflight import check_model_folder
from tests.bundles import tiny_bundle, write_bundle
from transforms.ingest import ingest_bundle

runner = CliRunner()


def one_line(result, code: int, *facts: str) -> str:
    """The command stopped itself (no exception escaped) with ``code`` and one line holding ``facts``."""
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == code, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    assert len(lines) == 1, result.output
    for fact in facts:
        assert fact in lines[0], (fact, lines[0])
    return lines[0]


@pytest.fixture()
def lake(tmp_path):
    write_bundle(tiny_bundle(), tmp_path / "raw")
    ingest_bundle(tmp_path / "raw", tmp_path / "lake")
    return tmp_path / "lake"


@pytest.fixture()
def foreign(tmp_path):
    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "cat.jpg").write_bytes(b"not a lake")
    return folder


def lake_commands(lake, tmp_path) -> dict[str, list[str]]:
    """Each command that reads a lake, with every other argument valid."""
    sim = tmp_path / "sim.jsonl"
    sim.write_text("")
    return {
        "chain": ["chain", "--lake", str(lake)],
        "records": ["records", "--lake", str(lake)],
        "extract": ["extract", "--lake", str(lake)],
        "train": ["train", "--lake", str(lake), "--stage", "sft", "--out", str(tmp_path / "run")],
        "validate": ["validate", "--lake", str(lake)],
        "sql": ["sql", "--lake", str(lake), "SELECT 1"],
        "evaluate": ["evaluate", "--lake", str(lake), "--simulator", "random", "--out", str(tmp_path / "e")],
        "score": ["score", "--real", str(lake), "--sim", str(sim)],
    }


@pytest.mark.parametrize("command", ["chain", "records", "extract", "train", "validate", "sql", "evaluate"])
def test_a_missing_lake_is_one_line(tmp_path, command):
    missing = tmp_path / "no-such-lake"
    one_line(runner.invoke(app, lake_commands(missing, tmp_path)[command]), 1, str(missing), "does not exist")
    assert not missing.exists()  # nothing made in its place


@pytest.mark.parametrize(
    "command", ["chain", "records", "extract", "train", "validate", "sql", "evaluate", "score"]
)
def test_a_folder_that_is_not_a_lake_is_one_line(tmp_path, foreign, command):
    line = one_line(runner.invoke(app, lake_commands(foreign, tmp_path)[command]), 1, str(foreign))
    assert "is not a lake" in line


def test_a_lake_without_the_table_a_command_reads_names_the_stage_that_writes_it(tmp_path, lake):
    # the tiny lake is ingested only: train reads records, which `trajforge records` writes
    result = runner.invoke(app, lake_commands(lake, tmp_path)["train"])
    one_line(result, 1, "has no 'records' table", f"trajforge records --lake {lake}")
    assert not (tmp_path / "run").exists()


def test_ingest_refuses_a_folder_holding_other_files(tmp_path, foreign):
    write_bundle(tiny_bundle(), tmp_path / "raw")
    result = runner.invoke(app, ["ingest", str(tmp_path / "raw"), "--lake", str(foreign)])
    one_line(result, 1, str(foreign), "is not a lake")
    assert sorted(p.name for p in foreign.iterdir()) == ["cat.jpg"]


@pytest.mark.parametrize(
    ("args", "option", "choices"),
    [
        (["records", "--mode", "foo"], "--mode", "'single', 'cross', 'both'"),
        (["train", "--lake", "x", "--out", "y", "--stage", "foo"], "--stage", "'sft', 'optd'"),
        (["synth", "--file-format", "foo"], "--file-format", "'parquet', 'jsonl', 'jsonl.gz', 'csv'"),
        (["ingest", ".", "--source-format", "foo"], "--source-format", "'bundle', 'userarena'"),
        (
            ["evaluate", "--lake", "x", "--simulator", "random", "--out", "y", "--split", "foo"],
            "--split",
            "'train', 'val', 'test'",
        ),
        (["score", "--real", ".", "--sim", ".", "--split", "foo"], "--split", "'train', 'val', 'test'"),
        (["sql", "SELECT 1", "--format", "foo"], "--format", "'table', 'csv', 'json'"),
        (["records", "--export-split", "train,foo"], "--export-split", "'train', 'val', 'test'"),
        (["extract", "--backend", "foo"], "--backend", "'heuristic', 'openai'"),
        (["chain", "--task-runner", "foo"], "--task-runner", "'local', 'ray'"),
    ],
)
def test_a_bad_choice_is_one_usage_line(args, option, choices):
    line = one_line(runner.invoke(app, args), 2, option, "'foo'", choices)
    assert line.startswith("error:") and "--help" in line


def test_choices_are_completed_by_the_shell():
    # click completes a choice parameter from its values: typer's own completion asks for them
    from typer.main import get_command

    command = get_command(app).commands["records"]
    mode = next(p for p in command.params if p.name == "mode")
    assert [c.value for c in mode.shell_complete(None, "s")] == ["single"]


def test_a_usage_error_is_one_line_too():
    one_line(runner.invoke(app, ["evaluate", "--lake", "x", "--out", "y"]), 2, "--simulator")
    one_line(runner.invoke(app, ["nosuch"]), 2, "No such command 'nosuch'")


@pytest.mark.parametrize(
    ("toml", "facts"),
    [
        ("[trian]\nsteps = 2\n", ["unknown section [trian]", "did you mean 'train'?"]),
        ("[train]\nstesp = 2\n", ["[train]", "unknown key 'stesp'", "did you mean 'steps'?"]),
        (
            "[train]\ntiny = {hiden_size = 8}\n",
            ["[train] tiny", "'hiden_size'", "did you mean 'hidden_size'?"],
        ),
        ("[train]\nsteps = 'many'\n", ["[train]", "steps", "'many'"]),
        ("[train\nsteps = 2\n", ["is not valid TOML", "line 1"]),
    ],
)
def test_a_bad_config_is_one_line_naming_the_key(tmp_path, lake, toml, facts):
    config = tmp_path / "run.toml"
    config.write_text(toml)
    args = [
        "train",
        "--lake",
        str(lake),
        "--stage",
        "sft",
        "--out",
        str(tmp_path / "run"),
        "--config",
        str(config),
    ]
    one_line(runner.invoke(app, args), 1, *facts)
    assert not (tmp_path / "run").exists()


def test_a_misspelt_records_key_names_the_nearest(tmp_path, lake):
    config = tmp_path / "records.toml"
    config.write_text("[records]\nwindow_singel = 4\n")
    one_line(runner.invoke(app, ["records", "--lake", str(lake), "--config", str(config)]), 1,
             "unknown key 'window_singel'", "did you mean 'window_single'?")  # fmt: skip


def model_folder(folder, weights: bytes) -> str:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (folder / "tokenizer.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(weights)
    return str(folder)


def safetensors(data_bytes: int) -> bytes:
    """One F32 tensor of 4 values (16 bytes by its header), followed by ``data_bytes`` of data."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    return struct.pack("<Q", len(header)) + header + b"\0" * data_bytes


def test_a_truncated_or_missing_base_is_one_line(tmp_path, lake):
    # a records table for train's lake check (its rows are read only once the run starts)
    (lake / "records").mkdir()
    pl.DataFrame({"x": [1]}).write_parquet(lake / "records" / "part-0.parquet")
    # the header says 16 bytes of tensors; 8 are there, as when a copy is cut short
    cut = model_folder(tmp_path / "cut", safetensors(8))
    args = ["train", "--lake", str(lake), "--stage", "optd", "--out", str(tmp_path / "run"), "--base", cut]
    one_line(runner.invoke(app, args), 1, f"--base {cut}", "is cut short: its tensors need 8")
    missing = tmp_path / "HuggingFaceTB" / "SmolLM2"  # a path, never read as a Hub id
    one_line(runner.invoke(app, [*args[:-1], str(missing)]), 1, f"--base {missing} does not exist")
    empty = tmp_path / "empty"
    empty.mkdir()
    one_line(runner.invoke(app, [*args[:-1], str(empty)]), 1, "not a model folder (no config.json)")
    assert not (tmp_path / "run").exists()
    whole = model_folder(tmp_path / "whole", safetensors(16))  # the same file, whole
    assert str(check_model_folder(whole)) == whole
    (tmp_path / "whole" / "tokenizer.json").unlink()  # what transformers reports as a missing package
    one_line(runner.invoke(app, [*args[:-1], whole]), 1, f"--base {whole}", "has no tokenizer")


def held_split(lake) -> str:
    """The split of the tiny bundle's one shopper (the other two have no session)."""
    return pl.read_parquet(lake / "sessions").get_column("split")[0]


def evaluate_args(lake, out, split: str, simulator: str = "random") -> list[str]:
    return ["evaluate", "--lake", str(lake), "--simulator", simulator, "--out", str(out), "--split", split]


def test_a_missing_or_cut_checkpoint_simulator_is_one_line(tmp_path, lake):
    missing = tmp_path / "no-model"
    args = evaluate_args(lake, tmp_path / "e", held_split(lake), f"checkpoint:{missing}")
    one_line(runner.invoke(app, args), 1, f"checkpoint:{missing}", "does not exist")
    cut = model_folder(tmp_path / "cut", safetensors(8))
    args = evaluate_args(lake, tmp_path / "e", held_split(lake), f"checkpoint:{cut}")
    one_line(runner.invoke(app, args), 1, f"checkpoint:{cut}", "cut short")
    assert not (tmp_path / "e").exists()  # refused before any work


def test_an_out_that_cannot_be_written_is_one_line_before_any_work(tmp_path, lake):
    taken = tmp_path / "taken"
    taken.write_text("a file")
    one_line(runner.invoke(app, evaluate_args(lake, taken, held_split(lake))), 1, f"--out {taken} is a file")
    inside = taken / "out"  # a folder that cannot be made: its parent is a file
    one_line(runner.invoke(app, ["synth", "--out", str(inside / "raw")]), 1, str(inside))
    assert taken.read_text() == "a file"


def test_an_empty_selection_of_sessions_is_an_error(tmp_path, lake):
    # the tiny bundle's one shopper falls in one split; the others have no session
    held = set(pl.read_parquet(lake / "sessions").get_column("split"))
    empty = next(split for split in ("train", "val", "test") if split not in held)
    args = evaluate_args(lake, tmp_path / "e", empty)
    one_line(runner.invoke(app, args), 1, f"--split {empty}", "no session to evaluate")
    assert not (tmp_path / "e").exists()
    one_line(runner.invoke(app, [*args[:-2], "--sessions", "0"]), 2, "--sessions")
    sim = tmp_path / "sim.jsonl"
    sim.write_text("")
    one_line(runner.invoke(app, ["score", "--real", str(lake), "--sim", str(sim), "--split", empty]), 1,
             "no session to evaluate")  # fmt: skip


def test_in_a_terminal_a_bad_input_is_one_line(tmp_path):
    # a real process, as a user runs it: no Rich traceback and no Prefect log reaches the terminal
    command = [sys.executable, "-m", "cli", "chain", "--lake", str(tmp_path / "missing")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300,
                            env=os.environ | {"COLUMNS": "80"})  # fmt: skip
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert result.returncode == 1 and len(lines) == 1, lines
    assert "does not exist" in lines[0] and result.stdout == ""


def test_prefects_run_logs_keep_a_clean_stops_message_without_its_traceback():
    def record(err: BaseException) -> logging.LogRecord:
        try:
            raise err
        except BaseException:
            return logging.LogRecord(
                "prefect.task_runs", logging.ERROR, "", 0, "failed: %r", (err,), sys.exc_info()
            )

    stop, bug = record(ValueError("bad --split")), record(ZeroDivisionError("a bug"))
    assert QuietCleanStops().filter(stop) and QuietCleanStops().filter(bug)
    assert stop.exc_info is None and stop.getMessage() == "failed: ValueError('bad --split')"
    assert bug.exc_info is not None  # any other error keeps its traceback: it is a bug to report


def test_an_error_inside_a_flow_is_one_line_without_prefects_tracebacks(tmp_path, lake):
    # a real process: the unknown simulator is found inside the flow's simulate task, after Prefect
    # has started; its task and flow logs say so in a line each, and no traceback reaches the terminal
    held = held_split(lake)
    command = [sys.executable, "-m", "cli", "evaluate", "--lake", str(lake), "--simulator", "oracle",
               "--out", str(tmp_path / "e"), "--split", held, "--no-effect"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300,
                            env=os.environ | {"COLUMNS": "200"})  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "Traceback" not in output and "│" not in output  # neither Python's traceback nor Rich's
    said = [line for line in output.splitlines() if line.startswith("stopped: ")]
    assert len(said) == 1 and "unknown simulator 'oracle'" in said[0], output


@pytest.mark.parametrize("command", ["ingest", "chain", "records", "extract", "train", "run"])
def test_every_command_reading_a_config_refuses_a_misspelt_section(tmp_path, lake, command):
    config = tmp_path / "run.toml"
    config.write_text("[trian]\nsteps = 2\n")
    args = {
        "ingest": ["ingest", str(lake), "--lake", str(tmp_path / "new")],
        "chain": ["chain", "--lake", str(lake)],
        "records": ["records", "--lake", str(lake)],
        "extract": ["extract", "--lake", str(lake)],
        "train": ["train", "--lake", str(lake), "--stage", "optd", "--out", str(tmp_path / "run")],
        "run": ["run", "--workdir", str(tmp_path / "work")],
    }[command]
    one_line(runner.invoke(app, [*args, "--config", str(config)]), 1, "unknown section [trian]", "'train'")
    assert not (tmp_path / "new").exists() and not (tmp_path / "work").exists()


def test_serve_refuses_a_missing_bundle_an_unwritable_lake_and_a_bad_schedule(tmp_path):
    missing = tmp_path / "no-raw"
    one_line(runner.invoke(app, ["serve", "--raw", str(missing)]), 1, f"--raw {missing} is not a folder")
    raw = tmp_path / "raw"
    raw.mkdir()
    (tmp_path / "file").write_text("")
    lake = tmp_path / "file" / "lake"  # its parent is a file: nothing can be written there
    one_line(runner.invoke(app, ["serve", "--raw", str(raw), "--lake", str(lake)]), 1, f"--lake {lake}")
    bad = ["serve", "--raw", str(raw), "--lake", str(tmp_path / "lake"), "--cron", "nightly"]
    one_line(runner.invoke(app, bad), 1, "--cron 'nightly' is not a cron schedule")
    one_line(runner.invoke(app, ["serve", "--role", "trainer"]), 1, "--role 'trainer' is none of")
    one_line(runner.invoke(app, ["serve", "--role", "all"]), 1, "--raw None is not a folder")
