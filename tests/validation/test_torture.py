"""Every torture fault through the pipeline: ingest, then the validation gate.

Per fault the pipeline either completes, with the bad rows in quarantine under
the exact reason codes and counts the fault states (worked out by hand in
tests/validation/torture.py), or stops with a one-paragraph error of a known
type. Never a traceback from an unexpected exception, never a lost row: every
table balances rows in = rows out + quarantined + duplicates merged.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import polars as pl
import pytest

from tests.validation.torture import FAULTS, Fault
from transforms.ingest import OUTPUT_OF, ingest_bundle
from transforms.lake import read_lake_table, table_files
from validation.gate import loss_outcomes, lost_reasons, run_gate

#: Ingest's reason codes (the foundation's list, plus the specific ones the readers and
#: aligner add); a quarantine reason outside this set would not be a specific reason.
INGEST_REASONS = {
    "unparseable_row",
    "schema_mismatch",
    "missing_required_field",
    "unknown_action",
    "illegal_action_on_screen",
    "duplicate_event_id",
    "duplicate_timestamp",
    "out_of_order_timestamp",
    "item_not_in_catalog",
    "click_target_not_visible",
    "ipv_without_open_item",
    "invalid_price",
    "missing_profile",
    "session_without_actions",
    "unreadable_file",
    "field_too_large",
    "nul_byte",
    "future_timestamp",
    "negative_offset",
    "page_view_user_conflict",
    "event_after_end",
    "scroll_distance_out_of_range",
    "after_rejected_event",
    "dropped_with_session",
    "defaulted_geometry",
    "non_finite_offset",
}


def _quarantine(lake: Path) -> tuple[Counter, Counter]:
    rows = read_lake_table(lake, "quarantine").filter(pl.col("stage") == "ingest")
    pairs = rows.select("table_name", "reason", "kept").iter_rows()
    rejected, flagged = Counter(), Counter()
    for table, reason, kept in pairs:
        (flagged if kept else rejected)[(table, reason)] += 1
    return rejected, flagged


def _gated_tables(fault: Fault) -> list[str]:
    """steps always, plus the lake table of every raw table the fault touches (GE costs
    ~0.3 s per suite even on a dozen rows; test_gate covers every suite on a clean lake)."""
    touched = {OUTPUT_OF[t] for t, _ in [*fault.rejected, *fault.flagged]}
    return ["steps", *sorted(touched - {"steps"})]


def test_at_least_30_fault_kinds():
    # the issue asks for >= 30; 'clean' is the control, not a fault
    assert len([f for f in FAULTS if f.name != "clean"]) >= 30
    assert len({f.name for f in FAULTS}) == len(FAULTS)


@pytest.mark.parametrize("fault", FAULTS, ids=lambda f: f.name)
def test_fault(fault: Fault, tmp_path: Path):
    raw, lake = tmp_path / "raw", tmp_path / "lake"
    fault.build(raw)
    if fault.stops:
        with pytest.raises(Exception) as info:
            ingest_bundle(raw, lake)
        message = str(info.value)
        assert type(info.value).__name__ == fault.stops
        assert "\n" not in message and 40 < len(message) < 2000, "one readable paragraph"
        assert not table_files(lake, "steps"), "a stopped ingest writes no table"
        return

    result = ingest_bundle(raw, lake)
    rejected, flagged = _quarantine(lake)
    assert dict(rejected) == fault.rejected
    assert dict(flagged) == fault.flagged
    assert {t for _, t in [*rejected, *flagged]} <= INGEST_REASONS
    assert {t: c.duplicates for t, c in result.counts.items() if c.duplicates} == fault.duplicates
    for table, c in result.counts.items():  # never silent loss
        assert c.rows_in == c.rows_out + c.quarantined + c.duplicates + c.dropped, table
    assert read_lake_table(lake, "steps").height == fault.steps
    if fault.check:
        fault.check(lake)

    # the loss gate (default allowance 50 %) stops exactly the faults that lose a table
    accounting = {
        t: {"rows_in": c.rows_in, "rows_out": c.rows_out, "quarantined": c.quarantined}
        for t, c in result.counts.items()
    }
    losses = loss_outcomes(accounting, lost_reasons(lake, "ingest"), max_share=0.5)
    assert sorted({o.table for o in losses if not o.success}) == sorted(fault.lost)

    summary = run_gate(lake, _gated_tables(fault), stage="ingest", replace_quarantine=True, docs=False)
    assert summary.ok
    assert all(t.balanced and t.quarantined == 0 for t in summary.tables.values())
