"""The accepted items, checked, keyed and written chunk by chunk, leaving a compact index that the
parts look their item ids up in."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from transforms import align
from transforms.config import IngestSettings
from transforms.files import atomic_file
from transforms.ingest.duplicate_ids import in_ranges, settle
from transforms.ingest.hashes import ID_SEED, check_hash, id_hash, merge_lookup
from transforms.ingest.keying import lake_columns, pseudonyms
from transforms.readers import empty_typed
from transforms.rekey import Pseudonymizer

if TYPE_CHECKING:
    from transforms.ingest.item_shards import ItemShards, ShardPieces
    from transforms.ingest.parts import Raw
    from transforms.ingest.run import StagedRun


ITEM_KEYED = ("item_id", "image")  # item columns keyed as they are read (see keyed_items)


@dataclass
class ItemIndex:
    """Accepted items sorted by a hash of ``item_id``: a part sorts its probes by the same hash and
    finds its items by one merge join (Polars' sorted-key join), never by building a hash table over
    the whole catalog (which grows with the bundle) or by a binary search per probe. A match
    is confirmed by a second, independently seeded 64-bit hash (``_check``) rather than by the id
    strings, whose random reads over a large catalog cost more: an id outside the index passes
    both hashes with odds of about 2^-128."""

    frame: pl.DataFrame  # _h (sorted, unique), item_id, title, top_category, review_count, _check
    seed: int
    arrival: pl.Series  # _h of the items as they came
    keys: pl.Series = field(default_factory=lambda: pl.Series(dtype=pl.String))  # pseudonyms, frame order
    by_hash: pl.DataFrame = field(init=False)  # _h (flagged sorted), _check, _row: what a lookup joins

    def __post_init__(self) -> None:
        rows = self.frame.select("_h", "_check").with_row_index("_row")
        self.by_hash = rows.with_columns(pl.col("_h").set_sorted())

    @classmethod
    def build(cls, items: pl.DataFrame, seed: int = ID_SEED) -> ItemIndex:
        hashes = items.select(pl.col("item_id").hash(seed)).to_series()
        if hashes.n_unique() < items.height:  # ids are unique here, so another seed separates them
            return cls.build(items, seed + 1)
        # a sort moves the rows (in parallel) several times faster than a gather by arg_sort does,
        # and leaves one chunk per column: gathers over many chunks cost a chunk lookup per row
        frame = items.with_columns(hashes.alias("_h"), check_hash(pl.col("item_id")).alias("_check"))
        return cls(frame.sort("_h").rechunk(), seed, hashes.alias("_h"))

    def attach(self, keys: list[pl.Series]) -> None:
        """The pseudonyms of the items as they came (chunk by chunk), put in ``frame`` order."""
        arrived = pl.concat([pl.Series(dtype=pl.String), *keys]).alias("_key")
        self.keys = pl.DataFrame([self.arrival, arrived]).sort("_h")["_key"].rechunk()

    def rows_of(self, ids: pl.Series) -> pl.Series:
        """Row of each id in ``frame``; null where the id is missing or not in the index."""
        present = ids.is_not_null()
        if self.frame.height == 0 or not present.any():
            return pl.repeat(None, ids.len(), dtype=pl.get_index_type(), eager=True).alias(ids.name)
        if not present.all():  # look up the ids only (most target/open item columns are null)
            found = self.rows_of(ids.filter(present))
            nulls = pl.repeat(None, ids.len(), dtype=found.dtype, eager=True).alias(ids.name)
            return nulls.scatter(present.arg_true(), found)
        confirmed = pl.when(pl.col("_check") == pl.col("_probe")).then("_row")
        found = merge_lookup(ids.hash(self.seed), self.by_hash, confirmed, {"_probe": check_hash(ids)})
        return found.alias(ids.name)

    @property
    def context(self) -> pl.DataFrame:
        """``align.item_context`` by index row: row k describes the item a ``_item`` of k names."""
        return self.frame.drop("_h", "_check")


INDEX_FILE, SEED_FILE = "item_index.parquet", "item_index.seed"


def save_index(index: ItemIndex, folder: Path, zstd_level: int | None = None) -> None:
    """``index`` with its pseudonyms as ``folder/item_index.parquet`` and its hash seed beside it
    (``zstd_level`` None: uncompressed, for a copy read back soon)."""
    folder.mkdir(parents=True, exist_ok=True)
    frame = index.frame.with_columns(index.keys.alias("_key"))
    with atomic_file(folder / INDEX_FILE) as tmp:
        if zstd_level is None:
            frame.write_parquet(tmp, compression="uncompressed")
        else:
            frame.write_parquet(tmp, compression="zstd", compression_level=zstd_level)
    (folder / SEED_FILE).write_text(f"{index.seed}\n")


def load_index(folder: Path) -> ItemIndex:
    """The index ``save_index`` wrote to ``folder``."""
    return indexed(pl.read_parquet(folder / INDEX_FILE), int((folder / SEED_FILE).read_text()))


def indexed(frame: pl.DataFrame, seed: int) -> ItemIndex:
    """An index from its rows as ``save_index`` writes them (sorted by ``_h``, pseudonyms as ``_key``)."""
    index = ItemIndex(frame.drop("_key"), seed, frame["_h"])
    index.keys = frame["_key"].rename("_key")
    return index


def items_pass(
    raw: Raw,
    settings: IngestSettings,
    pseudonymize: Pseudonymizer,
    run: StagedRun,
    shards: ShardPieces | None = None,
) -> tuple[ItemIndex | ItemShards, list[pl.DataFrame], int]:
    """Settle duplicate item ids, then check, key and write the items chunk by chunk.

    Returns the item index (``shards``: its rows handed over chunk by chunk, and the shards they
    make), the quarantine rows and the merged duplicates."""
    settled = settle(
        in_ranges(raw.item_id_hashes()),
        lambda: raw.item_frames(release=False),
        "item_id",
        lambda rows: align.dedupe(rows, ["item_id"], "items", "duplicate_item_id", pseudonymize),
    )
    rejects, pieces, keys = list(settled.rejects), [], []
    event_items, raw.event_items = raw.event_items, []  # handed over: kept no longer than this pass
    named = pl.concat([pl.Series(dtype=pl.UInt64), *event_items]).unique().implode()
    del event_items
    for n, frame in enumerate(raw.item_frames(count=True)):
        chunk_keys = Pseudonymizer(settings.rekey_key, settings.keep_image_refs)  # ids do not recur
        rows, bad = align.check_prices(settled.apply(frame), chunk_keys)
        rejects.append(bad)
        items = align.build_items(rows)
        # keyed here (unless pass 1 did), written in the writer thread while the next chunk is keyed
        items = items if "_keyed_item_id" in items.columns else keyed_items(items, settings)
        run.write("items", _with_pseudonyms(items, settings, chunk_keys), n)
        if shards is not None:
            shards.add(_index_rows(items, named).with_columns(items["_keyed_item_id"].alias("_key")))
            continue
        keys.append(items["_keyed_item_id"])
        pieces.append(_index_rows(items, named))
    if shards is not None:
        return shards.build(), rejects, settled.duplicates
    index = ItemIndex.build(pl.concat([_index_rows(empty_typed("items"), named), *pieces]))
    index.attach(keys)
    return index, rejects, settled.duplicates


def keyed_items(frame: pl.DataFrame, settings: IngestSettings) -> pl.DataFrame:
    """Item rows with the pseudonyms of their id and image columns beside the raw values
    (``_keyed_<column>``): one keyed hash per row, run in the writer thread while pass 1 reads on."""
    columns = [c for c in ITEM_KEYED if c in frame.columns]
    keys = Pseudonymizer(settings.rekey_key, settings.keep_image_refs)
    keyed = pseudonyms(frame.select(columns), settings, keys)
    return frame.with_columns(keyed.select(pl.all().name.prefix("_keyed_")))


def _with_pseudonyms(items: pl.DataFrame, settings: IngestSettings, keys: Pseudonymizer) -> pl.DataFrame:
    """The items' lake columns, ids keyed (by ``keyed_items`` where it ran)."""
    ready = tuple(c for c in ITEM_KEYED if f"_keyed_{c}" in items.columns)
    items = items.with_columns(pl.col(f"_keyed_{c}").alias(c) for c in ready)
    return pseudonyms(lake_columns(items, "items"), settings, keys, done=ready)


def _index_rows(items: pl.DataFrame, named: pl.Series) -> pl.DataFrame:
    """``align.item_context``, titles only where an event names the item (target and detail-page
    titles are their only use: most of a big catalog's text stays out of memory)."""
    return align.item_context(items).with_columns(
        pl.when(id_hash("item_id").is_in(named)).then(pl.col("title")).alias("title")
    )
