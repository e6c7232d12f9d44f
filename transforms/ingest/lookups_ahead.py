"""Pass 2's item lookups, made a group of parts at a time, one group ahead of the parts aligning.

A part names about as many items whatever the catalog's size, so in a large catalog its own lookup
finds one item in every few hundred and touches nearly every page of the shards' columns it reads:
looked up one at a time, the parts' lookups grow with the parts times the catalog. A group of parts
walks the shards once instead (``ItemShards.sweep``), their hashes searched as one sorted stream;
``group_size`` parts, enough that together they name a set share of the catalog. A thread of its
own sweeps the next group while the current one aligns; a group's indexes wait on disk, in its
folder (one Arrow file per shard, each part's rows record batches of their own), until each of its
parts has taken its own, and the folder goes. A part reads its batches into memory of its own, not
through a mapping: a frame over a mapped file holds the mapping (string views point into it) and,
stacked into the index, all the pages the part touched, for as long as the part lives.
"""

from __future__ import annotations

import itertools
import shutil
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.ipc as ipc

from transforms.files import atomic_file
from transforms.ingest.item_index import ItemIndex, indexed
from transforms.ingest.item_shards import ItemShards, PartNames

MAX_GROUP = 16  # parts whose lookups share one sweep over the shards, at most
# a group's parts name together about this share of the catalog. A part of a smaller catalog names
# that much alone: its lookup already walks the shards about in order, and a sweep would only add
# the group's merge and its files
GROUP_SHARE = 1 / 8

#: per shard, the record batch each part of a group starts at in that shard's file (and where the
#: last part ends)
Offsets = list[list[int]]


def group_size(shards: ItemShards, part_rows: int) -> int:
    """Parts a sweep serves: enough that together they name about ``GROUP_SHARE`` of the catalog (a
    part names at most its ``part_rows`` rows' items), at most ``MAX_GROUP``; 1 where one part alone
    names that share."""
    return max(1, min(MAX_GROUP, int(shards.rows * GROUP_SHARE // max(part_rows, 1))))


class LookupsAhead:
    """The item indexes of ``parts`` parts, from ``shards``, ``group`` parts a sweep; ``names(p)``
    reads what part p names of the catalog (from its rows on disk: it runs before the part's own
    read)."""

    def __init__(
        self, shards: ItemShards, names: Callable[[int], PartNames], parts: int, group: int, folder: Path
    ) -> None:
        self.shards, self.names, self.parts, self.group, self.folder = shards, names, parts, group, folder
        self.sweeper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ingest-lookups")
        self.groups: dict[int, Future[Offsets]] = {}
        self.taken: dict[int, int] = {}
        self.lock = threading.Lock()
        with self.lock:
            self._ahead(0)

    def index(self, part: int) -> ItemIndex:
        """Part ``part``'s index (waits for its group's sweep; starts the next group's)."""
        group, place = divmod(part, self.group)
        with self.lock:
            self._ahead(group)
            self._ahead(group + 1)
            sweep = self.groups[group]
        offsets = sweep.result()
        folder = self._group_folder(group)
        pieces = [
            _read_batches(folder / f"shard-{shard:05d}.arrow", starts[place], starts[place + 1])
            for shard, starts in enumerate(offsets)
        ]
        index = indexed(pl.concat(pieces).rechunk(), self.shards.seed)
        del pieces
        self._taken(group)
        return index

    def close(self) -> None:
        """Stop sweeping (a sweep under way finishes) and remove every group's files."""
        self.sweeper.shutdown(wait=True, cancel_futures=True)
        shutil.rmtree(self.folder, ignore_errors=True)

    def _members(self, group: int) -> range:
        return range(group * self.group, min((group + 1) * self.group, self.parts))

    def _group_folder(self, group: int) -> Path:
        return self.folder / f"group-{group:05d}"

    def _ahead(self, group: int) -> None:
        """Start ``group``'s sweep unless it has started (or there is no such group). Under the lock."""
        if group not in self.groups and group not in self.taken and len(self._members(group)):
            self.groups[group] = self.sweeper.submit(self._sweep, group)

    def _sweep(self, group: int) -> Offsets:
        folder = self._group_folder(group)
        folder.mkdir(parents=True, exist_ok=True)
        offsets = []
        named = (self.names(p) for p in self._members(group))
        for shard, rows in enumerate(self.shards.sweep(named)):
            batches = [frame.rechunk().to_arrow().to_batches() for frame in rows]
            offsets.append([0, *itertools.accumulate(len(b) for b in batches)])
            with (
                atomic_file(folder / f"shard-{shard:05d}.arrow") as tmp,
                ipc.new_file(str(tmp), _batches_schema(rows)) as writer,
            ):
                for batch in itertools.chain.from_iterable(batches):
                    writer.write_batch(batch)
        return offsets

    def _taken(self, group: int) -> None:
        """One more of ``group``'s parts has its index; the last one removes the group's files."""
        with self.lock:
            self.taken[group] = self.taken.get(group, 0) + 1
            if self.taken[group] < len(self._members(group)):
                return
            del self.groups[group]
        shutil.rmtree(self._group_folder(group), ignore_errors=True)


def _batches_schema(rows: list[pl.DataFrame]) -> pa.Schema:
    """The Arrow schema of a shard's rows for a group's parts (the same for every part)."""
    return rows[0].head(0).to_arrow().schema


def _read_batches(path: Path, start: int, end: int) -> pl.DataFrame:
    """Record batches [start, end) of an Arrow IPC file, read into memory of their own."""
    with pa.OSFile(str(path)) as source:
        reader = ipc.open_file(source)
        batches = [reader.get_batch(i) for i in range(start, end)]
        return pl.from_arrow(pa.Table.from_batches(batches, schema=reader.schema))
