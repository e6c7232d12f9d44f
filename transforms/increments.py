"""Which users a grown lake changed for a stage that works user by user, and what that stage keeps.

A rendered state depends only on its own user's rows: their steps, sessions and history, the items
their steps show or open, and (once extracted) their rationales, intents and rejected rationales.
``rendering_digests`` folds exactly those rows into one digest per user; a rendering records the
digests of the inputs it was made from (``RecordedInputs``) beside its table, and the next one, made
with the same settings and code (its ``key``), renders again only the users whose digest changed,
appeared or vanished, keeping every other user's rows as they are. Extraction does the same with
``extraction_digests``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from transforms.files import atomic_file
from transforms.lake import scan_table, table_dir, table_files

DIGEST_SEED = 20_240_917  # any fixed seed: digests compare only with digests of the same seed
#: what the steps show or open: a state's prompt quotes these items
ITEM_REFERENCES = ("visible_items", "target_item_id", "ipv_item_id")


def _row_digests(frame: pl.LazyFrame, table: str) -> pl.LazyFrame:
    """(user_id, table, digest): one digest per user of all their rows of ``table``, whatever order
    the rows lie in (row hashes sorted before they are hashed together)."""
    columns = sorted(frame.collect_schema().names())
    rows = frame.select(pl.col("user_id"), pl.struct(columns).hash(DIGEST_SEED).alias("_row"))
    return _digest_lists(rows.group_by("user_id").agg(pl.col("_row").sort()), table)


def _digest_lists(per_user: pl.LazyFrame, table: str) -> pl.LazyFrame:
    """A user's sorted list (in ``_row``) hashed as one value."""
    return per_user.select(
        "user_id", pl.lit(table).alias("table"), pl.col("_row").hash(DIGEST_SEED).alias("digest")
    )


def _item_digests(lake: str | Path) -> pl.LazyFrame:
    """Per user, a digest of the full rows of every item their steps show or open."""
    steps = scan_table(lake, "steps", ["user_id", *ITEM_REFERENCES])
    referenced = (
        pl.concat(
            [
                steps.select("user_id", pl.col("visible_items").alias("item_id")).explode("item_id"),
                steps.select("user_id", pl.col("target_item_id").alias("item_id")),
                steps.select("user_id", pl.col("ipv_item_id").alias("item_id")),
            ]
        )
        .drop_nulls("item_id")
        .unique()
    )
    items = scan_table(lake, "items")
    columns = sorted(items.collect_schema().names())
    item_rows = items.select("item_id", pl.struct(columns).hash(DIGEST_SEED).alias("_row"))
    shown = referenced.join(item_rows, on="item_id", how="left").with_columns(
        pl.col("_row").fill_null(0)  # an item the catalogue lacks renders as missing: that is its state
    )
    pairs = shown.select("user_id", pl.struct("item_id", "_row").alias("_row"))
    return _digest_lists(pairs.group_by("user_id").agg(pl.col("_row").sort()), "items")


def _rejected_rationales(lake: str | Path, sessions: pl.LazyFrame) -> pl.LazyFrame | None:
    """Extraction's quarantine rows with the user of the state they name (``record_id``)."""
    folder = table_dir(lake, "quarantine") / "stage=extract"
    files = sorted(folder.glob("*.parquet")) if folder.is_dir() else []
    if not files:
        return None
    rows = pl.scan_parquet(files, hive_partitioning=False).with_columns(
        pl.col("payload").str.json_path_match("$.record_id").str.extract(r"^(.*):\d+$").alias("session_id")
    )
    owners = sessions.select("session_id", "user_id")
    return rows.join(owners, on="session_id", how="inner").drop("session_id")


def _per_table(lake: str | Path, with_extraction: bool) -> list[pl.LazyFrame]:
    sessions = scan_table(lake, "sessions")
    parts = [_row_digests(scan_table(lake, "steps"), "steps"), _row_digests(sessions, "sessions")]
    parts.append(_item_digests(lake))
    optional = ["history", *(("rationales", "intents") if with_extraction else ())]
    parts += [_row_digests(scan_table(lake, name), name) for name in optional if table_files(lake, name)]
    if with_extraction and (rejected := _rejected_rationales(lake, sessions)) is not None:
        parts.append(_row_digests(rejected, "rejected_rationales"))
    return parts


def _per_user(parts: list[pl.LazyFrame]) -> pl.DataFrame:
    per_table = pl.concat(parts).collect()
    per_user = per_table.group_by("user_id").agg(pl.struct("table", "digest").sort().alias("_row"))
    return per_user.select("user_id", pl.col("_row").hash(DIGEST_SEED).alias("digest")).sort("user_id")


def rendering_digests(lake: str | Path, *, with_extraction: bool) -> pl.DataFrame:
    """(user_id, digest): one digest per user of every lake row their rendered states depend on."""
    return _per_user(_per_table(lake, with_extraction))


def session_digests(lake: str | Path) -> pl.DataFrame:
    """(user_id, digest): per user, a digest of their sessions rows, all a history depends on."""
    return _row_digests(scan_table(lake, "sessions"), "sessions").select("user_id", "digest").collect()


def extraction_digests(lake: str | Path, states: str | Path) -> pl.DataFrame:
    """(user_id, digest): per user, what extraction reads of them: their states as rendered before
    extraction (in the lake-shaped folder ``states``) and the lake rows behind their timelines."""
    rendered = _row_digests(scan_table(states, "records"), "states")
    return _per_user([*_per_table(lake, with_extraction=False), rendered])


def changed_users(before: pl.DataFrame, now: pl.DataFrame) -> pl.Series:
    """Users whose digest differs between ``before`` and ``now``, or who are in only one of them."""
    joined = before.join(now, on="user_id", how="full", suffix="_now", coalesce=True)
    differs = pl.col("digest").ne_missing(pl.col("digest_now"))
    return joined.filter(differs)["user_id"].sort()


@dataclass(frozen=True)
class RecordedInputs:
    """What a stage's rows were made from, kept beside its tables: the digests per user, the stage's
    key (settings, code), the fingerprint of the tables it wrote, and (a rendering's) per user the
    recorded actions their states show as not executable, which the summary of kept users needs."""

    folder: Path  # LAKE/_runs/<stage>

    @property
    def digests_file(self) -> Path:
        return self.folder / "user_digests.parquet"

    @property
    def not_executable_file(self) -> Path:
        return self.folder / "not_executable.parquet"

    @property
    def key_file(self) -> Path:
        return self.folder / "inputs.json"

    def previous(self, key: str, table_fingerprint: str | None) -> tuple[pl.DataFrame, pl.DataFrame] | None:
        """The previous rendering's (digests, not executable), when it was made with ``key`` and its
        table is still the one on disk (``table_fingerprint``); else None: render every user."""
        files = (self.key_file, self.digests_file, self.not_executable_file)
        if table_fingerprint is None or not all(f.is_file() for f in files):
            return None
        recorded = json.loads(self.key_file.read_text())
        if recorded != {"key": key, "table": table_fingerprint}:
            return None
        return pl.read_parquet(self.digests_file), pl.read_parquet(self.not_executable_file)

    def record(
        self, key: str, table_fingerprint: str | None, digests: pl.DataFrame, not_executable: pl.DataFrame
    ) -> None:
        """Written after the table is in place: a rendering that stopped before leaves a key that no
        longer matches the table, and the next one renders everything."""
        for frame, path in ((digests, self.digests_file), (not_executable, self.not_executable_file)):
            with atomic_file(path) as temporary:
                frame.write_parquet(temporary)
        with atomic_file(self.key_file) as temporary:
            temporary.write_text(json.dumps({"key": key, "table": table_fingerprint}))

    def forget(self) -> None:
        for path in (self.key_file, self.digests_file, self.not_executable_file):
            path.unlink(missing_ok=True)


def empty_not_executable() -> pl.DataFrame:
    """Per user, mode and recorded action: states whose recorded action is not executable as shown."""
    return pl.DataFrame(schema={"user_id": pl.String, "mode": pl.String, "action": pl.String, "n": pl.UInt32})


def files_without_users(previous_table: Path, replaced: pl.Series) -> list[tuple[Path, pl.DataFrame | None]]:
    """The previous table's files with the rows of users not in ``replaced``: (file, None) for a file
    none of whose users was replaced (kept whole), (file, its remaining rows) otherwise."""
    kept = []
    for path in sorted(previous_table.rglob("*.parquet")):
        users = pl.scan_parquet(path, hive_partitioning=False).select(pl.col("user_id").unique()).collect()
        if not users["user_id"].is_in(replaced.implode()).any():
            kept.append((path, None))
            continue
        rows = pl.read_parquet(path, hive_partitioning=False).filter(
            ~pl.col("user_id").is_in(replaced.implode())
        )
        kept.append((path, rows))
    return kept
