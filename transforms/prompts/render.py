"""The simulator prompt as a pure function of one state (PROTOCOL.md §1–§3).

The training records and the evaluation environment both call these functions,
so a state renders to the same text at train and test time. ``transforms.records``
builds the same text for whole tables with Polars expressions; a test checks the
two agree character for character.

Text rules shared with the vectorised builder (change both or neither):
free text is ``clean``-ed (CR/LF/TAB -> space), prices print with two decimals
after rounding half up, unknown values print as ``unknown``/``n/a``, JSON is
compact (``separators=(",", ":")``) and keeps non-ASCII characters.
"""

from __future__ import annotations

import json
import math
from typing import Any, Literal

from pydantic import BaseModel, Field

from transforms.click_line import click_ids_signature
from transforms.config import Geometry
from transforms.schemas import IPV_ACTIONS, PROFILE_FIELDS, SCROLL_ACTIONS

PROMPT_VERSION = "v1"
Mode = Literal["single", "cross"]
UNKNOWN_ITEM = "(unknown item)"
#: ipv actions counted in "already done on this item", in this order
DONE_ACTIONS: tuple[str, ...] = tuple(a for a in IPV_ACTIONS if a not in ("back_home", "end"))


class PromptSettings(BaseModel):
    """What a prompt shows; defaults are the reference values of PROTOCOL.md §3."""

    window_single: int = Field(10, ge=0, description="past steps shown in single-session mode")
    window_cross: int = Field(20, ge=0, description="past steps shown in cross-session mode")
    recent_clicks: int = Field(20, ge=0, description="recent clicked titles shown")
    recent_buys: int = Field(20, ge=0, description="recent purchased titles shown")
    max_reviews: int = Field(10, ge=0, description="reviews listed (aliases C1..Cn) when the list is open")
    inline_reviews: int = Field(
        2, ge=0, description="reviews the page's own review block shows (list closed)"
    )
    review_chars: int = Field(120, ge=1, description="characters kept per review")
    system: Literal["full", "brief"] = Field(
        "full",
        description="the system turn: the reference's description of screens and actions, or a brief "
        "one (each state lists its executable actions and their arguments either way)",
    )
    click_ids: bool = Field(
        False,
        description="the click's line among the executable actions lists the ids of the cards in view, "
        "near the prompt's end: a small model copies one of a few ids from a fixed place instead of "
        "finding a card among the screen's lines",
    )
    response_order: Literal["rationale_first", "action_first"] = Field(
        "rationale_first",
        description="the gold response's key order (PROTOCOL §2 parses either): the reference's reason "
        "then action, or the action first, so a click's id follows the prompt's end at a fixed distance",
    )
    click_by: Literal["title_and_id", "id"] = Field(
        "title_and_id",
        description="how a gold click names its card: title and id (the reference's), or the id alone "
        "(the id decides either way, PROTOCOL §1)",
    )
    # the geometry the lake was ingested with (flows.records takes it from the ingest's manifest), so
    # the prompts show the viewport and scroll limits alignment used
    geometry: Geometry = Field(default_factory=Geometry)

    def window(self, mode: Mode) -> int:
        return self.window_cross if mode == "cross" else self.window_single


# --- state objects -----------------------------------------------------------


class Card(BaseModel):
    """A feed card in view."""

    item_id: str
    title: str | None = None
    price: float | None = None
    category_l1: str | None = None


class Param(BaseModel):
    label: str | None = None
    value: str | None = None


class DetailPage(BaseModel):
    """The open item detail page (ipv screen)."""

    item_id: str | None = None
    title: str | None = None
    price: float | None = None
    category: str | None = None  # "L1-L2-L3"
    params: list[Param] = []
    reviews: list[str | None] = []
    scroll: float | None = None  # page offset in CSS px
    max_scroll: float | None = None  # page height - viewport, where the page's layout is known
    ui_state: str | None = None  # open panel: main | params | comments ...
    done: dict[str, int] = {}  # ipv actions already taken in this visit -> count


class Observation(BaseModel):
    screen: Literal["feed", "ipv"]
    scroll_top: float | None = None  # feed offset in CSS px (kept while on ipv)
    max_scroll: float | None = None  # feed height - viewport
    cards: list[Card] = []  # feed cards in view, reading order
    page: DetailPage | None = None


class PastStep(BaseModel):
    """One accepted step of the interaction-history window."""

    step: int
    session: int | None = None  # 1-based session of the chain (cross mode)
    gap_s: float | None = None  # cross mode, first step of a later session: idle time before it
    summary: str  # summarize(observation at that step)
    action: dict[str, Any]
    rationale: str | None = None


class State(BaseModel):
    mode: Mode = "single"
    profile: dict[str, str | None] = {}
    profile_extra: str | None = None
    recent_buys: list[str | None] = []  # titles, newest first
    recent_clicks: list[str | None] = []  # titles, newest first
    window: list[PastStep] = []  # oldest first; the renderer keeps the last N
    observation: Observation


# --- small formatters (mirrored by the Polars builder) -------------------------


def clean(text: str | None) -> str:
    """One-line text: CR, LF and TAB become spaces (each on its own, no collapsing)."""
    if text is None:
        return ""
    return text.replace("\r", " ").replace("\n", " ").replace("\t", " ")


def fmt_price(price: float | None) -> str:
    if price is None or math.isnan(price):
        return "n/a"
    cents = math.floor(price * 100 + 0.5)  # half up, identical float ops in Polars
    return f"{cents // 100}.{cents % 100:02d}"


def fmt_px(value: float | None) -> str:
    """CSS px as logged (often fractional), whole ones without a decimal point: 400 px, 331.4 px."""
    if value is None:
        return "unknown"
    return f"{int(value)} px" if float(value).is_integer() else f"{float(value)} px"


def fmt_gap(seconds: float) -> str:
    minutes = math.floor(seconds / 60)
    if minutes < 1:
        return "under a minute"
    if minutes < 60:
        return f"{minutes} min"
    hours = math.floor(seconds / 3600)
    return f"{hours} h" if hours < 48 else f"{math.floor(seconds / 86400)} days"


def panel_of(ui_state: str | None) -> str:
    return clean(ui_state) if ui_state else "main"


def reviews_open(ui_state: str | None) -> bool:
    state = (ui_state or "").lower()
    return "comment" in state or "review" in state


def params_open(ui_state: str | None) -> bool:
    state = (ui_state or "").lower()
    return "param" in state or "spec" in state


def to_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def token_estimate(*texts: str) -> int:
    """Rough, deliberately high: one token per 3 UTF-8 bytes (ASCII ~3 chars, CJK ~1 char)."""
    return -(-sum(len(t.encode("utf-8")) for t in texts) // 3)


# --- actions ---------------------------------------------------------------------


def gold_action(
    action: str,
    *,
    target_title: str | None = None,
    target_item_id: str | None = None,
    review_alias: str | None = None,
    distance: int | None = None,
) -> dict[str, Any]:
    """The PROTOCOL.md §2 action object of a recorded step (absent arguments omitted)."""
    out: dict[str, Any] = {"type": action}
    if action == "click":
        if target_title is not None:
            out["target"] = clean(target_title)
        if target_item_id is not None:
            out["target_item_id"] = target_item_id
    elif action == "ipv_click_comment" and review_alias is not None:
        out["target"] = review_alias
    elif action in SCROLL_ACTIONS and distance is not None:
        out["distance"] = int(distance)
    return out


def response_json(
    rationale: str | None, action: dict[str, Any], settings: PromptSettings | None = None
) -> str:
    """Gold response ``{"rationale": ..., "action": {...}}`` (rationale "" until extracted), in the
    settings' key order, a click naming its card as ``click_by`` says."""
    s = settings or PromptSettings()
    if s.click_by == "id" and action.get("type") == "click" and "target_item_id" in action:
        action = {"type": "click", "target_item_id": action["target_item_id"]}
    reason, act = to_json(rationale or ""), to_json(action)
    if s.response_order == "action_first":
        return f'{{"action":{act},"rationale":{reason}}}'
    return f'{{"rationale":{reason},"action":{act}}}'


def action_signatures(geometry: Geometry) -> dict[str, str]:
    feed, ipv = geometry.max_feed_scroll, geometry.max_ipv_scroll
    return {
        "scroll_down": f'scroll_down {{"distance": 1..{feed}}}',
        "scroll_up": f'scroll_up {{"distance": 1..{feed}}}',
        "click": 'click {"target": "<exact title of an item in view>", "target_item_id": "<its id>"}',
        "end": "end",
        "ipv_scroll_down": f'ipv_scroll_down {{"distance": 1..{ipv}}}',
        "ipv_scroll_up": f'ipv_scroll_up {{"distance": 1..{ipv}}}',
        "ipv_swipe_pic": "ipv_swipe_pic",
        "ipv_click_param": "ipv_click_param",
        "ipv_enter_comment": "ipv_enter_comment",
        "ipv_click_comment": 'ipv_click_comment {"target": "<alias of a review in view, e.g. C1>"}',
        "ipv_cart": "ipv_cart",
        "ipv_buy": "ipv_buy",
        "back_home": "back_home",
    }


def reviews_shown(page: DetailPage, settings: PromptSettings) -> list[str | None]:
    """Reviews in view, aliases C1.. in order: the open list, else the page's review block.

    The lake has no detail-page layout, so the text page shows its review block
    at every page offset; a review is "in view" when it is in that block.
    """
    limit = settings.max_reviews if reviews_open(page.ui_state) else settings.inline_reviews
    return page.reviews[:limit]


def at_page_bottom(page: DetailPage) -> bool:
    """At the bottom of the main page (a page of unknown height never is; the review list scrolls on)."""
    if page.scroll is None or page.max_scroll is None or reviews_open(page.ui_state):
        return False
    return page.scroll >= page.max_scroll


def legal_actions(obs: Observation, settings: PromptSettings | None = None) -> list[str]:
    """Executable actions in this state (PROTOCOL.md §1 legality), in display order."""
    settings = settings or PromptSettings()
    if obs.screen == "feed":
        top, top_max = obs.scroll_top, obs.max_scroll
        allowed = {
            "scroll_down": top is None or top_max is None or top < top_max,
            "scroll_up": top is None or top > 0,
            "click": len(obs.cards) > 0,
            "end": True,
        }
    else:
        page = obs.page or DetailPage()
        allowed = {
            "ipv_scroll_down": not at_page_bottom(page),
            "ipv_scroll_up": page.scroll is None or page.scroll > 0,
            "ipv_swipe_pic": True,
            "ipv_click_param": True,
            "ipv_enter_comment": True,
            "ipv_click_comment": len(reviews_shown(page, settings)) > 0,
            "ipv_cart": True,
            "ipv_buy": True,
            "back_home": True,
            "end": True,
        }
    return [name for name, ok in allowed.items() if ok]


# --- text sections ---------------------------------------------------------------


SYSTEM_TEMPLATE = """\
You simulate one real shopper using a mobile shopping app. Behave as this shopper would, given \
their profile, their shopping history, what they did so far and what is on the screen now. \
Each turn you choose exactly one next action.{cross}

Screens:
- feed: the home recommendation feed, a two-column list of item cards seen through a \
{feed_vp} px high viewport that scrolls.
- ipv: the detail page of one item (viewport {ipv_vp} px high): pictures, price, \
specifications, reviews.

Actions (screen, arguments):
- scroll_down (feed) {{"distance": integer 1..{feed_max}}}: move the feed down
- scroll_up (feed) {{"distance": integer 1..{feed_max}}}: move the feed up
- click (feed) {{"target": "<exact title>", "target_item_id": "<id>"}}: open an item in view
- end (feed or ipv): end the session
- ipv_scroll_down (ipv) {{"distance": integer 1..{ipv_max}}}: scroll the detail page down
- ipv_scroll_up (ipv) {{"distance": integer 1..{ipv_max}}}: scroll the detail page up
- ipv_swipe_pic (ipv): see the next product picture
- ipv_click_param (ipv): open the specifications panel
- ipv_enter_comment (ipv): open the review list
- ipv_click_comment (ipv) {{"target": "C1"}}: open one review in view by its alias
- ipv_cart (ipv): add the item to the cart
- ipv_buy (ipv): buy the item
- back_home (ipv): return to the feed where you left it
Only the actions listed as executable in the current state are accepted.

Response format: one JSON object and nothing else, with a short first-person reason:
{response_format}"""

CROSS_NOTE = (
    " Your sessions are chained over time: the history shows steps of earlier sessions too,"
    " marked with when each session started."
)


BRIEF_SYSTEM_TEMPLATE = """\
You simulate one real shopper using a mobile shopping app: given their profile, their shopping \
history, what they did so far and what is on the screen now, choose exactly one next action among \
those listed as executable.{cross}
Reply with one JSON object and nothing else: {response_format}"""


RESPONSE_FORMATS = {
    (
        "full",
        "rationale_first",
    ): '{"rationale": "<why you do this>", "action": {"type": "<action>", ...arguments}}',
    (
        "full",
        "action_first",
    ): '{"action": {"type": "<action>", ...arguments}, "rationale": "<why you do this>"}',
    (
        "brief",
        "rationale_first",
    ): '{"rationale": "<short first-person reason>", "action": {"type": "<action>", ...arguments}}',
    (
        "brief",
        "action_first",
    ): '{"action": {"type": "<action>", ...arguments}, "rationale": "<short first-person reason>"}',
}


def system_prompt(
    mode: Mode = "single",
    geometry: Geometry | None = None,
    style: str = "full",
    response_order: str = "rationale_first",
) -> str:
    """The system turn: ``full`` describes the screens and the 13 actions (the reference's); ``brief``
    leaves the actions to each state's list of executable ones, with their arguments. Either shows the
    response's keys in ``response_order``."""
    g = geometry or Geometry()
    response_format = RESPONSE_FORMATS[(style, response_order)]
    if style == "brief":
        return BRIEF_SYSTEM_TEMPLATE.format(
            cross=CROSS_NOTE if mode == "cross" else "", response_format=response_format
        )
    return SYSTEM_TEMPLATE.format(
        response_format=response_format,
        cross=CROSS_NOTE if mode == "cross" else "",
        feed_vp=g.feed_viewport,
        ipv_vp=g.ipv_viewport,
        feed_max=g.max_feed_scroll,
        ipv_max=g.max_ipv_scroll,
    )


def profile_text(profile: dict[str, str | None], extra: str | None) -> str:
    parts = [f"{name}: {clean(profile.get(name)) or 'unknown'}" for name in PROFILE_FIELDS]
    text = "; ".join(parts)
    if extra and extra != "{}":
        text += f"; other: {clean(extra)}"
    return text


def titles_text(titles: list[str | None], limit: int) -> str:
    lines = [f"- {clean(t) or UNKNOWN_ITEM}" for t in titles[:limit]]
    return "\n".join(lines) if lines else "(none)"


def summarize(obs: Observation) -> str:
    """One-line observation summary used in the history window."""
    if obs.screen == "feed":
        return f"feed at {fmt_px(obs.scroll_top)}, {len(obs.cards)} items in view"
    page = obs.page or DetailPage()
    title = clean(page.title) or UNKNOWN_ITEM
    return f"detail page of {title} at {fmt_px(page.scroll)}, panel {panel_of(page.ui_state)}"


def past_step(
    step: int,
    observation: Observation,
    action: dict[str, Any],
    *,
    rationale: str | None = None,
    session: int | None = None,
    gap_s: float | None = None,
) -> PastStep:
    """A window entry for an accepted step, as the environment records it after acting."""
    return PastStep(
        step=step,
        session=session,
        gap_s=gap_s,
        summary=summarize(observation),
        action=action,
        rationale=rationale,
    )


def window_line(past: PastStep, mode: Mode) -> str:
    head = ""
    if mode == "cross" and past.gap_s is not None:
        head = f"-- session {past.session} started {fmt_gap(past.gap_s)} after the previous one --\n"
    label = f"session {past.session} step {past.step}" if mode == "cross" else f"step {past.step}"
    thought = f" | thought: {clean(past.rationale)}" if past.rationale else ""
    return f"{head}{label}: {past.summary}{thought} | action: {to_json(past.action)}"


def card_line(index: int, card: Card) -> str:
    """A card in view; its id right after its title, as a click response writes them one after the
    other (a short copy for a small model), then price and top category."""
    title = clean(card.title) or UNKNOWN_ITEM
    category = clean(card.category_l1) or "n/a"
    return f"{index}. {title} | id {card.item_id} | {fmt_price(card.price)} | {category}"


def review_line(index: int, text: str | None, max_chars: int) -> str:
    body = clean(text)
    if len(body) > max_chars:
        body = body[:max_chars] + "…"
    return f"C{index}: {body}"


def done_text(done: dict[str, int]) -> str:
    parts = [f"{name} x{done[name]}" for name in DONE_ACTIONS if done.get(name, 0) > 0]
    return ", ".join(parts) if parts else "nothing yet"


def feed_text(obs: Observation) -> str:
    head = f"Screen: feed\nScroll position: {fmt_px(obs.scroll_top)} of max {fmt_px(obs.max_scroll)}"
    if not obs.cards:
        return f"{head}\nItems in view: none"
    cards = "\n".join(card_line(i, c) for i, c in enumerate(obs.cards, start=1))
    return f"{head}\nItems in view ({len(obs.cards)}):\n{cards}"


def page_text(page: DetailPage, settings: PromptSettings) -> str:
    lines = [
        "Screen: detail page",
        f"Item: {clean(page.title) or UNKNOWN_ITEM}",
        f"Price: {fmt_price(page.price)}",
        f"Category: {clean(page.category) or 'n/a'}",
        f"Page position: {fmt_px(page.scroll)}",
        f"Open panel: {panel_of(page.ui_state)}",
    ]
    if params_open(page.ui_state):
        params = "; ".join(f"{clean(p.label)}: {clean(p.value)}" for p in page.params)
        lines.append(f"Parameters: {params or 'none'}")
    shown = reviews_shown(page, settings)
    if shown:
        body = "\n".join(review_line(i, r, settings.review_chars) for i, r in enumerate(shown, 1))
        lines.append(f"Reviews (open one by its alias):\n{body}")
    elif reviews_open(page.ui_state):
        lines.append("Reviews: none")
    lines.append(f"Already done on this item: {done_text(page.done)}")
    return "\n".join(lines)


def observation_text(obs: Observation, settings: PromptSettings) -> str:
    return feed_text(obs) if obs.screen == "feed" else page_text(obs.page or DetailPage(), settings)


def actions_text(obs: Observation, settings: PromptSettings) -> str:
    signatures = action_signatures(settings.geometry)
    if settings.click_ids:
        signatures["click"] = click_ids_signature([c.item_id for c in obs.cards])
    return "\n".join(f"- {signatures[name]}" for name in legal_actions(obs, settings))


def window_header(mode: Mode, size: int) -> str:
    scope = "across your sessions" if mode == "cross" else "of this session"
    return f"## Interaction history (last {size} steps {scope}, oldest first)"


CLOSING = "Choose your next action and reply with the JSON object only."


def render_prompt(state: State, settings: PromptSettings | None = None) -> str:
    """The user message of one state."""
    s = settings or PromptSettings()
    size = s.window(state.mode)
    recent = state.window[-size:] if size > 0 else []
    window = "\n".join(window_line(p, state.mode) for p in recent) or "(none yet)"
    sections = [
        f"## Shopper profile\n{profile_text(state.profile, state.profile_extra)}",
        f"## Recent purchases (newest first)\n{titles_text(state.recent_buys, s.recent_buys)}",
        f"## Recent clicks (newest first)\n{titles_text(state.recent_clicks, s.recent_clicks)}",
        f"{window_header(state.mode, size)}\n{window}",
        f"## Current observation\n{observation_text(state.observation, s)}",
        f"## Executable actions\n{actions_text(state.observation, s)}",
        CLOSING,
    ]
    return "\n\n".join(sections)


def render_state(state: State, settings: PromptSettings | None = None) -> list[dict[str, str]]:
    """Chat messages [system, user] for one state: what the simulator is shown."""
    s = settings or PromptSettings()
    return [
        {"role": "system", "content": system_prompt(state.mode, s.geometry, s.system, s.response_order)},
        {"role": "user", "content": render_prompt(state, s)},
    ]
