"""OPTD: the teacher's contexts, on-policy generation, a whole run (SFT then OPTD), exact resume, the CLI."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer
from typer.testing import CliRunner

from cli.app import app
from evaluation.executable import ScreenJudge
from tests.trainer.conftest import tiny_model
from trainer.checkpoint import read_meta
from trainer.config import OPTDSettings, TinyModelSettings, TrainSettings
from trainer.data import (
    INTENT_HEADING,
    EncodedState,
    StatePool,
    encode,
    load_records,
    prompt_ids,
    records_hash,
)
from trainer.generation import (
    Generated,
    HFGenerator,
    StalePolicy,
    check_on_policy,
    cut_at_eos,
)
from trainer.loop import PhaseTimer
from trainer.models import train_tokenizer
from trainer.optd import HiddenStates, OPTDState, build_rollouts
from trainer.optd_run import ForeignBase, run_optd
from trainer.run import run_sft
from trainer.sampling import SamplingSettings

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
                    "session_id": trajectory,
                    "user_id": f"u-{trajectory}",
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


def write_lake(root: Path, rows: list[dict[str, object]] | None = None) -> Path:
    (root / "records").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows or lake_rows()), root / "records" / "part-0.parquet")
    return root


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> Path:
    return write_lake(tmp_path_factory.mktemp("optdlake"))


TINY = TinyModelSettings(
    vocab_size=512, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2, num_kv_heads=1
)


TRAIN_VALUES = dict(
    modes=["single"],
    steps=20,
    states_per_update=4,
    micro_batch_states=2,
    lr=2e-2,
    warmup_steps=2,
    eval_split="test",
    eval_every=0,
    checkpoint_every=0,
    held_out_states=6,
    held_out_sampled=0,
    probe_states=4,
    torch_threads=1,  # on a shared machine one thread each beats threads waiting for each other
    tiny=TINY,
)


def train_settings(**overrides) -> TrainSettings:
    return TrainSettings(**(TRAIN_VALUES | overrides))


def optd_settings(**overrides) -> OPTDSettings:
    values = {"rollout_sampling": SamplingSettings(max_new_tokens=40), "chunk_size": 16}
    return OPTDSettings(**(TRAIN_VALUES | values | overrides))


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
    records, _ = load_records(lake, ["train"], ["single"])
    record = records[0]
    user = record.privileged_messages()[1]["content"]
    assert user == f"{record.prompt}\n\n{INTENT_HEADING}\n{record.intent}"
    pool = StatePool(records, tokenizer, 10_000, 10_000, privileged=True)
    kept = [pool.get(i) for i in range(len(pool))]
    assert len(kept) == 24 and all(kept) and not pool.dropped  # 4 train trajectories x 6 steps
    assert all(len(pool.privileged_ids[s.record.key]) > len(s.prompt_ids) for s in kept)
    assert pool.privileged_ids[record.key] == prompt_ids(tokenizer, record.privileged_messages())
    # a privileged prompt over the limit drops its state, counted by reason; a state without an intent
    # has no privileged prompt at all
    shortest = min(len(ids) for ids in pool.privileged_ids.values())
    tight = StatePool(records, tokenizer, shortest - 1, 10_000, privileged=True)
    assert [tight.get(i) for i in range(len(tight))] == [None] * 24
    assert tight.dropped == {"privileged_prompt_too_long": 24}
    with pytest.raises(ValueError, match="has no intent"):
        load_records(lake, ["test"], ["single"])[0][0].privileged_messages()


def distillation_states(lake: Path, tokenizer, n: int) -> list[OPTDState]:
    records, _ = load_records(lake, ["train"], ["single"])
    pool = StatePool(records[:n], tokenizer, 10_000, 10_000, privileged=True)
    return [OPTDState(s, pool.privileged_ids[s.record.key]) for s in map(pool.get, range(n))]


def test_teacher_contexts_end_with_the_sampled_ids_and_align_from_the_right(lake, tokenizer):
    kept = distillation_states(lake, tokenizer, 3)
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
    judge = ScreenJudge(lake)
    untrained = tiny_model(trained_tokenizer, seed=0)

    def shares(model) -> dict:
        torch.manual_seed(0)
        generated = HFGenerator(model, trained_tokenizer, SamplingSettings(max_new_tokens=40))
        responses = generated.generate([s.prompt_ids for s in states]).response_ids
        texts = trained_tokenizer.batch_decode(responses, skip_special_tokens=True)
        return judge([s.record.record_id for s in states], texts)

    # this lake holds records only: no screen to judge them on, each of the 6 counted apart
    no_screen = {"executable_share": None, "recorded_action_share": None, "judged": 0, "rejected": {},
                 "no_screen": {"no_recorded_steps": 6}}  # fmt: skip
    # random weights put a '{' first with probability ~1/435 and never a whole JSON object
    assert shares(untrained) == {"parse_share": 0.0, **no_screen}
    after = shares(trained)
    assert after["parse_share"] >= 0.5 and after.items() >= no_screen.items()


# --- whole runs ----------------------------------------------------------------------------------


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def parameters(checkpoint: str | Path) -> dict[str, torch.Tensor]:
    return load_file(Path(checkpoint) / "model.safetensors")


def test_optd_lowers_the_objective_on_the_probe_states_and_the_checkpoint_loads_and_generates(
    lake, sft_checkpoint, tmp_path
):
    # control: an LR too small to move the weights -> the probe measurement at the end equals the one at
    # the start (fixed sampling seed), so a drop in the trained run is the training's, not sampling noise
    control = run_optd(
        optd_settings(steps=2, lr=1e-12), lake, tmp_path / "control", sft_checkpoint, progress=False
    )
    baseline = control.held_out_start["probe_objective"]
    assert control.held_out_end["probe_objective"] == pytest.approx(baseline, rel=1e-6)
    summary = run_optd(
        optd_settings(steps=10, lr=3e-3), lake, tmp_path / "run", sft_checkpoint, progress=False
    )
    assert summary.held_out_start["probe_objective"] == pytest.approx(baseline, rel=1e-6)
    # 24 intent-bearing train states, 4 of them probe states no update draws; 6 held-out (test) states
    assert summary.train_states == 20 and summary.held_out_states == 6 and summary.skipped_steps == 0
    assert summary.held_out_end["probe_objective"] < 0.95 * baseline
    for evaluation in (summary.held_out_start, summary.held_out_end):
        parts = evaluation["probe_distillation"] + 0.1 * evaluation["probe_grounding"]  # gamma = 0.1
        assert evaluation["probe_objective"] == pytest.approx(parts, rel=1e-5)
        assert 0.0 < evaluation["probe_mean_lambda"] <= 1.0 and evaluation["held_out_loss"] > 0
        # the teacher is frozen: its intent gain is one figure, at the start as at the end
        gain = evaluation["teacher_probe_nll_plain"] - evaluation["teacher_probe_nll_intent"]
        assert evaluation["teacher_probe_intent_gain"] == pytest.approx(gain)
    assert (
        summary.held_out_start["teacher_probe_intent_gain"]
        == summary.held_out_end["teacher_probe_intent_gain"]
    )

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
    start, end = summary.held_out_start, summary.held_out_end
    loss_row = f"| held-out loss (response NLL per token, nats) | {start['held_out_loss']:.4f} | {end['held_out_loss']:.4f} |"
    probe_row = f"| OPTD objective on the probe states | {start['probe_objective']:.4f} | {end['probe_objective']:.4f} |"
    assert loss_row in card and probe_row in card and "end (update 10)" in card
    assert (
        "| train states | 20 |" in card
        and "| held-out states | 6, one per session, of 1 held-out users" in card
    )
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


def test_the_held_out_users_are_never_trained_on_and_both_stages_score_the_same_states(
    lake, sft_checkpoint, tmp_path
):
    sft_run = Path(sft_checkpoint).parent.parent
    optd = run_optd(optd_settings(steps=1), lake, tmp_path / "optd", sft_checkpoint, progress=False)
    records = {r.key: r for split in ("train", "test") for r in load_records(lake, [split], ["single"])[0]}
    for run in (sft_run, tmp_path / "optd"):
        meta = read_meta(latest_checkpoint(run))
        assert meta["held_out"] == {"split": "test", "states": 6, "users": 1}
    held_out_users = {r.user_id for r in records.values() if r.split == "test"}
    trained_users = {r.user_id for r in records.values() if r.split == "train"}
    assert held_out_users == {"u-t5"} and not held_out_users & trained_users
    # the same held-out states in both stages: the SFT checkpoint's loss on them is OPTD's at step 0
    sft_end = json.loads((sft_run / "summary.json").read_text())["held_out_end"]["held_out_loss"]
    assert optd.held_out_start["held_out_loss"] == pytest.approx(sft_end, rel=1e-6)


def test_a_run_prepares_only_the_states_it_draws(lake, sft_checkpoint, tmp_path):
    summary = run_sft(train_settings(steps=2, states_per_update=3), lake, tmp_path / "sft", progress=False)
    # 2 updates x 3 states drawn from a permutation of the 20-state pool: 6 distinct states tokenized
    assert summary.train_states == 20 and summary.prepared_states == 6
    optd = run_optd(optd_settings(steps=2, states_per_update=3), lake, tmp_path / "optd", tmp_path / "sft",
                    progress=False)  # fmt: skip
    assert optd.prepared_states == 6 and optd.stage_figures["reused_states"] == 6  # the SFT run's, read back


def latest_checkpoint(run: Path) -> Path:
    return sorted((run / "checkpoints").glob("step-*"))[-1]


def test_resume_continues_exactly(lake, sft_checkpoint, tmp_path):
    settings = optd_settings(steps=3, lr=3e-3, checkpoint_every=1, eval_every=2)
    whole = run_optd(settings, lake, tmp_path / "whole", sft_checkpoint, progress=False)
    first = run_optd(settings, lake, tmp_path / "parts", sft_checkpoint, stop_after=1, progress=False)
    assert first.steps == 1 and first.checkpoint.endswith("step-000001")
    rest = run_optd(settings, lake, tmp_path / "parts", sft_checkpoint, resume=True, progress=False)
    a, b = parameters(whole.checkpoint), parameters(rest.checkpoint)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    def losses(run: str) -> list[tuple]:
        return [
            (r["kind"], r["step"], r.get("loss", r.get("probe_objective"))) for r in metrics(tmp_path / run)
        ]

    assert losses("parts") == losses("whole")  # the same samples, updates and evaluations, row for row
    with pytest.raises(ValueError, match="settings differ from the checkpoint's in epsilon"):
        run_optd(optd_settings(steps=3, lr=3e-3, checkpoint_every=1, eval_every=2, epsilon=0.05), lake,
                 tmp_path / "parts", sft_checkpoint, resume=True)  # fmt: skip


def test_resume_refuses_another_teacher(lake, sft_checkpoint, tmp_path):
    settings = optd_settings(steps=2, checkpoint_every=1)
    run_optd(settings, lake, tmp_path / "run", sft_checkpoint, stop_after=1, progress=False)
    other = run_sft(train_settings(steps=1, seed=5), lake, tmp_path / "other", progress=False)
    with pytest.raises(ValueError, match="cannot resume: the teacher's weights differ"):
        run_optd(settings, lake, tmp_path / "run", other.checkpoint, resume=True, progress=False)


def test_base_may_be_an_sft_run_folder_and_anything_else_is_one_clear_error(lake, sft_checkpoint, tmp_path):
    sft_run = Path(sft_checkpoint).parent.parent
    summary = run_optd(optd_settings(steps=1), lake, tmp_path / "run", sft_run, progress=False)
    assert read_meta(summary.checkpoint)["teacher"] == str(latest_checkpoint(sft_run))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"is neither a model folder \(no config.json\) nor a run folder"):
        run_optd(optd_settings(steps=1), lake, tmp_path / "x", tmp_path / "empty", progress=False)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        run_optd(optd_settings(steps=1), lake, tmp_path / "x", tmp_path / "missing", progress=False)


# --- lineage: the teacher must have been trained on this lake's records ----------------------------


def other_shoppers_lake(root: Path) -> Path:
    """The same texts, but recorded of other shoppers: another lake's records."""
    return write_lake(root, [{**row, "user_id": f"other-{row['user_id']}"} for row in lake_rows()])


def test_the_records_hash_follows_the_recorded_steps_not_their_rendering(tmp_path):
    rendered = [{**row, "prompt": row["prompt"].upper(), "intent": None} for row in lake_rows()]
    moved = [{**row, "split": "test"} if row["session_id"] == "t4" else row for row in lake_rows()]
    same = records_hash(write_lake(tmp_path / "same"))
    # re-rendered prompts and re-extracted intents: the same recorded steps, the same hash
    assert records_hash(write_lake(tmp_path / "rendered", rendered)) == same
    # a shopper moved to the test split, or other shoppers: other records
    assert records_hash(write_lake(tmp_path / "moved", moved)) != same
    assert records_hash(other_shoppers_lake(tmp_path / "other")) != same


def test_a_base_trained_on_another_lake_is_refused_naming_both_hashes(lake, sft_checkpoint, tmp_path):
    other = other_shoppers_lake(tmp_path / "other")
    theirs, ours = read_meta(sft_checkpoint)["records_hash"], records_hash(other)
    assert theirs == records_hash(lake)  # the SFT run recorded the records it read
    with pytest.raises(ForeignBase) as raised:
        run_optd(optd_settings(steps=1), other, tmp_path / "optd", sft_checkpoint, progress=False)
    assert f"(records_hash {theirs[:12]} there, {ours[:12]} here)" in str(raised.value)
    assert "allow_foreign_base" in str(raised.value)
    assert not (tmp_path / "optd" / "checkpoints").exists()  # refused before anything was trained


def test_a_base_that_records_no_lineage_is_refused(lake, sft_checkpoint, tmp_path):
    bare = Path(shutil.copytree(sft_checkpoint, tmp_path / "model"))  # the model folder without its run
    with pytest.raises(ForeignBase, match="it records no records_hash"):
        run_optd(optd_settings(steps=1), lake, tmp_path / "optd", bare, progress=False)


def test_allow_foreign_base_distils_and_the_checkpoint_says_so(lake, sft_checkpoint, tmp_path):
    other = other_shoppers_lake(tmp_path / "other")
    settings = optd_settings(steps=1, allow_foreign_base=True)
    summary = run_optd(settings, other, tmp_path / "optd", sft_checkpoint, progress=False)
    meta = read_meta(summary.checkpoint)
    assert (meta["foreign_base"], meta["settings"]["allow_foreign_base"]) == (True, True)
    assert (meta["teacher_records_hash"], meta["records_hash"]) == (records_hash(lake), records_hash(other))
    same = run_optd(optd_settings(steps=1), lake, tmp_path / "same", sft_checkpoint, progress=False)
    assert read_meta(same.checkpoint)["foreign_base"] is False  # this lake's teacher: nothing to allow


runner = CliRunner()


def test_cli_trains_optd_from_an_sft_checkpoint(prefect_harness, lake, sft_checkpoint, tmp_path):
    config = tmp_path / "train.toml"
    config.write_text(
        "[train]\nmodes = ['single']\nsteps = 2\nstates_per_update = 2\nmicro_batch_states = 1\n"
        "eval_split = 'test'\nlr = 0.001\nwarmup_steps = 1\ntorch_threads = 1\nheld_out_sampled = 2\n"
        "[optd]\nprobe_states = 2\nchunk_size = 8\nsteps = 3\n[optd.rollout_sampling]\nmax_new_tokens = 16\n"
    )
    out = tmp_path / "optd"
    args = ["train", "--lake", str(lake), "--stage", "optd", "--out", str(out), "--config", str(config)]
    result = runner.invoke(app, [*args, "--base", str(sft_checkpoint)])
    assert result.exit_code == 0, result.output
    final = out / "checkpoints" / "step-000003"  # [optd] steps on top of [train]'s
    assert f"checkpoint: {final}" in result.output.replace("\n", "")
    saved = read_meta(final)["settings"]
    assert (saved["rollout_sampling"]["max_new_tokens"], saved["probe_states"], saved["epsilon"]) == (
        16,
        2,
        0.02,
    )
    assert (saved["lr"], saved["steps"]) == (0.001, 3)
    assert "sampled held-out responses: parse " in result.output
    assert "without a screen: no_recorded_steps 2" in result.output  # a records-only lake
    # while it trained, the flow published its progress after each evaluation (start and end)
    published = progress_artifacts("train-optd-progress")
    assert len(published) >= 2 and "held-out" in published[-1].data
    assert (out / "curves.png").is_file() and (out / "tensorboard").is_dir() == tensorboard_installed()


def progress_artifacts(key: str) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
    return sorted(found, key=lambda a: a.created)


def tensorboard_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("tensorboard") is not None
