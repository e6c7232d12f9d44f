"""The suite declarations: consistent with the declared schemas, and the Polars
helper columns compute what their docs say on frames worked out by hand."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import polars as pl
import pytest

from transforms.config import IngestSettings
from transforms.schemas import ACTIONS, LAKE_TABLES, SCREENS, TERMINAL_STATES
from validation.suites import (
    LAKE_BUILDERS,
    PENDING_BUILDERS,
    RAW_ID_COLUMNS,
    TableSuite,
    all_suites,
    schema_suite,
    spec_hash,
    split_share_checks,
)

SUITES = all_suites()


def _helper(suite: str, name: str):
    return next(h for h in SUITES[suite].helpers if h.name == name).build()


@pytest.mark.parametrize("name", sorted(SUITES))
def test_checks_read_declared_columns_or_helpers(name: str):
    suite = SUITES[name]
    known = set(suite.schema.names) | {h.name for h in suite.helpers}
    assert set(suite.columns()) <= known, f"{name} reads columns its schema does not declare"
    assert len({c.name for c in suite.checks}) == len(suite.checks), "check names are quarantine reasons"
    assert {c.severity for c in suite.checks} <= {"error", "warn"}
    assert {c.level for c in suite.checks} <= {"row", "table"}


def test_every_declared_lake_table_with_a_builder_has_a_suite():
    builders = set(LAKE_BUILDERS) | set(PENDING_BUILDERS)
    assert {n for n in LAKE_TABLES if n in builders} == {n for n in SUITES if not n.startswith("raw.")}
    for name in LAKE_TABLES:
        if name in SUITES:
            assert SUITES[name].schema == LAKE_TABLES[name], "the suite checks the declared schema itself"


def test_value_sets_come_from_the_schemas_module():
    steps, sessions = SUITES["steps"], SUITES["sessions"]
    assert steps.check("action_known").kwargs["value_set"] == list(ACTIONS)
    assert len(ACTIONS) == 13
    assert steps.check("screen_known").kwargs["value_set"] == list(SCREENS)
    assert sessions.check("terminal_known").kwargs["value_set"] == list(TERMINAL_STATES)


def test_ranges_follow_the_configured_geometry():
    geometry = IngestSettings().geometry.model_copy(update={"max_feed_scroll": 500})
    suites = all_suites(IngestSettings(geometry=geometry))
    assert suites["steps"].check("feed_scroll_distance").kwargs["max_value"] == 500
    assert SUITES["steps"].check("ipv_scroll_distance").kwargs["max_value"] == 837  # PROTOCOL.md ref
    assert SUITES["items"].check("price_positive").kwargs == {
        "min_value": 0,
        "max_value": None,
        "column": "price",
        "strict_min": True,
    }


def test_split_share_bounds():
    # 0.8/0.1/0.1 +- 0.05: train in [0.75, 0.85]  ->  mostly(train) = 0.75, mostly(val|test) = 1 - 0.85
    checks = {c.name: c for c in split_share_checks((0.8, 0.1, 0.1))}
    assert checks["train_share_min"].kwargs["mostly"] == 0.75
    assert checks["train_share_max"].kwargs["mostly"] == pytest.approx(0.15)
    assert checks["train_share_max"].kwargs["value_set"] == ["val", "test"]
    assert checks["test_share_max"].kwargs["mostly"] == pytest.approx(0.85)
    assert all(c.severity == "warn" for c in checks.values())


def test_profile_coverage_is_a_warning_at_99_percent():
    coverage = [c for c in SUITES["profiles"].checks if c.name.startswith("profile__")]
    assert len(coverage) == 6
    assert all(c.kwargs["mostly"] == 0.99 and c.severity == "warn" for c in coverage)


def test_raw_suites_report_only_and_never_see_raw_ids():
    for name, suite in SUITES.items():
        if suite.raw:
            assert all(c.severity == "warn" and c.level == "table" for c in suite.checks), name
            assert not set(suite.columns()) & set(RAW_ID_COLUMNS), name


def test_row_routing_only_where_a_row_can_leave_alone():
    # steps/sessions/items/feed_layouts rows are never routed one by one (see validation/suites.py)
    routed = {n for n, s in SUITES.items() if any(c.level == "row" for c in s.checks)}
    assert routed <= {"history", "intents", "rationales"}


def test_version_changes_with_the_spec():
    steps = SUITES["steps"]
    changed = dataclasses.replace(steps, checks=steps.checks[:-1])
    assert spec_hash(changed) != spec_hash(steps)
    assert steps.version == f"1+{spec_hash(steps)}"
    assert all_suites(IngestSettings())["steps"].version == steps.version, "deterministic"


def test_schema_suite_is_generated_per_table():
    s = schema_suite(SUITES["steps"])
    assert isinstance(s, TableSuite) and s.name == "steps.schema"
    assert [c.name for c in s.checks] == ["declared_type_not_null", "observed_type_not_null", "column_type"]


# --- helpers on hand-built frames ----------------------------------------------


def test_step_contiguous():
    # s1: 0,1,3 -> the 3 should be 2; s2: 1,2 -> should start at 0; s3: 0,1 fine
    frame = pl.DataFrame({"session_id": ["s1"] * 3 + ["s2"] * 2 + ["s3"] * 2, "step": [0, 1, 3, 1, 2, 1, 0]})
    got = frame.select(_helper("steps", "_step_contiguous")).to_series().to_list()
    assert got == [True, True, False, False, False, True, True]


def test_end_is_last_and_ts_ordered():
    t = datetime(2025, 1, 1, tzinfo=UTC)
    frame = pl.DataFrame(
        {
            "session_id": ["s1", "s1", "s1"],
            "step": [0, 1, 2],
            "action": ["scroll_down", "end", "click"],  # something after end
            "ts": [t, t + timedelta(seconds=5), t + timedelta(seconds=1)],  # step 2 goes back in time
        }
    )
    assert frame.select(_helper("steps", "_end_is_last")).to_series().to_list() == [True, False, True]
    assert frame.select(_helper("steps", "_ts_ordered")).to_series().to_list() == [True, True, False]


def test_click_target_visible():
    frame = pl.DataFrame(
        {
            "action": ["click", "click", "scroll_down", "click", "click"],
            "target_item_id": ["i3", "i1", None, None, "i1"],
            "visible_items": [["i1", "i2"], ["i1", "i2"], None, ["i1"], None],
        }
    )
    got = frame.select(_helper("steps", "_click_target_visible")).to_series().to_list()
    # not visible, visible, not a click, click without target, click with nothing visible
    assert got == [False, True, True, False, False]


def test_ts_plausible_and_action_group():
    now = datetime.now(UTC)
    frame = pl.DataFrame(
        {
            "ts": [
                datetime(1970, 1, 21, tzinfo=UTC),
                now + timedelta(days=2),
                datetime(2025, 1, 1, tzinfo=UTC),
                None,
            ],
            "action": ["click", "back_home", "ipv_buy", "end"],
            "action_group": ["feed_click", "ipv_browse", "conversion", "termination"],
        },
        schema_overrides={"ts": pl.Datetime("ms", "UTC")},
    )
    # seconds read as ms land in 1970; two days ahead is the future; null is another check's job
    assert frame.select(_helper("steps", "_ts_plausible")).to_series().to_list() == [False, False, True, True]
    # back_home belongs to 'transition' (PROTOCOL.md §1)
    assert frame.select(_helper("steps", "_action_group_matches")).to_series().to_list() == [
        True,
        False,
        True,
        True,
    ]


def test_key_unique_flags_every_copy():
    frame = pl.DataFrame({"session_id": ["a", "a", "b"], "step": [0, 0, 0]})
    assert frame.select(_helper("steps", "_key_unique")).to_series().to_list() == [False, False, True]


def test_card_inside_feed():
    frame = pl.DataFrame({"y": [0, 800], "height": [390, 401], "feed_height": [1200, 1200]})
    # 800 + 401 = 1201 > 1200
    got = frame.select(_helper("feed_layouts", "_card_inside_feed")).to_series().to_list()
    assert got == [True, False]
