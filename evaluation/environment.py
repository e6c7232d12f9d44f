"""The shopping environment: one session's feed and detail pages as a state machine (PROTOCOL.md §1, §3).

The feed is the session's full pre-rendered layout seen through a viewport: a card
is in view when at least ``visible_fraction`` of its height is inside it (fractional
CSS pixels throughout). Clicking any card in view opens that item's detail page,
built from the catalog, whether or not the real shopper ever opened it.

What the simulator sees is a ``transforms.prompts`` ``Observation``, rendered by the
same renderer as the training prompts; whether a response is executable is decided
on that observation by ``transforms.prompts.judge_response`` (the renderer's own
``legal_actions``), so the executable-action list shown is exactly what is accepted.

Detail pages (the lake records no page layout, so its geometry is configuration):
the page is ``PageLayout.height`` px tall (or the catalog's ``page_height``), with
the review preview block (alias ``C1``) at ``review_block_at`` of its height. Rollout
and replay lay pages out alike, so the main page shows ``C1`` only while the preview
overlaps the viewport; replay widens a seated page only where its record says more
(``widen_to``). Panels
follow the reference environment: ``ipv_click_param`` opens the specifications
panel, ``ipv_enter_comment`` / ``ipv_click_comment`` the review list, and every
other detail-page action first returns to the main page (closing both); the page
offset is kept while a panel is open. ``ipv_swipe_pic`` shows the next picture and
stops at the last one (no wrap).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

from evaluation.session import DEFAULT_CARD_HEIGHT, CardBox, CatalogItem, Session
from transforms.config import Geometry
from transforms.prompts import (
    Accepted,
    DetailPage,
    Observation,
    PromptSettings,
    Verdict,
    judge_response,
)
from transforms.prompts.render import DONE_ACTIONS, Mode, reviews_open

Screen = Literal["feed", "ipv"]
PANEL_MAIN, PANEL_PARAMS, PANEL_REVIEWS = "main", "params", "comments"
#: the panel open after a detail-page action; any other action returns to the main page
PANEL_AFTER = {
    "ipv_click_param": PANEL_PARAMS,
    "ipv_enter_comment": PANEL_REVIEWS,
    "ipv_click_comment": PANEL_REVIEWS,
}


class PageLayout(BaseModel):
    """Detail-page geometry used where the catalog has none."""

    height: float = Field(
        2750.0, gt=0, description="page height px (the synthetic world's 1500..4000 midpoint)"
    )
    review_block_at: float = Field(0.6, ge=0, le=1, description="top of the review preview, share of height")
    review_block_height: float = Field(240.0, gt=0, description="height of the review preview block px")
    pictures: int = Field(5, ge=1, description="pictures in the gallery")


class EnvironmentSettings(BaseModel):
    """How episodes run; defaults are the reference values of PROTOCOL.md §1–§3."""

    prompt: PromptSettings = PromptSettings()  # its geometry is the environment's geometry
    page: PageLayout = PageLayout()
    default_card_height: float = Field(
        DEFAULT_CARD_HEIGHT, gt=0, description="height of a logged card box without one"
    )
    budget_single: int = Field(31, ge=1, description="accepted actions per single-session episode")
    budget_cross: int = Field(42, ge=1, description="accepted actions per session in cross-session mode")
    max_try: int = Field(1, ge=1, description="consecutive invalid outputs that end an episode")

    @property
    def geometry(self) -> Geometry:
        return self.prompt.geometry

    def budget(self, mode: Mode) -> int:
        return self.budget_cross if mode == "cross" else self.budget_single


def _fractional_pixels_shown() -> bool:
    """Whether the renderer's models carry fractional pixels (else offsets are shown rounded)."""
    try:
        Observation(screen="feed", scroll_top=0.5)  # type: ignore[arg-type]
    except ValidationError:
        return False
    return True


FRACTIONAL_PIXELS = _fractional_pixels_shown()


def shown_px(value: float | None) -> float | int | None:
    """A pixel value as the observation carries it (None: unknown)."""
    if value is None or (FRACTIONAL_PIXELS and not float(value).is_integer()):
        return value
    return round(value)


def overlap(top: float, bottom: float, view_top: float, view_bottom: float) -> float:
    """Length of [top, bottom] inside [view_top, view_bottom] (0 when apart)."""
    return max(0.0, min(bottom, view_bottom) - max(top, view_top))


def card_in_view(card: CardBox, offset: float, geometry: Geometry) -> bool:
    shown = overlap(card.y, card.y + card.height, offset, offset + geometry.feed_viewport)
    return shown >= geometry.visible_fraction * card.height


def cards_in_view(cards: tuple[CardBox, ...], offset: float, geometry: Geometry) -> list[str]:
    """Ids of the cards in view at ``offset``, in reading order."""
    return [c.item_id for c in cards if card_in_view(c, offset, geometry)]


@dataclass
class PageState:
    """The open detail page of one visit."""

    item: CatalogItem
    pictures: int
    max_scroll: float
    review_top: float
    review_bottom: float
    scroll: float | None = 0.0  # None: a record without the page offset (replay only)
    panel: str = PANEL_MAIN
    picture: int = 0  # 0-based picture shown
    done: dict[str, int] = field(default_factory=dict)  # detail-page actions taken in this visit
    recorded_reviews: int | None = None  # replay: reviews the record shows on the main page (None: layout)

    def preview_in_view(self, viewport: float) -> bool:
        """The review preview block overlaps the viewport by at least 1 px (an unknown offset may show it)."""
        if self.scroll is None:
            return True
        return overlap(self.review_top, self.review_bottom, self.scroll, self.scroll + viewport) >= 1.0

    def reviews_in_view(self, viewport: float) -> tuple[str | None, ...]:
        """The open list shows every review; the main page only the preview's first (``C1``)."""
        if reviews_open(self.panel):
            return self.item.reviews
        if self.recorded_reviews is not None:
            return self.item.reviews[: self.recorded_reviews]
        return self.item.reviews[:1] if self.preview_in_view(viewport) else ()


def review_number(alias: str | None) -> int | None:
    """1 for ``C1``; None for anything that is not an alias."""
    digits = alias[1:] if alias and alias[:1] == "C" else ""
    return int(digits) if digits.isdigit() and int(digits) > 0 else None


def scrolled(position: float, delta: float, bottom: float | None) -> float:
    """``position`` moved by ``delta`` within [0, bottom] (None: no known bottom). A position
    already past the bottom (seated from a record) never moves further down."""
    moved = max(position + delta, 0.0)
    return moved if bottom is None else min(moved, max(bottom, position))


def scroll_delta(action: Accepted) -> float:
    """Signed px of a scroll (down is positive); a recorded scroll without a distance moves nothing."""
    distance = action.distance or 0
    return -distance if action.type.endswith("scroll_up") else distance


class ShoppingEnvironment:
    """One session's screens. ``judge`` checks a response, ``apply`` executes an accepted action."""

    def __init__(self, session: Session, settings: EnvironmentSettings | None = None) -> None:
        self.session = session
        self.settings = settings or EnvironmentSettings()
        geometry = self.settings.geometry
        bottom = max((c.y + c.height for c in session.cards), default=0.0)
        height = session.feed_height if session.feed_height is not None else bottom
        self.max_offset: float = max(height - geometry.feed_viewport, 0.0)
        self.screen: Screen = "feed"
        self.offset: float = min(max(session.start_offset, 0.0), self.max_offset)
        self.page: PageState | None = None
        self.carted: set[str] = set()
        self.bought: set[str] = set()
        self.ended = False
        self._seated_cards: tuple[str, ...] | None = None  # replay: the recorded cards in view

    # --- what is on screen ---------------------------------------------------------------

    def visible_item_ids(self) -> list[str]:
        if self.screen != "feed":
            return []
        if self._seated_cards is not None:
            return list(self._seated_cards)
        return cards_in_view(self.session.cards, self.offset, self.settings.geometry)

    def observation(self) -> Observation:
        feed = {"scroll_top": shown_px(self.offset), "max_scroll": shown_px(self.max_offset)}
        if self.screen == "feed":
            cards = [self.session.item(i).card() for i in self.visible_item_ids()]
            return Observation(screen="feed", cards=cards, **feed)
        return Observation(screen="ipv", page=self._detail_page(), **feed)

    def _detail_page(self) -> DetailPage:
        page = self.page
        if page is None:
            raise RuntimeError("the detail page screen has no open page")
        item = page.item
        return DetailPage(
            item_id=item.item_id,
            title=item.title,
            price=item.price,
            category=item.category,
            params=item.parameters(),
            reviews=list(page.reviews_in_view(self.settings.geometry.ipv_viewport)),
            scroll=shown_px(page.scroll),
            max_scroll=shown_px(page.max_scroll),
            ui_state=page.panel,
            done=dict(page.done),
        )

    def judge(self, text: str) -> Verdict:
        """The response checked against the current screen (PROTOCOL.md §2): an action or a reason."""
        return judge_response(text, self.observation(), self.settings.prompt)

    # --- transitions ---------------------------------------------------------------------

    def apply(self, action: Accepted) -> None:
        """Execute ``action``. Strict callers pass only judged actions; replay passes recorded ones,
        so a missing distance moves nothing and a click opens its item wherever the card is."""
        if self.ended:
            raise RuntimeError("the session has ended")
        if action.type == "end":
            self.ended = True
        elif self.screen == "feed":
            self._apply_feed(action)
        else:
            self._apply_page(action)

    def _apply_feed(self, action: Accepted) -> None:
        if action.type in ("scroll_down", "scroll_up"):
            self.offset = scrolled(self.offset, scroll_delta(action), self.max_offset)
        elif action.type == "click" and action.target_item_id is not None:
            self.open_page(action.target_item_id)
            return
        else:
            raise ValueError(f"{action.type} cannot be applied on the feed")
        self._seated_cards = None

    def open_page(self, item_id: str) -> PageState:
        """Show ``item_id``'s detail page from the top, with a fresh visit."""
        item, layout = self.session.item(item_id), self.settings.page
        height = item.page_height or layout.height
        review_top = height * layout.review_block_at
        page = PageState(
            item=item,
            pictures=item.pictures or layout.pictures,
            max_scroll=max(height - self.settings.geometry.ipv_viewport, 0.0),
            review_top=review_top,
            review_bottom=review_top + layout.review_block_height,
        )
        self.page, self.screen, self._seated_cards = page, "ipv", None
        return page

    def _apply_page(self, action: Accepted) -> None:
        page, kind = self.page, action.type
        if page is None:
            raise RuntimeError("the detail page screen has no open page")
        if kind == "back_home":
            self.screen, self.page = "feed", None
            return
        page.recorded_reviews = None
        if kind in DONE_ACTIONS:
            page.done[kind] = page.done.get(kind, 0) + 1
        page.panel = PANEL_AFTER.get(kind, PANEL_MAIN)
        if kind in ("ipv_scroll_down", "ipv_scroll_up") and page.scroll is not None:
            page.scroll = scrolled(page.scroll, scroll_delta(action), page.max_scroll)
        elif kind == "ipv_swipe_pic":
            page.picture = min(page.picture + 1, page.pictures - 1)
        elif kind == "ipv_cart":
            self.carted.add(page.item.item_id)
        elif kind == "ipv_buy":
            self.bought.add(page.item.item_id)

    # --- replay: placing the screen where the record says it was ---------------------------

    def seat_feed(self, offset: float, visible: tuple[str, ...] | None = None) -> None:
        """Show the feed at ``offset`` (the feed is at least that long); ``visible`` overrides the
        geometry with the cards a log recorded."""
        self.screen, self.page = "feed", None
        self.offset = max(offset, 0.0)
        self.max_offset = max(self.max_offset, self.offset)
        self._seated_cards = visible

    def seat_page(self, item_id: str, scroll: float | None, panel: str | None) -> PageState:
        """Show ``item_id``'s page at ``scroll`` (None: unknown) with ``panel`` open, keeping the visit
        if it is open; the page is laid out as in rollout, and at least as long as the record shows."""
        page = self.page if self.page is not None and self.page.item.item_id == item_id else None
        page = page or self.open_page(item_id)
        self.screen, self.page = "ipv", page
        page.scroll = None if scroll is None else max(scroll, 0.0)
        if page.scroll is not None:
            page.max_scroll = max(page.max_scroll, page.scroll)
        page.panel = panel or PANEL_MAIN
        page.recorded_reviews = None
        return page

    def widen_to(self, action: Accepted) -> bool:
        """Replay: widen the seated main page where ``action``, recorded on it, shows the page held more
        than its layout: the review it opens in view, more page below a scroll down at the bottom.
        Whether the layout said otherwise (the action is then the only evidence of what was shown)."""
        page = self.page
        if self.screen != "ipv" or page is None or reviews_open(page.panel):
            return False
        if action.type == "ipv_click_comment":
            wanted = review_number(action.review_alias)
            if wanted is None or wanted <= len(page.reviews_in_view(self.settings.geometry.ipv_viewport)):
                return False
            page.recorded_reviews = min(wanted, len(page.item.reviews))
            return True
        if action.type == "ipv_scroll_down" and page.scroll is not None and page.scroll >= page.max_scroll:
            page.max_scroll = page.scroll + max(action.distance or 0, 1)
            return True
        return False
