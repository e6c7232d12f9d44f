"""The model card (``README.md``) of a checkpoint folder, from what the run records in ``trainer.json``.

A pure function of that record: the stage, the settings, the data hash, the base or the teacher, the
data counts and the held-out figures, each one optional (a key the caller does not know leaves its
line out). It needs nothing of the data stack: it is written on the GPU machine with the checkpoint.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from trainer.models import PROTOCOL_SAMPLING

# stage -> (its name, what it does)
STAGES = {
    "sft": (
        "supervised fine-tuning",
        "on the gold responses of the lake's records: a mean over each response's tokens, equal weights "
        "for the states (or the class resampling the settings name)",
    ),
    "optd": (
        "on-policy trajectory distillation",
        "the student samples whole responses, the frozen teacher (the SFT checkpoint, the student's "
        "start) scores the sampled tokens with and without the shopper's privileged intent, and the "
        "student matches a per-token trust-region target, plus a grounding loss on the gold response",
    ),
}
# (key in an evaluation, its name in the card, its format): the loss of SFT, the objective of OPTD
FIGURES = (
    ("held_out_loss", "held-out loss (response NLL per token, nats)", "{:.4f}"),
    ("parse_share", "parse share (responses that are the JSON shape)", "{:.3f}"),
    ("executable_share", "executable share (on the record's screen)", "{:.3f}"),
    ("probe_objective", "OPTD objective on the probe states", "{:.4f}"),
    ("teacher_probe_intent_gain", "teacher's intent gain on the probe states (nats/token)", "{:.4f}"),
    ("probe_intent_gain", "intent gain on the probe states (nats/token)", "{:.4f}"),
)
EXAMPLE_RESPONSE = (
    '{"rationale": "These running shoes look close to what I want; I will see what others say.", '
    '"action": {"type": "ipv_enter_comment"}}'
)


def model_card(meta: Mapping[str, Any]) -> str:
    """Markdown with Hugging Face front matter for a checkpoint whose ``trainer.json`` is ``meta``."""
    stage = meta.get("stage")
    sections = [
        front_matter(meta),
        f"# trajforge shopper simulator{f' ({stage.upper()})' if stage else ''}",
        what_it_is(meta),
        "## Base model\n\n" + base_model_text(meta),
        "## Data\n\n" + data_table(meta),
        "## Stages\n\n" + stages_text(meta),
    ]
    if figures := figures_table(meta):
        sections.append("## Held-out figures\n\n" + figures)
    if "settings" in meta:
        settings = json.dumps(meta["settings"], indent=2, default=str)
        sections.append(f"## Settings\n\nThe training settings, exactly:\n\n```json\n{settings}\n```")
    sections.append(usage())
    return "\n\n".join(sections) + "\n"


def front_matter(meta: Mapping[str, Any]) -> str:
    # JSON strings are YAML double-quoted scalars: a path with a colon or a quote stays one value
    lines = ["---", "library_name: transformers", "pipeline_tag: text-generation"]
    if base := base_model(meta):
        lines.append(f"base_model: {json.dumps(base)}")
    tags = ["trajforge", "user-simulator", "shopping", *([meta["stage"]] if meta.get("stage") else [])]
    lines += ["tags:", *(f"- {json.dumps(tag)}" for tag in tags), "---"]
    return "\n".join(lines)


def base_model(meta: Mapping[str, Any]) -> str | None:
    """The folder or name this one was trained from: OPTD's student starts from its teacher."""
    if meta.get("stage") == "optd" and meta.get("teacher"):
        return str(meta["teacher"])
    return str(meta["base"]) if meta.get("base") else None


def what_it_is(meta: Mapping[str, Any]) -> str:
    text = (
        "A language model that plays a shopper in trajforge's shopping environment: shown the shopper's "
        "profile, recent purchases and clicks, the last steps taken and the current screen (the "
        "recommendation feed or an item's detail page), it answers with a short first-person reason and "
        "the next of the 13 actions."
    )
    if stage := meta.get("stage"):
        name = STAGES[stage][0] if stage in STAGES else "the stage"
        text += f" Trained by {name} ({stage.upper()})."
    if "step" in meta:
        steps = meta.get("settings", {}).get("steps")
        ranks = meta.get("world_size", 1)
        text += f" This is the checkpoint after update {meta['step']}"
        text += f" of {steps}" if steps is not None else ""
        text += f", trained on {ranks} ranks." if ranks > 1 else "."
    return text


def base_model_text(meta: Mapping[str, Any]) -> str:
    if meta.get("stage") == "optd" and meta.get("teacher"):
        teacher = meta["teacher"]
        return f"The SFT checkpoint `{teacher}`: the teacher it was distilled from, and its starting weights."
    if meta.get("base"):
        return f"`{meta['base']}`, fine-tuned with its own tokenizer and chat template."
    if meta.get("stage") == "sft":
        text = (
            "None: trajforge's tiny default, a small Llama-architecture model trained from scratch with a "
            "byte-level BPE tokenizer trained on the records' own texts (its shape under `tiny` in the "
            "settings)."
        )
        if meta.get("settings", {}).get("tiny", {}).get("copy_head"):
            text += (
                " Its first layer carries a copy head wired at initialisation and kept fixed: at a click's "
                "opening it writes one of the ids in view (`copy_head` in config.json; trajforge's "
                "trainer/copy_head.py)."
            )
        return text
    return "Not recorded."


def data_table(meta: Mapping[str, Any]) -> str:
    rows = [
        ("lake", f"`{meta['lake']}`" if meta.get("lake") else None),
        ("data hash (states and tokenizer)", f"`{meta['data_hash']}`" if meta.get("data_hash") else None),
        ("train states", meta.get("train_states")),
        ("held-out states", held_out_text(meta)),
        ("left out (records not trained on, by reason)", left_out_text(meta.get("left_out"))),
    ]
    known = [(name, value) for name, value in rows if value is not None]
    if not known:
        return "Not recorded."
    return "\n".join(["| | |", "|---|---|", *(f"| {name} | {value} |" for name, value in known)])


def held_out_text(meta: Mapping[str, Any]) -> str | None:
    held_out = meta.get("held_out")
    if isinstance(held_out, Mapping):
        return (
            f"{held_out.get('states')}, one per session, of {held_out.get('users')} held-out users "
            f"(the {held_out.get('split')} split; never trained on)"
        )
    return meta.get("held_out_states")


def left_out_text(left_out: Mapping[str, int] | None) -> str | None:
    if left_out is None:
        return None
    counted = {reason: n for reason, n in left_out.items() if n}
    if not counted:
        return "none"
    return f"{sum(counted.values())}: " + ", ".join(f"{reason} {n}" for reason, n in sorted(counted.items()))


def stages_text(meta: Mapping[str, Any]) -> str:
    stage = meta.get("stage")
    sft, optd = (f"{name}, {does}" for name, does in (STAGES["sft"], STAGES["optd"]))
    if stage == "optd":
        teacher = f"`{meta['teacher']}`" if meta.get("teacher") else "an SFT checkpoint"
        return f"1. SFT: {sft}; its checkpoint {teacher} is the teacher.\n2. OPTD (this checkpoint): {optd}."
    if stage == "sft":
        return f"1. SFT (this checkpoint): {sft}. It can then be the teacher of an OPTD run."
    return "Not recorded."


def figures_table(meta: Mapping[str, Any]) -> str | None:
    """The start and end evaluations as far as the caller knows them; None when it knows neither."""
    start = dict(meta.get("held_out_start") or {})
    if meta.get("held_out_loss_start") is not None:
        start.setdefault("held_out_loss", meta["held_out_loss_start"])
    end = dict(meta.get("held_out_end") or {})
    columns = [
        (heading, evaluation)
        for heading, evaluation in (
            ("start (before the first update)", start),
            (f"end (update {end['step']})" if "step" in end else "end", end),
        )
        if any(evaluation.get(key) is not None for key, _, _ in FIGURES)
    ]
    if not columns:
        return None

    def cell(evaluation: dict[str, Any], key: str, fmt: str) -> str:
        return fmt.format(evaluation[key]) if evaluation.get(key) is not None else "–"

    shown = [(k, name, fmt) for k, name, fmt in FIGURES if any(e.get(k) is not None for _, e in columns)]
    lines = ["| | " + " | ".join(heading for heading, _ in columns) + " |", "|---" * (len(columns) + 1) + "|"]
    lines += [
        f"| {name} | " + " | ".join(cell(evaluation, key, fmt) for _, evaluation in columns) + " |"
        for key, name, fmt in shown
    ]
    note = (
        "Responses sampled from a fixed seed on held-out states; a response is executable when it is a "
        "legal action on the screen its record was taken on (PROTOCOL.md §2). Probe states are "
        "intent-bearing states of training users that no update drew."
    )
    return "\n".join(lines) + "\n\n" + note


def usage() -> str:
    sampling = ", ".join(f"`{k}: {json.dumps(v)}`" for k, v in PROTOCOL_SAMPLING.items())
    return f"""## How to use

```python
from transformers import AutoModelForCausalLM, AutoTokenizer

folder = "path/to/this/folder"
tokenizer = AutoTokenizer.from_pretrained(folder)
model = AutoModelForCausalLM.from_pretrained(folder)
messages = [
    {{"role": "system", "content": "..."}},  # the simulator's instructions, as in training
    {{"role": "user", "content": "..."}},  # profile, history and the current screen, as text
]
inputs = tokenizer.apply_chat_template(
    messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
)
output = model.generate(**inputs)  # samples as generation_config.json says
print(tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True))
```

The chat template is the tokenizer's (`chat_template.jinja`, also inline in `tokenizer_config.json`);
the prompts are rendered by trajforge's `records` stage (`trajforge records --export-jsonl` writes them
in this chat format). `generation_config.json` samples as the evaluation protocol does: {sampling};
answering ends at the tokenizer's eos. An OpenAI-compatible server (vLLM, `transformers serve`) serves
the folder as it is.

The response is one JSON object, `{{"rationale": "<short first-person reason>", "action": {{"type":
"<one of 13>", ...arguments}}}}`, for example:

```json
{EXAMPLE_RESPONSE}
```"""
