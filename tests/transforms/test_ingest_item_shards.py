"""The item index in shards: built from chunks of index rows, each part's index taken from it gives
what the whole index gives for that part's ids (alone, or swept with other parts and made ahead),
and a shared sort hash moves it to the next seed."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import polars as pl

from transforms.ingest import item_shards, lookups_ahead
from transforms.ingest.hashes import ID_SEED
from transforms.ingest.item_index import ItemIndex, load_index, save_index
from transforms.ingest.item_shards import ItemShards, PartNames, ShardPieces


def catalog(n: int, seed: int = 5) -> pl.DataFrame:
    """Index rows as the items pass makes them: ``item_context`` columns, then the pseudonym."""
    rng = random.Random(seed)
    return pl.DataFrame(
        {
            "item_id": [f"itm-{rng.getrandbits(40):x}-{k}" for k in range(n)],
            "title": [f"title {k}" if k % 3 else None for k in range(n)],
            "top_category": [f"cat-{k % 7}" for k in range(n)],
            "review_count": pl.Series([k % 11 for k in range(n)], dtype=pl.UInt32),
            "_key": [f"item_{k:08x}" for k in range(n)],
        }
    )


def whole_index(rows: pl.DataFrame) -> ItemIndex:
    index = ItemIndex.build(rows.drop("_key"))
    index.attach([rows["_key"]])
    return index


def sharded(rows: pl.DataFrame, folder, chunk: int) -> ItemShards:
    pieces = ShardPieces(folder)
    for start in range(0, rows.height, chunk):
        pieces.add(rows.slice(start, chunk))
    return pieces.build()


def test_shards_in_order_are_the_whole_index(tmp_path, monkeypatch):
    monkeypatch.setattr(item_shards, "SHARD_ITEMS", 64)
    rows = catalog(500)
    shards = sharded(rows, tmp_path / "shards", chunk=120)
    assert shards.bits == 3 and shards.seed == ID_SEED  # 500 / 64 items -> 8 shards
    assert sorted(p.name for p in (tmp_path / "shards").glob("shard-*")) == [
        f"shard-{s:05d}.arrow" for s in range(8)
    ]
    assert not (tmp_path / "shards" / "pieces").exists()
    whole = whole_index(rows)
    stacked = pl.concat([shards.shard(s) for s in range(8)])
    assert stacked.drop("_key").equals(whole.frame)
    assert stacked["_key"].equals(whole.keys)
    # the landed copy, streamed shard by shard, loads as the whole index's own file does
    shards.save_as_index(tmp_path / "landed", zstd_level=1)
    save_index(whole, tmp_path / "direct")
    from_shards, direct = load_index(tmp_path / "landed"), load_index(tmp_path / "direct")
    assert from_shards.frame.equals(direct.frame) and from_shards.keys.equals(direct.keys)
    assert from_shards.seed == direct.seed == ID_SEED


def test_a_parts_index_gives_the_whole_index_answers_for_its_ids(tmp_path, monkeypatch):
    monkeypatch.setattr(item_shards, "SHARD_ITEMS", 64)
    rows = catalog(500)
    shards, whole = sharded(rows, tmp_path / "shards", chunk=200), whole_index(rows)
    ids = rows["item_id"].to_list()
    feeds = pl.Series("item_id", [ids[k] for k in range(0, 500, 7)] + ["not-in-catalog", None])
    clicks = pl.Series("item_id", [ids[3], None, ids[3], ids[498], ids[7], "gone"])  # ids[7]: a card too
    visible = pl.Series("visible_items", [[ids[10], "logged-only"], None, []])
    part = shards.index_for(PartNames((feeds, visible), (clicks,)))
    named = {*feeds.drop_nulls(), *clicks.drop_nulls(), ids[10]} & set(ids)
    assert part.frame["_h"].equals(pl.Series("_h", sorted(named)).hash(ID_SEED).sort().alias("_h"))
    assert set(part.frame["item_id"].drop_nulls()) == {ids[3], ids[498], ids[7]}  # the acted-on only
    for probe in (feeds, clicks, pl.Series("item_id", [ids[10], "logged-only"])):
        mine, theirs = part.rows_of(probe), whole.rows_of(probe)
        assert mine.is_null().equals(theirs.is_null())
        assert part.keys.gather(mine).equals(whole.keys.gather(theirs))
        cards = [c for c in whole.context.columns if c in item_shards.CARD_COLUMNS]
        assert part.context.select(cards).gather(mine).equals(whole.context.select(cards).gather(theirs))
    # the acted-on items carry their whole context; the items only shown carry none of the rest
    mine, theirs = part.rows_of(clicks), whole.rows_of(clicks)
    assert part.context.gather(mine).equals(whole.context.gather(theirs))
    shown_only = part.rows_of(pl.Series([ids[14], ids[10]]))
    assert part.context.gather(shown_only).select("item_id", "title", "review_count").null_count().row(0) == (
        2,
        2,
        2,
    )
    assert part.rows_of(pl.Series("item_id", [ids[11]])).to_list() == [None]  # not the part's


def test_a_part_naming_no_catalog_item_gets_an_empty_index(tmp_path):
    shards = sharded(catalog(30), tmp_path / "shards", chunk=10)
    part = shards.index_for(PartNames((pl.Series("item_id", ["nope", None], dtype=pl.String),)))
    assert part.frame.height == 0 and part.rows_of(pl.Series(["nope"])).to_list() == [None]
    assert part.frame.columns == load_shard_columns(shards)


def load_shard_columns(shards: ItemShards) -> list[str]:
    return [c for c in shards.shard(0).columns if c != "_key"]


def test_a_shared_sort_hash_moves_every_shard_to_the_next_seed(tmp_path, monkeypatch):
    monkeypatch.setattr(item_shards, "SHARD_ITEMS", 16)
    rows = catalog(100)
    pieces = ShardPieces(tmp_path / "shards")
    pieces.add(rows.slice(0, 50))
    pieces.add(rows.slice(50))
    # plant a collision: two ids of the second piece given one sort hash, as a 64-bit clash would
    path = tmp_path / "shards" / "pieces" / "000001.arrow"
    piece = pl.read_ipc(path)
    clash = piece["_h"].scatter(1, piece["_h"][0])
    piece.with_columns(clash).write_ipc(path)
    shards = pieces.build()
    assert shards.seed == ID_SEED + 1
    stacked = pl.concat([shards.shard(s) for s in range(2**shards.bits)])
    assert stacked.height == 100 and stacked["_h"].n_unique() == 100
    assert stacked["_h"].equals(stacked["item_id"].hash(ID_SEED + 1).sort().alias("_h"))
    part = shards.index_for(PartNames((rows["item_id"].slice(40, 20),)))
    assert part.seed == ID_SEED + 1 and part.rows_of(rows["item_id"].slice(40, 20)).null_count() == 0


def some_parts(ids: list[str], parts: int, seed: int = 3) -> list[PartNames]:
    """Parts naming overlapping draws of the catalog, ids outside it and nulls among them."""
    rng = random.Random(seed)
    named = []
    for _ in range(parts):
        shown = pl.Series("item_id", [*rng.sample(ids, 40), f"gone-{rng.random()}", None])
        acted = pl.Series("item_id", [*rng.sample(list(shown[:40]), 5), None])
        named.append(PartNames((shown, pl.Series("visible_items", [rng.sample(ids, 3), None])), (acted,)))
    return named


def test_parts_swept_together_get_the_indexes_they_get_alone(tmp_path, monkeypatch):
    monkeypatch.setattr(item_shards, "SHARD_ITEMS", 64)
    rows = catalog(500)
    shards = sharded(rows, tmp_path / "shards", chunk=150)
    parts = some_parts(rows["item_id"].to_list(), 5)
    by_shard = list(shards.sweep(iter(parts)))  # read once, as a generator of names is
    assert len(by_shard) == 2**shards.bits and all(len(rows) == 5 for rows in by_shard)
    for k, names in enumerate(parts):
        together = pl.concat([rows[k] for rows in by_shard])
        assert together.equals(shards.index_for(names).frame.with_columns(shards.index_for(names).keys))
    # a part naming nothing of the catalog gets no rows, the others theirs all the same
    nothing = PartNames((pl.Series("item_id", ["gone"]),))
    with_empty = list(shards.sweep([parts[0], nothing, parts[1]]))
    assert sum(rows[1].height for rows in with_empty) == 0
    assert pl.concat([rows[2] for rows in with_empty]).equals(pl.concat([rows[1] for rows in by_shard]))


def test_a_group_names_a_set_share_of_the_catalog():
    shards = ItemShards(Path("unused"), ID_SEED, 5, rows=56_000_000)
    assert lookups_ahead.group_size(shards, part_rows=750_000) == 9  # 7 M items to name, 750 k a part
    assert lookups_ahead.group_size(replace(shards, rows=5_600_000), part_rows=750_000) == 1
    assert (
        lookups_ahead.group_size(replace(shards, rows=10**10), part_rows=750_000) == lookups_ahead.MAX_GROUP
    )


def test_lookups_ahead_give_each_part_its_index_and_leave_no_files(tmp_path, monkeypatch):
    monkeypatch.setattr(item_shards, "SHARD_ITEMS", 64)
    rows = catalog(500)
    shards = sharded(rows, tmp_path / "shards", chunk=150)
    parts = some_parts(rows["item_id"].to_list(), 5, seed=11)
    asked: list[int] = []

    def names(p: int) -> PartNames:
        asked.append(p)
        return parts[p]

    ahead = lookups_ahead.LookupsAhead(shards, names, 5, 2, tmp_path / "lookups")
    try:
        for p in range(5):  # groups {0, 1}, {2, 3}, {4}: each swept once, the next one ahead
            index, alone = ahead.index(p), shards.index_for(parts[p])
            assert index.frame.equals(alone.frame) and index.keys.equals(alone.keys)
            assert index.seed == shards.seed
            assert index.rows_of(parts[p].acted_on[0]).equals(alone.rows_of(parts[p].acted_on[0]))
        assert sorted(asked) == [0, 1, 2, 3, 4]  # every part's names read once
        assert list((tmp_path / "lookups").iterdir()) == []  # each group's files went with its last part
    finally:
        ahead.close()
    assert not (tmp_path / "lookups").exists()


def test_a_part_index_holds_no_mapping_of_its_group_files(tmp_path, monkeypatch):
    # a frame over a mapped file keeps the mapping and every page the part touched resident for as
    # long as the part lives; the part's index must be memory of its own
    monkeypatch.setattr(item_shards, "SHARD_ITEMS", 64)
    rows = catalog(500)
    shards = sharded(rows, tmp_path / "shards", chunk=150)
    parts = some_parts(rows["item_id"].to_list(), 2, seed=5)
    ahead = lookups_ahead.LookupsAhead(shards, parts.__getitem__, 2, 2, tmp_path / "lookups")
    try:
        index = ahead.index(0)
        assert any((tmp_path / "lookups").rglob("shard-*.arrow"))  # part 1 has yet to take its own
        mapped = Path("/proc/self/maps").read_text()
        assert str(tmp_path / "lookups") not in mapped
        assert index.frame.equals(shards.index_for(parts[0]).frame)
    finally:
        ahead.close()
