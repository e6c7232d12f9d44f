"""The simulator's response, parsed and resolved against what is on screen (PROTOCOL.md §2).

Two steps, so the trainer's parse-rate check and the evaluation environment share
one implementation:

1. ``parse_response`` turns text into a ``Candidate`` (the action as written) or a
   ``Rejected`` with ``parse_failure``: pure text, no state needed.
2. ``resolve`` checks a candidate against one ``Observation``: the action must be
   one of the 13 (``unknown_action``), executable here (``illegal_in_state``, the
   renderer's own ``legal_actions``), and its argument must name something in view
   (``target_unresolved``). The result is an ``Accepted`` action or the reason.

The reasons are checked in the order of ``REJECT_REASONS``: the first that applies wins.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from transforms.prompts.render import (
    Card,
    DetailPage,
    Observation,
    PromptSettings,
    clean,
    gold_action,
    legal_actions,
    reviews_shown,
)
from transforms.schemas import ACTIONS

REJECT_REASONS: tuple[str, ...] = ("parse_failure", "unknown_action", "illegal_in_state", "target_unresolved")
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
FEED_SCROLLS: tuple[str, ...] = ("scroll_down", "scroll_up")
PAGE_SCROLLS: tuple[str, ...] = ("ipv_scroll_down", "ipv_scroll_up")


@dataclass(frozen=True)
class Candidate:
    """An action as the response wrote it, arguments not yet checked against the screen."""

    type: str
    rationale: str
    target: str | None = None
    target_item_id: str | None = None
    distance: Any = None  # the JSON value as written: checked by ``resolve``


@dataclass(frozen=True)
class Accepted:
    """An executable action with its resolved argument."""

    type: str
    rationale: str = ""
    target_item_id: str | None = None  # click: the card opened
    target_title: str | None = None  # click: that card's title
    review_alias: str | None = None  # ipv_click_comment: "C1", "C2", ...
    distance: int | None = None  # scrolls: px

    def action_object(self) -> dict[str, Any]:
        """The PROTOCOL.md §2 action object, as the history window shows it."""
        return gold_action(
            self.type,
            target_title=self.target_title,
            target_item_id=self.target_item_id,
            review_alias=self.review_alias,
            distance=self.distance,
        )


@dataclass(frozen=True)
class Rejected:
    """A response that does not become an action: one of ``REJECT_REASONS`` and why."""

    reason: str
    detail: str
    type: str | None = None  # the action type asked for, once the response parsed


Verdict = Accepted | Rejected


def strip_thinking(text: str) -> str:
    """Drop one complete leading ``<think>…</think>`` block; anything else is left for the JSON check."""
    leading = text.lstrip()
    if not leading.startswith(THINK_OPEN):
        return text
    body, closing, rest = leading[len(THINK_OPEN) :].partition(THINK_CLOSE)
    if not closing or THINK_OPEN in body:
        return text
    return rest


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _failure(detail: str) -> Rejected:
    return Rejected("parse_failure", detail)


def parse_response(text: str) -> Candidate | Rejected:
    """The response's action, or ``parse_failure`` when it is not the strict JSON shape of §2."""
    try:
        payload = json.loads(strip_thinking(text), parse_constant=_refuse_constant)
    except ValueError as error:  # JSONDecodeError is a ValueError, so are NaN / Infinity
        return _failure(f"not JSON: {error}")
    if not isinstance(payload, dict):
        return _failure("the response is not a JSON object")
    if not isinstance(payload.get("rationale"), str):
        return _failure("rationale is not a string")
    action = payload.get("action")
    if not isinstance(action, dict):
        return _failure("action is not an object")
    kind = action.get("type")
    if not isinstance(kind, str) or not kind.strip():
        return _failure("action.type is not a non-empty string")
    for key in ("target", "target_item_id"):
        if action.get(key) is not None and not isinstance(action[key], str):
            return _failure(f"action.{key} is not a string")
    return Candidate(
        type=kind,
        rationale=payload["rationale"],
        target=action.get("target"),
        target_item_id=action.get("target_item_id"),
        distance=action.get("distance"),
    )


def parse_rate(texts: Iterable[str]) -> float:
    """Share of ``texts`` in the response format (not ``parse_failure``); 0.0 for no texts."""
    verdicts = [parse_response(t) for t in texts]
    return sum(isinstance(v, Candidate) for v in verdicts) / len(verdicts) if verdicts else 0.0


def _unresolved(candidate: Candidate, detail: str) -> Rejected:
    return Rejected("target_unresolved", detail, candidate.type)


def _click_card(candidate: Candidate, cards: list[Card]) -> Card | None:
    """The id alone decides when given; else the exact title (as shown, or as catalogued)."""
    if candidate.target_item_id is not None:
        return next((c for c in cards if c.item_id == candidate.target_item_id), None)
    if not candidate.target:
        return None
    return next((c for c in cards if candidate.target in (c.title, clean(c.title))), None)


def _scroll_limit(kind: str, settings: PromptSettings) -> int | float:
    geometry = settings.geometry
    return geometry.max_feed_scroll if kind in FEED_SCROLLS else geometry.max_ipv_scroll


def _resolve_argument(candidate: Candidate, obs: Observation, settings: PromptSettings) -> Verdict:
    kind = candidate.type
    if kind == "click":
        card = _click_card(candidate, obs.cards)
        if card is None:
            return _unresolved(candidate, "no card in view has that id or title")
        return Accepted(kind, candidate.rationale, target_item_id=card.item_id, target_title=card.title)
    if kind == "ipv_click_comment":
        aliases = [f"C{n}" for n in range(1, len(reviews_shown(obs.page or DetailPage(), settings)) + 1)]
        if candidate.target not in aliases:
            return _unresolved(candidate, f"review alias not in view (in view: {', '.join(aliases)})")
        return Accepted(kind, candidate.rationale, review_alias=candidate.target)
    if kind in FEED_SCROLLS or kind in PAGE_SCROLLS:
        distance, limit = candidate.distance, _scroll_limit(kind, settings)
        # type(...) is int: JSON true parses to a bool (an int subclass) and 100.0 to a float
        if type(distance) is not int:
            return _unresolved(candidate, "distance is not a plain integer")
        if not 1 <= distance <= limit:
            return _unresolved(candidate, f"distance {distance} outside 1..{limit}")
        return Accepted(kind, candidate.rationale, distance=distance)
    return Accepted(kind, candidate.rationale)


def resolve(candidate: Candidate, obs: Observation, settings: PromptSettings | None = None) -> Verdict:
    """``candidate`` checked against ``obs``: the action, or the first rejection reason that applies."""
    s = settings or PromptSettings()
    if candidate.type not in ACTIONS:
        return Rejected("unknown_action", f"{candidate.type!r} is not one of the 13 actions", candidate.type)
    if candidate.type not in legal_actions(obs, s):
        return Rejected("illegal_in_state", f"{candidate.type} is not executable here", candidate.type)
    return _resolve_argument(candidate, obs, s)


def judge_response(text: str, obs: Observation, settings: PromptSettings | None = None) -> Verdict:
    """Parse ``text`` and resolve it against ``obs`` in one call."""
    parsed = parse_response(text)
    return parsed if isinstance(parsed, Rejected) else resolve(parsed, obs, settings)
