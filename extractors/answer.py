"""Ask until the checker is satisfied: the re-ask loop shared by intents and rationales.

An answer that is not the requested JSON, or that the checker rejects, is
re-asked with the violations listed (up to ``max_reasks`` times); then the job
is quarantined with its reasons. A stopped client (budget, fatal HTTP status)
leaves the job *pending*: neither kept nor quarantined, and resumable.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, Literal, TypeVar

from pydantic import BaseModel

from extractors.client import ExtractionStopped, LLMClient, RequestFailed, Stats
from extractors.leakage import LEAK_CODES, Violation
from extractors.prompts import Message, PromptTemplate, repair_message
from extractors.schemas import AnswerError, parse_answer

M = TypeVar("M", bound=BaseModel)
Status = Literal["ok", "quarantined", "pending"]
FORMAT_CODES = frozenset({"invalid_json", "schema_mismatch"})


@dataclass
class Provenance:
    backend: str
    model: str
    prompt_version: str
    prompt_hash: str
    tokens_in: int = 0
    tokens_out: int = 0
    attempts: int = 0  # answers asked for (1 + re-asks)
    cached: bool = False  # every answer came from the response cache
    request_key: str | None = None  # cache key of the accepted answer


@dataclass
class Outcome(Generic[M]):
    status: Status
    value: M | None
    provenance: Provenance
    rejected: list[Violation] = field(default_factory=list)  # of every rejected answer
    reason: str | None = None  # quarantine reason
    last_text: str | None = None

    def detail(self) -> str:
        return json.dumps([v.__dict__ for v in self.rejected], ensure_ascii=False)

    def rejected_codes(self) -> list[str]:
        return sorted({v.code for v in self.rejected})


def reason_for(problems: list[Violation]) -> str:
    """Quarantine reason family of the last rejected answer."""
    codes = {p.code for p in problems}
    if codes & FORMAT_CODES:
        return "invalid_answer"
    if codes & set(LEAK_CODES):
        return "leakage"
    return "check_failed"


async def ask_until_clean(
    client: LLMClient,
    template: PromptTemplate,
    messages: list[Message],
    model: type[M],
    check: Callable[[M], list[Violation]],
    *,
    max_reasks: int,
) -> Outcome[M]:
    prov = Provenance("openai", client.settings.model, template.version, template.hash, cached=True)
    history = list(messages)
    rejected: list[Violation] = []
    problems: list[Violation] = []
    text: str | None = None
    for attempt in range(max_reasks + 1):
        try:
            answer = await client.complete(template, history)
        except ExtractionStopped:
            return Outcome("pending", None, prov, rejected, None, text)
        except RequestFailed as exc:
            failed = [Violation("request_failed", "", str(exc))]
            return Outcome("quarantined", None, prov, rejected + failed, "request_failed", text)
        prov.attempts += 1
        prov.tokens_in += answer.tokens_in
        prov.tokens_out += answer.tokens_out
        prov.cached = prov.cached and answer.cached
        text = answer.text
        value, problems = _judge(text, model, check)
        if not problems:
            prov.request_key = answer.key
            return Outcome("ok", value, prov, rejected, None, text)
        rejected += problems
        client.stats.rejects.update(p.code for p in problems)
        client.stats.reasks += attempt < max_reasks
        history += [{"role": "assistant", "content": text}, repair_message(problems)]
    return Outcome("quarantined", None, prov, rejected, reason_for(problems), text)


def _judge(
    text: str, model: type[M], check: Callable[[M], list[Violation]]
) -> tuple[M | None, list[Violation]]:
    try:
        value = parse_answer(text, model)
    except AnswerError as exc:
        return None, [Violation(exc.code, text[:80], exc.detail)]
    return value, check(value)


def judged_locally(
    value: M, check: Callable[[M], list[Violation]], prov: Provenance, stats: Stats
) -> Outcome[M]:
    """An offline backend's output goes through the same checker; a failure is quarantined too."""
    prov.attempts = 1
    problems = check(value)
    if problems:
        stats.rejects.update(p.code for p in problems)
        return Outcome("quarantined", None, prov, problems, reason_for(problems), str(value))
    return Outcome("ok", value, prov)
