"""Feeds laid out by the environment from a policy's slate (the ranked candidates of one page).

A served page keeps the geometry of the session's logged feed: its card slots (the y and height of
each card in reading order) are filled with the slate's items in order, so a policy's feed shows its
k-th item where the logged feed showed its k-th card, and the simulator sees it exactly as it sees a
logged feed (PROTOCOL.md §1 visibility). The synthetic world lays its feeds out the same way — card
heights belong to the slot, not to the item — so a slate served from the world's candidates is the
page the world itself would have shown. A slate longer than the page is cut (the rest can be served
on a later page); a shorter one keeps the first slots, the feed ending that much sooner. A session
without a logged layout gets two columns of the default card height.

Candidates (``CandidateSettings.source``): ``logged``, the items the session's logged feed offered,
in their logged order; or ``category_mix``, the ``top_n`` most popular catalog items over a mix of
top categories in proportion to the shopper's click history (Laplace-smoothed over the catalog's
top categories).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Literal

import polars as pl
from pydantic import BaseModel, Field

from evaluation.policies import Candidate
from evaluation.session import CardBox, CatalogItem, Session, catalog_items
from transforms.lake import scan_table, table_files

CARD_GAP = 8.0  # px between cards of a fresh layout, as the world's masonry leaves them


class CandidateSettings(BaseModel):
    """Where a served page's candidates come from."""

    source: Literal["logged", "category_mix"] = Field(
        "logged", description="logged: the session's logged feed's items; category_mix: top-N of a mix"
    )
    top_n: int = Field(60, ge=1, description="candidates of a category mix")


def lake_popularity(lake: str | Path, split: str = "train") -> pl.DataFrame:
    """(item_id, popularity): how often the ``split`` sessions' feeds showed the item plus how often
    their shoppers opened it — what a recommender learns from the logs."""
    ids = scan_table(lake, "sessions").filter(pl.col("split") == split).select("session_id")
    shown = scan_table(lake, "feed_layouts").join(ids, on="session_id", how="semi").select("item_id")
    opened = (
        scan_table(lake, "steps")
        .join(ids, on="session_id", how="semi")
        .filter(pl.col("action") == "click")
        .select(pl.col("target_item_id").alias("item_id"))
    )
    events = pl.concat([shown, opened]).drop_nulls()
    return events.group_by("item_id").agg(pl.len().cast(pl.Int64).alias("popularity")).collect()


def catalog(lake: str | Path) -> dict[str, CatalogItem]:
    """Every catalog row of the lake (the items a category mix may offer)."""
    return catalog_items(scan_table(lake, "items").collect()) if table_files(lake, "items") else {}


def candidate(item: CatalogItem, popularity: dict[str, int]) -> Candidate:
    return {
        "item_id": item.item_id,
        "title": item.title,
        "price": item.price,
        "category": item.category,
        "category_l1": item.category_l1,
        "popularity": popularity.get(item.item_id, 0),
    }


def logged_candidates(session: Session, popularity: dict[str, int]) -> list[Candidate]:
    """The items of the session's logged feed, in its reading order."""
    return [candidate(session.item(card.item_id), popularity) for card in session.cards]


def category_mix_candidates(
    session: Session, items: pl.DataFrame, popularity: pl.DataFrame, top_n: int
) -> list[str]:
    """Ids of the ``top_n`` most popular items over top categories in proportion to the shopper's
    recent clicks (each catalog top category counted once more, so none is left out entirely)."""
    tops = items.select(pl.col("category").str.split("-").list.first().alias("top")).unique()
    clicked = pl.DataFrame({"top": [c.split("-")[0] for c in session.recent_click_categories if c]},
                           schema={"top": pl.String})  # fmt: skip
    weights = tops.join(clicked.group_by("top").len(), on="top", how="left").with_columns(
        (pl.col("len").fill_null(0) + 1).alias("weight")
    )
    quota = weights.with_columns(
        (pl.col("weight") / pl.col("weight").sum() * top_n).ceil().cast(pl.Int64).alias("quota")
    )
    ranked = (
        items.select("item_id", pl.col("category").str.split("-").list.first().alias("top"))
        .join(popularity, on="item_id", how="left")
        .with_columns(pl.col("popularity").fill_null(0))
        .sort(["popularity", "item_id"], descending=[True, False])
        .with_columns(pl.int_range(pl.len()).over("top").alias("place"))
        .join(quota.select("top", "quota"), on="top")
        .filter(pl.col("place") < pl.col("quota"))
        .sort(["place", "popularity", "item_id"], descending=[False, True, False])
    )
    return ranked["item_id"].head(top_n).to_list()


def page_slots(session: Session) -> tuple[tuple[float, float], ...]:
    """(y, height) of each card slot of the session's logged feed page, in reading order."""
    return tuple((card.y, card.height) for card in session.cards)


def fresh_slots(count: int, height: float) -> list[tuple[float, float]]:
    """Two columns of equal cards: card k in row k // 2."""
    return [(CARD_GAP + (k // 2) * (height + CARD_GAP), height) for k in range(count)]


def lay_out(
    session: Session,
    slate: list[str],
    *,
    default_height: float,
    viewport: float,
    items: dict[str, CatalogItem] | None = None,
    slots: int | None = None,
) -> Session:
    """``session`` showing ``slate`` (item ids in order) in its logged feed's card slots (at most
    ``slots`` of them), with no recorded steps (the simulator starts at the top of the served feed).
    ``items``: catalog rows of slate items the session's own catalog lacks."""
    logged = page_slots(session)
    page = logged if logged else tuple(fresh_slots(len(slate), default_height))
    if slots is not None:
        page = page[:slots]
    shown = slate[: len(page)]
    cards = tuple(CardBox(item, y, height) for item, (y, height) in zip(shown, page, strict=False))
    bottom = max((card.y + card.height for card in cards), default=0.0)
    full_bottom = max((y + h for y, h in page), default=0.0)
    padding = (session.feed_height - full_bottom) if (logged and session.feed_height) else CARD_GAP
    if len(shown) == len(page) and logged and session.feed_height is not None:
        feed_height = session.feed_height
    else:
        feed_height = max(bottom + max(padding, 0.0), viewport + 1.0)
    catalog_rows = {**(items or {}), **session.items}
    return replace(
        session,
        cards=cards,
        feed_height=feed_height,
        items={i: catalog_rows[i] for i in shown if i in catalog_rows} | session.items,
        steps=(),
    )
