"""Pseudonyms of the lake rows: item keys from the item index, visible-item lists, the per-view
columns (session, user, split, bucket) and the lake columns of each keyed part."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from transforms import align
from transforms.config import IngestSettings
from transforms.rekey import ID_COLUMNS, PREFIXES, Pseudonymizer, bucket_of, keyed_hex, split_of
from transforms.schemas import LAKE_TABLES

if TYPE_CHECKING:
    from transforms.ingest.alignment import Context, Part
    from transforms.ingest.item_index import ItemIndex


REPEAT_PROBE_ROWS = 10_000  # rows of a column that tell whether its values repeat


def _id_columns(settings: IngestSettings) -> dict[str, str]:
    return ID_COLUMNS if settings.keep_image_refs else {**ID_COLUMNS, "image": "image"}


def _per_element(lists: pl.Series, fn: Callable[[pl.Series], pl.Series]) -> pl.Series:
    """``fn`` over the elements of a list column, rebuilt with the same offsets (null lists stay)."""
    arrow = lists.to_arrow()
    arrow = arrow.combine_chunks() if isinstance(arrow, pa.ChunkedArray) else arrow
    offsets = pc.subtract(arrow.offsets, arrow.offsets[0])
    flat = fn(pl.from_arrow(arrow.flatten())).to_arrow()
    rebuilt = type(arrow).from_arrays(offsets, flat, mask=arrow.is_null() if arrow.null_count else None)
    return pl.from_arrow(rebuilt).alias(lists.name)


def _item_keys(values: pl.Series, index: ItemIndex, pseudonymize: Pseudonymizer) -> pl.Series:
    """Item ids (or lists of them) -> pseudonyms from the index; a column holding an id the
    index lacks (a logged visible item) is hashed instead."""
    if isinstance(values.dtype, pl.List):
        return _per_element(values, lambda flat: _item_keys(flat, index, pseudonymize))
    keys = index.keys.gather(index.rows_of(values))
    if keys.null_count() != values.null_count():
        return pseudonymize.column(values, "item")
    return keys.alias(values.name)


def _hashed(values: pl.Series, kind: str, settings: IngestSettings, pseudonymize: Pseudonymizer) -> pl.Series:
    """Ids that hardly repeat (item ids, image refs) hashed straight through: the keys of
    ``pseudonymize.column`` without its per-distinct lookups, which cost more than the hash here.
    A column whose head repeats (e.g. one placeholder image everywhere) goes per distinct value."""
    head = values.head(REPEAT_PROBE_ROWS)
    if head.n_unique() * 2 < head.len():
        return pseudonymize.column(values, kind)
    hexes = keyed_hex(values, settings.rekey_key.encode("utf-8"), kind)
    return (f"{PREFIXES[kind]}_" + hexes).alias(values.name)


def pseudonyms(
    frame: pl.DataFrame,
    settings: IngestSettings,
    pseudonymize: Pseudonymizer,
    index: ItemIndex | None = None,
    done: tuple[str, ...] = (),
) -> pl.DataFrame:
    """Every raw id column but ``done`` re-keyed: item ids from the ``index`` where given (hashed
    once per run), the rest hashed here (image refs and the index's own ids do not repeat)."""
    keyed = [
        _item_keys(frame[c], index, pseudonymize)
        if kind == "item" and index is not None
        else _hashed(frame[c], kind, settings, pseudonymize)
        for c, kind in _id_columns(settings).items()
        if c in frame.columns and c not in done
    ]
    return frame.with_columns(keyed)


def _visible_keys(steps: pl.DataFrame, index: ItemIndex, pseudonymize: Pseudonymizer) -> pl.Series:
    """Pseudonyms of ``visible_items``: lists computed from the layout map through the cards' own
    index rows (``_visible_item``), no lookup; logged lists are looked up."""
    if (steps["visible_source"] == "logged").any():
        return _item_keys(steps["visible_items"], index, pseudonymize)
    rows = steps.select(pl.when(pl.col("screen") == "feed").then(pl.col("_visible_item"))).to_series()
    return _per_element(rows, lambda flat: index.keys.gather(flat)).alias("visible_items")


def _views(part: Part, ctx: Context, pseudonymize: Pseudonymizer) -> pl.DataFrame:
    """Per page view of the part: its pseudonym, and its user's pseudonym, split and bucket."""
    views = part.sessions.select("session_id", "user_id").join(ctx.users, on="user_id", how="left")
    return views.with_columns(pseudonymize.column(views["session_id"], "session").alias("_session"))


def _with_view_columns(layout: pl.DataFrame, views: pl.DataFrame) -> pl.DataFrame:
    """``views``' columns on every card of the view. ``layouts`` keeps each view's cards together
    with its rank-0 card first, so the view of card k is a run number: a gather, not a join."""
    first_cards = layout.filter(pl.col("rank") == 0).select("session_id")
    per_view = first_cards.join(views, on="session_id", how="left", maintain_order="left")
    runs = layout.select(pl.col("_pv").rle_id()).to_series()
    if runs.len() and (runs[-1] + 1 != per_view.height or per_view["_session"].null_count()):
        raise AssertionError("feed layout rows are not grouped by page view, one session each")
    return pl.concat([layout.drop("session_id"), per_view.gather(runs)], how="horizontal")


def key_part(part: Part, ctx: Context, pseudonymize: Pseudonymizer) -> dict[str, pl.DataFrame]:
    """The part's lake rows: pseudonyms, split and bucket (sessions keyed once per page view, then
    joined; feed cards through their integer view number ``_pv``)."""
    views = _views(part, ctx, pseudonymize)
    layout = _with_view_columns(part.layout, views)
    layout = layout.with_columns(ctx.item_index.keys.gather(layout["_item"]).alias("item_id"))
    by_view = {"how": "left", "maintain_order": "left", "on": "session_id"}
    steps = part.steps.drop("user_id").join(views, **by_view)
    keys = ctx.item_index.keys  # target and open item: pseudonyms by their index rows
    targets = keys.gather(steps.select(pl.when(pl.col("action") == "click").then("_item")).to_series())
    tables = {
        "steps": steps.with_columns(
            _visible_keys(steps, ctx.item_index, pseudonymize),
            targets.alias("target_item_id"),
            keys.gather(steps["_open_item"]).alias("ipv_item_id"),
        ),
        "feed_layouts": layout,
        "sessions": part.sessions.drop("user_id").join(views, **by_view),
    }
    keyed_ids = [pl.col("_session").alias("session_id"), pl.col("_user").alias("user_id")]
    return {
        name: pseudonyms(
            lake_columns(frame.with_columns(keyed_ids), name),
            ctx.settings,
            pseudonymize,
            ctx.item_index,
            ("session_id", "user_id", "item_id", "visible_items", "target_item_id", "ipv_item_id"),
        )
        for name, frame in tables.items()
    }


def lake_columns(frame: pl.DataFrame, table: str) -> pl.DataFrame:
    """Only the lake table's columns (ids are keyed after this, so nothing unused gets hashed)."""
    return frame.select([c for c in LAKE_TABLES[table].names if c in frame.columns])


def helper_columns(frame: pl.DataFrame) -> list[str]:
    """Locator and helper columns, never part of an output."""
    return [c for c in frame.columns if c.startswith("_")]


def user_assignment(users: pl.Series, pseudonymize: Pseudonymizer, settings: IngestSettings) -> pl.DataFrame:
    """user_id (raw) -> _user (pseudonym), split, bucket; both derive from the pseudonym alone."""
    keys = pseudonymize.mapping(users, "user")
    return keys.select(
        pl.col("raw").alias("user_id"),
        pl.col("key").alias("_user"),
        split_of(keys["key"], settings.split_seed, settings.split_ratios),
        bucket_of(keys["key"], settings.buckets),
    )


def history_rows(
    history: pl.DataFrame, pseudonymize: Pseudonymizer, settings: IngestSettings
) -> pl.DataFrame:
    """Pre-window history with its user's split (from the pseudonym, so also for users without events)."""
    users = user_assignment(history["user_id"].unique(), pseudonymize, settings)
    splits = users.select(pl.col("_user").alias("user_id"), "split")
    keyed = pseudonymize(history.drop(helper_columns(history)))
    return keyed.join(splits, on="user_id", how="left", maintain_order="left")


def profile_rows(profiles: pl.DataFrame, users: pl.DataFrame, pseudonymize: Pseudonymizer) -> pl.DataFrame:
    splits = users.select(pl.col("_user").alias("user_id"), "split")
    keyed = pseudonymize(profiles.drop(helper_columns(profiles)))
    return align.profile_columns(keyed).join(splits, on="user_id", how="left")
