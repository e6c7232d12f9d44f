"""Intent extraction: one set of typed anchors per training trajectory, LLM or offline rules.

The LLM sees a compact account of the trajectory (profile, per session: how much
of the feed was covered, what was in view, each detail-page visit with its
title, price, category, what was looked at and how it ended). Its answer must
pass ``check_intent``: the rendered intent text against everything the
trajectory contains.
"""

from __future__ import annotations

from collections import Counter

from extractors.answer import AnswerOutcome, Provenance, ask_until_clean, judged_locally
from extractors.client import LLMClient, Stats
from extractors.heuristic import MODEL, VERSION, Visit, heuristic_intent, rules_hash, visits
from extractors.leakage import Violation, check_intent_text
from extractors.prompts import INTENT_V1
from extractors.schemas import Intent
from extractors.trajectory import IntentJob, Item, Step

PROMPT = INTENT_V1

_INFO_WORDS = {
    "ipv_click_param": "read the specifications",
    "ipv_enter_comment": "opened the reviews",
    "ipv_click_comment": "read a review",
    "ipv_swipe_pic": "looked through pictures",
    "ipv_scroll_down": "read further down the page",
}
_DECISION_WORDS = {
    "return": "went back to the feed",
    "cart": "added it to the cart",
    "buy": "bought it",
    "end": "ended the session there",
    "open": "left it open",
}


def check_intent(intent: Intent, job: IntentJob) -> list[Violation]:
    return check_intent_text(intent.render(), job.index)


def render_trajectory(job: IntentJob) -> str:
    profile = "; ".join(f"{k}: {v}" for k, v in job.timeline.profile.items() if v) or "unknown"
    blocks = [f"## Shopper profile\n{profile}"]
    for n, session in enumerate(job.session_ids, start=1):
        steps = [s for s in job.steps if s.session_id == session]
        blocks.append(f"## Session {n} ({len(steps)} actions)\n" + _session_text(steps, job.items))
    return "\n\n".join(blocks)


def _session_text(steps: list[Step], items: dict[str, Item]) -> str:
    moves = sum(s.action in ("scroll_down", "scroll_up") for s in steps)
    in_view = Counter(
        items[i].leaf for s in steps if s.screen == "feed" for i in s.visible_items if i in items
    )
    top = ", ".join(f"{leaf} ({k})" for leaf, k in in_view.most_common(5)) or "nothing recorded"
    lines = [f"Feed: {moves} scrolls; mostly in view: {top}"]
    lines += [_visit_line(v, items) for v in visits(steps)]
    last = steps[-1] if steps else None
    if last is not None:
        lines.append("Ended the session." if last.action == "end" else "The log stops here.")
    return "\n".join(lines)


def _visit_line(visit: Visit, items: dict[str, Item]) -> str:
    item = items.get(visit.item_id or "")
    label = f'"{item.title}" ({_price(item)}; {item.category})' if item else "an item"
    looked = ", ".join(f"{_INFO_WORDS[a]} x{k}" for a, k in visit.info.items()) or "nothing else"
    return f"Detail page of {label}: {looked}; then {_DECISION_WORDS[visit.decision]}"


def _price(item: Item) -> str:
    return f"{item.price:.2f}" if item.price is not None else "price unknown"


async def intent_llm(client: LLMClient, job: IntentJob) -> AnswerOutcome[Intent]:
    messages = PROMPT.messages(trajectory=render_trajectory(job))
    return await ask_until_clean(
        client,
        PROMPT,
        messages,
        Intent,
        lambda i: check_intent(i, job),
        max_reasks=client.settings.max_reasks,
    )


def intent_heuristic(job: IntentJob, stats: Stats) -> AnswerOutcome[Intent]:
    prov = Provenance("heuristic", MODEL, VERSION, rules_hash())
    return judged_locally(heuristic_intent(job.steps, job.items), lambda i: check_intent(i, job), prov, stats)
