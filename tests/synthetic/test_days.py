"""A bundle as it stood at the end of a day (``synthetic.days``): the next day adds files, changes none,
and the last day's bundle holds every row of the generated one."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from synthetic.bundle import write_bundle
from synthetic.days import add_new_files, bundle_through, event_days


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("days") / "generated"
    write_bundle(root, users=25, seed=5)
    return root


def test_the_next_day_adds_files_and_changes_none(generated: Path, tmp_path: Path):
    days = event_days(generated)
    earlier = set(bundle_through(generated, tmp_path / "a", days[3]))
    later = set(bundle_through(generated, tmp_path / "b", days[4]))
    assert earlier < later
    assert {f"events/part-{days[4]}.parquet"} <= later - earlier
    for name in earlier:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_the_last_days_bundle_holds_every_row(generated: Path, tmp_path: Path):
    bundle_through(generated, tmp_path / "all", event_days(generated)[-1])
    for table in ("events", "feeds", "items", "profiles", "history"):
        ours = pl.read_parquet(tmp_path / "all" / table / "*.parquet")
        theirs = pl.read_parquet(generated / table / "*.parquet")
        assert ours.sort(pl.all()).equals(theirs.sort(pl.all())), table


def test_a_days_feeds_are_those_of_page_views_begun_by_then(generated: Path, tmp_path: Path):
    day = event_days(generated)[2]
    bundle_through(generated, tmp_path / "early", day)
    views = pl.read_parquet(tmp_path / "early" / "feeds" / "*.parquet")["page_view_id"].unique()
    events = pl.read_parquet(generated / "events" / "*.parquet")
    begun = (
        events.group_by("page_view_id")
        .agg(pl.col("ts").min())
        .filter(pl.col("ts").dt.strftime("%Y%m%d") <= day)["page_view_id"]
    )
    assert set(views) <= set(begun) and views.len() > 0


def test_a_days_delivery_makes_the_earlier_bundle_the_later(generated: Path, tmp_path: Path):
    days = event_days(generated)
    earlier = set(bundle_through(generated, tmp_path / "raw", days[5]))
    later = set(bundle_through(generated, tmp_path / "later", days[6]))
    assert set(add_new_files(tmp_path / "raw", tmp_path / "later")) == later - earlier
    files = {p.relative_to(tmp_path / "raw").as_posix() for p in (tmp_path / "raw").rglob("*") if p.is_file()}
    assert files == later | {"manifest.json"}
    assert (tmp_path / "raw" / "manifest.json").read_text() == (
        tmp_path / "later" / "manifest.json"
    ).read_text()
