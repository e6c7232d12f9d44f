"""Great Expectations 1.x plumbing: one ephemeral context per gate run.

GE has no Polars or DuckDB engine, so every batch is an Arrow-backed pandas
frame (``pd.ArrowDtype`` columns, converted from Polars without copying
strings to Python objects). Each suite runs through a Checkpoint, once per
batch; the run's Data Docs site (one folder per run) is built once at the end.
An ``UpdateDataDocsAction`` on each checkpoint would re-render the site after
every batch (about 0.2 s each, 10x the cost of one build for a dozen suites).
Imports of GE stay inside this module: it takes seconds, and the CLI should not
pay for it unless it validates.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import great_expectations as gx
import great_expectations.expectations as gxe
import pandas as pd
import polars as pl
from great_expectations.core.run_identifier import RunIdentifier
from great_expectations.data_context.types.base import (
    DataContextConfig,
    InMemoryStoreBackendDefaults,
    ProgressBarsConfig,
)
from great_expectations.data_context.types.resource_identifiers import (
    ExpectationSuiteIdentifier,
    ValidationResultIdentifier,
)
from great_expectations.execution_engine import pandas_execution_engine
from great_expectations.expectations.row_conditions import Column, Condition

from validation.suites import Check, Cond, TableSuite

# GE fingerprints every in-memory batch under this many bytes by hashing all its values;
# pandas hashes Arrow timestamps and strings through Python objects, which took ~45 % of
# the gate's time at 578k steps. The fingerprint is batch metadata we never read.
pandas_execution_engine.HASH_THRESHOLD = 0

SITE = "trajforge"
PARTIAL = 20  # failing values and row indexes a result lists, where it does not list them all
#: row-level checks: COMPLETE gives every failing row's index (routing needs them all); no index
#: query strings
RESULT_FORMAT: dict[str, Any] = {
    "result_format": "COMPLETE",
    "partial_unexpected_count": PARTIAL,
    "return_unexpected_index_query": False,
}
#: every other check: counts and the first failing rows. A check judged on a share (``mostly``)
#: can fail most rows by design, and every index listed costs GE a Python dict, held for the run's
#: Data Docs: listed whole, the gate's memory would grow with the table
SUMMARY_FORMAT: dict[str, Any] = {"result_format": "SUMMARY", "partial_unexpected_count": PARTIAL}
ROW_SUITE_SUFFIX = ".rows"  # the GE suite of a table suite's row-level checks

_OPS = {
    "==": operator.eq,
    "!=": operator.ne,
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
    "in": lambda c, v: c.is_in(list(v)),
    "not_in": lambda c, v: c.is_not_in(list(v)),
    "null": lambda c, _: c.is_null(),
    "not_null": lambda c, _: c.is_not_null(),
}


def condition(terms: tuple[Cond, ...]) -> Condition:
    return functools.reduce(operator.and_, [_OPS[op](Column(col), value) for col, op, value in terms])


def expectation(check: Check) -> gxe.Expectation:
    """The GE expectation object of one check; our gate semantics travel in ``meta``."""
    kwargs = dict(check.kwargs)
    if check.when:
        kwargs["row_condition"] = condition(check.when)
    meta = {"check": check.name, "severity": check.severity, "level": check.level}
    return getattr(gxe, check.expectation)(**kwargs, meta=meta, notes=check.doc)


def to_pandas(frame: pl.DataFrame, index: str) -> pd.DataFrame:
    """Arrow-backed pandas batch indexed by the global row number ``index``, save the numeric
    columns that numpy holds exactly (``numpy_exact``): GE's range check compares numpy int64 and
    float64 columns in one vectorized step, and calls Python once per value on any other."""
    values = frame.drop(index)
    exact = {c: numpy_exact(values[c]) for c in values.columns}
    exact = {c: column for c, column in exact.items() if column is not None}
    out = values.drop(list(exact)).to_arrow().to_pandas(types_mapper=pd.ArrowDtype)
    for name, column in exact.items():
        out[name] = column
    out = out[values.columns]
    out.index = pd.Index(frame[index].to_numpy(), name=index)
    return out


def numpy_exact(column: pl.Series) -> Any:
    """``column`` as a numpy int64 or float64 array when that changes neither a value nor which
    values are missing, else None: integers without nulls (within int64); integers of at most 32
    bits with nulls, as float64 whose NaN marks a null (pandas reads NaN as missing, as it reads an
    Arrow null); floats with neither nulls nor NaN (a NaN value would turn into a missing one)."""
    dtype = column.dtype
    if dtype.is_integer():
        if column.null_count() == 0 and (dtype != pl.UInt64 or column.max() is None or column.max() < 2**63):
            return column.cast(pl.Int64).to_numpy()
        if column.null_count() and dtype not in (pl.Int64, pl.UInt64):
            return column.cast(pl.Float64).to_numpy()
        return None
    if dtype.is_float() and column.null_count() == 0 and not column.is_nan().any():
        return column.cast(pl.Float64).to_numpy()
    return None


class Runner:
    """An ephemeral GE context whose Data Docs site lives in ``docs_dir`` (None: a context that only
    validates, its results adopted by another runner's site)."""

    def __init__(self, docs_dir: Path | None, run_id: str) -> None:
        site = {
            "class_name": "SiteBuilder",
            "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": str(docs_dir)},
            "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
        }
        config = DataContextConfig(
            store_backend_defaults=InMemoryStoreBackendDefaults(),
            progress_bars=ProgressBarsConfig(globally=False),
            analytics_enabled=False,
            data_docs_sites={SITE: site} if docs_dir is not None else {},
        )
        self.context = gx.get_context(mode="ephemeral", project_config=config)
        self.source = self.context.data_sources.add_pandas("lake")
        self.run_id = run_id
        self.docs_dir = docs_dir
        self._checkpoints: dict[str, list[gx.Checkpoint]] = {}

    def _suite_checkpoints(self, suite: TableSuite) -> list[gx.Checkpoint]:
        """The checkpoints of ``suite``: its row-level checks (every failing row listed) and the others
        (counts and a few rows), each a GE suite of its own where it has checks."""
        if suite.name not in self._checkpoints:
            rows = [c for c in suite.checks if c.level == "row"]
            totals = [c for c in suite.checks if c.level != "row"]
            parts = [
                (suite.name, totals, SUMMARY_FORMAT),
                (suite.name + ROW_SUITE_SUFFIX, rows, RESULT_FORMAT),
            ]
            self._checkpoints[suite.name] = [
                self._checkpoint(suite, name, checks, result_format)
                for name, checks, result_format in parts
                if checks
            ]
        return self._checkpoints[suite.name]

    def _checkpoint(
        self, suite: TableSuite, name: str, checks: Sequence[Check], result_format: dict[str, Any]
    ) -> gx.Checkpoint:
        meta = {"version": suite.version, "table": suite.table, "doc": suite.doc}
        # all expectations at once: add_expectation() persists the suite once per call
        expectations = [expectation(c) for c in checks]
        ge_suite = self.context.suites.add(
            gx.ExpectationSuite(name=name, meta=meta, expectations=expectations)
        )
        batch = self.source.add_dataframe_asset(name).add_batch_definition_whole_dataframe("batch")
        definition = self.context.validation_definitions.add(
            gx.ValidationDefinition(data=batch, suite=ge_suite, name=name)
        )
        return self.context.checkpoints.add(
            gx.Checkpoint(
                name=name,
                validation_definitions=[definition],
                actions=[],  # Data Docs are built once per gate run: see build_docs
                result_format=result_format,
            )
        )

    def validate(self, suite: TableSuite, batches: Iterable[pd.DataFrame], first: int = 0) -> list[Any]:
        """An ExpectationSuiteValidationResult per batch and checkpoint of ``suite`` (its row-level
        checks and the others); ``first`` numbers the batches of a table validated in several calls
        (chunk by chunk)."""
        checkpoints = self._suite_checkpoints(suite)
        results = []
        for number, frame in enumerate(batches, start=first):
            run = RunIdentifier(run_name=f"{self.run_id}-batch{number}")
            for checkpoint in checkpoints:
                outcome = checkpoint.run(batch_parameters={"dataframe": frame}, run_id=run)
                results.extend(outcome.run_results.values())
        return results

    def batches_of(self, suite: TableSuite, results: Sequence[Any]) -> int:
        """How many batches ``validate`` returned ``results`` for."""
        return len(results) // max(len(self._suite_checkpoints(suite)), 1)

    def adopt(self, suite: TableSuite, results: Sequence[Any]) -> None:
        """Results of ``suite`` validated by another runner (a gate's part in another process), kept
        in this context so its Data Docs show them."""
        self._suite_checkpoints(suite)
        store = self.context.validation_results_store
        for result in results:
            batch = result.meta["active_batch_definition"]
            key = ValidationResultIdentifier(
                expectation_suite_identifier=ExpectationSuiteIdentifier(name=result.suite_name),
                run_id=result.meta["run_id"],
                batch_identifier=f"{batch['datasource_name']}-{batch['data_asset_name']}",
            )
            store.set(key, result)

    def build_docs(self) -> Path:
        self.context.build_data_docs(site_names=[SITE])
        return self.index_html

    @property
    def index_html(self) -> Path:
        if self.docs_dir is None:
            raise ValueError(f"the GE runner of {self.run_id} has no Data Docs site")
        return self.docs_dir / "index.html"
