"""Extraction against a real model: lenient reading of its answers, then a live run on `transformers serve`.

The hand-written answers below are the kinds SmolLM2-135M-Instruct really gives
when ``response_format`` is not enforced (several copied from its answers to our
prompts): JSON in code fences, prose before and after, the schema ignored, cut off
at the token cap.
"""

from __future__ import annotations

import asyncio
import json

import polars as pl
import pytest
from typer.testing import CliRunner

from cli.app import app
from extractors.answer import ask_until_clean, balanced_objects, parse_lenient
from extractors.cache import CACHE_DIR, ResponseCache
from extractors.client import LLMClient, Stats
from extractors.fakeserver import reply
from extractors.prompts import RATIONALE_V1
from extractors.schemas import AnswerError, Intent, RationaleAnswer
from tests.extractors.conftest import fast_settings
from tests.extractors.tinylake import write_sessions_lake
from trainer.pretrained import served
from transforms.lake import read_lake_table
from transforms.manifest import read_manifest

CLEAN = "The blouse looks soft, so I want a closer look at its fabric."
FENCED_WITH_PROSE = f"""Here is the JSON you asked for:

```json
{{"rationale": "{CLEAN}"}}
```

I hope this helps! Let me know if you need anything else."""
JSON_THEN_RAMBLING = (
    '{"rationale": "Nothing here suits me yet."}\n\n'
    "The shopper's reason for this action is to see more of the feed. The shopper's reason"
)
ACTION_ECHOED_FIRST = (
    'Action: {"type": "click", "target": "Veria Relaxed Cotton Blouse"}\n'
    'Reason: {"rationale": "The relaxed cut looks comfortable."}'
)
SCHEMA_IGNORED = '{\n  "reason": "Back home"\n}'
CUT_OFF = '{\n  "rationale": "The reason is that the card is a card with a dress, and the card'
PROSE_ONLY = "I'm here to help with your JSON data. What's your request?"
INTENT_PLACEHOLDER_TYPE = (
    'Sure.\n```\n{"anchors": [{"type": "one of the five types", "text": "The one of the five types"}]}\n```'
)


@pytest.mark.parametrize(
    ("text", "rationale"),
    [
        (FENCED_WITH_PROSE, CLEAN),
        (JSON_THEN_RAMBLING, "Nothing here suits me yet."),
        # the first object has no "rationale": the next balanced object is the answer
        (ACTION_ECHOED_FIRST, "The relaxed cut looks comfortable."),
        # braces and an escaped quote inside the string do not end the object
        (
            'Sure! {"rationale": "I like the {soft} look, \\"really\\" }"} Done.',
            'I like the {soft} look, "really" }',
        ),
        ('<think>short answer</think>\nOkay: {"rationale": "I\'ll look further."}', "I'll look further."),
    ],
)
def test_object_recovered_from_fences_and_prose(text, rationale):
    value, recovered = parse_lenient(text, RationaleAnswer)
    assert value.rationale == rationale and recovered


def test_strict_answer_is_not_counted_as_recovered():
    # a bare or fenced object is the requested answer as it stands
    for text in (json.dumps({"rationale": CLEAN}), f'```json\n{{"rationale": "{CLEAN}"}}\n```'):
        assert parse_lenient(text, RationaleAnswer) == (RationaleAnswer(rationale=CLEAN), False)


@pytest.mark.parametrize(
    ("text", "model", "code", "says"),
    [
        (SCHEMA_IGNORED, RationaleAnswer, "schema_mismatch", "rationale: Field required"),
        # prose around a wrong-shaped object: the object's shape error, not the prose's parse error
        (f"Answer: {SCHEMA_IGNORED} hope it helps", RationaleAnswer, "schema_mismatch", "rationale"),
        (CUT_OFF, RationaleAnswer, "invalid_json", "never closed"),
        (PROSE_ONLY, RationaleAnswer, "invalid_json", "no JSON object"),
        (INTENT_PLACEHOLDER_TYPE, Intent, "schema_mismatch", "anchors.0.type"),
    ],
)
def test_unrecoverable_answers_say_what_is_wrong(text, model, code, says):
    with pytest.raises(AnswerError) as err:
        parse_lenient(text, model)
    assert err.value.code == code and says in err.value.detail


def test_balanced_objects_are_the_top_level_ones():
    text = 'a {"x": 1} b {"y": {"z": "}{"}} c {"open": {"inner": 1}'
    # two closed top-level objects; the last one never closes, so neither it nor its inner object counts
    assert list(balanced_objects(text)) == ['{"x": 1}', '{"y": {"z": "}{"}}']


def test_schema_ignored_is_reasked_with_the_violation_then_recovered(server, tmp_path):
    server.enqueue(reply(SCHEMA_IGNORED), reply(FENCED_WITH_PROSE))
    messages = RATIONALE_V1.messages(context="## Current observation\nFeed", action='{"type":"click"}')
    stats = Stats()

    async def go():
        async with LLMClient(fast_settings(server), cache=ResponseCache(tmp_path), stats=stats) as client:
            return await ask_until_clean(
                client, RATIONALE_V1, messages, RationaleAnswer, lambda a: [], max_reasks=2
            )

    outcome = asyncio.run(go())
    # answer 1 is rejected (schema), answer 2 is dug out of its fence: 2 requests, 1 re-ask, 1 recovered
    assert outcome.status == "ok" and outcome.value.rationale == CLEAN and outcome.provenance.attempts == 2
    assert stats.reasks == 1 and stats.recovered_json == 1 and stats.rejects == {"schema_mismatch": 1}
    reask = server.chat_requests()[1].body["messages"]
    assert reask[-2] == {"role": "assistant", "content": SCHEMA_IGNORED}
    assert "schema_mismatch: 'rationale: Field required'" in reask[-1]["content"]


# --- the converted model ---------------------------------------------------------------------


@pytest.mark.slow
def test_converted_folder_is_the_gguf_model(smollm2_folder):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer.pretrained import MARKER, convert_smollm2, gguf_path

    torch.set_num_threads(2)
    # a second conversion finds the folder complete and leaves it untouched
    stamp = (smollm2_folder / MARKER).stat().st_mtime_ns
    assert convert_smollm2(smollm2_folder) == smollm2_folder
    assert (smollm2_folder / MARKER).stat().st_mtime_ns == stamp
    tokenizer = AutoTokenizer.from_pretrained(smollm2_folder)
    model = AutoModelForCausalLM.from_pretrained(smollm2_folder)
    source = gguf_path()
    reference = AutoModelForCausalLM.from_pretrained(
        source.parent, gguf_file=source.name, dtype=torch.float32
    )
    assert type(model).__name__ == "LlamaForCausalLM" and model.dtype == torch.float32
    # 134.5M parameters (MODELS.md); the input and output embeddings are one tied matrix
    assert round(sum(p.numel() for p in model.parameters()) / 1e6, 1) == 134.5
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hello"}], add_generation_prompt=True, tokenize=False
    )
    assert chat.endswith("<|im_start|>assistant\n") and tokenizer.eos_token == "<|im_end|>"
    ids = tokenizer(chat, return_tensors="pt")
    with torch.no_grad():
        # the same de-quantised float32 weights: logits equal to the bit
        assert torch.equal(model(**ids).logits, reference(**ids).logits)


# --- the live run ------------------------------------------------------------------------------

MAX_REASKS = 1
SERVED_SESSIONS = ["sB1"]  # user B's first session, single mode: 1 intent + 4 rationale jobs
QUARANTINE_REASONS = {"invalid_answer", "leakage", "check_failed"}


def read_leniently(text: str) -> bool:
    """Whether an intent or rationale answer validates only once dug out of fences or prose."""
    for model in (Intent, RationaleAnswer):
        try:
            return parse_lenient(text, model)[1]
        except AnswerError:
            continue
    return False


@pytest.fixture(scope="module")
def served_smollm2(smollm2_folder, tmp_path_factory):
    log = tmp_path_factory.mktemp("serve") / "transformers-serve.log"
    with served(smollm2_folder, log=log) as base_url:
        yield base_url


@pytest.mark.slow
@pytest.mark.timeout(2400)  # ~10 answers: 2 min on a quiet machine, 20 on a crowded one
def test_extract_against_served_smollm2(prefect_harness, served_smollm2, smollm2_folder, tmp_path):
    lake = write_sessions_lake(tmp_path / "lake", SERVED_SESSIONS)
    config = tmp_path / "extract.toml"
    # greedy decoding (a re-run gives the same answers), one request at a time on 2 cores, and a
    # token cap that fits a rationale but cuts an intent short (so the re-ask path is taken too)
    config.write_text(f"[extract]\ntemperature = 0.0\nmax_reasks = {MAX_REASKS}\nrequest_timeout_s = 600\n")
    endpoint = ["--backend", "openai", "--base-url", served_smollm2, "--model", str(smollm2_folder)]
    limits = ["--config", str(config), "--max-tokens", "32", "--concurrency", "1"]
    args = ["extract", "--lake", str(lake), *endpoint, *limits]
    before = {p.relative_to(lake): p.read_bytes() for p in lake.rglob("*") if p.is_file()}
    result = CliRunner().invoke(app, args, env={"TRAJFORGE_EXTRACT_PROGRESS": "false"})
    segments = sorted((lake / CACHE_DIR).glob("seg-*.jsonl"))
    texts = [json.loads(line)["text"] for seg in segments for line in seg.read_text().splitlines()]
    if result.exit_code == 1:
        # the untrained model kept no answer: the gate stops the stage (nothing kept from a non-empty
        # input) and the lake keeps its previous tables; every answer is still cached as it came,
        # 1 + MAX_REASKS for each of the 5 jobs, so a rerun with a better model starts from there
        text = " ".join(result.output.split())
        assert "failed expectation 'rows_kept'" in text and "reason=invalid_answer" in text, result.output
        assert "Traceback" not in result.output
        assert len(texts) == (1 + MAX_REASKS) * 5
        after = {p.relative_to(lake): p.read_bytes() for p in lake.rglob("*") if p.is_file()}
        kept = {
            path: data for path, data in after.items() if path.parts[0] not in ("_cache", "_runs", "_docs")
        }
        assert kept == {
            path: data for path, data in before.items() if path.parts[0] not in ("_cache", "_runs", "_docs")
        }
        return
    assert result.exit_code == 0, result.output
    summary = read_manifest(lake, "extract").details

    # every job ends ok or quarantined: nothing pending, nothing lost, nothing twice
    counts = summary["counts"]
    assert counts["intents"]["jobs"] == 1 and counts["rationales"]["jobs"] == 4
    assert counts["intents"]["pending"] == counts["rationales"]["pending"] == 0
    assert summary["balanced"] and summary["cache_hits"] == 0
    intents, rationales = read_lake_table(lake, "intents"), read_lake_table(lake, "rationales")
    quarantine = read_lake_table(lake, "quarantine").filter(pl.col("stage") == "extract")
    held = [json.loads(p) for p in quarantine["payload"]]
    held_records = [h["record_id"] for h in held if "record_id" in h]
    assert rationales.height + len(held_records) == 4 and intents.height + len(held) - len(held_records) == 1
    assert set(rationales["record_id"]) | set(held_records) == set(
        read_lake_table(lake, "records")["record_id"]
    )
    assert not set(rationales["record_id"]) & set(held_records)
    assert rationales.height == counts["rationales"]["ok"] and intents.height == counts["intents"]["ok"]

    # quarantined after 1 + MAX_REASKS rejected answers, each with its reasons
    assert set(quarantine["reason"]) <= QUARANTINE_REASONS
    assert all(len(json.loads(d)) >= 1 + MAX_REASKS for d in quarantine["detail"])
    # every answer the server gave is accounted for: the accepted one of each kept job
    # (1 + its re-asks) and 1 + MAX_REASKS of each quarantined job; re-asks = answers - jobs
    kept_answers = int(intents["attempts"].sum() or 0) + int(rationales["attempts"].sum() or 0)
    assert summary["answers"] == kept_answers + (1 + MAX_REASKS) * quarantine.height
    assert summary["reasks"] == summary["answers"] - 5
    assert summary["requests"] == summary["answers"] + summary["retries_total"]
    # every answer was cached as it came, and recovered_json counts exactly those read leniently
    assert len(texts) == summary["answers"]
    assert summary["recovered_json"] == sum(read_leniently(t) for t in texts)

    # what was kept passed the schema and the checker
    assert all(RationaleAnswer(rationale=r).rationale == r and r for r in rationales["rationale"])
