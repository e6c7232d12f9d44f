"""A feed state's click line when it lists the ids in view (``PromptSettings.click_ids``), and what an
action-first response writes before a click's id: shared by the prompts and the trainer's screen-id
loss, with no imports beyond the standard library (the GPU-side trainer has no pydantic)."""

from __future__ import annotations

import json
import re


def click_ids_signature(item_ids: list[str]) -> str:
    """The click's executable line when it lists the ids in view (``PromptSettings.click_ids``)."""
    return (
        'click {"target_item_id": one of '
        + ", ".join(json.dumps(i, ensure_ascii=False) for i in item_ids)
        + "}"
    )


CLICK_IDS_LINE = re.compile(r'^- click \{"target_item_id": one of (.*)\}$', re.M)


def listed_click_ids(prompt: str) -> list[str]:
    """The ids a prompt's click line lists (``click_ids``); none when it lists none."""
    found = CLICK_IDS_LINE.search(prompt)
    return [json.loads(i) for i in found.group(1).split(", ")] if found else []


#: what an action-first response writes before a click's id (``listed_click_ids`` are its choices)
CLICK_ID_PREFIX = '{"action":{"type":"click","target_item_id":"'
