"""Which users a changed lake changed (``transforms.increments``), and a rendering of only those users
that keeps everyone else's rows: the table a full rendering writes."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from synthetic.bundle import write_bundle
from transforms.increments import RecordedInputs, changed_users, empty_not_executable, rendering_digests
from transforms.ingest import ingest_bundle
from transforms.lake import differing_tables, read_lake_table, table_dir, write_table
from transforms.records import KeptRendering, write_records


@pytest.fixture(scope="module")
def built_lake(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("increments")
    write_bundle(root / "raw", users=30, seed=11)
    ingest_bundle(root / "raw", root / "lake")
    return root / "lake"


@pytest.fixture
def lake(built_lake: Path, tmp_path: Path) -> Path:
    """A copy each test may change."""
    import shutil

    copy = tmp_path / "lake"
    shutil.copytree(built_lake, copy)
    return copy


def users_showing(lake: Path, item_id: str) -> set[str]:
    """Written out independently of the digests: whose steps show, click or open ``item_id``."""
    steps = read_lake_table(lake, "steps", ["user_id", "visible_items", "target_item_id", "ipv_item_id"])
    shows = (
        pl.col("visible_items").list.contains(item_id)
        | (pl.col("target_item_id") == item_id)
        | (pl.col("ipv_item_id") == item_id)
    )
    return set(steps.filter(shows.fill_null(False))["user_id"])


def test_digests_ignore_row_order_and_file_layout(lake: Path):
    before = rendering_digests(lake, with_extraction=False)
    steps = read_lake_table(lake, "steps")
    write_table(lake, "steps", steps.reverse())  # one file per bucket, rows reversed
    after = rendering_digests(lake, with_extraction=False)
    assert before.height == read_lake_table(lake, "sessions")["user_id"].n_unique()
    assert changed_users(before, after).len() == 0


def test_a_changed_item_changes_exactly_the_users_who_see_it(lake: Path):
    before = rendering_digests(lake, with_extraction=False)
    steps = read_lake_table(lake, "steps", ["user_id", "target_item_id"])
    item = steps.drop_nulls("target_item_id")["target_item_id"][0]
    items = read_lake_table(lake, "items")
    write_table(lake, "items", items.with_columns(
        pl.when(pl.col("item_id") == item).then(pl.lit("A new title")).otherwise(pl.col("title")).alias("title")
    ))  # fmt: skip
    changed = set(changed_users(before, rendering_digests(lake, with_extraction=False)))
    assert changed == users_showing(lake, item)
    assert 0 < len(changed) < before.height


def test_one_users_new_session_changes_only_that_user(lake: Path):
    before = rendering_digests(lake, with_extraction=False)
    sessions = read_lake_table(lake, "sessions")
    user = sessions["user_id"].sort()[0]
    write_table(lake, "sessions", sessions.with_columns(
        pl.when(pl.col("user_id") == user).then(pl.col("length") + 1).otherwise(pl.col("length")).alias("length")
    ))  # fmt: skip
    assert changed_users(before, rendering_digests(lake, with_extraction=False)).to_list() == [user]


def test_changed_users_names_changed_new_and_gone_users():
    before = pl.DataFrame(
        {"user_id": ["a", "b", "c"], "digest": [1, 2, 3]}, schema_overrides={"digest": pl.UInt64}
    )
    now = pl.DataFrame(
        {"user_id": ["a", "b", "d"], "digest": [1, 5, 4]}, schema_overrides={"digest": pl.UInt64}
    )
    assert changed_users(before, now).to_list() == ["b", "c", "d"]


def test_rendering_only_the_changed_users_writes_the_full_rendering(lake: Path, tmp_path: Path):
    earlier = write_records(lake, out=tmp_path / "earlier")
    sessions = read_lake_table(lake, "sessions")
    users = sessions["user_id"].unique().sort()
    gone, changed = users[0], users[1]
    steps = read_lake_table(lake, "steps")
    write_table(lake, "steps", steps.filter(pl.col("user_id") != gone).with_columns(
        pl.when(pl.col("user_id") == changed).then(pl.col("scroll_top") + 1).otherwise(pl.col("scroll_top"))
        .alias("scroll_top")
    ))  # fmt: skip
    write_table(lake, "sessions", sessions.filter(pl.col("user_id") != gone))
    full = write_records(lake, out=tmp_path / "full")
    kept = KeptRendering(table_dir(tmp_path / "earlier", "records"), earlier.not_executable_by_user())
    partial = write_records(lake, out=tmp_path / "partial", only_users=pl.Series([gone, changed]), keep=kept)
    assert differing_tables(tmp_path / "partial", tmp_path / "full", ["records"]) == {}
    assert differing_tables(tmp_path / "earlier", tmp_path / "full", ["records"]) != {}
    for field in ("records", "by_mode_split", "gold_not_executable", "with_intent", "token_estimate_max"):
        assert getattr(partial, field) == getattr(full, field), field
    assert partial.token_estimate_mean == pytest.approx(full.token_estimate_mean, abs=0.2)
    assert sorted(map(tuple, partial.not_executable_by_user().sort(pl.all()).rows())) == sorted(
        map(tuple, full.not_executable_by_user().sort(pl.all()).rows())
    )
    kept_files = list(table_dir(tmp_path / "partial", "records").rglob("kept-*.parquet"))
    assert kept_files, "unchanged users' files are kept, not rendered again"


def test_a_recorded_rendering_counts_only_for_its_key_and_its_table(tmp_path: Path):
    inputs = RecordedInputs(tmp_path / "_runs" / "records")
    digests = pl.DataFrame({"user_id": ["a"], "digest": [1]}, schema_overrides={"digest": pl.UInt64})
    assert inputs.previous("k", "table-1") is None  # nothing recorded
    inputs.record("k", "table-1", digests, empty_not_executable())
    recorded = inputs.previous("k", "table-1")
    assert recorded is not None and recorded[0].equals(digests)
    assert inputs.previous("other settings", "table-1") is None
    assert inputs.previous("k", "table-2") is None  # the table was rewritten since
    assert inputs.previous("k", None) is None  # or is gone
    inputs.forget()
    assert inputs.previous("k", "table-1") is None
