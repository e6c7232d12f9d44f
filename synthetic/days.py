"""A bundle as it stood at the end of a day: logs that arrive one day at a time.

``bundle_through(source, out, day)`` writes the part of a generated bundle (Parquet) that had arrived
by the end of ``day`` (UTC): the events files of the days up to it, and the feeds by the day of their
page view's first event, one file per day (``feeds/part-YYYYMMDD``); the catalogue, profiles and
history whole. The bundle through the next day is this one plus new files only, never a changed one,
which is how a daily export grows.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import polars as pl

from synthetic.bundle import _encode

WHOLE_TABLES = ("items", "profiles", "history")


def event_days(source: str | Path) -> list[str]:
    """The days (YYYYMMDD) the source bundle has events for, in order."""
    return sorted(
        p.name.split(".")[0].removeprefix("part-") for p in (Path(source) / "events").glob("part-*")
    )


def _first_days(source: Path) -> pl.DataFrame:
    """(page_view_id, day) of the first event of every page view."""
    events = pl.scan_parquet(source / "events" / "*.parquet")
    return (
        events.group_by("page_view_id").agg(pl.col("ts").min().dt.strftime("%Y%m%d").alias("day")).collect()
    )


def bundle_through(source: str | Path, out: str | Path, day: str) -> list[str]:
    """Write the bundle ``source`` as it stood at the end of ``day`` into ``out`` (replaced); returns
    the files written, relative to ``out``."""
    source, out = Path(source), Path(out)
    manifest = json.loads((source / "manifest.json").read_text())
    if manifest.get("format") != "parquet":
        raise ValueError(
            f"{source}: bundle_through reads Parquet bundles, this one is {manifest.get('format')}"
        )
    shutil.rmtree(out, ignore_errors=True)
    files: dict[str, list[str]] = {}
    for table in WHOLE_TABLES:
        for path in sorted((source / table).glob("*.parquet")):
            (out / table).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, out / table / path.name)
            files.setdefault(table, []).append(f"{table}/{path.name}")
    for path in sorted((source / "events").glob("part-*.parquet")):
        if path.name.removeprefix("part-").split(".")[0] <= day:
            (out / "events").mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, out / "events" / path.name)
            files.setdefault("events", []).append(f"events/{path.name}")
    days = event_days(source)
    # a feed whose page view has no event at all arrived with the first day: nothing is left out
    feeds = (
        pl.read_parquet(source / "feeds" / "*.parquet")
        .join(_first_days(source), on="page_view_id", how="left")
        .with_columns(pl.col("day").fill_null(days[0] if days else day))
    )
    (out / "feeds").mkdir(parents=True, exist_ok=True)
    for (feed_day,), rows in sorted(
        feeds.filter(pl.col("day") <= day).partition_by("day", as_dict=True).items()
    ):
        name = f"feeds/part-{feed_day}.parquet"
        (out / name).write_bytes(_encode(rows.drop("day"), "feeds", "parquet"))
        files.setdefault("feeds", []).append(name)
    manifest |= {"files": files, "through_day": day}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return [name for names in files.values() for name in names]


def add_new_files(raw: str | Path, later: str | Path) -> list[str]:
    """Copy into the bundle ``raw`` the files of the later bundle ``later`` it lacks, and the later
    manifest: the day's delivery. Returns the files added, relative to the bundle."""
    raw, later = Path(raw), Path(later)
    added = []
    for path in sorted(p for p in later.rglob("*") if p.is_file() and p.name != "manifest.json"):
        target = raw / path.relative_to(later)
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
            added.append(path.relative_to(later).as_posix())
    shutil.copyfile(later / "manifest.json", raw / "manifest.json")
    return added


def main() -> None:
    parser = argparse.ArgumentParser(description="Write a generated bundle as it stood at the end of a day.")
    parser.add_argument("source")
    parser.add_argument("out")
    parser.add_argument("--day", required=True, help="YYYYMMDD (UTC)")
    args = parser.parse_args()
    print(f"{len(bundle_through(args.source, args.out, args.day))} files in {args.out}")


if __name__ == "__main__":
    main()
