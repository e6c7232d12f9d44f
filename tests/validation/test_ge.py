"""The GE batches: bounded by rows and by bytes, numeric columns handed to GE as numpy where that
keeps every value and every missing value, and the range checks' verdicts the same whichever way a
column travels."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from validation import gate
from validation.gate import ROW
from validation.ge import PARTIAL, ROW_SUITE_SUFFIX, Runner, numpy_exact, to_pandas
from validation.suites import TableSuite, between, in_set, not_null


def test_numeric_columns_go_to_numpy_only_where_exact():
    as_int = numpy_exact(pl.Series([3, -1, 0], dtype=pl.Int32))
    assert as_int.dtype == np.int64 and as_int.tolist() == [3, -1, 0]
    with_nulls = numpy_exact(pl.Series([3, None, 7], dtype=pl.Int16))
    assert with_nulls.dtype == np.float64 and with_nulls[0] == 3 and math.isnan(with_nulls[1])
    assert numpy_exact(pl.Series([2**62 + 1, None], dtype=pl.Int64)) is None  # float64 would round it
    assert numpy_exact(pl.Series([2**63 + 5], dtype=pl.UInt64)) is None  # beyond int64
    assert numpy_exact(pl.Series([2**63 - 1], dtype=pl.UInt64)).tolist() == [2**63 - 1]
    assert numpy_exact(pl.Series([1.5, float("nan")])) is None  # a NaN would become a missing value
    assert numpy_exact(pl.Series([1.5, None])) is None
    assert numpy_exact(pl.Series([1.5, -0.25], dtype=pl.Float32)).dtype == np.float64
    assert numpy_exact(pl.Series(["a"])) is None and numpy_exact(pl.Series([True])) is None


def test_a_batch_keeps_its_columns_order_values_and_row_numbers():
    frame = pl.DataFrame(
        {
            "name": ["a", None, "c"],
            "count": pl.Series([1, 2, 3], dtype=pl.UInt32),
            "gap": pl.Series([None, -4, 5], dtype=pl.Int32),
            "score": [0.5, float("nan"), 2.0],
            "__row": [10, 11, 12],
        }
    )
    batch = to_pandas(frame, "__row")
    assert list(batch.columns) == ["name", "count", "gap", "score"]
    assert batch.index.tolist() == [10, 11, 12] and batch.index.name == "__row"
    assert str(batch["count"].dtype) == "int64" and str(batch["gap"].dtype) == "float64"
    assert str(batch["name"].dtype).endswith("[pyarrow]") and str(batch["score"].dtype).endswith("[pyarrow]")
    assert batch["gap"].isna().tolist() == [True, False, False]
    assert batch["score"].isna().tolist() == [False, False, False]  # NaN is a value here, not a gap


RANGE_CASES = {  # column -> (values, dtype): what each column's range check must flag
    "small": ([0, -1, None, 5, -7], pl.Int32),
    "wide": ([0, -1, None, 2**62, -(2**62)], pl.Int64),  # stays Arrow: Python compares each value
    "plain": ([4, -2, 3, 0, 1], pl.Int64),
    "ratio": ([0.0, -0.5, float("nan"), float("inf"), 2.5], pl.Float64),
    "share": ([0.1, -0.1, 0.0, 1.0, 3.0], pl.Float32),
}


@pytest.mark.parametrize("column", sorted(RANGE_CASES))
def test_range_checks_flag_the_same_rows_whichever_way_a_column_travels(column):
    values, dtype = RANGE_CASES[column]
    frame = pl.DataFrame({column: pl.Series(values, dtype=dtype), "__row": range(100, 105)})
    check = between(f"{column}_non_negative", column, "never negative", 0)
    suite = TableSuite("ranges", "ranges", frame.drop("__row").to_arrow().schema, (), (check,))
    [result] = Runner(None, "test").validate(suite, [to_pandas(frame, "__row")])
    flagged = sorted(i["__row"] for i in result.results[0].result["partial_unexpected_index_list"])
    # independent reference: a value below 0 fails, a null is not judged, NaN compares false
    expected = [100 + k for k, v in enumerate(values) if v is not None and not v >= 0]
    assert flagged == expected


def test_only_row_level_checks_list_every_failing_row():
    # a share check fails most rows by design: its result counts them and lists a few, while a
    # row-level check, whose rows the gate routes, lists every one
    frame = pl.DataFrame({"split": ["train"] * 90 + ["val"] * 10, ROW: range(1_000, 1_100)})
    share = in_set("val_share_min", "split", ["val"], "at least 5% are val", mostly=0.05, severity="warn")
    routed = in_set("train_only", "split", ["train"], "train rows only", severity="warn", level="row")
    suite = TableSuite("shares", "shares", frame.drop(ROW).to_arrow().schema, (), (share, routed))
    runner = Runner(None, "test")
    results = runner.validate(suite, [to_pandas(frame, ROW)] * 2, first=7)
    assert [r.suite_name for r in results] == ["shares", "shares" + ROW_SUITE_SUFFIX] * 2
    assert runner.batches_of(suite, results) == 2
    assert {r.meta["run_id"].run_name for r in results} == {"test-batch7", "test-batch8"}
    by_check = {r.expectation_config.meta["check"]: r.result for r in results[0].results + results[1].results}
    assert by_check["val_share_min"]["unexpected_count"] == 90
    assert "unexpected_index_list" not in by_check["val_share_min"]
    assert len(by_check["val_share_min"]["partial_unexpected_index_list"]) == PARTIAL
    assert sorted(i[ROW] for i in by_check["train_only"]["unexpected_index_list"]) == list(
        range(1_090, 1_100)
    )
    outcomes = {o.check: o for o in gate.combine(suite, results)}
    assert outcomes["val_share_min"].success and outcomes["val_share_min"].unexpected == 180
    assert not outcomes["train_only"].success and outcomes["train_only"].routes
    assert sorted(outcomes["train_only"].rows) == sorted(list(range(1_090, 1_100)) * 2)


def test_a_ge_batch_holds_at_most_its_rows_and_its_bytes(monkeypatch):
    checks = (between("n_non_negative", "n", "never negative", 0), not_null("note"))
    frame = pl.DataFrame({"n": range(100), "note": ["x" * 1000] * 100, "unread": ["y" * 5000] * 100})
    suite = TableSuite("notes", "notes", frame.drop("unread").to_arrow().schema, (), checks)
    frame = frame.with_row_index(ROW, offset=500)
    read = frame.select("n", "note", ROW)  # what GE sees: the unread column counts for nothing
    monkeypatch.setattr(gate, "BATCH_BYTES", read.estimated_size() // 4)
    by_bytes = list(gate.batches(suite, frame, batch_rows=60))
    per_batch = gate.BATCH_BYTES * 100 // read.estimated_size()
    assert [len(b) for b in by_bytes[:-1]] == [per_batch] * (len(by_bytes) - 1) and per_batch < 60
    assert sum(len(b) for b in by_bytes) == 100 and len(by_bytes) == -(-100 // per_batch)
    assert list(by_bytes[0].columns) == ["n", "note"]
    assert [i for b in by_bytes for i in b.index] == list(range(500, 600))
    monkeypatch.setattr(gate, "BATCH_BYTES", 2**40)
    assert [len(b) for b in gate.batches(suite, frame, batch_rows=60)] == [60, 40]


def test_repeated_keys_are_counted_by_hash_range_and_confirmed_on_the_keys(tmp_path, monkeypatch):
    from transforms.ingest import duplicate_ids

    monkeypatch.setattr(duplicate_ids, "RANGE_HASHES", 64)  # 600 keys: hashes on disk, in ranges
    monkeypatch.setattr(gate, "FRAME_ROWS", 50)  # Parquet batches of 50 rows
    # a weak hash (eight values) makes most keys share a hash with another: only real repeats count
    monkeypatch.setattr(gate, "key_hash", lambda keys: pl.struct(list(keys)).hash(7) % 8)
    sessions = [f"s{k // 3}" for k in range(600)]
    items = [f"i{k % 3}" for k in range(600)]
    frame = pl.DataFrame({"session_id": sessions, "item_id": items, "rank": range(600)})
    repeats = frame.slice(10, 2).vstack(frame.slice(500, 1))  # keys 10, 11 and 500 twice
    files = [tmp_path / "a.parquet", tmp_path / "b.parquet"]
    frame.write_parquet(files[0], row_group_size=70)
    repeats.vstack(repeats.slice(0, 1)).write_parquet(files[1])  # key 10 three times in all
    suite = TableSuite("cards", "cards", frame.to_arrow().schema, ("session_id", "item_id"), ())
    found = gate.duplicated_key_hashes(files, suite)
    expected = repeats.select(gate.key_hash(["session_id", "item_id"])).to_series()
    assert sorted(found.to_list()) == sorted(expected.to_list())
    # no repeat at all: nothing, whatever the hashes share
    assert gate.duplicated_key_hashes(files[:1], suite).len() == 0
