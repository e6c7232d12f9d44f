"""One session's world, as the environment sees it: its feed layout, the items it may open, its record.

Built from small per-session frames (rows of ``feed_layouts``, ``items`` and
``steps``), so tests write a session in memory and ``evaluation.loader`` reads one
from the lake. Everything here is plain immutable data; the environment holds the
moving state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from transforms.prompts import Card, Observation, Param, PastStep, State, past_step
from transforms.prompts.render import Mode

# frames come in from the loader; a session itself is plain data, and rolls out where polars is missing
if TYPE_CHECKING:
    import polars as pl

DEFAULT_CARD_HEIGHT = 328.0  # px, the reference's height for a logged card box without one


@dataclass(frozen=True)
class CardBox:
    """A feed card's vertical extent: only ``y`` and ``height`` decide visibility (PROTOCOL.md §1)."""

    item_id: str
    y: float
    height: float


@dataclass(frozen=True)
class CatalogItem:
    """An item's catalog row: what its feed card and its detail page show."""

    item_id: str
    title: str | None = None
    price: float | None = None
    category: str | None = None  # "L1-L2-L3"
    category_l1: str | None = None
    params: tuple[tuple[str | None, str | None], ...] = ()  # (label, value)
    reviews: tuple[str | None, ...] = ()
    page_height: float | None = None  # detail-page height px, where the catalog knows it
    pictures: int | None = None  # gallery size, where the catalog knows it

    def card(self) -> Card:
        return Card(item_id=self.item_id, title=self.title, price=self.price, category_l1=self.category_l1)

    def parameters(self) -> list[Param]:
        return [Param(label=label, value=value) for label, value in self.params]


@dataclass(frozen=True)
class RecordedStep:
    """One recorded action with the screen state it was taken in (a ``steps`` row)."""

    step: int
    screen: str
    action: str
    target_item_id: str | None = None
    target_title: str | None = None
    review_alias: str | None = None
    distance: int | None = None
    scroll_top: float | None = None
    visible_items: tuple[str, ...] | None = None
    visible_source: str | None = None  # "logged" | "layout"
    ipv_item_id: str | None = None
    ipv_scroll: float | None = None
    ui_state: str | None = None
    rationale: str | None = None  # the lake's rationale for the action (extraction), shown in later windows


@dataclass(frozen=True)
class Session:
    """A session's world: layout in reading order, catalog rows by id, the recorded steps."""

    session_id: str
    user_id: str | None
    feed_height: float | None
    cards: tuple[CardBox, ...]
    items: dict[str, CatalogItem]
    steps: tuple[RecordedStep, ...] = ()
    profile: dict[str, str | None] = field(default_factory=dict)
    profile_extra: str | None = None
    recent_clicks: tuple[str | None, ...] = ()  # titles, newest first
    recent_buys: tuple[str | None, ...] = ()
    recent_click_categories: tuple[str | None, ...] = ()  # of the recent clicks, newest first
    prior_clicks: int = 0  # in the user's history before the session
    prior_buys: int = 0
    cut_reason: str | None = None  # ingest cut the session at a bad event

    @property
    def start_offset(self) -> float:
        """The feed offset of the first recorded step that has one (0 for a session without)."""
        return next((s.scroll_top for s in self.steps if s.scroll_top is not None), 0.0)

    def item(self, item_id: str) -> CatalogItem:
        """The catalog row, or a bare one for an id the catalog lacks (its card shows as unknown)."""
        return self.items.get(item_id) or CatalogItem(item_id=item_id)

    @classmethod
    def from_frames(
        cls,
        session: dict[str, Any],
        layout: pl.DataFrame,
        items: pl.DataFrame,
        steps: pl.DataFrame | None = None,
        *,
        default_card_height: float = DEFAULT_CARD_HEIGHT,
    ) -> Session:
        """From a ``sessions`` row (plus optional profile fields) and this session's frames."""
        return cls(
            session_id=session["session_id"],
            user_id=session.get("user_id"),
            feed_height=_feed_height(session, layout),
            cards=card_boxes(layout, default_card_height),
            items=catalog_items(items),
            steps=recorded_steps(steps),
            profile=dict(session.get("profile") or {}),
            profile_extra=session.get("profile_extra"),
            recent_clicks=tuple(session.get("recent_clicks") or ()),
            recent_buys=tuple(session.get("recent_buys") or ()),
            recent_click_categories=tuple(session.get("recent_click_categories") or ()),
            prior_clicks=session.get("prior_clicks") or 0,
            prior_buys=session.get("prior_buys") or 0,
            cut_reason=session.get("cut_reason"),
        )


@dataclass
class Trajectory:
    """Where a session's prompts stand: the mode and the history window of accepted steps.

    In cross-session mode one trajectory is carried from a user's session to the next
    (``next_session``), so the window spans sessions as the training records' does.
    """

    mode: Mode = "single"
    window: list[PastStep] = field(default_factory=list)
    session_ordinal: int | None = None  # 1-based session of the chain (cross mode)
    gap_s: float | None = None  # idle time before this session (cross mode, later sessions)
    _steps_in_session: int = field(default=0, init=False, repr=False)

    def record(
        self, step: int, observation: Observation, action: dict[str, Any], rationale: str | None = None
    ) -> None:
        """Add an accepted step; the first of a later session carries the gap before it."""
        later = (self.session_ordinal or 1) > 1
        gap = self.gap_s if later and self._steps_in_session == 0 else None
        entry = past_step(
            step, observation, action, rationale=rationale, session=self.session_ordinal, gap_s=gap
        )
        self.window.append(entry)
        self._steps_in_session += 1

    def next_session(self, gap_s: float | None) -> Trajectory:
        """The same window continued into the user's next session."""
        ordinal = (self.session_ordinal or 1) + 1
        return Trajectory(self.mode, list(self.window), session_ordinal=ordinal, gap_s=gap_s)

    def state(self, session: Session, observation: Observation) -> State:
        """The prompt state of ``session`` showing ``observation``."""
        return State(
            mode=self.mode,
            profile=session.profile,
            profile_extra=session.profile_extra,
            recent_buys=list(session.recent_buys),
            recent_clicks=list(session.recent_clicks),
            window=list(self.window),
            observation=observation,
        )


def _feed_height(session: dict[str, Any], layout: pl.DataFrame) -> float | None:
    if session.get("feed_height") is not None:
        return float(session["feed_height"])
    if "feed_height" in layout.columns and layout["feed_height"].drop_nulls().len():
        return float(layout["feed_height"].max())  # type: ignore[arg-type]
    return None


def card_boxes(layout: pl.DataFrame, default_height: float) -> tuple[CardBox, ...]:
    """Cards in reading order (``rank``, else y then x); a missing height takes the default."""
    import polars as pl

    order = ["rank"] if "rank" in layout.columns else [c for c in ("y", "x") if c in layout.columns]
    rows = layout.sort(order).select(
        "item_id",
        pl.col("y").cast(pl.Float64),
        pl.col("height").cast(pl.Float64).fill_null(default_height),
    )
    return tuple(CardBox(item, y, height) for item, y, height in rows.iter_rows())


def catalog_items(items: pl.DataFrame) -> dict[str, CatalogItem]:
    out = {}
    for row in items.iter_rows(named=True):
        category = row.get("category")
        l1 = row.get("category_l1") or (category.split("-")[0] if category else None)
        out[row["item_id"]] = CatalogItem(
            item_id=row["item_id"],
            title=row.get("title"),
            price=row.get("price"),
            category=category,
            category_l1=l1,
            params=tuple((p["label"], p["value"]) for p in row.get("params") or ()),
            reviews=tuple(row.get("reviews") or ()),
            page_height=row.get("page_height"),
            pictures=row.get("pictures"),
        )
    return out


STEP_FIELDS = tuple(RecordedStep.__dataclass_fields__)


def recorded_steps(steps: pl.DataFrame | None) -> tuple[RecordedStep, ...]:
    if steps is None or steps.height == 0:
        return ()
    present = [c for c in STEP_FIELDS if c in steps.columns]
    out = []
    for row in steps.sort("step").select(present).iter_rows(named=True):
        visible = row.get("visible_items")
        out.append(RecordedStep(**{**row, "visible_items": None if visible is None else tuple(visible)}))
    return tuple(out)
