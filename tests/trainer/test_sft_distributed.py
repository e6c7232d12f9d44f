"""Two ``torchrun`` ranks (gloo, CPU) run SFT as one process does: under DDP and FSDP2, two updates end at
the single-process weights on the same global batches, and a run stopped after one update and resumed
ends where the uninterrupted run ends.

The file is also the workers' script: ``torchrun ... test_sft_distributed.py LAKE OUT PART`` (see ``work``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from tests.trainer.test_distributed_resume import rows
from tests.trainer.test_optd import train_settings, write_lake
from tests.trainer.torchrun import two_ranks
from trainer.checkpoint import read_meta
from trainer.data import load_records
from trainer.loop import seed_everything
from trainer.run import run_sft, starting_model

# DDP: 3 states shared unevenly (2 + 1); FSDP2 needs as many forwards on every rank: 4 states, 2 each.
STATES = {"ddp": 3, "fsdp": 4}
# 5 held-out states: 3 + 2 over the ranks, so under FSDP2 the ranks run different numbers of forwards
HELD_OUT = 5


def settings(strategy: str, micro_batch_states: int = 1):
    return train_settings(
        steps=2,
        states_per_update=STATES[strategy],
        micro_batch_states=micro_batch_states,
        lr=3e-3,
        held_out_states=HELD_OUT,
        strategy=strategy,
    )


@contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """The tiny model built in ``dtype``: float64 for the runs compared across ranks and one process.

    Adam's first step divides each gradient by its own size, so the float32 rounding of a gradient that
    is near ``adam_eps`` (the two ranks sum their halves in another order than one process does) would
    show in the weights; in float64 that rounding is far below the tolerance.
    """
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def work(lake: Path, out: Path, part: str) -> None:
    """``first``: per strategy, two float64 updates into OUT/STRATEGY/same, then in float32 the
    uninterrupted run into OUT/STRATEGY/whole and the first update of the interrupted one into
    OUT/STRATEGY/parts; ``rest``: those resumed."""
    for strategy in STATES:
        train = settings(strategy)
        if part == "first":
            with default_dtype(torch.float64):
                run_sft(train, lake, out / strategy / "same", progress=False)
            run_sft(train, lake, out / strategy / "whole", progress=False)
            run_sft(train, lake, out / strategy / "parts", stop_after=1, progress=False)
        else:
            run_sft(train, lake, out / strategy / "parts", resume=True, progress=False)


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> Path:
    return write_lake(tmp_path_factory.mktemp("sftlake"))


@pytest.fixture(scope="module")
def runs(lake, tmp_path_factory) -> Path:
    """Both strategies' two-rank runs: the first part, then the resume in fresh processes."""
    out = tmp_path_factory.mktemp("sftruns")
    two_ranks(__file__, str(lake), str(out), "first")
    two_ranks(__file__, str(lake), str(out), "rest")
    return out


@pytest.fixture(scope="module")
def alone(lake, tmp_path_factory) -> Path:
    """One process, float64, each strategy's global batches split into micro-batches of 2 states."""
    out = tmp_path_factory.mktemp("sftalone")
    with default_dtype(torch.float64):
        for strategy in STATES:
            run_sft(settings(strategy, micro_batch_states=2), lake, out / strategy, progress=False)
    return out


def initial_weights(lake: Path, train) -> dict[str, torch.Tensor]:
    """The tiny model every run starts from, in float64: seeded, built for the tokenizer of the records."""
    seed_everything(train.seed)
    records, _ = load_records(lake, [train.train_split], train.modes)
    with default_dtype(torch.float64):
        model, _ = starting_model(records, train, None)
    return {name: p.detach() for name, p in model.named_parameters()}


def final_weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(run / "checkpoints" / "step-000002" / "model.safetensors")


@pytest.mark.slow
@pytest.mark.parametrize("strategy", list(STATES))
def test_two_ranks_make_the_single_process_updates(strategy, runs, alone, lake):
    ranks, single = final_weights(runs / strategy / "same"), final_weights(alone / strategy)
    start = initial_weights(lake, settings(strategy))
    assert ranks.keys() == single.keys() == start.keys()
    assert single["model.embed_tokens.weight"].dtype == torch.float64
    # the updates moved the weights: Adam moves each by about the LR, 1.5e-3 then 3e-3 in the warm-up
    assert max(float((single[k] - start[k]).abs().max()) for k in single) > 1e-3
    for name, value in ranks.items():
        torch.testing.assert_close(value, single[name], rtol=0, atol=1e-10)
    # each row's loss, gradient norm and LR (the loss a mean over both ranks' states), and the held-out
    # loss (each rank scored its shard, summed over the ranks) are the single process's
    for kind in ("train", "eval"):
        two, one = rows(runs / strategy / "same", kind), rows(alone / strategy, kind)
        assert two.keys() == one.keys() == ({1, 2} if kind == "train" else {0, 2})
        for step, row in one.items():
            assert two[step].keys() == row.keys()
            for name, value in row.items():
                expected = pytest.approx(value, rel=1e-10) if isinstance(value, float) else value
                assert two[step][name] == expected, (kind, step, name)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", list(STATES))
def test_a_resumed_two_rank_run_ends_where_the_uninterrupted_one_does(strategy, runs):
    stopped = runs / strategy / "parts" / "checkpoints" / "step-000001"
    assert read_meta(stopped)["world_size"] == 2
    # the same float operations in the same order (gloo reduces two ranks deterministically, the sampler
    # and the optimizer state restored): the weights agree to the last bit
    whole, resumed = final_weights(runs / strategy / "whole"), final_weights(runs / strategy / "parts")
    for name in whole:
        torch.testing.assert_close(resumed[name], whole[name], rtol=0, atol=0)
    for kind in ("train", "eval"):
        assert rows(runs / strategy / "parts", kind) == rows(runs / strategy / "whole", kind)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", list(STATES))
def test_the_checkpoint_is_whole_and_loads_with_from_pretrained(strategy, runs):
    run = runs / strategy / "parts"
    loaded = dict(
        AutoModelForCausalLM.from_pretrained(run / "checkpoints" / "step-000002").named_parameters()
    )
    # every parameter once and whole, as the ranks last held it (the tied head not written twice)
    written = final_weights(run)
    assert written.keys() == loaded.keys()
    assert all(torch.equal(loaded[name], written[name]) for name in written)
    # the summary, written by rank 0, counts the held-out states of both ranks' shards
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["steps"], summary["held_out_states"]) == (2, HELD_OUT)


@pytest.mark.slow
def test_one_process_refuses_to_resume_a_two_rank_sft_checkpoint(runs, lake):
    with pytest.raises(ValueError, match="world size is 2, this run's 1"):
        run_sft(settings("ddp"), lake, runs / "ddp" / "parts", resume=True, progress=False)


CLI_CONFIG = """
[train]
modes = ["single"]
steps = 2
states_per_update = 4
micro_batch_states = 1
eval_split = "test"
held_out_states = 5
held_out_sampled = 2
torch_threads = 1
strategy = "fsdp"

[train.tiny]
vocab_size = 512
hidden_size = 32
intermediate_size = 64
num_layers = 2
num_heads = 2
num_kv_heads = 1
"""


@pytest.mark.slow
def test_the_command_line_trains_under_torchrun_with_one_flow_and_one_writer(lake, tmp_path):
    # the README's launch: rank 0 runs the flow and prints the summary, rank 1 trains beside it
    (tmp_path / "train.toml").write_text(CLI_CONFIG)
    out = tmp_path / "run"
    arguments = [
        "--lake",
        str(lake),
        "--stage",
        "sft",
        "--out",
        str(out),
        "--config",
        str(tmp_path / "train.toml"),
    ]
    printed = two_ranks("-m", "cli", "train", *arguments)
    assert printed.count("trained in") == 1
    folder = out / "checkpoints" / "step-000002"
    meta = read_meta(folder)
    assert (meta["world_size"], meta["settings"]["strategy"]) == (2, "fsdp")
    assert json.loads((out / "summary.json").read_text())["checkpoint"] == str(folder)
    assert [row["step"] for row in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())] == [
        0,
        1,
        2,
        2,
    ]


def test_optd_reads_the_strategy_from_train_unless_its_own_section_sets_one():
    from trainer.config import optd_settings

    # the OPTD settings extend the training settings: [train] strategy holds for both stages ...
    assert optd_settings({"strategy": "fsdp"}, {}).strategy == "fsdp"
    # ... and [optd] on top of [train] changes it for the OPTD stage alone
    assert optd_settings({"strategy": "ddp"}, {"strategy": "fsdp"}).strategy == "fsdp"
    assert optd_settings({}, {}).strategy == "ddp"


if __name__ == "__main__":
    from trainer.distributed import shutdown

    work(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3])
    shutdown()
