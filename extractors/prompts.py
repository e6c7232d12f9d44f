"""Versioned prompt templates. Changing any text means a new version (and so a new hash).

Every extracted record carries ``prompt_version`` and ``prompt_hash``; the hash
covers the version, the system text, the user template and the JSON schema, so
two records with the same hash were asked exactly the same way.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from extractors.leakage import Violation, describe
from extractors.schemas import INTENT_JSON_SCHEMA, RATIONALE_JSON_SCHEMA

Message = dict[str, str]


@dataclass(frozen=True)
class PromptTemplate:
    name: str  # also the json_schema name sent to the server
    version: str
    system: str
    user: str  # str.format template
    schema: dict[str, Any] = field(compare=False)

    @cached_property
    def hash(self) -> str:
        payload = json.dumps([self.version, self.system, self.user, self.schema], sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def messages(self, **fields: str) -> list[Message]:
        return [
            {"role": "system", "content": self.system},
            {"role": "user", "content": self.user.format(**fields)},
        ]


INTENT_V1 = PromptTemplate(
    name="intent",
    version="intent-v1",
    system="""\
You study one shopper's recorded behaviour on a shopping app and describe their latent intent as a few
abstract, typed anchors that explain how they shop.

Anchor types:
- preference: attributes they are drawn to
- concern: what makes them hesitate
- information_need: what they look for before deciding
- comparison_criterion: how they weigh alternatives
- conditional_tendency: if-then decision habits

Give one to three anchors for each type the evidence supports (leave out a type without evidence). Each
anchor is a short abstract phrase of at most 20 words, with a confidence between 0 and 1.

The intent must not be an answer key. Never mention:
- what the shopper did or what happened: no action or outcome words in any form (click, tap, scroll,
  swipe, open, view, cart, buy, purchase, order, check out, leave, exit, end, return, go back);
- specific items: no titles, brand or model names, no distinctive words taken from titles;
- identifiers of any kind (item, user or session ids, SKU-like codes);
- prices or amounts of money: describe price level in words ("budget-conscious", "premium");
- steps, sessions, moments or positions ("at step 5", "the third item", "the first session").
Describe the person, not the log.

Answer with JSON only, exactly of this shape:
{"anchors": [{"type": "<one of the five types>", "text": "<phrase>", "confidence": <number 0..1>}]}""",
    user="""\
{trajectory}

Write this shopper's intent anchors as JSON.""",
    schema=INTENT_JSON_SCHEMA,
)

RATIONALE_V1 = PromptTemplate(
    name="rationale",
    version="rationale-v1",
    system="""\
You reconstruct why a shopper took a recorded action on a shopping app. You see what they saw (their
profile, recent history and the current screen) and the action they actually took next. Write the short
first-person reason, at most 40 words, that would lead a shopper to exactly that action.

Rules:
- stay consistent with the recorded action: do not describe doing anything else;
- refer only to what is on the screen now or was seen before; never anything that comes later;
- no item, user or session identifiers and no step numbers.

Answer with JSON only, exactly of this shape: {"rationale": "<first-person reason>"}""",
    user="""\
{context}

## Recorded next action
{action}

Write the shopper's reason for this action as JSON.""",
    schema=RATIONALE_JSON_SCHEMA,
)


def repair_message(problems: list[Violation]) -> Message:
    """The follow-up turn after a rejected answer: the violations, listed."""
    return {
        "role": "user",
        "content": "Your answer was rejected for these reasons:\n"
        f"{describe(problems)}\n"
        "Write it again without them, keeping the same JSON shape. Answer with JSON only.",
    }
