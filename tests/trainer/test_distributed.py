"""Two ``torchrun`` processes (gloo, CPU) make the same OPTD update as one process on the same global batch.

The file is also the workers' script: ``torchrun ... test_distributed.py OUT STRATEGY`` runs one update
on this rank's shard and rank 0 saves the parameters.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from tests.trainer.torchrun import two_ranks

RESPONSE_LENGTHS = (5, 9, 4, 6)
# DDP: 3 states, uneven over two ranks (2 + 1): the divisor must be the global count, not the local one.
# FSDP2 gathers weights at every forward, so every rank must run as many micro-batches: 4 states.
STATES = {"ddp": 3, "fsdp": 4}


def one_update(out: Path, strategy: str) -> dict[str, dict[str, torch.Tensor]]:
    """One OPTD update of a tiny student on fixed states and fixed 'sampled' responses, on this rank's shard."""
    from tests.trainer.conftest import TINY
    from tests.trainer.test_optd import lake_rows
    from trainer.data import RecordText, StatePool
    from trainer.distributed import full_tensor, init_world, wrap
    from trainer.loop import PhaseTimer, Trainer, adam, schedule
    from trainer.models import build_tiny_model, train_tokenizer
    from trainer.objective import ObjectiveSettings
    from trainer.optd import HiddenStates, OPTDObjective, OPTDState, build_rollouts

    torch.set_num_threads(1)
    world = init_world()
    n_states = STATES[strategy]
    rows = lake_rows()
    tokenizer = train_tokenizer([t for r in rows for t in (r["system"], r["prompt"], r["response"])], 512)
    records = [
        RecordText(
            key=str(r["record_id"]),
            **{k: r[k] for k in ("system", "prompt", "response", "action", "intent", "split")},
        )
        for r in rows[:n_states]
    ]
    pool = StatePool(records, tokenizer, 10_000, 10_000, privileged=True)
    states = [OPTDState(s, pool.privileged_ids[s.record.key]) for s in map(pool.get, range(len(records)))]
    generator = torch.Generator().manual_seed(7)
    responses = [
        torch.randint(4, len(tokenizer), (n,), generator=generator).tolist()
        for n in RESPONSE_LENGTHS[:n_states]
    ]
    # float64: Adam's first step divides each gradient by its own size, so rounding in a gradient
    # near adam_eps would show in the weights; in float64 the summation order cannot matter at 1e-6
    torch.manual_seed(0)
    student = build_tiny_model(tokenizer, TINY).double()
    torch.manual_seed(1)
    teacher = HiddenStates(build_tiny_model(tokenizer, TINY).double()).eval().requires_grad_(False)
    cpu = torch.device("cpu")
    initial = {name: p.detach().clone() for name, p in student.named_parameters()}
    body = HiddenStates(student)
    wrapped = wrap(body, world, strategy, cpu)
    optimizer = adam(student, lr=1e-2, betas=(0.9, 0.999), eps=1e-8)
    trainer = Trainer(wrapped, optimizer, schedule(optimizer, 0, 10), clip=1.0, device=cpu, bf16=False)
    rollouts = build_rollouts(
        world.shard(states),
        world.shard(responses),
        teacher,
        tokenizer.pad_token_id,
        2 if not world.active else 1,  # the micro-batches differ too: 2 + 1 (+ 1) alone, 1 each on a rank
        cpu,
        PhaseTimer(cpu),
    )
    teacher_head = tuple(t.detach() if t is not None else None for t in teacher.head())
    objective = OPTDObjective(body.head, teacher_head, len(tokenizer), ObjectiveSettings(), chunk_size=4)
    report = trainer.step(rollouts, objective, world.divisor(n_states))
    assert not report.skipped
    params = {name: full_tensor(p).detach().clone() for name, p in student.named_parameters()}
    if world.is_main and world.active:
        torch.save(params, out)
    return {"initial": initial, "updated": params}


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_gloo_ranks_make_the_single_process_update(strategy, tmp_path):
    single_process = one_update(tmp_path / "alone.pt", strategy)
    out = tmp_path / "params.pt"
    two_ranks(__file__, str(out), strategy, timeout=180)
    ranks, alone = torch.load(out), single_process["updated"]
    assert ranks.keys() == alone.keys()
    moved = max(float((alone[k] - single_process["initial"][k]).abs().max()) for k in alone)
    assert moved > 1e-3  # the update is not empty (Adam moves each weight by about the LR, 1e-2)
    for name, value in ranks.items():
        torch.testing.assert_close(value, alone[name], atol=1e-6, rtol=0)


if __name__ == "__main__":
    from trainer.distributed import shutdown

    one_update(Path(sys.argv[1]), sys.argv[2])
    shutdown()  # after the update's model is unreferenced: see shutdown
