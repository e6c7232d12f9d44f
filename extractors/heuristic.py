"""The offline backend: intents and rationales derived by rules from trajectory statistics.

No model is involved; provenance says ``backend="heuristic"``, ``model="rules"``
and a hash of this module's source, so a rule change is a new prompt hash.
Every output passes through the same leakage checker as an LLM answer: the
rules only use abstract words and category names (which no single item owns),
never titles, ids, prices or step numbers.
"""

from __future__ import annotations

import hashlib
import inspect
import sys
from collections import Counter
from dataclasses import dataclass, field
from functools import cache

from extractors.schemas import Anchor, Intent
from extractors.trajectory import Item, RationaleJob, Step, median_price

VERSION = "heuristic-v1"
MODEL = "rules"
INFO_ACTIONS = (
    "ipv_click_param",
    "ipv_enter_comment",
    "ipv_click_comment",
    "ipv_swipe_pic",
    "ipv_scroll_down",
)
FEED_MOVES = ("scroll_down", "scroll_up")


@cache
def rules_hash() -> str:
    source = inspect.getsource(sys.modules[__name__])
    return hashlib.sha256(f"{VERSION}\n{source}".encode()).hexdigest()[:16]


# --- detail-page visits (PROTOCOL.md §4) -----------------------------------------------------


@dataclass
class Visit:
    item_id: str | None
    info: Counter[str] = field(default_factory=Counter)
    decision: str = "open"  # return | cart | buy | end | open


_DECISIONS = {"back_home": "return", "ipv_cart": "cart", "ipv_buy": "buy", "end": "end"}


def visits(steps: list[Step]) -> list[Visit]:
    """A feed click opens a visit, a feed step closes it; the decision is the first of return/cart/buy/end."""
    out: list[Visit] = []
    current: Visit | None = None
    for s in steps:
        if s.screen == "feed":
            current = None
            if s.action == "click":
                current = Visit(s.target_item_id)
                out.append(current)
            continue
        if current is None:  # a detail page without a recorded click (e.g. the session starts there)
            current = Visit(s.ipv_item_id)
            out.append(current)
        if s.action in INFO_ACTIONS:
            current.info[s.action] += 1
        if current.decision == "open" and s.action in _DECISIONS:
            current.decision = _DECISIONS[s.action]
    return out


@dataclass(frozen=True)
class Profile:
    """Trajectory statistics the rules read."""

    visits: list[Visit]
    leaves: Counter[str]  # categories of visited items
    seen_leaves: Counter[str]  # categories of everything on screen
    feed_moves: int
    price_ratio: float | None  # median visited price / median price on screen

    @classmethod
    def of(cls, steps: list[Step], items: dict[str, Item]) -> Profile:
        vs = visits(steps)
        visited = [items[v.item_id] for v in vs if v.item_id in items]
        shown = [items[i] for i in dict.fromkeys(i for s in steps for i in s.shown()) if i in items]
        mv, ms = median_price(visited), median_price(shown)
        return cls(
            visits=vs,
            leaves=Counter(i.leaf for i in visited),
            seen_leaves=Counter(i.leaf for i in shown),
            feed_moves=sum(s.action in FEED_MOVES for s in steps),
            price_ratio=mv / ms if mv is not None and ms else None,
        )

    @property
    def info(self) -> Counter[str]:
        return sum((v.info for v in self.visits), Counter())

    @property
    def decisions(self) -> Counter[str]:
        return Counter(v.decision for v in self.visits)


def _confidence(evidence: int, base: float = 0.3) -> float:
    return round(min(0.9, base + 0.1 * evidence), 2)


# --- intents ---------------------------------------------------------------------------------


def heuristic_intent(steps: list[Step], items: dict[str, Item]) -> Intent:
    p = Profile.of(steps, items)
    anchors = [
        *_category_preference(p),
        *_price_preference(p),
        *_information_need(p),
        _concern(p),
        _comparison(p),
        _tendency(p),
    ]
    return Intent(anchors=anchors)


def _category_preference(p: Profile) -> list[Anchor]:
    if p.leaves:
        top = [leaf for leaf, _ in p.leaves.most_common(2)]
        share = sum(p.leaves[t] for t in top) / sum(p.leaves.values())
        return [
            Anchor(
                type="preference",
                text=f"drawn to {' and '.join(top)}",
                confidence=round(0.3 + 0.6 * share, 2),
            )
        ]
    if p.seen_leaves:
        leaf = p.seen_leaves.most_common(1)[0][0]
        return [
            Anchor(
                type="preference", text=f"curious about {leaf} without a clear favourite yet", confidence=0.3
            )
        ]
    return []


def _price_preference(p: Profile) -> list[Anchor]:
    if p.price_ratio is None:
        return []
    if p.price_ratio < 0.8:
        text = "leans toward budget-friendly options"
    elif p.price_ratio > 1.25:
        text = "comfortable with premium-priced options"
    else:
        text = "favours mid-range prices"
    return [Anchor(type="preference", text=text, confidence=_confidence(len(p.visits)))]


_INFO_TEXT = {
    "reviews": "relies on other shoppers' reviews before deciding",
    "ipv_click_param": "checks the specifications before deciding",
    "ipv_swipe_pic": "looks closely at product photos",
    "ipv_scroll_down": "reads the full product description",
}


def _information_need(p: Profile) -> list[Anchor]:
    if not p.visits:
        return []
    info = p.info
    kinds = Counter(
        {
            "reviews": info["ipv_enter_comment"] + info["ipv_click_comment"],
            "ipv_click_param": info["ipv_click_param"],
            "ipv_swipe_pic": info["ipv_swipe_pic"],
            "ipv_scroll_down": info["ipv_scroll_down"],
        }
    )
    top = [(k, n) for k, n in kinds.most_common(2) if n > 0]
    if not top:
        return [Anchor(type="information_need", text="judges mostly from a first impression", confidence=0.4)]
    return [Anchor(type="information_need", text=_INFO_TEXT[k], confidence=_confidence(n)) for k, n in top]


def _concern(p: Profile) -> Anchor:
    d, n = p.decisions, len(p.visits)
    if not n:
        text, evidence = "rarely finds an option worth a closer look", p.feed_moves
    elif d["return"] / n >= 0.5:
        text, evidence = "often unconvinced once the full details are in front of them", d["return"]
    elif sum(p.info.values()) >= 3 and not (d["cart"] or d["buy"]):
        text, evidence = "hesitates until doubts about quality or fit are settled", sum(p.info.values())
    elif d["cart"] and not d["buy"]:
        text, evidence = "holds off on a final commitment even when an option appeals", d["cart"]
    else:
        text, evidence = "few hesitations once an option matches the need", d["buy"]
    return Anchor(type="concern", text=text, confidence=_confidence(evidence))


def _comparison(p: Profile) -> Anchor:
    repeated = [leaf for leaf, k in p.leaves.items() if k >= 2]
    if repeated:
        return Anchor(
            type="comparison_criterion",
            text=f"weighs similar {repeated[0]} against each other",
            confidence=_confidence(p.leaves[repeated[0]]),
        )
    per_visit = p.feed_moves / max(1, len(p.visits))
    if per_visit >= 4:
        text = "compares many alternatives before narrowing down"
    elif p.visits and per_visit <= 1.5:
        text = "settles on a shortlist quickly"
    else:
        text = "weighs a handful of alternatives side by side"
    return Anchor(type="comparison_criterion", text=text, confidence=_confidence(p.feed_moves // 3))


def _tendency(p: Profile) -> Anchor:
    d = p.decisions
    committed = [v for v in p.visits if v.decision in ("cart", "buy")]
    if committed:
        studied = sum(bool(v.info) for v in committed)
        text = (
            "commits only after the details confirm the choice"
            if studied * 2 >= len(committed)
            else "commits quickly when an option matches at first glance"
        )
        return Anchor(type="conditional_tendency", text=text, confidence=_confidence(len(committed), 0.4))
    if p.visits:
        return Anchor(
            type="conditional_tendency",
            text="keeps options open rather than committing right away",
            confidence=_confidence(d["return"] + d["open"]),
        )
    return Anchor(
        type="conditional_tendency", text="moves on quickly when nothing stands out", confidence=0.3
    )


# --- rationales ------------------------------------------------------------------------------

_FIXED = {
    "scroll_up": "I want another look at something I passed a moment ago, so I'll move back up.",
    "ipv_scroll_down": "I want to see more of this item's details further down the page before deciding.",
    "ipv_scroll_up": "I want to check something near the top of this page again.",
    "ipv_swipe_pic": "I want to see more pictures to judge how it really looks.",
    "ipv_click_param": "I need the specifications to check whether it suits my needs.",
    "ipv_enter_comment": "I'd like to hear what other shoppers say about it before deciding.",
    "ipv_click_comment": "This review looks informative, so I'll read it in full.",
    "back_home": "This one doesn't quite convince me, so I'll head back to the feed and keep looking.",
}


def heuristic_rationale(job: RationaleJob) -> str:
    """A first-person reason from the recorded action and what the shopper has done so far."""
    action = job.action
    if action in _FIXED:
        return _FIXED[action]
    past = job.timeline.steps[: job.position]
    items = job.timeline.items
    if action == "scroll_down":
        return _scroll_down(past, items)
    if action == "click":
        return _click(job, past, items)
    if action in ("ipv_cart", "ipv_buy"):
        return _commit(action, _visit_so_far(past))
    if action == "end":
        done = any(s.action in ("ipv_cart", "ipv_buy") for s in past)
        if done:
            return "I've found what I came for, so I'm done for now."
        return "Nothing here is convincing enough today, so I'll stop browsing for now."
    return "This seems like the right next move for what I want."


def _favourite(past: list[Step], items: dict[str, Item]) -> str | None:
    leaves = Counter(
        items[s.target_item_id].leaf for s in past if s.action == "click" and s.target_item_id in items
    )
    return leaves.most_common(1)[0][0] if leaves else None


def _scroll_down(past: list[Step], items: dict[str, Item]) -> str:
    favourite = _favourite(past, items)
    if favourite:
        return (
            f"I'm still hoping for more {favourite} like the ones I liked, so I'll keep looking further down."
        )
    return "Nothing in view really matches what I'm after yet, so I'll keep looking further down."


def _click(job: RationaleJob, past: list[Step], items: dict[str, Item]) -> str:
    target = items.get(job.current.target_item_id or "")
    if target is None:
        return "Something in view catches my eye, so I'll take a closer look."
    if target.leaf == _favourite(past, items):
        return f"More {target.leaf} like the ones I've been considering; this one looks worth checking."
    return f"One of the {target.leaf} here catches my eye and might suit me, so I'll take a closer look."


def _visit_so_far(past: list[Step]) -> list[Step]:
    """The current detail-page visit's earlier steps."""
    visit: list[Step] = []
    for s in reversed(past):
        if s.screen == "feed":
            break
        visit.append(s)
    return visit


def _commit(action: str, visit: list[Step]) -> str:
    studied = any(s.action in INFO_ACTIONS for s in visit)
    if action == "ipv_cart":
        if studied:
            return "The details check out and it suits me; I'll save it in my cart for now."
        return "It fits what I want at first glance; I'll save it in my cart to decide later."
    if studied:
        return "The details reassure me and it meets my needs, so I'll buy it."
    return "It's exactly what I need, so I'll buy it now."
