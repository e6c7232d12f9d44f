"""The gate over tiny hand-built lakes (tests/validation/lakes.py): green when
clean, a readable stop when broken, row routing with the accounting identity,
batching, Data Docs, results files, and the Prefect task/flow/command."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from html.parser import HTMLParser
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.validation import lakes
from transforms.lake import Staging, read_lake_table, table_files
from transforms.schemas import RATIONALES, polars_schema
from validation import gate
from validation.gate import TablePart, check_part, loss_outcomes, quarantine_stage, run_gate
from validation.report import GateError, GateSummary
from validation.suites import all_suites


def _broken_frames() -> dict[str, pl.DataFrame]:
    """s1's click (step 1) on i3 while only i1 is visible; item i2 priced -5."""
    frames = lakes.frames()
    frames["steps"] = frames["steps"].with_columns(
        pl.when((pl.col("session_id") == "s1") & (pl.col("step") == 1))
        .then(pl.lit(["i1"]))
        .otherwise(pl.col("visible_items"))
        .alias("visible_items")
    )
    frames["items"] = frames["items"].with_columns(
        pl.when(pl.col("item_id") == "i2").then(-5.0).otherwise(pl.col("price")).alias("price")
    )
    return frames


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> GateSummary:
    lake = lakes.write_lake(tmp_path_factory.mktemp("clean"))
    return run_gate(lake, stage="ingest")


@pytest.fixture(scope="module")
def broken(tmp_path_factory) -> tuple[Path, GateError, dict[Path, bytes]]:
    lake = lakes.write_lake(tmp_path_factory.mktemp("broken"), _broken_frames())
    before = {p: p.read_bytes() for p in lake.rglob("*.parquet")}
    with pytest.raises(GateError) as info:
        run_gate(lake, stage="ingest", batch_rows=4)  # 9 steps -> 3 batches
    return lake, info.value, before


# --- clean ----------------------------------------------------------------------


def test_clean_lake_passes_with_every_table_balanced(clean: GateSummary):
    assert clean.ok
    assert set(clean.tables) == {"steps", "sessions", "feed_layouts", "items", "profiles", "history"}
    rows = {t: (r.rows_in, r.rows_out, r.quarantined) for t, r in clean.tables.items()}
    # 9 steps (6 + 3), 2 sessions, 6 cards (4 + 2), 4 items, 2 profiles, 3 history rows; nothing moves
    assert rows == {
        "steps": (9, 9, 0),
        "sessions": (2, 2, 0),
        "feed_layouts": (6, 6, 0),
        "items": (4, 4, 0),
        "profiles": (2, 2, 0),
        "history": (3, 3, 0),
    }
    assert all(not r.errors for r in clean.tables.values())


def test_clean_lake_only_warns_about_split_shares_of_two_users(clean: GateSummary):
    # u1 train, u2 val: train 50 % < 75 %; val 50 % > 15 %; test 0 % < 5 %. Everything else holds.
    assert clean.tables["profiles"].warnings == ["train_share_min", "val_share_max", "test_share_min"]
    assert [t for t, r in clean.tables.items() if r.warnings] == ["profiles"]


def test_results_and_summary_json_are_written(clean: GateSummary):
    results = json.loads(Path(clean.results_path).read_text())
    suites = {r["meta"]["active_batch_definition"]["data_asset_name"] for r in results}
    # a table's row-level checks (history's) are a GE suite of their own, every failing row listed
    with_rows = {t for t in clean.tables if any(c.level == "row" for c in all_suites()[t].checks)}
    assert with_rows == {"history"}
    assert suites == {f"{t}{s}" for t in clean.tables for s in ("", ".schema")} | {"history.rows"}
    summary = json.loads((Path(clean.results_path).parent / "summary.json").read_text())
    assert summary["ok"] is True and summary["run_id"] == clean.run_id
    assert all(t["balanced"] for t in summary["tables"].values())


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.hrefs += [v for k, v in attrs if k == "href" and v]


def _links(path: Path) -> list[str]:
    parser = _Links()
    parser.feed(path.read_text())
    return parser.hrefs


def test_data_docs_render_every_suite(clean: GateSummary):
    # GE's index lists its pages from embedded table data; a dotted suite name is a sub-folder
    index = Path(clean.docs_index)
    text = index.read_text()
    for table in clean.tables:
        for suite in (table, f"{table}.schema"):
            path = suite.replace(".", "/")
            assert f"expectations/{path}.html" in text and f"validations/{path}/" in text, suite
            assert suite in (index.parent / "expectations" / f"{path}.html").read_text()
    listing = Path(clean.lake) / "_docs" / "index.html"
    assert f"validation/{clean.run_id}/index.html" in _links(listing)


# --- broken ---------------------------------------------------------------------


def test_broken_lake_stops_with_one_readable_paragraph(broken):
    lake, error, _ = broken
    text = str(error)
    assert "\n" not in text
    assert "table 'steps' failed expectation 'click_target_visible'" in text
    assert "on 1 of 9 rows" in text  # only s1's click, combined over 3 batches
    # the example names the file and row, the key, and the helper's inputs
    assert "steps/bucket=0/part-0.parquet row 1 {session_id=s1, step=1, action=click" in text
    assert 'visible_items=["i1"]' in text and "target_item_id=i3" in text
    assert "items.price_positive (1 row)" in text
    assert str(lake / "_runs" / "validation") in text


def test_broken_lake_is_left_as_it_was(broken):
    lake, error, before = broken
    after = {p: p.read_bytes() for p in lake.rglob("*.parquet")}
    assert after == before, "a stopped gate rewrites nothing and quarantines nothing"
    assert {t: r.errors for t, r in error.summary.tables.items() if r.errors} == {
        "steps": ["click_target_visible"],
        "items": ["price_positive"],
    }
    assert not json.loads((Path(error.summary.results_path).parent / "summary.json").read_text())["ok"]


def test_schema_drift_is_named_column_by_column(tmp_path: Path):
    lake = lakes.write_lake(tmp_path)
    part = table_files(lake, "items")[0]
    table = pq.read_table(part)
    drifted = table.set_column(
        table.schema.get_field_index("price"), "price", table["price"].cast(pa.string())
    )
    pq.write_table(drifted.append_column("colour", pa.array(["red"] * table.num_rows)), part)
    with pytest.raises(GateError) as info:
        run_gate(lake, ["items"])
    failed = {o.check: o.examples for o in info.value.summary.failed}
    assert failed["column_type"] == [
        {"column": "price", "declared_type": "double", "observed_type": "string"}
    ]
    assert failed["declared_type_not_null"] == [
        {"column": "colour", "declared_type": None, "observed_type": "string"}
    ]
    assert "table 'items' failed expectation" in str(info.value)


def test_missing_table_and_unknown_table(tmp_path: Path):
    lake = lakes.write_lake(tmp_path)
    with pytest.raises(GateError, match="'records' failed expectation 'table_present'"):
        run_gate(lake, ["records"], docs=False)
    with pytest.raises(ValueError, match="no validation suite for nope"):
        run_gate(lake, ["nope"])


# --- routing --------------------------------------------------------------------


def _history_with_two_bad_rows(lake: Path) -> Path:
    frames = lakes.frames()
    history = frames["history"].with_columns(
        pl.when(pl.int_range(pl.len()) == 1).then(pl.lit("view")).otherwise(pl.col("kind")).alias("kind"),
        pl.when(pl.int_range(pl.len()) == 2)
        .then(pl.lit(datetime(2100, 1, 1, tzinfo=UTC)).dt.cast_time_unit("ms"))
        .otherwise(pl.col("ts"))
        .alias("ts"),
    )
    return lakes.write_lake(lake, {"history": history})


def test_row_level_warnings_route_rows_and_keep_the_identity(tmp_path: Path):
    lake = _history_with_two_bad_rows(tmp_path)
    summary = run_gate(lake, ["history"], stage="ingest", replace_quarantine=True, docs=False)
    report = summary.tables["history"]
    assert summary.ok and report.warnings == ["kind_known", "ts_plausible"]
    assert (report.rows_in, report.rows_out, report.quarantined) == (3, 1, 2)
    moved = read_lake_table(lake, "quarantine").sort("source_row")
    assert moved["stage"].to_list() == [quarantine_stage("history")] * 2
    assert moved["reason"].to_list() == ["expectation:kind_known", "expectation:ts_plausible"]
    assert moved["source_file"].to_list() == ["history/part-0.parquet"] * 2
    assert moved["source_row"].to_list() == [1, 2]
    assert json.loads(moved["payload"][0])["kind"] == "view"
    assert read_lake_table(lake, "history").height == 1

    again = run_gate(lake, ["history"], docs=False)  # on demand: nothing new, nothing lost
    assert (again.tables["history"].rows_in, again.tables["history"].quarantined) == (1, 0)
    assert read_lake_table(lake, "quarantine").height == 2

    lakes.write_lake(lake, {"history": lakes.history()})  # the stage re-ran with good data
    run_gate(lake, ["history"], stage="ingest", replace_quarantine=True, docs=False)
    assert not table_files(lake, "quarantine"), "stale gate rejects of the old table are gone"


def test_rows_routed_from_several_frames_keep_their_locators_and_the_identity(tmp_path: Path):
    lake = _history_with_two_bad_rows(tmp_path)
    # one row per frame: the two bad rows are found, moved and located in frames of their own
    summary = run_gate(lake, ["history"], stage="ingest", replace_quarantine=True, docs=False, frame_rows=1)
    report = summary.tables["history"]
    assert (report.rows_in, report.rows_out, report.quarantined) == (3, 1, 2)
    moved = read_lake_table(lake, "quarantine").sort("source_row")
    assert moved["source_row"].to_list() == [1, 2]
    assert moved["reason"].to_list() == ["expectation:kind_known", "expectation:ts_plausible"]
    kept = read_lake_table(lake, "history")
    assert kept.equals(lakes.frames()["history"].slice(0, 1).select(kept.columns))


def test_a_key_repeated_in_two_buckets_is_found_though_each_bucket_is_read_alone(tmp_path: Path):
    frames = lakes.frames()
    steps = frames["steps"]
    stray = steps.filter((pl.col("session_id") == "s2") & (pl.col("step") == 0)).with_columns(
        bucket=pl.lit(0)
    )
    lake = lakes.write_lake(tmp_path, {"steps": pl.concat([steps, stray])})
    assert len({p.parent.name for p in table_files(lake, "steps")}) == 2, "the copies lie in two buckets"
    with pytest.raises(GateError) as stop:
        run_gate(lake, ["steps"], docs=False)
    unique = next(o for o in stop.value.summary.outcomes if o.check == "key_unique")
    assert (unique.evaluated, unique.unexpected) == (steps.height + 1, 2)
    assert sorted(e["_at"].split("/")[1] for e in unique.examples) == ["bucket=0", "bucket=1"]


def test_steps_read_in_frames_of_whole_sessions_judge_each_session_whole(tmp_path: Path):
    lake = lakes.write_lake(tmp_path)
    # frames of about 2 rows: each bucket's sessions are split by hash, never a session itself, so the
    # checks that read a whole session (contiguous steps, time order, end last) still pass
    summary = run_gate(lake, ["steps"], docs=False, frame_rows=2, batch_rows=2)
    assert summary.ok and summary.tables["steps"].rows_in == lakes.frames()["steps"].height
    frames = lakes.frames()
    steps = frames["steps"].filter(~((pl.col("session_id") == "s1") & (pl.col("step") == 2)))
    gap = lakes.write_lake(tmp_path / "gap", {"steps": steps})  # s1 loses its step 2
    with pytest.raises(GateError) as stop:
        run_gate(gap, ["steps"], docs=False, frame_rows=2, batch_rows=2)
    contiguous = next(o for o in stop.value.summary.outcomes if o.check == "step_contiguous")
    assert contiguous.unexpected == 3  # s1's steps 3, 4, 5 are no longer at their rank


def test_a_bucket_split_by_session_reads_each_file_once_and_keeps_file_order(tmp_path: Path, monkeypatch):
    # the frames of a bucket split by session hash: each file read once, each frame the rows of its
    # sessions in file order, as if every file were filtered to them; a frame no session hashes
    # to comes back empty with the table's columns
    files = [
        pl.DataFrame(
            {"session_id": [f"s{(k * 7 + i) % 23}" for i in range(40)], "n": range(k * 40, k * 40 + 40)}
        )
        for k in range(5)
    ]
    read: list[int] = []

    def frames():
        for k, frame in enumerate(files):
            read.append(k)
            yield frame

    monkeypatch.setattr(gate, "SPLIT_BUFFER_BYTES", files[0].estimated_size() * 2)  # flushed twice on the way
    parts = 40  # more frames than sessions: some stay empty
    paths = [tmp_path / f"frame-{k}.arrow" for k in range(parts)]
    schema = gate._split_by_session(frames(), parts, paths)
    assert read == [0, 1, 2, 3, 4] and schema == files[0].schema
    whole = pl.concat(files)
    chosen = pl.col("session_id").hash(gate.KEY_SEED) % parts
    for k, path in enumerate(paths):
        frame = gate._read_frame(path, schema)
        assert frame.equals(whole.filter(chosen == k)), k
        assert frame.schema == schema
    assert any(gate._read_frame(path, schema).height == 0 for path in paths)
    written = [p for p in paths if p.exists()]
    assert max(pa.ipc.open_file(str(p)).num_record_batches for p in written) < len(files)  # rows gathered


def test_mostly_is_judged_on_all_batches(tmp_path: Path):
    frames = lakes.frames()
    profiles = frames["profiles"].with_columns(
        pl.when(pl.col("user_id") == "u2")
        .then(pl.col("profile").struct.with_fields(pl.lit(None, dtype=pl.String).alias("gender")))
        .otherwise(pl.col("profile"))
        .alias("profile")
    )
    lake = lakes.write_lake(tmp_path, {"profiles": profiles})
    # one batch per user: each batch alone is 0 % or 100 % covered; together 50 % < 99 %
    summary = run_gate(lake, ["profiles"], batch_rows=1, docs=False)
    coverage = next(o for o in summary.outcomes if o.check == "profile__gender_not_null")
    assert (coverage.success, coverage.evaluated, coverage.unexpected) == (False, 2, 1)
    assert "profile__gender_not_null" in summary.tables["profiles"].warnings


@pytest.mark.parametrize("range_hashes", [1 << 23, 2], ids=["in-memory", "on-disk-by-range"])
def test_raw_suites_run_chunk_by_chunk_and_see_keys_across_chunks(tmp_path: Path, monkeypatch, range_hashes):
    from tests.validation.torture import fault
    from transforms.ingest import duplicate_ids, ingest_bundle

    # 2 hashes a range: the 13 event keys are kept on disk in 7 ranges while the chunks are read
    monkeypatch.setattr(duplicate_ids, "RANGE_HASHES", range_hashes)
    spilled: list[Path] = []
    real_flush = duplicate_ids.IdHashes._flush

    def spy_flush(kept):
        real_flush(kept)
        spilled.extend(kept.folder.rglob("*.arrow"))

    monkeypatch.setattr(duplicate_ids.IdHashes, "_flush", spy_flush)

    raw, lake = tmp_path / "raw", tmp_path / "lake"
    fault("duplicate_event_id").build(raw)  # a second e11 with other values
    ingest_bundle(raw, lake)
    events = pl.read_parquet(raw / "events" / "part-0.parquet")
    (raw / "events" / "part-0.parquet").unlink()
    for n in range(4):  # 13 rows as files of 4, 4, 4, 1: with 4-row chunks, one chunk per file
        events.slice(4 * n, 4).write_parquet(raw / "events" / f"part-{n}.parquet")
    copies = events.with_row_index("row").filter(pl.col("event_id") == "e11")["row"].to_list()
    assert len({row // 4 for row in copies}) == 2, "the two copies of e11 lie in different chunks"
    summary = run_gate(lake, ["steps"], raw=raw, docs=False, batch_rows=4)
    unique = next(o for o in summary.outcomes if o.suite == "raw.events" and o.check == "key_unique")
    assert (unique.evaluated, unique.unexpected) == (13, 2)
    assert bool(spilled) == (range_hashes == 2)
    # each example is located in its own file, at its row within that file
    assert sorted(e["_at"] for e in unique.examples) == sorted(
        f"events/part-{row // 4}.parquet row {row % 4}" for row in copies
    )


# --- staged tables and losses ---------------------------------------------------------


def _hashes(lake: Path) -> dict[str, bytes]:
    return {p.relative_to(lake).as_posix(): p.read_bytes() for p in lake.rglob("*.parquet")}


def test_staged_tables_are_gated_where_they_lie_and_the_lake_is_untouched(tmp_path: Path):
    lake = lakes.write_lake(tmp_path / "lake")
    before = _hashes(lake)
    staged = Staging(lake)
    lakes.write_lake(staged.open(), {"steps": _broken_frames()["steps"]})
    with pytest.raises(GateError, match="table 'steps' failed expectation 'click_target_visible'") as stop:
        run_gate(lake, ["steps"], stage="ingest", staged=staged.root, docs=False)
    # the example row is located as it will lie in the lake
    assert "steps/bucket=0/part-0.parquet row 1 {session_id=s1, step=1" in str(stop.value)
    staged.discard()  # what the stage does after a stop
    assert _hashes(lake) == before


def test_staged_routing_rewrites_the_staging_folder_then_swaps(tmp_path: Path):
    lake = lakes.write_lake(tmp_path / "lake")
    bad_history = _history_with_two_bad_rows(tmp_path / "bad")
    staged = Staging(lake)
    lakes.write_lake(staged.open(), {"history": read_lake_table(bad_history, "history")})
    summary = run_gate(
        lake, ["history"], stage="ingest", replace_quarantine=True, staged=staged.root, docs=False
    )
    assert summary.tables["history"].quarantined == 2
    assert read_lake_table(lake, "history").height == lakes.history().height, "the lake waits for the swap"
    staged.commit()
    # 3 staged rows: 1 kept, 2 moved to the gate's quarantine partition
    assert read_lake_table(lake, "history").height == 1
    assert read_lake_table(lake, "quarantine")["stage"].to_list() == [quarantine_stage("history")] * 2
    assert not staged.root.exists()


def test_a_clean_staged_rerun_retires_the_lakes_stale_gate_rejects(tmp_path: Path):
    lake = _history_with_two_bad_rows(tmp_path)
    run_gate(lake, ["history"], stage="ingest", replace_quarantine=True, docs=False)
    assert read_lake_table(lake, "quarantine").height == 2
    staged = Staging(lake)
    lakes.write_lake(staged.open(), {"history": lakes.history()})
    run_gate(lake, ["history"], stage="ingest", replace_quarantine=True, staged=staged.root, docs=False)
    staged.commit()
    assert read_lake_table(lake, "quarantine").height == 0


REASONS = pl.DataFrame(
    {
        "table_name": ["events", "events", "events", "feeds"],
        "reason": ["a", "b", "c", "a"],
        "rows": [6, 3, 1, 2],
    }
)


def _failed(outcomes: list) -> dict[tuple[str, str], int]:
    return {(o.table, o.check): o.unexpected for o in outcomes if not o.success}


def test_losses_nothing_kept_or_too_much_quarantined():
    accounting = {
        "events": {"rows_in": 10, "rows_out": 0, "quarantined": 10},  # nothing kept, 100 % lost
        "feeds": {"rows_in": 4, "rows_out": 2, "quarantined": 2},  # 2/4 = 50 %: at the limit, passes
        "items": {"rows_in": 5, "rows_out": 2, "quarantined": 3},  # 3/5 = 60 % > 50 %
        "history": {"rows_in": 0, "rows_out": 0, "quarantined": 0},  # an empty input loses nothing
    }
    outcomes = loss_outcomes(accounting, REASONS, max_share=0.5)
    assert _failed(outcomes) == {
        ("events", "rows_kept"): 10,
        ("events", "quarantined_share"): 10,
        ("items", "quarantined_share"): 3,
    }
    events = next(o for o in outcomes if (o.table, o.check) == ("events", "rows_kept"))
    # the top reasons, most rows first
    assert events.examples == [
        {"reason": "a", "rows": 6},
        {"reason": "b", "rows": 3},
        {"reason": "c", "rows": 1},
    ]
    assert all(o.severity == "error" for o in outcomes)


def test_losses_allowance_is_a_setting():
    accounting = {"items": {"rows_in": 5, "rows_out": 2, "quarantined": 3}}
    assert _failed(loss_outcomes(accounting, REASONS, max_share=0.6)) == {}  # 3/5 = 0.6, allowed
    assert _failed(loss_outcomes(accounting, REASONS, max_share=0.0)) == {("items", "quarantined_share"): 3}


# --- Prefect --------------------------------------------------------------------


def test_validate_flow_publishes_artifacts(prefect_harness, clean: GateSummary):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from flows.validate import validate_flow

    result = validate_flow(clean.lake, ["items"])
    assert result["ok"] and list(result["tables"]) == ["items"]
    with get_client(sync_client=True) as client:
        keys = {
            a.key
            for a in client.read_artifacts(
                artifact_filter=ArtifactFilter(
                    key=ArtifactFilterKey(any_=["validation-validate", "validation-validate-docs"])
                )
            )
        }
    assert keys == {"validation-validate", "validation-validate-docs"}


def test_validate_command_stops_cleanly(prefect_harness, broken, capfd):
    import typer

    from cli.dataset import validate

    lake, _, _ = broken
    with pytest.raises(typer.Exit) as info:
        validate(Path(lake), "steps")
    out, err = capfd.readouterr()
    assert info.value.exit_code == 1
    assert "click_target_visible" in out and "Traceback" not in out + err
    with pytest.raises(typer.Exit) as info:
        validate(Path(lake), "nope")
    assert info.value.exit_code == 2 and "no validation suite" in capfd.readouterr().out


# --- raw inputs -----------------------------------------------------------------


def test_raw_suites_report_without_raw_ids(tmp_path: Path):
    from tests.validation.torture import fault
    from transforms.ingest import ingest_bundle

    raw, lake = tmp_path / "raw", tmp_path / "lake"
    fault("duplicate_event_id").build(raw)  # a second e11 with other values
    ingest_bundle(raw, lake)
    summary = run_gate(lake, ["steps"], raw=raw, docs=False)
    assert summary.ok, "raw suites only report"
    raw_tables = {t: r for t, r in summary.tables.items() if t.startswith("raw.")}
    assert set(raw_tables) == {"raw.profiles", "raw.items", "raw.feeds", "raw.events", "raw.history"}
    # 13 event rows, both copies of e11 are not unique
    assert raw_tables["raw.events"].rows_in == 13 and raw_tables["raw.events"].warnings == ["key_unique"]
    assert (
        next(o for o in summary.outcomes if o.suite == "raw.events" and o.check == "key_unique").unexpected
        == 2
    )
    written = (
        Path(summary.results_path).read_text()
        + (Path(summary.results_path).parent / "summary.json").read_text()
    )
    assert '"e11"' not in written and "pv3" not in written and '"u3"' not in written, "no raw id in the lake"


def test_frames_and_ge_batches_of_a_wide_table_are_bounded_by_bytes(tmp_path: Path, monkeypatch):
    from validation.suites import all_suites

    lake = _history_with_two_bad_rows(tmp_path)
    files, suite = table_files(lake, "history"), all_suites(None)["history"]
    every = gate.uncompressed_row_bytes(files, suite.schema.names)
    assert every > gate.uncompressed_row_bytes(files, ["user_id"]) > 0
    # a byte bound below two rows: frames and GE batches of one row each, whatever frame_rows says
    monkeypatch.setattr(gate, "FRAME_BYTES", int(every * 1.5))
    monkeypatch.setattr(gate, "BATCH_BYTES", int(every * 1.5))
    reader = gate.LakeTableReader(lake, suite, files, frame_rows=1_000_000)
    assert reader.frame_rows == 1 and [f.height for f in reader.frames()] == [1, 1, 1]
    summary = run_gate(lake, ["history"], stage="ingest", replace_quarantine=True, docs=False)
    report = summary.tables["history"]
    assert (report.rows_in, report.rows_out, report.quarantined) == (3, 1, 2)
    assert read_lake_table(lake, "quarantine").sort("source_row")["source_row"].to_list() == [1, 2]


# --- a table checked bucket by bucket ---------------------------------------------------------------


class InProcessParts:
    """The gate's map step run here, part by part (the flows run it on their task runner)."""

    def __init__(self) -> None:
        self.parts: list[TablePart] = []

    def __call__(self, parts, repeated, settings):
        self.parts += parts
        return [check_part(part, repeated, settings) for part in parts]


def _verdicts(summary: GateSummary) -> dict[tuple[str, str], tuple]:
    return {
        (o.table, o.check): (o.success, o.evaluated, o.unexpected, sorted(o.rows), o.examples, o.exception)
        for o in summary.outcomes
    }


def _both_ways(lake: Path, copy: Path, **options) -> tuple[GateSummary | GateError, ...]:
    """The gate over ``lake`` as one table at a time, and over its copy ``copy`` bucket by bucket."""
    shutil.copytree(lake, copy)
    spread = InProcessParts()
    out = []
    for folder, map_parts in ((lake, None), (copy, spread)):
        try:
            out.append(run_gate(folder, docs=False, map_parts=map_parts, **options))
        except GateError as stop:
            out.append(stop)
    assert {part.table for part in spread.parts} >= {"steps", "sessions", "feed_layouts"}
    return (*out, spread)


def test_a_table_checked_bucket_by_bucket_gets_the_whole_tables_verdict(tmp_path: Path):
    frames = _broken_frames()
    steps = frames["steps"]
    stray = steps.filter((pl.col("session_id") == "s2") & (pl.col("step") == 0)).with_columns(
        bucket=pl.lit(0)
    )
    frames["steps"] = pl.concat([steps, stray])  # a key repeated in two buckets
    lake = lakes.write_lake(tmp_path / "whole", frames)
    # frames of two rows: buckets split by session hash, batches of two rows, in both runs alike
    whole, parts, spread = _both_ways(lake, tmp_path / "parts", frame_rows=2, batch_rows=2)
    assert isinstance(whole, GateError) and isinstance(parts, GateError)
    assert len([p for p in spread.parts if p.table == "steps"]) == 2
    firsts = [p.first_row for p in spread.parts if p.table == "steps"]
    assert firsts == [0, frames["steps"].filter(pl.col("bucket") == 0).height]
    found = _verdicts(parts.summary)
    assert found == _verdicts(whole.summary)
    assert found[("steps", "key_unique")][1:3] == (steps.height + 1, 2)
    assert not found[("steps", "click_target_visible")][0], "the click on a card not in view"


def _rationales(texts: list[str]) -> pl.DataFrame:
    """Rationales of s1's and s2's steps (buckets 0 and 1), the other columns null."""
    keys = lakes.frames()["steps"].select("session_id", "step", "bucket").head(len(texts))
    declared = polars_schema(RATIONALES)
    rows = keys.with_columns(pl.Series("rationale", texts))
    return rows.with_columns(
        pl.lit(None, dtype=dtype).alias(name) for name, dtype in declared.items() if name not in rows.columns
    ).select(declared.names())


def test_rows_routed_from_a_table_checked_bucket_by_bucket_are_the_whole_tables(tmp_path: Path):
    texts = ["I want a closer look at this one."] * 9
    texts[1] = texts[7] = "meh"  # too short to be a reason, in bucket 0 and bucket 1
    rationales = _rationales(texts)
    assert rationales.filter(pl.col("rationale") == "meh")["bucket"].to_list() == [0, 1]
    lake = lakes.write_lake(tmp_path / "whole")
    for (bucket,), rows in rationales.partition_by("bucket", as_dict=True).items():
        folder = lake / "rationales" / f"bucket={bucket}"  # written in buckets, as a bucketed stage would
        folder.mkdir(parents=True)
        pq.write_table(rows.to_arrow().cast(RATIONALES), folder / "part-0.parquet")
    whole, parts, spread = _both_ways(lake, tmp_path / "parts", replace_quarantine=True, stage="extract")
    assert "rationales" in {part.table for part in spread.parts}
    assert _verdicts(parts) == _verdicts(whole)
    report = parts.tables["rationales"]
    assert (report.rows_in, report.rows_out, report.quarantined) == (9, 7, 2)
    for name in ("rationales", "quarantine"):
        ours, theirs = (read_lake_table(folder, name) for folder in (tmp_path / "parts", lake))
        assert ours.sort(ours.columns).equals(theirs.sort(theirs.columns)), name
    moved = read_lake_table(lake, "quarantine")
    assert sorted(moved["source_file"].str.split("/").list.get(1).to_list()) == ["bucket=0", "bucket=1"]


def test_the_data_docs_of_a_gate_in_parts_show_every_parts_batches(tmp_path: Path):
    lake = lakes.write_lake(tmp_path)
    spread = InProcessParts()
    summary = run_gate(lake, ["steps"], map_parts=spread)
    pages = sorted(Path(summary.docs_index).parent.rglob("*.html"))
    data = [p.relative_to(p.parents[3]).parts for p in pages if p.name == "lake-steps.html"]
    assert len(spread.parts) == 2 and [part[0] for part in data] == ["steps", "steps"], pages
    assert sorted(part[1].rsplit("-", 1)[0][-5:] for part in data) == ["part0", "part1"]  # a batch per bucket
