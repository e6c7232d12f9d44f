"""Step alignment on the hand-built bundle of tests/bundles.py (expected values worked out there)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from tests.bundles import tiny_bundle, write_bundle
from transforms.config import IngestSettings
from transforms.ingest import ingest_bundle
from transforms.ingest.alignment import USER_HASH, Context, by_user_hash, for_part
from transforms.ingest.duplicate_ids import Settled
from transforms.ingest.hashes import ID_SEED
from transforms.ingest.item_index import ItemIndex
from transforms.lake import read_lake_table
from transforms.readers import empty_typed
from transforms.rekey import Pseudonymizer

KEY = IngestSettings().rekey_key


def keyed(kind: str, *raw: str) -> list[str]:
    """Pseudonyms computed independently of the ingest, with the same documented key."""
    pseudo = Pseudonymizer(KEY)
    return pseudo.column(pl.Series(list(raw), dtype=pl.String), kind).to_list()


def items(*numbers: int) -> list[str]:
    return keyed("item", *(f"itm-{n}" for n in numbers))


@pytest.fixture(scope="module", params=["parquet", "jsonl", "jsonl.gz", "csv"])
def lake(request, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp(f"align-{request.param.replace('.', '-')}")
    write_bundle(tiny_bundle(), root / "raw", request.param)
    ingest_bundle(root / "raw", root / "lake")
    return root / "lake"


def test_steps_are_contiguous_and_in_time_order(lake):
    steps = read_lake_table(lake, "steps").sort("step")
    assert steps["step"].to_list() == list(range(9))
    assert steps["action"].to_list() == [
        "scroll_down", "click", "ipv_scroll_down", "ipv_enter_comment", "ipv_click_comment",
        "ipv_cart", "back_home", "scroll_up", "end",
    ]  # fmt: skip
    assert steps["ts"].is_sorted()


def test_visible_items_follow_the_half_height_rule(lake):
    visible = read_lake_table(lake, "steps").sort("step")["visible_items"].to_list()
    assert visible[0] == items(1, 2, 3, 4)  # top 0
    assert visible[1] == items(3, 4, 5, 6, 7, 8)  # top 400
    assert visible[7] == items(3, 4, 5, 6, 7, 8)  # top 400 again after back_home
    assert visible[8] == items(1, 2, 3, 4, 5, 6)  # top 100
    assert all(v is None for v in visible[2:7])  # the feed is not on screen on the detail page


def test_click_target_detail_context_and_arguments(lake):
    steps = read_lake_table(lake, "steps").sort("step")
    click = steps.row(1, named=True)
    assert click["target_item_id"] == items(5)[0]
    assert click["target_title"] == "Linen shirt 5"
    ipv = steps.filter(pl.col("screen") == "ipv")
    assert ipv["ipv_item_id"].unique().to_list() == items(5)
    assert ipv["ipv_item_title"].unique().to_list() == ["Linen shirt 5"]
    assert steps["distance"].to_list() == [400, None, 500, None, None, None, None, 300, None]
    assert steps.row(4, named=True)["review_alias"] == "C2"  # review_index 1 -> second alias
    assert steps.row(7, named=True)["scroll_top"] == 400


def test_profile_snapshot_and_session_summary(lake):
    steps = read_lake_table(lake, "steps")
    assert steps["profile"].struct.field("member_level").unique().to_list() == ["gold"]
    assert not steps["profile_missing"].any()
    session = read_lake_table(lake, "sessions").row(0, named=True)
    assert (session["length"], session["clicks"], session["carts"], session["buys"]) == (9, 1, 1, 0)
    assert session["terminal"] == "cart_only"  # ended, a cart, no buy
    assert session["categories"] == ["Apparel"]  # itm-5 is odd-numbered -> Apparel
    assert session["feed_items"] == 8 and session["feed_height"] == 1240


def test_feed_layout_ranks_in_reading_order(lake):
    layout = read_lake_table(lake, "feed_layouts").sort("rank")
    assert layout["item_id"].to_list() == items(1, 2, 3, 4, 5, 6, 7, 8)
    assert layout["rank"].to_list() == list(range(8))


def test_items_split_category_levels(lake):
    item = read_lake_table(lake, "items").filter(pl.col("item_id") == items(2)[0]).row(0, named=True)
    assert (item["category_l1"], item["category_l2"], item["category_l3"]) == ("Bags", "Totes", "Canvas")


def test_a_smaller_visible_fraction_admits_partly_shown_cards(tmp_path):
    # at top 0 itm-5 shows 560..693 = 133 px of 300: visible at 0.4 (>= 120 px), not at 0.5
    settings = IngestSettings(geometry={"visible_fraction": 0.4})
    write_bundle(tiny_bundle(), tmp_path / "raw")
    ingest_bundle(tmp_path / "raw", tmp_path / "lake", settings)
    visible = read_lake_table(tmp_path / "lake", "steps").sort("step")["visible_items"].to_list()
    assert visible[0] == items(1, 2, 3, 4, 5)


def _part_context(users: pl.DataFrame, profiles: pl.DataFrame) -> Context:
    return Context(
        settings=IngestSettings(),
        item_index=ItemIndex.build(empty_typed("items").select("item_id")),
        profiles=by_user_hash(profiles),
        users=by_user_hash(users),
        max_ts=pl.lit(None),
        events=Settled(pl.DataFrame(), [], 0),
        source_cuts=pl.DataFrame(),
    )


def test_a_part_takes_only_its_own_users_rows():
    ids = [f"usr-{n}" for n in range(5_000)]
    users = pl.DataFrame({"user_id": ids, "bucket": list(range(5_000))})
    profiles = pl.DataFrame({"user_id": ids[::2], "age": list(range(2_500))})
    events = pl.DataFrame({"user_id": ["usr-7", "usr-4", None, "usr-4", "usr-4998", "nobody"]})
    part = for_part(_part_context(users, profiles), events, pl.DataFrame({"item_id": []}))
    wanted = ["usr-4", "usr-7", "usr-4998"]
    assert part.users.sort("user_id").equals(users.filter(pl.col("user_id").is_in(wanted)).sort("user_id"))
    assert part.profiles.sort("user_id").equals(
        profiles.filter(pl.col("user_id").is_in(wanted)).sort("user_id")
    )
    assert USER_HASH not in part.users.columns  # the sort key stays with the run's tables


def test_users_sharing_a_hash_are_all_taken():
    """Two ids under one hash (as a collision would put them): both rows come, the join on user_id
    tells them apart."""
    ctx = _part_context(pl.DataFrame({"user_id": ["a"]}), pl.DataFrame({"user_id": ["a"]}))
    hashed = pl.Series(["a"]).hash(ID_SEED)[0]
    shared = pl.DataFrame({"user_id": ["a", "z", "y"], USER_HASH: [hashed, hashed, hashed + 1]})
    ctx.users = shared.with_columns(pl.col(USER_HASH).cast(pl.UInt64)).sort(USER_HASH)
    part = for_part(ctx, pl.DataFrame({"user_id": ["a"]}), pl.DataFrame({"item_id": []}))
    assert sorted(part.users["user_id"]) == ["a", "z"]
