"""Pydantic shapes of what the extractor asks for, and the JSON schemas sent as structured output.

An intent is a set of typed anchors (EXTRACTION.md): preference, concern,
information_need, comparison_criterion, conditional_tendency. A rationale answer
is one short first-person reason. Both are validated with pydantic whatever the
server claims to have enforced.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal, TypeVar, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

AnchorType = Literal[
    "preference", "concern", "information_need", "comparison_criterion", "conditional_tendency"
]
ANCHOR_TYPES: tuple[str, ...] = get_args(AnchorType)
MAX_ANCHORS = 12


class Anchor(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: AnchorType
    text: str = Field(min_length=3, max_length=200)
    confidence: float | None = Field(None, ge=0.0, le=1.0)

    @field_validator("text")
    @classmethod
    def _strip(cls, value: str) -> str:
        return " ".join(value.split())


class Intent(BaseModel):
    model_config = ConfigDict(extra="ignore")

    anchors: list[Anchor] = Field(min_length=1, max_length=MAX_ANCHORS)

    def render(self) -> str:
        """The intent text the teacher sees: one anchor per line, grouped by type in a fixed order."""
        ordered = sorted(self.anchors, key=lambda a: ANCHOR_TYPES.index(a.type))
        return "\n".join(f"- {a.type.replace('_', ' ')}: {a.text}" for a in ordered)


class RationaleAnswer(BaseModel):
    model_config = ConfigDict(extra="ignore")  # a model may echo the action too; only the reason is kept

    rationale: str

    @field_validator("rationale")
    @classmethod
    def _strip(cls, value: str) -> str:
        return " ".join(value.split())


# Strict JSON schemas for ``response_format={"type": "json_schema", ...}``: every property
# required and no extras, as strict mode demands; length limits stay in pydantic.
INTENT_JSON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "anchors": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "type": {"type": "string", "enum": list(ANCHOR_TYPES)},
                    "text": {"type": "string"},
                    "confidence": {"type": ["number", "null"]},
                },
                "required": ["type", "text", "confidence"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["anchors"],
    "additionalProperties": False,
}
RATIONALE_JSON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"rationale": {"type": "string"}},
    "required": ["rationale"],
    "additionalProperties": False,
}

M = TypeVar("M", bound=BaseModel)

_THINK = re.compile(r"^\s*<think>.*?</think>", re.DOTALL)
_FENCE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.DOTALL)


class AnswerError(ValueError):
    """An answer that is not the requested JSON shape; ``code`` is invalid_json or schema_mismatch."""

    def __init__(self, code: str, detail: str):
        super().__init__(detail)
        self.code = code
        self.detail = detail


def parse_answer(text: str, model: type[M]) -> M:
    """Validate a model answer: a leading <think> block and a ``` fence are tolerated."""
    body = _THINK.sub("", text, count=1)
    fenced = _FENCE.match(body)
    body = fenced.group(1) if fenced else body.strip()
    try:
        data = json.loads(body)
    except json.JSONDecodeError as exc:
        raise AnswerError("invalid_json", f"not JSON: {exc.msg} at char {exc.pos}") from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "answer"
        raise AnswerError("schema_mismatch", f"{where}: {first['msg']}") from None
