"""A lake and a raw bundle on an object store (``flows.object_store``), against moto's S3 server started
on 127.0.0.1 by the test: the sync of a working copy, a killed push finished by the next pull, and the
dataset commands on an ``s3://`` lake making the local lake's tables, queried in place by DuckDB."""

from __future__ import annotations

import logging
import socket
import threading
import time
from pathlib import Path

import polars as pl
import pytest

from flows.object_store import INDEX_FILE, PUSHING_FILE, StoreLocation, pull, push, working_copy

moto_server = pytest.importorskip("moto.server")
BUCKET = "lakes"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def s3_endpoint():
    # the server's request lines would be logged into the commands' captured output
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def store(s3_endpoint, monkeypatch, tmp_path):
    """Credentials and endpoint in the environment, as a user sets them; a bucket of our own."""
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": s3_endpoint,
        "TRAJFORGE_STORE_CACHE": str(tmp_path / "store-cache"),
    }.items():
        monkeypatch.setenv(name, value)
    fs = StoreLocation(f"s3://{BUCKET}").filesystem()
    if not fs.exists(BUCKET):
        fs.mkdir(BUCKET)
    return fs


def files_of(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in folder.rglob("*")
        if p.is_file() and p.name not in (INDEX_FILE, PUSHING_FILE)
    }


def write(folder: Path, files: dict[str, bytes]) -> None:
    for relative, payload in files.items():
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        (folder / relative).write_bytes(payload)


def test_push_and_pull_mirror_a_folder_moving_only_what_changed(store, tmp_path):
    location = StoreLocation(f"s3://{BUCKET}/mirror")
    here = tmp_path / "here"
    write(here, {"steps/bucket=0/part-0.parquet": b"a" * 10, "steps/bucket=1/part-0.parquet": b"b",
                 "warehouse.duckdb": b"catalog", "_runs/ingest.json": b"{}"})  # fmt: skip
    first = push(location, here)
    assert first.transferred[0].endswith(".parquet") and first.transferred[-1] == "warehouse.duckdb"
    assert sorted(first.transferred) == sorted(files_of(here)) and not first.deleted
    assert push(location, here).transferred == []  # nothing changed, nothing sent

    there = tmp_path / "there"  # another machine's copy
    assert sorted(pull(location, there).transferred) == sorted(files_of(here))
    assert files_of(there) == files_of(here)
    assert pull(location, there).transferred == []

    (here / "steps/bucket=1/part-0.parquet").unlink()
    (here / "steps/bucket=0/part-0.parquet").write_bytes(b"c" * 12)
    changed = push(location, here)
    assert changed.transferred == ["steps/bucket=0/part-0.parquet"]
    assert changed.deleted == ["steps/bucket=1/part-0.parquet"]
    assert not store.exists(f"{BUCKET}/mirror/steps/bucket=1/part-0.parquet")
    after = pull(location, there)
    assert after.transferred == ["steps/bucket=0/part-0.parquet"]
    assert after.deleted == ["steps/bucket=1/part-0.parquet"]
    assert files_of(there) == files_of(here)
    assert not (there / "steps/bucket=1").exists()  # emptied folders go too


def test_a_pull_keeps_work_the_store_never_saw(store, tmp_path):
    location = StoreLocation(f"s3://{BUCKET}/keep")
    here = tmp_path / "here"
    write(here, {"steps/part.parquet": b"s"})
    push(location, here)
    write(here, {".staging-chain/histories/part.parquet": b"half", "_cache/extract/abc.json": b"{}"})
    (here / "steps/part.parquet").write_bytes(b"changed here")  # not pushed: the store still has "s"
    assert pull(location, here).transferred == []
    assert files_of(here)[".staging-chain/histories/part.parquet"] == b"half"
    assert files_of(here)["steps/part.parquet"] == b"changed here"


def test_a_killed_push_is_finished_by_the_next_pull(store, tmp_path, monkeypatch):
    location = StoreLocation(f"s3://{BUCKET}/killed")
    here = tmp_path / "here"
    write(here, {f"records/bucket={i}/part.parquet": bytes([i]) * 5 for i in range(4)})
    real_filesystem = StoreLocation.filesystem
    sent: list[str] = []
    sending = threading.Lock()  # uploads run side by side

    def dying_filesystem(self):
        fs = real_filesystem(self)
        real_put = fs.put_file

        def put_file(local, remote, **kwargs):
            with sending:
                if len(sent) == 2:
                    raise KeyboardInterrupt  # the process killed after two uploads
                sent.append(remote)
            return real_put(local, remote, **kwargs)

        fs.put_file = put_file
        return fs

    monkeypatch.setattr(StoreLocation, "filesystem", dying_filesystem)
    with pytest.raises(KeyboardInterrupt):
        push(location, here)
    assert (here / PUSHING_FILE).exists() and len(store.find(f"{BUCKET}/killed")) == 2
    monkeypatch.setattr(StoreLocation, "filesystem", real_filesystem)

    resumed = pull(location, here)
    assert resumed.finished_push and len(resumed.transferred) == 2  # the two not sent before
    assert not (here / PUSHING_FILE).exists()
    fresh = tmp_path / "fresh"
    pull(location, fresh)
    assert files_of(fresh) == files_of(here)


def test_uploads_run_side_by_side_and_the_catalog_goes_once_the_tables_landed(store, tmp_path, monkeypatch):
    location = StoreLocation(f"s3://{BUCKET}/concurrent")
    here = tmp_path / "here"
    write(here, {f"steps/bucket={i}/part-{j}.parquet": bytes([i, j]) for i in range(4) for j in range(5)})
    write(here, {"warehouse.duckdb": b"catalog", "_runs/ingest/manifest.json": b"{}"})
    real_filesystem = StoreLocation.filesystem
    spans: dict[str, tuple[float, float]] = {}
    in_flight, most = [0], [0]
    counting = threading.Lock()

    def timed_filesystem(self):
        fs = real_filesystem(self)
        real_put = fs.put_file

        def put_file(local, remote, **kwargs):
            with counting:
                in_flight[0] += 1
                most[0] = max(most[0], in_flight[0])
            started = time.monotonic()
            time.sleep(0.05)  # a store's round trip
            real_put(local, remote, **kwargs)
            with counting:
                in_flight[0] -= 1
            spans[remote.rsplit("/concurrent/", 1)[1]] = (started, time.monotonic())

        fs.put_file = put_file
        return fs

    monkeypatch.setattr(StoreLocation, "filesystem", timed_filesystem)
    pushed = push(location, here)
    assert sorted(pushed.transferred) == sorted(files_of(here)) and most[0] > 1
    tables_done = max(end for name, (_, end) in spans.items() if name.endswith(".parquet"))
    assert (
        spans["warehouse.duckdb"][0] >= tables_done and spans["_runs/ingest/manifest.json"][0] >= tables_done
    )
    monkeypatch.setattr(StoreLocation, "filesystem", real_filesystem)
    there = tmp_path / "there"
    assert len(pull(location, there).transferred) == 22 and files_of(there) == files_of(here)


def lake_tables_of(folder: Path) -> dict[str, pl.DataFrame]:
    """Each table's rows in a fixed order (files and their order may differ; the rows may not)."""
    tables = {}
    for table in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))):
        files = sorted(table.rglob("*.parquet"))
        if files:
            frame = pl.read_parquet(files, hive_partitioning=False)
            tables[table.name] = frame[frame.hash_rows(seed=0).arg_sort()]
    return tables


@pytest.mark.slow
def test_the_dataset_commands_on_an_s3_lake_make_the_local_lakes_tables(prefect_harness, store, tmp_path):
    from typer.testing import CliRunner

    from cli.app import app

    runner = CliRunner()

    def ok(*args: str) -> str:
        result = runner.invoke(app, list(args))
        assert result.exit_code == 0, result.output
        return result.output

    raw = tmp_path / "raw"
    ok("synth", "--out", str(raw), "--users", "24", "--seed", "3")
    push(StoreLocation(f"s3://{BUCKET}/raw"), raw)
    local, remote = str(tmp_path / "lake"), f"s3://{BUCKET}/lake"
    for source, lake in ((str(raw), local), (f"s3://{BUCKET}/raw", remote)):
        ok("ingest", source, "--lake", lake)
        ok("chain", "--lake", lake)
        ok("records", "--lake", lake)
        ok("extract", "--lake", lake)
        ok("records", "--lake", lake)
        ok("validate", "--lake", lake)

    on_store = tmp_path / "pulled"  # what a reader elsewhere gets from the store
    pull(StoreLocation(remote), on_store)
    expected, got = lake_tables_of(Path(local)), lake_tables_of(on_store)
    assert {"steps", "sessions", "histories", "records", "intents", "rationales"} <= set(expected)
    assert sorted(got) == sorted(expected)
    for name, frame in expected.items():
        assert frame.equals(got[name]), name
    assert all(expected[name].height for name in ("steps", "sessions", "histories", "records", "rationales"))
    assert working_copy(StoreLocation(remote)).is_dir()

    query = "SELECT count(*) AS n, count(DISTINCT session_id) AS sessions FROM steps"
    in_place = ok("sql", query, "--lake", remote, "--format", "csv")
    assert in_place == ok("sql", query, "--lake", local, "--format", "csv")
    assert in_place.splitlines()[1].split(",")[0] == str(expected["steps"].height)
    mix = ok("sql", "SELECT * FROM action_mix()", "--lake", remote, "--format", "csv")
    assert mix == ok("sql", "SELECT * FROM action_mix()", "--lake", local, "--format", "csv")


def test_a_missing_store_lake_is_one_line_naming_the_uri(store):
    from typer.testing import CliRunner

    from cli.app import app

    result = CliRunner().invoke(app, ["chain", "--lake", f"s3://{BUCKET}/nothing-here"])
    assert result.exit_code == 1, result.exception
    assert f"s3://{BUCKET}/nothing-here" in result.output and "store-cache" not in result.output, (
        result.output
    )


def test_an_unreachable_store_is_one_line(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from cli.app import app

    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "testing")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    monkeypatch.setenv("TRAJFORGE_STORE_CACHE", str(tmp_path))
    result = CliRunner().invoke(app, ["chain", "--lake", f"s3://{BUCKET}/lake"])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert f"s3://{BUCKET}/lake: the store cannot be read" in lines[0]
    queried = CliRunner().invoke(app, ["sql", "SELECT 1", "--lake", f"s3://{BUCKET}/lake"])
    lines = [line for line in queried.output.splitlines() if line.strip()]
    assert queried.exit_code == 1 and len(lines) == 1, queried.output
    assert f"s3://{BUCKET}/lake: the store cannot be read" in lines[0]


def test_what_a_killed_download_left_is_never_pushed(store, tmp_path):
    location = StoreLocation(f"s3://{BUCKET}/partial")
    here = tmp_path / "here"
    write(
        here, {"steps/part.parquet": b"s", "steps/part.parquet.pulling": b"half", f"{INDEX_FILE}.tmp": b"{"}
    )
    assert push(location, here).transferred == ["steps/part.parquet"]
    assert store.find(f"{BUCKET}/partial") == [f"{BUCKET}/partial/steps/part.parquet"]


def test_a_userarena_release_file_on_the_store_ingests_as_the_local_file_does(
    prefect_harness, store, tmp_path
):
    import json

    from typer.testing import CliRunner

    from cli.app import app
    from tests.transforms.test_userarena_import import CROSS, SINGLE

    release = tmp_path / "release.jsonl"
    release.write_text("\n".join(json.dumps(record) for record in (SINGLE, CROSS)) + "\n")
    store.put_file(str(release), f"{BUCKET}/releases/2026-12/release.jsonl")
    store.pipe(f"{BUCKET}/releases/2026-12/other-day.jsonl", b"{}\n")  # beside it, never read
    uri = f"s3://{BUCKET}/releases/2026-12/release.jsonl"
    for raw, lake in ((str(release), str(tmp_path / "local-lake")), (uri, f"s3://{BUCKET}/ua")):
        result = CliRunner().invoke(app, ["ingest", raw, "--lake", lake, "--source-format", "userarena"])
        assert result.exit_code == 0, result.output
    pulled = working_copy(StoreLocation(uri))
    assert files_of(pulled) == {"release.jsonl": release.read_bytes()}  # the one object, not its folder
    fresh = tmp_path / "fresh"
    pull(StoreLocation(f"s3://{BUCKET}/ua"), fresh)
    expected, got = lake_tables_of(tmp_path / "local-lake"), lake_tables_of(fresh)
    assert sorted(got) == sorted(expected) and expected["steps"].height
    for name, frame in expected.items():
        assert frame.equals(got[name]), name
