"""Answer parsing, intent rendering, and prompt versioning."""

from __future__ import annotations

import subprocess
import sys

import pytest

from extractors.prompts import INTENT_V1, RATIONALE_V1, PromptTemplate
from extractors.schemas import Anchor, AnswerError, Intent, RationaleAnswer, parse_answer


def test_parse_tolerates_think_block_and_fence():
    text = '<think>weighing it</think>\n```json\n{"rationale": "  I want   a closer look. "}\n```'
    assert parse_answer(text, RationaleAnswer).rationale == "I want a closer look."


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ('{"rationale": ', "invalid_json"),
        ('{"anchors": []}', "schema_mismatch"),  # at least one anchor
        ('{"anchors": [{"type": "mood", "text": "calm", "confidence": 0.5}]}', "schema_mismatch"),
        ('{"anchors": [{"type": "concern", "text": "fit", "confidence": 1.5}]}', "schema_mismatch"),
    ],
)
def test_parse_failures_have_codes(text, code):
    with pytest.raises(AnswerError) as err:
        parse_answer(text, Intent)
    assert err.value.code == code


def test_intent_renders_in_type_order():
    intent = Intent(
        anchors=[
            Anchor(type="conditional_tendency", text="commits after reviews"),
            Anchor(type="preference", text="likes linen", confidence=0.8),
        ]
    )
    assert intent.render() == "- preference: likes linen\n- conditional tendency: commits after reviews"


def test_prompt_hash_tracks_every_part():
    same = PromptTemplate(
        INTENT_V1.name, INTENT_V1.version, INTENT_V1.system, INTENT_V1.user, INTENT_V1.schema
    )
    edited = PromptTemplate(
        INTENT_V1.name, INTENT_V1.version, INTENT_V1.system + " ", INTENT_V1.user, INTENT_V1.schema
    )
    assert (
        same.hash == INTENT_V1.hash and edited.hash != INTENT_V1.hash and INTENT_V1.hash != RATIONALE_V1.hash
    )
    assert len(INTENT_V1.hash) == 16


def test_prompt_messages_fill_the_template():
    system, user = RATIONALE_V1.messages(context="## Current observation\nFeed", action='{"type":"end"}')
    assert system["role"] == "system" and "40 words" in system["content"]
    assert user["content"].startswith("## Current observation\nFeed") and '{"type":"end"}' in user["content"]


def test_extractors_do_not_import_prefect():
    code = "import sys, extractors.pipeline, extractors.fakeserver; print('prefect' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"  # ARCHITECTURE.md: extractors/ must not know about Prefect
