"""Stages served from Prefect's cache (``flows.caching``) and retries only for transient errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from prefect import flow, task

from flows.caching import StageOutcome, cached_stage, fingerprint, run_stage
from flows.retrying import IO_RETRIES, transient

CALLS: list[str] = []


@cached_stage(
    "upper",
    reads=lambda source, out, shout: {"source": fingerprint(source), "shout": shout},
    writes=lambda source, out, shout: [Path(out)],
)
def upper_stage(source: str, out: str, shout: bool) -> dict:
    """A stage that reads one file and writes another."""
    CALLS.append(source)
    text = Path(source).read_text()
    Path(out).write_text(text.upper() + ("!" if shout else ""))
    return {"chars": len(text)}


@flow
def run_upper(lake: str, source: str, out: str, shout: bool = False, refresh: bool = False) -> StageOutcome:
    return run_stage(upper_stage, lake, refresh, source=source, out=out, shout=shout)


@pytest.fixture
def files(tmp_path):
    CALLS.clear()
    source, out = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_text("hello")
    return str(tmp_path / "lake"), str(source), str(out)


def test_an_unchanged_stage_is_served_from_the_cache(prefect_harness, files):
    lake, source, out = files
    first = run_upper(lake, source, out)
    written = Path(out).stat().st_mtime_ns
    second = run_upper(lake, source, out)
    assert (first.reused, second.reused) == (False, True)
    assert second.summary == first.summary == {"chars": 5}
    assert len(CALLS) == 1 and Path(out).stat().st_mtime_ns == written  # not run, nothing rewritten
    assert any(p.name.startswith("upper-") for p in (Path(lake) / "_cache").iterdir())


def test_new_input_content_or_settings_run_the_stage_again(prefect_harness, files):
    lake, source, out = files
    run_upper(lake, source, out)
    Path(source).write_text("hello, world")  # same path, new content
    changed = run_upper(lake, source, out)
    assert not changed.reused and changed.summary == {"chars": 12}
    assert not run_upper(lake, source, out, shout=True).reused  # a setting is part of the key
    assert Path(out).read_text() == "HELLO, WORLD!"
    assert run_upper(lake, source, out, shout=True).reused
    assert len(CALLS) == 3


def test_an_output_changed_since_is_written_again(prefect_harness, files):
    lake, source, out = files
    run_upper(lake, source, out)
    Path(out).write_text("edited by hand")
    assert not run_upper(lake, source, out).reused
    assert Path(out).read_text() == "HELLO"
    Path(out).unlink()
    assert not run_upper(lake, source, out).reused
    assert Path(out).read_text() == "HELLO"
    assert not run_upper(lake, source, out, refresh=True).reused  # refresh: runs whatever the cache holds
    assert len(CALLS) == 4


def test_a_folder_fingerprint_follows_content_and_skips_temporaries(tmp_path):
    folder = tmp_path / "table"
    (folder / "bucket=0").mkdir(parents=True)
    (folder / "bucket=0" / "part-0.parquet").write_bytes(b"abc")
    before = fingerprint(folder)
    (folder / "bucket=0" / ".part-1.tmp").write_bytes(b"half written")
    assert fingerprint(folder) == before
    (folder / "bucket=0" / "part-0.parquet").write_bytes(b"abd")
    assert fingerprint(folder) != before
    assert fingerprint(tmp_path / "absent") is None


ATTEMPTS: list[str] = []


@task(**{**IO_RETRIES, "retry_delay_seconds": 0})
def flaky_io(error: str) -> None:
    ATTEMPTS.append(error)
    raise {"missing": FileNotFoundError("no such file: x"), "network": ConnectionResetError("reset by peer"),
           "value": ValueError("bad value")}[error]  # fmt: skip


@flow
def try_io(error: str) -> None:
    flaky_io(error)


@pytest.mark.parametrize(("error", "attempts"), [("missing", 1), ("value", 1), ("network", 2)])
def test_only_transient_errors_are_retried(prefect_harness, error, attempts):
    ATTEMPTS.clear()
    with pytest.raises((OSError, ValueError)):
        try_io(error)
    assert len(ATTEMPTS) == attempts


def test_transient_errors():
    assert (
        transient(TimeoutError()) and transient(ConnectionRefusedError()) and transient(OSError(28, "full"))
    )
    assert not any(transient(e) for e in (FileNotFoundError(), PermissionError(), KeyError("x")))
