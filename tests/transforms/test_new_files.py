"""A bundle grown by new files is ingested from those files alone, and the lake equals the one the
whole grown bundle gives, table by table, quarantine included, also when the new day's rows reach
back into earlier days: a page view crossing midnight, an event id repeated from an earlier day, a
rejected event cutting an earlier session, a profile that arrives late, a feed whose events come
the next day."""

from __future__ import annotations

import shutil
from datetime import timedelta
from pathlib import Path

import polars as pl
import pytest

import transforms.readers as readers
from synthetic.bundle import write_bundle
from synthetic.days import bundle_through, event_days
from transforms.config import IngestSettings
from transforms.ingest import ingest_bundle
from transforms.ingest.landed import landed_dir
from transforms.lake import differing_tables, read_lake_table
from transforms.schemas import LAKE_TABLES

TABLES = [*LAKE_TABLES, "quarantine"]


def _last_view(events: pl.DataFrame) -> str:
    return events.sort("ts")["page_view_id"][-1]


def messy_day(root: Path) -> tuple[Path, Path, list[str]]:
    """(bundle through a day, the same bundle grown by the next day's files, those files)."""
    write_bundle(root / "generated", users=40, seed=3)
    days = event_days(root / "generated")
    before, day = days[len(days) // 2 - 1], days[len(days) // 2]
    grown = root / "grown"
    bundle_through(root / "generated", grown, day)
    old_file, new_file = grown / "events" / f"part-{before}.parquet", grown / "events" / f"part-{day}.parquet"
    old, new = pl.read_parquet(old_file), pl.read_parquet(new_file)
    earlier = pl.read_parquet(grown / "events" / f"part-{days[0]}.parquet")

    crossing = _last_view(old)  # its last two events arrive with the next day's file
    tail = old.filter(pl.col("page_view_id") == crossing).sort("ts").tail(2)
    old = old.join(tail.select("event_id"), on="event_id", how="anti")
    victim = old.filter(pl.col("page_view_id") != crossing).sort("ts").row(0, named=True)
    orphan_user = new["user_id"][0]
    orphan_ts = new["ts"].min() - timedelta(minutes=5)
    added = pl.concat(
        [
            tail,
            earlier.head(1),  # an exact repeat of an earlier day's event
            earlier.filter(pl.col("user_id") != earlier["user_id"][0])
            .head(1)
            .with_columns(
                # an earlier day's event id on a page view of another user, the next day
                pl.lit(new["user_id"][0]).alias("user_id"),
                pl.lit(new["page_view_id"][0]).alias("page_view_id"),
                pl.lit(new["ts"][0]).alias("ts"),
            ),
            pl.DataFrame([victim]).with_columns(  # a rejected event inside an earlier session
                pl.lit("ev-unknown-action").alias("event_id"), pl.lit("teleport").alias("action")
            ),
            new.head(1).with_columns(  # a click on an item the catalog lacks
                pl.lit("ev-no-item").alias("event_id"),
                pl.lit("click").alias("action"),
                pl.lit("no-such-item").alias("item_id"),
                pl.lit("feed").alias("screen"),
            ),
            new.filter(pl.col("page_view_id") == new["page_view_id"][0]).with_columns(
                pl.lit("pv-orphan").alias("page_view_id"),
                pl.lit(orphan_user).alias("user_id"),
                (pl.col("event_id") + "-o"),
                pl.col("ts") - (pl.col("ts").min() - orphan_ts),
            ),
        ],
        how="vertical_relaxed",
    ).select(new.columns)
    old.write_parquet(old_file)
    pl.concat([new, added], how="vertical_relaxed").write_parquet(new_file)

    feeds_old_file = grown / "feeds" / f"part-{before}.parquet"
    feeds_old, feeds_new = (
        pl.read_parquet(feeds_old_file),
        pl.read_parquet(grown / "feeds" / f"part-{day}.parquet"),
    )
    first_view = new["page_view_id"][0]
    orphan_feed = feeds_new.filter(pl.col("page_view_id") == first_view).with_columns(
        pl.lit("pv-orphan").alias("page_view_id")
    )  # the feed lands a day before its events
    pl.concat([feeds_old, orphan_feed]).write_parquet(feeds_old_file)
    late_card = feeds_old.filter(pl.col("page_view_id") == crossing).head(1)  # a card repeated a day late
    pl.concat([feeds_new, late_card]).write_parquet(grown / "feeds" / f"part-{day}.parquet")

    profiles = pl.read_parquet(grown / "profiles" / "part-00000.parquet")
    busy = pl.concat([new["user_id"], added["user_id"], earlier["user_id"]])
    late_user = old.filter(~pl.col("user_id").is_in(busy.implode()))["user_id"].sort()[0]  # no other news
    pl.concat([profiles.filter(pl.col("user_id") != late_user)]).write_parquet(
        grown / "profiles" / "part-00000.parquet"
    )
    pl.concat([profiles.filter(pl.col("user_id") == late_user), profiles.head(1).with_columns(
        pl.lit("other").alias("gender"))]).write_parquet(grown / "profiles" / f"part-{day}.parquet")  # fmt: skip
    history = pl.read_parquet(grown / "history" / "part-00000.parquet")
    pl.concat(
        [history.head(3), history.slice(3, 1).with_columns(pl.lit("wish").alias("kind"))]
    ).write_parquet(grown / "history" / f"part-{day}.parquet")
    new_files = [f"events/part-{day}.parquet", f"feeds/part-{day}.parquet",
                 f"history/part-{day}.parquet", f"profiles/part-{day}.parquet"]  # fmt: skip
    raw = root / "raw"
    shutil.copytree(grown, raw)
    for name in new_files:
        (raw / name).unlink()
    return raw, grown, new_files


def add_files(raw: Path, grown: Path, names: list[str]) -> None:
    for name in names:
        shutil.copyfile(grown / name, raw / name)


@pytest.fixture(scope="module")
def day(tmp_path_factory) -> tuple[Path, Path, list[str]]:
    return messy_day(tmp_path_factory.mktemp("messy"))


def test_a_new_day_is_ingested_from_its_files_alone_and_equals_the_whole_bundle(day, tmp_path, monkeypatch):
    raw_before, grown, new_files = day
    raw, lake, fresh = tmp_path / "raw", tmp_path / "lake", tmp_path / "fresh"
    shutil.copytree(raw_before, raw)
    (tmp_path / ".lake.landed-0badf00d").mkdir()  # rows a killed ingest left staged: raw ids, removed
    first = ingest_bundle(raw, lake)
    assert not (tmp_path / ".lake.landed-0badf00d").exists()
    assert first.increment == {"whole_bundle": "the lake has no landed rows"}
    assert first.flagged_by_reason.get("missing_profile", 0) >= 1  # the late profile's user
    assert first.quarantine_by_reason.get("session_without_actions", 0) >= 1  # the feed before its events

    add_files(raw, grown, new_files)
    parsed: list[str] = []
    read_chunk = readers.read_chunk

    def spying(root, chunk, *args):
        parsed.extend(p.relative_to(root).as_posix() for p in chunk.paths)
        return read_chunk(root, chunk, *args)

    monkeypatch.setattr(readers, "read_chunk", spying)
    again = ingest_bundle(raw, lake)
    monkeypatch.undo()
    assert sorted(set(parsed)) == sorted(new_files)
    assert again.increment["files_read"] == sorted(new_files)
    users = read_lake_table(lake, "sessions")["user_id"].n_unique()
    assert 0 < again.increment["users_read"] < users

    assert again.quarantine_by_reason.get("session_without_actions", 0) == 0
    assert "missing_profile" not in again.flagged_by_reason
    ingest_bundle(grown, fresh)
    assert differing_tables(lake, fresh, TABLES) == {}
    reasons = set(read_lake_table(lake, "quarantine")["reason"])
    assert {"duplicate_event_id", "unknown_action", "unknown_history_kind", "duplicate_profile"} <= reasons
    assert read_lake_table(lake, "sessions").filter(pl.col("session_id").is_null()).height == 0


def test_a_second_new_day_adds_to_the_landed_rows(day, tmp_path):
    raw_before, grown, new_files = day
    raw, lake, fresh = tmp_path / "raw", tmp_path / "lake", tmp_path / "fresh"
    shutil.copytree(raw_before, raw)
    ingest_bundle(raw, lake)
    add_files(raw, grown, new_files[:2])  # events and feeds one day, profiles and history the next
    assert ingest_bundle(raw, lake).increment["files_read"] == sorted(new_files[:2])
    add_files(raw, grown, new_files[2:])
    assert ingest_bundle(raw, lake).increment["files_read"] == sorted(new_files[2:])
    ingest_bundle(grown, fresh)
    assert differing_tables(lake, fresh, TABLES) == {}


def test_what_cannot_be_ingested_alone_reads_the_whole_bundle(day, tmp_path):
    raw_before, grown, new_files = day
    raw, lake, fresh = tmp_path / "raw", tmp_path / "lake", tmp_path / "fresh"
    shutil.copytree(raw_before, raw)
    ingest_bundle(raw, lake)
    add_files(raw, grown, new_files)
    shutil.copyfile(grown / "items" / "part-00000.parquet", raw / "items" / "part-9.parquet")
    shutil.copyfile(grown / "items" / "part-00000.parquet", grown / "items" / "part-9.parquet")
    assert ingest_bundle(raw, lake).increment == {
        "whole_bundle": "new items files: the catalog is read whole"
    }
    ingest_bundle(grown, fresh)
    assert differing_tables(lake, fresh, TABLES) == {}
    (grown / "items" / "part-9.parquet").unlink()

    changed = sorted((raw / "events").glob("*.parquet"))[0]
    pl.read_parquet(changed).head(5).write_parquet(changed)
    why = ingest_bundle(raw, lake).increment["whole_bundle"]
    assert why.startswith("1 landed files changed or are gone") and changed.name in why
    assert ingest_bundle(raw, lake, settings=IngestSettings(buckets=3)).increment == {
        "whole_bundle": "the settings differ from the landed rows'"
    }


def test_no_landed_rows_when_asked_not_to_keep_them(day, tmp_path):
    raw_before, _, _ = day
    settings = IngestSettings(keep_landed=False)
    result = ingest_bundle(raw_before, tmp_path / "lake", settings=settings)
    assert result.increment == {} and not landed_dir(tmp_path / "lake").exists()
    assert not any(p.name.endswith(".landed") or ".landed-" in p.name for p in tmp_path.iterdir())
