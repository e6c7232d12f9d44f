"""The item index on disk, in shards by item-id hash, for a bundle read in several parts: no process
holds the whole catalog's index; each part takes from the shards only the items its rows name
(``ItemShards.index_for``), and the checks and keys it gets are the whole index's.

The items pass hands each chunk's index rows to ``ShardPieces``, which writes them sorted by hash;
``ShardPieces.build`` then gathers each hash range of the pieces into one shard file, sorted. A
shard covers ``1 / 2**bits`` of the 64-bit hash space (its top ``bits`` bits), so the shards in
order are the whole index in hash order. Shards are uncompressed Arrow IPC files, mapped rather
than read: a part's lookup touches the hash column and the rows it takes, not the whole shard."""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.ipc as ipc

from transforms.files import atomic_file
from transforms.ingest.hashes import ID_SEED, check_hash
from transforms.ingest.item_index import INDEX_FILE, SEED_FILE, ItemIndex, indexed

SHARD_ITEMS = 1 << 21  # items per shard, about: what building one shard holds in memory
SHARDS_FILE = "shards.json"
#: what a part needs of every item it finds (a feed card: found, its top category, its pseudonym)
CARD_COLUMNS = ("_h", "top_category", "_check", "_key")


@dataclass(frozen=True)
class PartNames:
    """The item ids one part names (id columns, or lists of ids; nulls and ids outside the catalog
    are skipped): ``shown`` by its feed cards and the logged cards in view, ``acted_on`` by its
    events, whose every index column the part reads (the detail-page checks, the steps' titles)."""

    shown: tuple[pl.Series, ...]
    acted_on: tuple[pl.Series, ...] = ()


class HashCollision(Exception):
    """Two item ids share a sort hash under the current seed."""


@dataclass(frozen=True)
class ItemShards:
    """The shards ``ShardPieces.build`` wrote to ``folder``: ``2**bits`` files, hash seed ``seed``,
    ``rows`` items in all."""

    folder: Path
    seed: int
    bits: int
    rows: int

    @classmethod
    def open(cls, folder: str | Path) -> ItemShards:
        meta = json.loads((Path(folder) / SHARDS_FILE).read_text())
        return cls(Path(folder), meta["seed"], meta["bits"], meta["rows"])

    def ranges(self) -> list[tuple[int, int]]:
        """The lowest and highest hash of each shard, in shard order."""
        width = 1 << (64 - self.bits)
        return [(s * width, (s + 1) * width - 1) for s in range(2**self.bits)]

    def shard_file(self, shard: int) -> Path:
        return self.folder / f"shard-{shard:05d}.arrow"

    def shard(self, shard: int) -> pl.DataFrame:
        """Shard ``shard``, mapped (its pages are read as a lookup touches them)."""
        return mapped_frame(self.shard_file(shard))

    def index_for(self, names: PartNames) -> ItemIndex:
        """The index of the catalog's items that one part names: rows in hash order like the whole
        index's, so the part's lookups, checks and keys come out as they would from it. Only the
        items it acts on carry their id, title and review count (the others' are null): for the
        many its feed cards alone name it reads only ``CARD_COLUMNS``, which is most of what a
        lookup spends in a large catalog."""
        return indexed(pl.concat([rows for [rows] in self.sweep([names])]).rechunk(), self.seed)

    def sweep(self, parts: Iterable[PartNames]) -> Iterator[list[pl.DataFrame]]:
        """Shard by shard, in order, the index rows of each of ``parts`` in that shard (a part's index
        is its rows of every shard, stacked: ``index_for``). The parts' hashes are searched as one
        sorted stream per shard, so a group of parts walks each shard once, in order: one part at a
        time, each would touch most pages of a large catalog on its own. ``parts`` is read once,
        each part's ids hashed as it comes."""
        probes = [(self._hashes([*n.shown, *n.acted_on]), self._hashes(n.acted_on)) for n in parts]
        spans = [(self._spans(named), self._spans(acted)) for named, acted in probes]
        for shard in range(2**self.bits):
            table = self.shard(shard)
            named = [hashes.slice(*span[shard]) for (hashes, _), (span, _) in zip(probes, spans, strict=True)]
            acted = [hashes.slice(*span[shard]) for (_, hashes), (_, span) in zip(probes, spans, strict=True)]
            cards = _rows_by_part(table, CARD_COLUMNS, named)
            described = _rows_by_part(table, table.columns, acted)
            columns = table.columns
            del table  # unmapped before the caller writes these rows: one shard's pages at a time
            yield [_with_acted_on(c, d, columns) for c, d in zip(cards, described, strict=True)]

    def _hashes(self, ids: tuple[pl.Series, ...] | list[pl.Series]) -> pl.Series:
        """The distinct sort hashes of ``ids`` (id columns, or lists of ids; nulls skipped), sorted."""
        flat = [(c.explode() if isinstance(c.dtype, pl.List) else c).drop_nulls() for c in ids]
        flat = [column.hash(self.seed) for column in flat]
        return pl.concat([pl.Series("_h", dtype=pl.UInt64), *flat]).unique().sort().alias("_h")

    def _spans(self, hashes: pl.Series) -> list[tuple[int, int]]:
        """Where each shard's hashes lie in ``hashes`` (sorted): (offset, length)."""
        starts = hashes.search_sorted(pl.Series([low for low, _ in self.ranges()], dtype=pl.UInt64))
        return [(start, end - start) for start, end in zip(starts, [*starts[1:], hashes.len()], strict=True)]

    def save_as_index(self, folder: Path, zstd_level: int) -> None:
        """The shards as one ``item_index.save_index`` file in ``folder``, streamed shard by shard."""
        folder.mkdir(parents=True, exist_ok=True)
        files = [str(self.shard_file(s)) for s in range(2**self.bits)]
        with atomic_file(folder / INDEX_FILE) as tmp:
            pl.scan_ipc(files).sink_parquet(tmp, compression="zstd", compression_level=zstd_level)
        (folder / SEED_FILE).write_text(f"{self.seed}\n")


def _mapped(path: Path) -> ipc.RecordBatchFileReader:
    return ipc.open_file(pa.memory_map(str(path)))


def mapped_frame(path: Path) -> pl.DataFrame:
    """An uncompressed Arrow IPC file as a frame over its mapping (pages read as they are touched)."""
    return pl.from_arrow(_mapped(path).read_all())


def _rows_by_part(table: pl.DataFrame, columns: Sequence[str], probes: list[pl.Series]) -> list[pl.DataFrame]:
    """``columns`` of the rows of ``table`` (a shard) that hold each part's ``probes`` (sorted), in
    hash order: every part's probes merged into one sorted stream and searched together."""
    empty = table.select(columns).clear()
    parts = [
        pl.DataFrame(
            [hashes.alias("_h"), pl.repeat(k, hashes.len(), dtype=pl.UInt32, eager=True).alias("_part")]
        )
        for k, hashes in enumerate(probes)
    ]
    merged = pl.concat(parts) if len(parts) == 1 else pl.concat(parts).sort("_h")
    if table.height == 0 or merged.height == 0:
        return [empty] * len(probes)
    at = table["_h"].search_sorted(merged["_h"]).clip(upper_bound=table.height - 1)
    hit = table["_h"].gather(at) == merged["_h"]
    rows = table.select(columns).gather(at.filter(hit)).with_columns(merged["_part"].filter(hit))
    by_part = rows.partition_by("_part", as_dict=True, include_key=False, maintain_order=True)
    return [by_part.get((k,), empty) for k in range(len(probes))]


def _with_acted_on(cards: pl.DataFrame, described: pl.DataFrame, columns: Sequence[str]) -> pl.DataFrame:
    """A part's rows of a shard: ``cards`` (``CARD_COLUMNS``), the other ``columns`` null save on the
    rows ``described`` holds whole (the acted-on items, a subset of the cards' rows)."""
    at = cards["_h"].search_sorted(described["_h"])
    others = [
        pl.repeat(None, cards.height, dtype=described[c].dtype, eager=True).alias(c).scatter(at, described[c])
        for c in columns
        if c not in CARD_COLUMNS
    ]
    return cards.with_columns(others).select(columns)


class ShardPieces:
    """Index rows (``item_context`` and ``_key``) as the items pass makes them, chunk by chunk,
    written to ``folder/pieces`` sorted by hash; ``build`` turns them into ``ItemShards``."""

    def __init__(self, folder: Path, seed: int = ID_SEED) -> None:
        self.folder, self.seed, self.rows, self.count = folder, seed, 0, 0
        self.pieces = folder / "pieces"
        self.pieces.mkdir(parents=True, exist_ok=True)

    def add(self, rows: pl.DataFrame) -> None:
        _write_piece(rows, self.seed, self.pieces / f"{self.count:06d}.arrow")
        self.rows, self.count = self.rows + rows.height, self.count + 1

    def build(self) -> ItemShards:
        """Each hash range of the pieces as a shard, sorted; a shared sort hash (ids are unique
        here, so another seed separates them) hashes every piece again with the next seed."""
        bits = max(0, math.ceil(math.log2(max(self.rows, 1) / SHARD_ITEMS)))
        while True:
            try:
                shards = self._build(bits)
                break
            except HashCollision:
                self.seed += 1
                for path in self._files():
                    _write_piece(pl.read_ipc(path), self.seed, path)
        shutil.rmtree(self.pieces)
        return shards

    def _files(self) -> list[Path]:
        return sorted(self.pieces.glob("*.arrow"))

    def _build(self, bits: int) -> ItemShards:
        shards = ItemShards(self.folder, self.seed, bits, self.rows)
        for shard, (low, high) in enumerate(shards.ranges()):
            rows = pl.concat([_hash_range(path, low, high) for path in self._files()]).sort("_h")
            if rows["_h"].n_unique() < rows.height:
                raise HashCollision(f"item ids share a hash under seed {self.seed}")
            with atomic_file(shards.shard_file(shard)) as tmp:
                rows.rechunk().write_ipc(tmp, compression="uncompressed")
        meta = {"seed": self.seed, "bits": bits, "rows": self.rows}
        (self.folder / SHARDS_FILE).write_text(json.dumps(meta) + "\n")
        return shards


def _hash_range(piece: Path, low: int, high: int) -> pl.DataFrame:
    """The rows of ``piece`` (sorted by ``_h``) whose hash lies in [low, high], copied out of its
    mapping (which closes with it)."""
    rows = pl.from_arrow(_mapped(piece).read_all())
    start = rows["_h"].search_sorted(pl.Series([low], dtype=pl.UInt64), side="left")[0]
    end = rows["_h"].search_sorted(pl.Series([high], dtype=pl.UInt64), side="right")[0]
    return pl.from_arrow(rows.slice(start, end - start).to_arrow(compat_level=pl.CompatLevel.oldest()))


def _write_piece(rows: pl.DataFrame, seed: int, path: Path) -> None:
    """``rows`` with their sort and check hashes, in hash order (a hash range is one slice of it)."""
    hashed = rows.drop("_h", "_check", strict=False).with_columns(
        pl.col("item_id").hash(seed).alias("_h"), check_hash(pl.col("item_id")).alias("_check")
    )
    key_last = [c for c in hashed.columns if c != "_key"] + ["_key"]
    with atomic_file(path) as tmp:
        hashed.select(key_last).sort("_h").rechunk().write_ipc(tmp, compression="uncompressed")
