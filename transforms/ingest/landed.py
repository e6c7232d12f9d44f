"""The bundle's rows as the reader typed them, kept beside the lake in ``LAKE.landed`` (a sibling folder,
never inside the lake) so that a bundle grown by new files is ingested from those files alone
(``new_files``):

    LAKE.landed/events/bucket=K/*.parquet   typed events rows (locators ``_file``, ``_row`` included),
                                        K the bucket of the row's user, as in the lake
    LAKE.landed/feeds/bucket=K/*.parquet    typed feed rows, K the bucket of their page view's user;
                                        ``ORPHAN_BUCKET`` while no event names the view
    LAKE.landed/marks/*.parquet             where the rows the reader rejected from events stood (they
                                        cut their sessions)
    LAKE.landed/profiles/, history/         typed rows, whole
    LAKE.landed/item_index.parquet          the run's item index (``ItemIndex``) with its pseudonyms
    LAKE.landed/landed.json                 the bundle files landed (with fingerprints), the settings
                                        and the code that read them

These rows carry the bundle's own ids: they are not re-keyed, so they stay out of the lake, with
whoever holds the bundle. They are swapped into place after the lake's tables (``commit_landed``),
so they never describe files the lake does not hold. ``IngestSettings.keep_landed`` False keeps none, and
every ingest then reads the whole bundle.
"""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
import uuid
from pathlib import Path

import polars as pl

from transforms.config import IngestSettings
from transforms.files import link_tree, swap_into_place
from transforms.fingerprints import code_version, fingerprint
from transforms.ingest.item_index import INDEX_FILE, ItemIndex, load_index, save_index
from transforms.ingest.item_shards import ItemShards
from transforms.readers import empty_typed, no_event_marks, raw_table_files
from transforms.schemas import RAW_TABLES

RECORD = "landed.json"
ORPHAN_BUCKET = -1  # feeds of page views no event names (yet)
LAYOUT_VERSION = 1


def landed_dir(lake: str | Path) -> Path:
    """``LAKE.landed``, beside the lake folder."""
    lake = Path(lake).absolute()
    return lake.parent / f"{lake.name}.landed"


def commit_landed(staged: str | Path, lake: str | Path) -> Path:
    """Swap landed rows staged (and sealed) by an ingest into place, once the lake holds its tables."""
    swap_into_place(Path(staged), landed_dir(lake))
    return landed_dir(lake)


def settings_key(settings: IngestSettings) -> str:
    """What the landed rows and the lake built from them depend on among the settings (the key by
    its hash only: it never leaves the environment)."""
    payload = settings.model_dump(mode="json")
    payload["rekey_key"] = hashlib.blake2b(settings.rekey_key.encode(), digest_size=16).hexdigest()
    return json.dumps(payload, sort_keys=True)


class LandedWriter:
    """Writes the landed rows of one ingest of ``lake`` into a hidden folder beside it, sealed with
    their record and then swapped into place (``commit_landed``). Every file gets a name of its own,
    so a later ingest adds files beside the earlier ones (``link_from``) instead of rewriting them."""

    def __init__(self, lake: str | Path, zstd_level: int = 1) -> None:
        self.token, self.count, self.zstd_level = uuid.uuid4().hex[:8], 0, zstd_level
        self.target = landed_dir(lake)
        self.root = self.target.parent / f".{self.target.name}-{self.token}"
        self.sealed = False
        for stale in self.target.parent.glob(f".{self.target.name}-*"):  # left by a killed ingest
            shutil.rmtree(stale, ignore_errors=True)

    def _write(self, folder: Path, frame: pl.DataFrame) -> None:
        if frame.height == 0:
            return
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"part-{self.token}-{self.count:05d}.parquet"
        self.count += 1
        frame.write_parquet(path, compression="zstd", compression_level=self.zstd_level)

    def add_views(
        self, events: pl.DataFrame, feeds: pl.DataFrame, marks: pl.DataFrame, buckets: pl.DataFrame
    ) -> None:
        """Rows of some page views: ``buckets`` maps every user (raw ``user_id``) and page view
        (``page_view_id``) seen so far to its bucket, as ``view_buckets`` does."""
        users = buckets.select("user_id", "bucket").unique("user_id")
        placed = events.join(users, on="user_id", how="left", maintain_order="left")
        for (bucket,), rows in placed.partition_by("bucket", as_dict=True).items():
            self._write(self.root / "events" / f"bucket={bucket}", rows.drop("bucket"))
        views = buckets.select("page_view_id", "bucket").drop_nulls("page_view_id").unique("page_view_id")
        feeds = feeds.join(views, on="page_view_id", how="left", maintain_order="left")
        feeds = feeds.with_columns(pl.col("bucket").fill_null(ORPHAN_BUCKET))
        for (bucket,), rows in feeds.partition_by("bucket", as_dict=True).items():
            self._write(self.root / "feeds" / f"bucket={bucket}", rows.drop("bucket"))
        self._write(self.root / "marks", marks)

    def for_part(self, part: int) -> LandedWriter:
        """A writer into the same folder whose files are named for ``part``: for a task that lands one
        part's rows in another thread or process while others land theirs."""
        writer = copy.copy(self)
        writer.token, writer.count = f"{self.token}-p{part}", 0
        return writer

    def add_whole(self, name: str, frame: pl.DataFrame) -> None:
        self._write(self.root / name, frame)

    def save_index(self, index: ItemIndex | ItemShards) -> None:
        if isinstance(index, ItemShards):
            index.save_as_index(self.root, self.zstd_level)
        else:
            save_index(index, self.root, self.zstd_level)

    def link_from(self, lake: str | Path) -> None:
        """The lake's landed files (its item index aside) hard-linked into this writer's folder: the
        earlier rows stay as they were."""
        link_tree(landed_dir(lake), self.root, skip=(INDEX_FILE,))

    def seal(self, files: dict[str, str], settings: IngestSettings) -> Path:
        """Write the record a later ingest compares the bundle with (every landed file's fingerprint);
        returns the staged folder, for ``commit_landed`` once the lake's tables are in place."""
        self.root.mkdir(parents=True, exist_ok=True)
        record = {
            "layout": LAYOUT_VERSION,
            "files": dict(sorted(files.items())),
            "settings": settings_key(settings),
            "code": code_version(),
        }
        (self.root / RECORD).write_text(json.dumps(record, indent=1) + "\n")
        self.sealed = True
        return self.root

    def discard(self) -> None:
        """Remove the rows unless sealed (they then wait for ``commit_landed`` or ``discard_sealed``)."""
        if not self.sealed:
            shutil.rmtree(self.root, ignore_errors=True)


def discard_sealed(staged: str | Path) -> None:
    shutil.rmtree(staged, ignore_errors=True)


def bundle_files(root: str | Path) -> dict[str, str]:
    """Every raw table file of a bundle folder, by its path relative to the folder, with its
    fingerprint."""
    root = Path(root)
    return {
        path.relative_to(root).as_posix(): fingerprint(path) or ""
        for table in RAW_TABLES
        for path in raw_table_files(root, table)
    }


def view_buckets(events: pl.DataFrame, users: pl.DataFrame) -> pl.DataFrame:
    """(user_id, page_view_id, bucket) of the events' rows: a page view goes with the bucket of the
    first of its rows' users."""
    rows = events.select("user_id", "page_view_id").join(
        users.select("user_id", "bucket"), on="user_id", how="left", maintain_order="left"
    )
    return rows.unique(["user_id", "page_view_id"], maintain_order=True)


class Landed:
    """The landed rows of a lake, read back."""

    def __init__(self, lake: str | Path) -> None:
        self.root = landed_dir(lake)

    def record(self) -> dict | None:
        path = self.root / RECORD
        return json.loads(path.read_text()) if path.is_file() else None

    def _files(self, table: str, buckets: list[int] | None = None) -> list[Path]:
        folder = self.root / table
        if buckets is None:
            return sorted(folder.rglob("*.parquet"))
        return sorted(p for b in buckets for p in (folder / f"bucket={b}").glob("*.parquet"))

    def scan(self, table: str, buckets: list[int] | None = None) -> pl.LazyFrame | None:
        files = self._files(table, buckets)
        return pl.scan_parquet(files, hive_partitioning=False) if files else None

    def read(
        self, table: str, where: pl.Expr | None = None, buckets: list[int] | None = None
    ) -> pl.DataFrame:
        """Landed rows of ``table`` (of ``buckets`` only, where given) that satisfy ``where``."""
        scan = self.scan(table, buckets)
        if scan is None:
            return no_event_marks() if table == "marks" else empty_typed(table)
        return (scan if where is None else scan.filter(where)).collect()

    def event_keys(self) -> pl.DataFrame:
        """(event_id, user_id, page_view_id) of every landed event row."""
        scan = self.scan("events")
        if scan is None:
            return empty_typed("events").select("event_id", "user_id", "page_view_id")
        return scan.select("event_id", "user_id", "page_view_id").collect()

    def item_index(self) -> ItemIndex:
        return load_index(self.root)
