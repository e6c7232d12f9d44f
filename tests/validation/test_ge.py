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
from validation.ge import Runner, numpy_exact, to_pandas
from validation.suites import TableSuite, between, not_null


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
    flagged = sorted(i["__row"] for i in result.results[0].result["unexpected_index_list"])
    # independent reference: a value below 0 fails, a null is not judged, NaN compares false
    expected = [100 + k for k, v in enumerate(values) if v is not None and not v >= 0]
    assert flagged == expected


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
