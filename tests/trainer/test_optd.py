"""OPTD: the teacher's contexts, on-policy generation, a whole run (SFT then OPTD), exact resume, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer
from typer.testing import CliRunner

from flows.cli import app
from tests.trainer.conftest import tiny_model
from trainer.checkpoint import read_meta
from trainer.config import TinyModelSettings, TrainSettings
from trainer.data import EncodedState, RecordText, encode, load_records, prompt_ids
from trainer.generation import (
    Generated,
    HFGenerator,
    SamplingSettings,
    StalePolicy,
    check_on_policy,
    cut_at_eos,
)
from trainer.loop import PhaseTimer
from trainer.models import train_tokenizer
from trainer.optd import (
    INTENT_HEADING,
    HiddenStates,
    build_rollouts,
    optd_states,
    privileged_messages,
)
from trainer.optd_config import OPTDSettings
from trainer.optd_run import run_optd
from trainer.responses import record_screens_for, response_shares
from trainer.run import run_sft

# --- a small lake of short, regular states -----------------------------------------------------

INTENTS = {
    "t1": ("shoes", "wants running shoes and compares soles"),
    "t2": ("books", "wants a cookbook and reads the reviews"),
    "t3": ("shoes", "wants trail shoes under 80"),
    "t4": ("books", "wants a novel for a trip"),
    "t5": ("shoes", "wants sandals for the beach"),
}
ITEMS = {"shoes": ["Swift Runner", "Trail Boot", "Beach Sandal"], "books": ["Lemon Cookbook", "Night Novel"]}


def lake_rows() -> list[dict[str, object]]:
    """Five trajectories of six steps: scroll, scroll, click the wanted item, ... (t5 is the test split)."""
    rows = []
    for trajectory, (wanted, intent) in INTENTS.items():
        split = "test" if trajectory == "t5" else "train"
        for step in range(6):
            shown = [ITEMS["shoes"][step % 3], ITEMS["books"][step % 2]]
            pick = shown[0] if wanted == "shoes" else shown[1]
            if step % 3 == 2:
                action = {"type": "click", "target": pick}
                rationale = f"The {pick} is what I came for."
            else:
                action = {"type": "scroll_down", "distance": 300}
                rationale = "Nothing here yet, so I keep looking."
            rows.append(
                {
                    "record_id": f"{trajectory}:{step}",
                    "mode": "single",
                    "system": "You are a shopper. Reply with one JSON object.",
                    "prompt": f"In view: {shown[0]}; {shown[1]}. Step {step}. Your next action?",
                    "response": json.dumps({"rationale": rationale, "action": action}, separators=(",", ":")),
                    "action": action["type"],
                    "intent": intent if split == "train" else None,
                    "split": split,
                }
            )
    return rows


def write_lake(root: Path) -> Path:
    (root / "records").mkdir()
    pq.write_table(pa.Table.from_pylist(lake_rows()), root / "records" / "part-0.parquet")
    return root


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> Path:
    return write_lake(tmp_path_factory.mktemp("optdlake"))


TINY = TinyModelSettings(
    vocab_size=512, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2, num_kv_heads=1
)


def train_settings(**overrides) -> TrainSettings:
    values = dict(
        modes=["single"],
        steps=20,
        states_per_update=4,
        micro_batch_states=2,
        lr=2e-2,
        warmup_steps=2,
        eval_split="test",
        eval_every=0,
        checkpoint_every=0,
        eval_max_states=6,
        torch_threads=1,  # on a shared machine one thread each beats threads waiting for each other
        tiny=TINY,
    )
    return TrainSettings(**(values | overrides))


def optd_settings(**overrides) -> OPTDSettings:
    return OPTDSettings(**({"max_new_tokens": 40, "chunk_size": 16, "held_out_states": 4} | overrides))


@pytest.fixture(scope="module")
def sft_checkpoint(lake, tmp_path_factory) -> Path:
    summary = run_sft(train_settings(), lake, tmp_path_factory.mktemp("sft"), progress=False)
    return Path(summary.checkpoint)


@pytest.fixture(scope="module")
def tokenizer():
    rows = lake_rows()
    return train_tokenizer([t for r in rows for t in (r["system"], r["prompt"], r["response"])], 512)


def lake_states(lake: Path, tokenizer, split: str = "train") -> list[EncodedState]:
    records, _ = load_records(lake, [split], ["single"])
    states, dropped = encode(records, tokenizer, 10_000, 10_000)
    assert not dropped
    return states


# --- states and the teacher's contexts -----------------------------------------------------------


def test_the_privileged_prompt_is_the_plain_one_with_the_intent_appended(lake, tokenizer):
    states = lake_states(lake, tokenizer)
    record = states[0].record
    user = privileged_messages(record)[1]["content"]
    assert user == f"{record.prompt}\n\n{INTENT_HEADING}\n{record.intent}"
    kept, left_out = optd_states(states, tokenizer, max_prompt_tokens=10_000)
    assert len(kept) == 24 and not left_out  # 4 train trajectories x 6 steps, each with its intent
    assert all(len(s.privileged_prompt_ids) > len(s.state.prompt_ids) for s in kept)
    assert kept[0].privileged_prompt_ids == prompt_ids(tokenizer, privileged_messages(record))
    # a state without an intent cannot be distilled; a privileged prompt over the limit is dropped
    no_intent = EncodedState(RecordText(**{**vars(record), "intent": None}), states[0].prompt_ids, [1])
    shortest = min(len(s.privileged_prompt_ids) for s in kept)
    _, counted = optd_states([no_intent, *states], tokenizer, max_prompt_tokens=shortest - 1)
    assert counted == {"no_intent": 1, "privileged_prompt_too_long": 24}


def test_teacher_contexts_end_with_the_sampled_ids_and_align_from_the_right(lake, tokenizer):
    kept, _ = optd_states(lake_states(lake, tokenizer)[:3], tokenizer, 10_000)
    teacher = HiddenStates(tiny_model(tokenizer, seed=3))
    generator = torch.Generator().manual_seed(0)
    responses = [torch.randint(4, len(tokenizer), (n,), generator=generator).tolist() for n in (3, 7, 5)]
    rollouts = build_rollouts(
        kept,
        responses,
        teacher,
        tokenizer.pad_token_id,
        2,
        torch.device("cpu"),
        PhaseTimer(torch.device("cpu")),
    )
    assert [r.n_states for r in rollouts] == [2, 1]
    pairs = [(rollout, i) for rollout in rollouts for i in range(rollout.n_states)]
    for (rollout, i), state, response in zip(pairs, kept, responses, strict=True):
        n = len(response)
        for batch, prompt in (
            (rollout.sampled, state.state.prompt_ids),
            (rollout.privileged, state.privileged_prompt_ids),
        ):
            row = batch.input_ids[i, : int(batch.attention_mask[i].sum())].tolist()
            assert row == prompt + response  # the sampled ids themselves, never decoded and re-encoded
            assert batch.labels[batch.owner == i].tolist() == response
        for hidden, prompt in (
            (rollout.base_hidden, state.state.prompt_ids),
            (rollout.intent_hidden, state.privileged_prompt_ids),
        ):
            # reference: the context alone, unpadded; the n positions predicting the response are the
            # (n+1)-th last to the second last, counted from the right end whatever the prompt's length
            alone = torch.tensor([prompt + response])
            with torch.no_grad():
                full = teacher(alone, torch.ones_like(alone))[0]
            torch.testing.assert_close(
                hidden[rollout.sampled.owner == i], full[-n - 1 : -1], atol=1e-5, rtol=1e-5
            )
    # the teacher's weights require grad in this test, and still no graph reaches its outputs
    assert all(p.requires_grad for p in teacher.parameters())
    assert not any(r.base_hidden.requires_grad or r.intent_hidden.requires_grad for r in rollouts)


# --- generation -------------------------------------------------------------------------------------


def test_cut_at_eos_keeps_the_eos_and_drops_the_filler():
    assert cut_at_eos([5, 6, 3, 0, 0], eos_ids=[3]) == [5, 6, 3]
    assert cut_at_eos([5, 6, 7], eos_ids=[3]) == [5, 6, 7]  # ran to max_new_tokens: every token sampled
    assert cut_at_eos([9, 4, 8], eos_ids=[4, 8]) == [9, 4]


def test_hf_generation_samples_whole_responses_stamped_with_the_policy_version(lake, tokenizer):
    model = tiny_model(tokenizer, seed=1)
    prompts = [s.prompt_ids for s in lake_states(lake, tokenizer)[:3]]
    generator = HFGenerator(model, tokenizer, SamplingSettings(max_new_tokens=12))
    model.train()
    torch.manual_seed(5)
    first = generator.generate(prompts)
    assert model.training  # back in training mode after sampling in eval mode
    torch.manual_seed(5)
    assert generator.generate(prompts).response_ids == first.response_ids  # the RNG state decides the samples
    eos = tokenizer.eos_token_id
    for response in first.response_ids:
        assert (response[-1] == eos and eos not in response[:-1]) or (
            len(response) == 12 and eos not in response
        )
        assert max(response) < len(tokenizer)  # padded vocabulary rows are never sampled
    assert first.policy_version == 0
    check_on_policy(first, trainer_updates=0)
    with pytest.raises(StalePolicy, match="policy version 0, the student has had 1 updates"):
        check_on_policy(first, trainer_updates=1)
    generator.sync(model, 1)
    assert generator.generate(prompts[:1]).policy_version == 1
    check_on_policy(Generated([], 1), trainer_updates=1)


def test_sft_raises_the_share_of_responses_that_parse(lake, tmp_path):
    summary = run_sft(train_settings(steps=80), lake, tmp_path / "sft", progress=False)
    trained = AutoModelForCausalLM.from_pretrained(summary.checkpoint)
    trained_tokenizer = AutoTokenizer.from_pretrained(summary.checkpoint)
    states = lake_states(lake, trained_tokenizer, split="test")
    records = [s.record for s in states]
    screens = record_screens_for(lake, records)
    untrained = tiny_model(trained_tokenizer, seed=0)

    def shares(model) -> dict:
        torch.manual_seed(0)
        generated = HFGenerator(model, trained_tokenizer, SamplingSettings(max_new_tokens=40))
        responses = generated.generate([s.prompt_ids for s in states]).response_ids
        return response_shares(trained_tokenizer, records, responses, screens)

    # this lake holds records only: no screen to judge them on, each of the 6 counted apart
    no_screen = {"executable_share": None, "judged": 0, "rejected": {}, "no_screen": {"no_recorded_steps": 6}}
    # random weights put a '{' first with probability ~1/435 and never a whole JSON object
    assert shares(untrained) == {"parse_share": 0.0, **no_screen}
    after = shares(trained)
    assert after["parse_share"] >= 0.5 and after.items() >= no_screen.items()


# --- whole runs ----------------------------------------------------------------------------------


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def parameters(checkpoint: str | Path) -> dict[str, torch.Tensor]:
    return load_file(Path(checkpoint) / "model.safetensors")


def test_optd_lowers_the_held_out_objective_and_the_checkpoint_loads_and_generates(
    lake, sft_checkpoint, tmp_path
):
    # control: an LR too small to move the weights -> the held-out measurement at the end equals the one
    # at the start (fixed sampling seed), so a drop in the trained run is the training's, not sampling noise
    control = run_optd(
        train_settings(steps=2, lr=1e-12),
        optd_settings(),
        lake,
        tmp_path / "control",
        sft_checkpoint,
        progress=False,
    )
    baseline = control.held_out_start["objective"]
    assert control.held_out_end["objective"] == pytest.approx(baseline, rel=1e-6)
    summary = run_optd(
        train_settings(steps=10, lr=3e-3),
        optd_settings(),
        lake,
        tmp_path / "run",
        sft_checkpoint,
        progress=False,
    )
    assert summary.held_out_start["objective"] == pytest.approx(baseline, rel=1e-6)
    assert summary.train_states == 20 and summary.held_out_states == 4 and summary.skipped_steps == 0
    # three seeds of this setup end at 0.90-0.92 of the start: 0.95 leaves room
    assert summary.held_out_end["objective"] < 0.95 * baseline
    for evaluation in (summary.held_out_start, summary.held_out_end):
        parts = evaluation["distillation"] + 0.1 * evaluation["grounding"]  # gamma = 0.1
        assert evaluation["objective"] == pytest.approx(parts, rel=1e-5)
        assert 0.0 <= evaluation["parse_share"] <= 1.0 and 0.0 < evaluation["mean_lambda"] <= 1.0

    rows = metrics(tmp_path / "run")
    train = [r for r in rows if r["kind"] == "train"]
    assert [r["step"] for r in train] == list(range(1, 11))
    assert [r["step"] for r in rows if r["kind"] == "eval"] == [0, 10]
    phases = {"generate", "teacher_plain", "teacher_intent", "forward_backward", "optimizer"}
    for row in train:
        assert phases <= row["seconds"].keys() and row["tokens_per_s"] > 0
        assert {"student_forward", "grounding_forward", "loss"} == row["forward_backward_detail"].keys()
        assert row["loss"] == pytest.approx(row["distillation"] + 0.1 * row["grounding"], rel=1e-5)
        assert row["policy_version"] == row["step"] - 1  # sampled from the weights after the previous update
        assert 0.0 <= row["binding_share"] <= 1.0 and row["guidance_kl"] <= 0.02 + 1e-6  # epsilon bounds it
    assert all("parse_share" in r for r in rows if r["kind"] == "eval")

    folder = Path(summary.checkpoint)
    meta = read_meta(folder)
    assert meta["stage"] == "optd" and meta["teacher"] == str(sft_checkpoint)
    assert not {"trainer.json", "trainer_state.pt"} & {p.name for p in folder.iterdir()}
    card = (folder / "README.md").read_text()
    # the student starts from its teacher; the card's figures are the run's, to four places
    assert (
        f'base_model: "{sft_checkpoint}"' in card
        and f"its checkpoint `{sft_checkpoint}` is the teacher" in card
    )
    start, end = summary.held_out_start["objective"], summary.held_out_end["objective"]
    assert f"| held-out OPTD objective | {start:.4f} | {end:.4f} |" in card and "end (update 10)" in card
    assert "| train states | 20 |" in card and "| held-out states | 4 |" in card
    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    record = load_records(lake, ["test"], ["single"])[0][0]
    ids = torch.tensor([prompt_ids(tokenizer, record.messages())])
    generated = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=30, do_sample=False)
    text = tokenizer.decode(generated[0, ids.shape[1] :], skip_special_tokens=True)
    assert len(text) > 0
    before, after = parameters(sft_checkpoint), parameters(folder)
    assert not torch.equal(
        before["model.layers.0.mlp.up_proj.weight"], after["model.layers.0.mlp.up_proj.weight"]
    )


def test_resume_continues_exactly(lake, sft_checkpoint, tmp_path):
    settings = train_settings(steps=3, lr=3e-3, checkpoint_every=1, eval_every=2)
    whole = run_optd(settings, optd_settings(), lake, tmp_path / "whole", sft_checkpoint, progress=False)
    first = run_optd(
        settings, optd_settings(), lake, tmp_path / "parts", sft_checkpoint, stop_after=1, progress=False
    )
    assert first.steps == 1 and first.checkpoint.endswith("step-000001")
    rest = run_optd(
        settings, optd_settings(), lake, tmp_path / "parts", sft_checkpoint, resume=True, progress=False
    )
    a, b = parameters(whole.checkpoint), parameters(rest.checkpoint)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    def losses(run: str) -> list[tuple]:
        return [(r["kind"], r["step"], r.get("loss", r.get("objective"))) for r in metrics(tmp_path / run)]

    assert losses("parts") == losses("whole")  # the same samples, updates and evaluations, row for row
    with pytest.raises(ValueError, match="settings differ from the checkpoint's in optd"):
        run_optd(settings, optd_settings(epsilon=0.05), lake, tmp_path / "parts", sft_checkpoint, resume=True)


runner = CliRunner()


def test_cli_trains_optd_from_an_sft_checkpoint(prefect_harness, lake, sft_checkpoint, tmp_path):
    config = tmp_path / "train.toml"
    config.write_text(
        "[train]\nmodes = ['single']\nsteps = 2\nstates_per_update = 2\nmicro_batch_states = 1\n"
        "eval_split = 'test'\nlr = 0.001\nwarmup_steps = 1\ntorch_threads = 1\n"
        "[optd]\nmax_new_tokens = 16\nheld_out_states = 2\nchunk_size = 8\n"
    )
    out = tmp_path / "optd"
    args = ["train", "--lake", str(lake), "--stage", "optd", "--out", str(out), "--config", str(config)]
    result = runner.invoke(app, [*args, "--base", str(sft_checkpoint)])
    assert result.exit_code == 0, result.output
    final = out / "checkpoints" / "step-000002"
    assert f"checkpoint: {final}" in result.output.replace("\n", "")
    saved = read_meta(final)["settings"]["optd"]
    assert (saved["max_new_tokens"], saved["held_out_states"], saved["epsilon"]) == (16, 2, 0.02)
    assert "sampled held-out responses: parse " in result.output
    assert "without a screen: no_recorded_steps 2" in result.output  # a records-only lake
