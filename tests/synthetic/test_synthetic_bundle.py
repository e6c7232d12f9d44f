"""The written bundle: layout, exact column types per format, ids, keys and references."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from synthetic.bundle import FORMATS, bundle_schema, write_bundle
from transforms.schemas import PROFILE_FIELDS, RAW_TABLES

TABLES = ("profiles", "items", "feeds", "events", "history")
ISO_Z = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")


def _files(root: Path, table: str, fmt: str) -> list[Path]:
    return sorted((root / table).glob(f"part-*.{fmt}"))


def _lines(path: Path) -> list[dict]:
    data = path.read_bytes()
    text = gzip.decompress(data).decode() if path.name.endswith(".gz") else data.decode()
    return [json.loads(line) for line in text.splitlines()]


def _read(root: Path, table: str, fmt: str) -> pl.DataFrame:
    """Read a table back into the RAW_* types with plain readers (no project code)."""
    schema = bundle_schema(table)
    frames = []
    for path in _files(root, table, fmt):
        if fmt == "parquet":
            frames.append(pl.from_arrow(pq.read_table(path)))
            continue
        if fmt == "csv":
            raw = pl.read_csv(path, infer_schema=False)
            rows = [
                {k: json.loads(v) if k in ("params", "reviews") else v for k, v in row.items()}
                for row in raw.iter_rows(named=True)
            ]
        else:
            rows = _lines(path)
        frames.append(_typed(pl.from_arrow(pa.Table.from_pylist(rows)), schema))
    return pl.concat(frames)


def _typed(frame: pl.DataFrame, schema: pa.Schema) -> pl.DataFrame:
    out = []
    for field in schema:
        col = pl.col(field.name)
        if pa.types.is_timestamp(field.type):
            col = col.str.to_datetime("%Y-%m-%dT%H:%M:%S%.3fZ", time_unit="ms", time_zone="UTC")
        elif pa.types.is_integer(field.type):
            col = col.cast(pl.Int32)
        elif pa.types.is_floating(field.type):
            col = col.cast(pl.Float64)
        out.append(col)
    return frame.select(out)


@pytest.mark.parametrize("fmt", FORMATS)
def test_layout_and_manifest(written, fmt):
    root = written[fmt]
    manifest = json.loads((root / "manifest.json").read_text())
    assert (manifest["seed"], manifest["users"], manifest["format"]) == (3, 80, fmt)
    assert manifest["geometry"]["feed_viewport"] == 693
    for table in TABLES:
        files = _files(root, table, fmt)
        assert files, table
        assert sorted(manifest["files"][table]) == [p.relative_to(root).as_posix() for p in files]
    # events are split one file per UTC day; every other table in parts_per_table=2 chunks (profiles: 80 rows)
    assert all(re.fullmatch(r"part-\d{8}\." + re.escape(fmt), p.name) for p in _files(root, "events", fmt))
    assert len(_files(root, "profiles", fmt)) == 2


def test_parquet_schemas_are_exactly_the_raw_ones(written):
    for table in TABLES:
        expected = bundle_schema(table)
        for path in _files(written["parquet"], table, "parquet"):
            assert pq.read_schema(path).remove_metadata() == expected, (table, path.name)
    # visible_items is optional and deliberately not logged; profiles carry the ab_arm extra
    assert "visible_items" not in bundle_schema("events").names
    assert bundle_schema("profiles").names == ["user_id", *PROFILE_FIELDS, "ab_arm"]
    for table in ("items", "feeds", "history"):
        assert bundle_schema(table) == RAW_TABLES[table]


@pytest.mark.parametrize("fmt", ["jsonl", "jsonl.gz"])
def test_jsonl_shapes(written, fmt):
    root = written[fmt]
    event = _lines(_files(root, "events", fmt)[0])[0]
    assert list(event) == bundle_schema("events").names
    assert ISO_Z.match(event["ts"])
    item = _lines(_files(root, "items", fmt)[0])[0]
    assert all(set(p) == {"label", "value"} for p in item["params"])
    assert isinstance(item["reviews"], list) and isinstance(item["price"], float)


def test_csv_nested_columns_are_json(written):
    raw = pl.read_csv(_files(written["csv"], "items", "csv")[0], infer_schema=False)
    assert raw.columns == bundle_schema("items").names
    params = [json.loads(v) for v in raw["params"]]
    assert all(isinstance(p, list) and all(set(x) == {"label", "value"} for x in p) for p in params)
    assert all(isinstance(json.loads(v), list) for v in raw["reviews"])


@pytest.mark.parametrize("fmt", ["jsonl", "jsonl.gz", "csv"])
def test_text_formats_hold_the_same_rows_as_parquet(written, fmt):
    for table in TABLES:
        expected = _read(written["parquet"], table, "parquet")
        got = _read(written[fmt], table, fmt)
        assert got.height == expected.height, table
        assert got.select(expected.columns).equals(expected), table


def test_ids_are_prefixed_opaque_hex(small_bundle):
    def ids(frame: pl.DataFrame, col: str) -> pl.Series:
        return frame[col].drop_nulls()

    checks = [
        (ids(small_bundle.profiles, "user_id"), "usr"),
        (ids(small_bundle.events, "user_id"), "usr"),
        (ids(small_bundle.events, "page_view_id"), "pv"),
        (ids(small_bundle.feeds, "page_view_id"), "pv"),
        (ids(small_bundle.events, "event_id"), "ev"),
        (ids(small_bundle.events, "item_id"), "itm"),
        (ids(small_bundle.items, "item_id"), "itm"),
    ]
    for series, prefix in checks:
        assert series.str.contains(rf"^{prefix}-[0-9a-f]{{16}}$").all(), prefix


def test_keys_unique_and_references_resolve(small_bundle):
    b = small_bundle
    assert b.events["event_id"].is_unique().all()
    assert b.items["item_id"].is_unique().all()
    assert b.profiles["user_id"].is_unique().all()
    assert b.feeds.select(pl.struct("page_view_id", "item_id").is_unique().all()).item()
    items = b.items["item_id"].implode()
    assert b.events["item_id"].drop_nulls().is_in(items).all()
    assert b.feeds["item_id"].is_in(items).all()
    assert b.events["user_id"].is_in(b.profiles["user_id"].implode()).all()
    # one user per page view, and every page view has a feed
    assert b.events.group_by("page_view_id").agg(pl.col("user_id").n_unique())["user_id"].max() == 1
    assert set(b.events["page_view_id"]) == set(b.feeds["page_view_id"])


def test_items_look_like_a_catalog(small_bundle):
    items = small_bundle.items
    assert (items["category"].str.split("-").list.len() == 3).all()
    assert (items["price"] > 0).all()
    assert items["reviews"].list.len().max() <= 20 and items["reviews"].list.len().min() == 0
    assert (items["title"].str.split(" ").list.len() >= 3).all()
    assert items["params"].list.len().min() >= 1
    assert items["image"].str.starts_with("img/").all()


def test_history_precedes_each_users_first_session(small_bundle):
    first = small_bundle.events.group_by("user_id").agg(pl.col("ts").min().alias("first"))
    hist = small_bundle.history.join(first, on="user_id")
    assert hist.height == small_bundle.history.height > 0
    assert (hist["ts"] < hist["first"]).all()
    assert set(hist["kind"]) == {"click", "buy"}


def test_refuses_to_overwrite_a_non_empty_folder(tmp_path):
    (tmp_path / "keep.txt").write_text("x")
    with pytest.raises(FileExistsError):
        write_bundle(tmp_path, users=5, seed=1)
