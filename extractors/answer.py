"""Ask until the checker is satisfied: the re-ask loop shared by intents and rationales.

An answer that is not the requested JSON, or that the checker rejects, is
re-asked with the violations listed (up to ``max_reasks`` times); then the job
is quarantined with its reasons. A stopped client (budget, fatal HTTP status)
leaves the job *pending*: neither kept nor quarantined, and resumable.

Answers are read leniently. A server that does not enforce ``response_format``
(``transformers serve``, many proxies) returns what the model writes: JSON inside
code fences, prose before or after it, a second object echoing the action. When
the answer as a whole is not the requested JSON, every top-level balanced
``{...}`` in it is tried in order and the first that validates against the
pydantic model is taken. Nothing is repaired or guessed: an object that is cut
off, or of the wrong shape, is re-asked with what was wrong.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
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
_THINK = re.compile(r"^\s*<think>.*?</think>", re.DOTALL)


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
class AnswerOutcome(Generic[M]):
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
) -> AnswerOutcome[M]:
    prov = Provenance("openai", client.settings.model, template.version, template.hash, cached=True)
    history = list(messages)
    rejected: list[Violation] = []
    problems: list[Violation] = []
    text: str | None = None
    for attempt in range(max_reasks + 1):
        try:
            answer = await client.complete(template, history)
        except ExtractionStopped:
            return AnswerOutcome("pending", None, prov, rejected, None, text)
        except RequestFailed as exc:
            failed = [Violation("request_failed", "", str(exc))]
            return AnswerOutcome("quarantined", None, prov, rejected + failed, "request_failed", text)
        prov.attempts += 1
        prov.tokens_in += answer.tokens_in
        prov.tokens_out += answer.tokens_out
        prov.cached = prov.cached and answer.cached
        text = answer.text
        value, problems = _judge(text, model, check, client.stats)
        if not problems:
            prov.request_key = answer.key
            return AnswerOutcome("ok", value, prov, rejected, None, text)
        rejected += problems
        client.stats.rejects.update(p.code for p in problems)
        client.stats.reasks += attempt < max_reasks
        history += [{"role": "assistant", "content": text}, repair_message(problems)]
    return AnswerOutcome("quarantined", None, prov, rejected, reason_for(problems), text)


def balanced_objects(text: str) -> Iterator[str]:
    """Each top-level ``{...}`` span of ``text`` whose braces balance, in order.

    Braces inside JSON strings (escapes honoured) do not count; an object that is
    never closed yields nothing, and neither do the objects nested in it.
    """
    depth, start, in_string, escaped = 0, 0, False, False
    for i, char in enumerate(text):
        if depth == 0:
            if char == "{":
                depth, start = 1, i
        elif in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                yield text[start : i + 1]


def parse_lenient(text: str, model: type[M]) -> tuple[M, bool]:
    """The answer validated against ``model``, and whether it had to be dug out of surrounding text.

    Strict first (the whole answer, a fence or a leading <think> block allowed),
    then the first balanced object that validates. Raises ``AnswerError``: the
    shape error of the first JSON object found, or ``invalid_json`` when the
    answer holds no complete object.
    """
    try:
        return parse_answer(text, model), False
    except AnswerError as strict:
        error = strict
    body = _THINK.sub("", text, count=1)
    found = False
    for span in balanced_objects(body):
        found = True
        try:
            return parse_answer(span, model), True
        except AnswerError as exc:
            if error.code == "invalid_json" and exc.code == "schema_mismatch":
                error = exc  # a JSON object of the wrong shape says more than the prose around it
    if not found:
        cut = "an object is opened but never closed (cut off?)" if "{" in body else "no JSON object"
        error = AnswerError("invalid_json", f"{cut}; answer with one JSON object")
    raise error


def _judge(
    text: str, model: type[M], check: Callable[[M], list[Violation]], stats: Stats
) -> tuple[M | None, list[Violation]]:
    try:
        value, recovered = parse_lenient(text, model)
    except AnswerError as exc:
        # the re-ask shows ``match`` to the model: say what is wrong, not the answer it wrote
        return None, [Violation(exc.code, exc.detail, text[:80])]
    stats.recovered_json += recovered
    return value, check(value)


def judged_locally(
    value: M, check: Callable[[M], list[Violation]], prov: Provenance, stats: Stats
) -> AnswerOutcome[M]:
    """An offline backend's output goes through the same checker; a failure is quarantined too."""
    prov.attempts = 1
    problems = check(value)
    if problems:
        stats.rejects.update(p.code for p in problems)
        return AnswerOutcome("quarantined", None, prov, problems, reason_for(problems), str(value))
    return AnswerOutcome("ok", value, prov)
