"""Two ``torchrun`` ranks (gloo, CPU): an OPTD run stopped after one update and resumed ends where the
uninterrupted run ends, under DDP and under FSDP2.

The file is also the workers' script: ``torchrun ... test_distributed_resume.py LAKE BASE OUT PART``
(see ``work``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from tests.trainer.test_optd import optd_settings, train_settings, write_lake
from tests.trainer.torchrun import two_ranks
from trainer.checkpoint import read_meta, state_folder
from trainer.optd_run import run_optd
from trainer.run import run_sft
from trainer.sampling import SamplingSettings

# DDP: 3 states shared unevenly (2 + 1); FSDP2 needs as many forwards on every rank: 4 states, 2 each
STATES = {"ddp": 3, "fsdp": 4}
UNEVEN_IDS = torch.arange(1, 9).view(1, 8)
TIMING = {"seconds", "tokens_per_s", "forward_backward_detail"}  # wall clock: differs between any two runs


def settings(strategy: str):
    return optd_settings(
        steps=2,
        states_per_update=STATES[strategy],
        micro_batch_states=1,
        lr=3e-3,
        rollout_sampling=SamplingSettings(max_new_tokens=12),
        probe_states=2,
        strategy=strategy,
    )


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2
    )
    return LlamaForCausalLM(config)


def uneven_forwards(out: Path, rank: int) -> None:
    """Under FSDP2, rank r runs r + 1 forwards inside ``unsharded`` (ranks sampling responses of different
    lengths do), then one sharded forward through the root; each rank saves what it computed."""
    from trainer.distributed import shard_fully, unsharded
    from trainer.optd import HiddenStates

    lm = tiny_llama()
    body = shard_fully(HiddenStates(lm))
    with torch.no_grad():
        with unsharded(body):
            logits = [lm(UNEVEN_IDS).logits for _ in range(rank + 1)][-1]
        hidden = body(UNEVEN_IDS, torch.ones_like(UNEVEN_IDS))
    torch.save({"logits": logits, "hidden": hidden}, out / f"uneven-{rank}.pt")


def work(lake: Path, base: Path, out: Path, part: str) -> None:
    """``first``: the uneven forwards, then per strategy the uninterrupted run into OUT/STRATEGY/whole
    and the first update of the interrupted one into OUT/STRATEGY/parts; ``rest``: those resumed."""
    from trainer.distributed import init_world

    world = init_world()
    if part == "first":
        uneven_forwards(out, world.rank)
    for strategy in STATES:
        optd = settings(strategy)
        if part == "first":
            run_optd(optd, lake, out / strategy / "whole", base, progress=False)
            run_optd(optd, lake, out / strategy / "parts", base, stop_after=1, progress=False)
        else:
            run_optd(optd, lake, out / strategy / "parts", base, resume=True, progress=False)


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> Path:
    return write_lake(tmp_path_factory.mktemp("resumelake"))


@pytest.fixture(scope="module")
def base(lake, tmp_path_factory) -> Path:
    """A short SFT run's checkpoint: the frozen teacher and the student's start."""
    return Path(
        run_sft(train_settings(steps=2), lake, tmp_path_factory.mktemp("sft"), progress=False).checkpoint
    )


@pytest.fixture(scope="module")
def runs(lake, base, tmp_path_factory) -> Path:
    """Both strategies' runs: the first part, then the resume in fresh processes (a stopped job restarted)."""
    out = tmp_path_factory.mktemp("runs")
    two_ranks(__file__, str(lake), str(base), str(out), "first")
    for strategy in STATES:
        stopped = out / strategy / "parts" / "checkpoints" / "step-000001"
        assert read_meta(stopped)["world_size"] == 2
    two_ranks(__file__, str(lake), str(base), str(out), "rest")
    return out


def rows(run: Path, kind: str) -> dict[int, dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return {
        row["step"]: {k: v for k, v in row.items() if k not in TIMING}
        for row in map(json.loads, lines)
        if row["kind"] == kind
    }


@pytest.mark.slow
@pytest.mark.parametrize("strategy", list(STATES))
def test_a_resumed_two_rank_run_ends_where_the_uninterrupted_one_does(strategy, runs, base):
    whole = runs / strategy / "whole" / "checkpoints" / "step-000002"
    resumed = runs / strategy / "parts" / "checkpoints" / "step-000002"
    # same float operations in the same order on every rank (gloo reduces two ranks deterministically,
    # sampling draws from the restored per-rank RNG streams): the weights agree to the last bit
    a, b, start = (load_file(folder / "model.safetensors") for folder in (whole, resumed, base))
    assert a.keys() == b.keys() == start.keys()
    assert max(float((a[k] - start[k]).abs().max()) for k in a) > 1e-4  # two updates moved the weights
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=0, atol=0)
    # step 2's row (loss, parts, lambda*, LR, gradient norm, policy version) and the final evaluation agree
    step_2 = rows(runs / strategy / "whole", "train")[2]
    assert step_2["policy_version"] == 1 and not step_2["skipped"]
    assert rows(runs / strategy / "parts", "train")[2] == step_2
    assert rows(runs / strategy / "parts", "eval") == rows(runs / strategy / "whole", "eval")


@pytest.mark.slow
@pytest.mark.parametrize("strategy", list(STATES))
def test_the_checkpoint_is_a_plain_folder_of_whole_tensors(strategy, runs):
    folder = runs / strategy / "parts" / "checkpoints" / "step-000002"
    written = load_file(folder / "model.safetensors")
    model = AutoModelForCausalLM.from_pretrained(folder)
    # each tensor once, whole (the tied head is not written beside the embedding it shares)
    assert written.keys() == {name for name, _ in model.named_parameters()}
    for name, param in model.named_parameters():
        torch.testing.assert_close(param, written[name], rtol=0, atol=0)
    # the optimizer state is whole too, by parameter name; every rank's RNG states, each its own
    state = torch.load(state_folder(folder) / "trainer_state.pt", weights_only=False)
    shapes = {name: p.shape for name, p in model.named_parameters()}
    assert {name: s["exp_avg"].shape for name, s in state["optimizer"]["state"].items()} == shapes
    assert len(state["rng"]) == 2 and not torch.equal(state["rng"][0]["torch"], state["rng"][1]["torch"])


@pytest.mark.slow
def test_generation_under_fsdp2_runs_no_collective_and_sees_whole_weights(runs):
    # rank 1 ran twice as many forwards inside `unsharded` as rank 0 and neither waited on the other; both
    # computed what the whole model computes, and the root's own forward still works afterwards
    from trainer.optd import HiddenStates

    lm = tiny_llama()
    with torch.no_grad():
        logits = lm(UNEVEN_IDS).logits
        hidden = HiddenStates(lm)(UNEVEN_IDS, torch.ones_like(UNEVEN_IDS))
    for rank in (0, 1):
        computed = torch.load(runs / f"uneven-{rank}.pt")
        torch.testing.assert_close(computed["logits"], logits, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(computed["hidden"], hidden, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_one_process_refuses_to_resume_a_two_rank_checkpoint(runs, lake, base):
    # one process cannot continue the two ranks' sampling streams: refused, not resumed inexactly
    with pytest.raises(ValueError, match="world size is 2, this run's 1"):
        run_optd(settings("ddp"), lake, runs / "ddp" / "parts", base, resume=True, progress=False)


if __name__ == "__main__":
    from trainer.distributed import shutdown

    work(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4])
    shutdown()
