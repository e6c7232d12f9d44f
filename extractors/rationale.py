"""Rationale extraction: a short first-person reason per recorded action (counterfactual reconstruction).

The LLM is shown the record's own prompt (profile, recent history, window and
current observation, exactly what the simulator will see) and the recorded
action; its reason must pass ``check_rationale_text``. The pair
(rationale, action JSON) becomes the gold response.
"""

from __future__ import annotations

from extractors.answer import AnswerOutcome, Provenance, ask_until_clean, judged_locally
from extractors.client import LLMClient, Stats
from extractors.heuristic import MODEL, VERSION, heuristic_rationale, rules_hash
from extractors.leakage import Violation, check_rationale
from extractors.prompts import RATIONALE_V1
from extractors.schemas import RationaleAnswer
from extractors.trajectory import RationaleJob

PROMPT = RATIONALE_V1
CHECKS: tuple[str, ...] = ("non_empty", "length", "consistent", "visible_only", "no_identifiers")


def check_rationale_text(answer: RationaleAnswer, job: RationaleJob, max_words: int) -> list[Violation]:
    return check_rationale(
        answer.rationale,
        action=job.action,
        index=job.timeline.index,
        is_future=job.is_future,
        max_words=max_words,
    )


async def rationale_llm(client: LLMClient, job: RationaleJob) -> AnswerOutcome[RationaleAnswer]:
    messages = PROMPT.messages(context=job.context, action=job.action_json)
    max_words = client.settings.rationale_max_words
    return await ask_until_clean(
        client,
        PROMPT,
        messages,
        RationaleAnswer,
        lambda a: check_rationale_text(a, job, max_words),
        max_reasks=client.settings.max_reasks,
    )


def rationale_heuristic(job: RationaleJob, stats: Stats, max_words: int) -> AnswerOutcome[RationaleAnswer]:
    prov = Provenance("heuristic", MODEL, VERSION, rules_hash())
    answer = RationaleAnswer(rationale=heuristic_rationale(job))
    return judged_locally(answer, lambda a: check_rationale_text(a, job, max_words), prov, stats)
