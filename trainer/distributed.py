"""Data-parallel training under ``torchrun``: DDP (gloo on CPU, nccl on GPU) or FSDP2.

Every rank draws the same update from the same sampler and keeps its shard of the states
(``rank::world``). The trainer divides each rank's state-loss sum by ``global_states / world``;
DDP then averages the gradients over the ranks, which gives the gradient of the mean over
all the update's states: the same update as one process on the whole batch.

Only torch is imported: the module runs on a machine without the data stack.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal, TypeVar

import torch
import torch.distributed as dist
from torch import nn

Item = TypeVar("Item")
Strategy = Literal["ddp", "fsdp"]


@dataclass(frozen=True)
class World:
    """This process's place among the ranks (one process: rank 0 of 1)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.size > 1

    def shard(self, items: Sequence[Item]) -> list[Item]:
        """This rank's share of ``items``: every ``size``-th from ``rank``."""
        return list(items[self.rank :: self.size])

    def divisor(self, global_states: int) -> float:
        """What each rank divides its state-loss sum by, so averaged gradients are the global mean's."""
        return global_states / self.size


def init_world() -> World:
    """Join the process group ``torchrun`` set up (``WORLD_SIZE`` > 1), or run alone."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size == 1:
        return World()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return World(rank=dist.get_rank(), size=dist.get_world_size(), local_rank=local_rank)


def check_shards(world: World, strategy: Strategy, states_per_update: int, micro_batch_states: int) -> None:
    """Every rank needs a state; under FSDP2 (weights gathered at every forward) equal micro-batch counts."""
    if states_per_update < world.size:
        raise ValueError(f"{states_per_update} states per update cannot be shared by {world.size} ranks")
    if strategy == "fsdp" and world.active and states_per_update % (world.size * micro_batch_states):
        raise ValueError(
            f"fsdp: states_per_update ({states_per_update}) must be a multiple of ranks x micro_batch_states "
            f"({world.size} x {micro_batch_states}): every rank runs the same number of forward passes"
        )


def device_for(world: World, requested: torch.device) -> torch.device:
    """On GPU each rank takes its own device; on CPU all share the host."""
    if requested.type == "cuda" and world.active:
        return torch.device("cuda", world.local_rank)
    return requested


def sum_over_ranks(values: dict[str, float], world: World, device: torch.device) -> dict[str, float]:
    """Each value summed over the ranks (reported losses are sums divided by the global state count)."""
    if not world.active or not values:
        return dict(values)
    packed = torch.tensor(list(values.values()), dtype=torch.float64, device=device)
    dist.all_reduce(packed, op=dist.ReduceOp.SUM)
    return dict(zip(values, packed.tolist(), strict=True))


def wrap(body: nn.Module, world: World, strategy: Strategy, device: torch.device) -> nn.Module:
    """``body`` ready for data-parallel training (unchanged when running alone)."""
    if not world.active:
        return body
    if strategy == "ddp":
        ids = [device.index] if device.type == "cuda" else None
        # No buffer broadcast at each forward: it is a collective, and ranks of an uneven update run
        # different numbers of forwards (a deadlock). The buffers (rotary frequencies) are built, not
        # learnt, and the one broadcast at construction keeps them equal.
        return nn.parallel.DistributedDataParallel(body, device_ids=ids, forward_sync_buffers=False)
    return shard_fully(body)


def shard_fully(body: nn.Module) -> nn.Module:
    """FSDP2: each decoder layer its own unit, the rest (embeddings, final norm, head) the root's."""
    from torch.distributed.fsdp import fully_shard

    for layer in decoder_layers(body):
        fully_shard(layer)
    fully_shard(body)
    return body


def decoder_layers(module: nn.Module) -> list[nn.Module]:
    """The repeated blocks of a Hugging Face decoder (the ``layers`` ModuleList, wherever it sits)."""
    for name, child in module.named_modules():
        if name.endswith("layers") and isinstance(child, nn.ModuleList):
            return list(child)
    raise ValueError(f"{type(module).__name__} has no 'layers' list of decoder blocks to shard")


def gradient_sync(module: nn.Module, enabled: bool) -> None:
    """Whether the next backward all-reduces (DDP) or reduce-scatters (FSDP2) the gradients.

    Off for every micro-batch but a rank's last: each rank then syncs exactly once per update,
    however many micro-batches its shard has (shards of an uneven update differ by one state).
    """
    if isinstance(module, nn.parallel.DistributedDataParallel):
        module.require_backward_grad_sync = enabled  # what DDP's no_sync() toggles, read at forward
    elif hasattr(module, "set_requires_gradient_sync"):
        module.set_requires_gradient_sync(enabled)


def full_tensor(param: torch.Tensor) -> torch.Tensor:
    """A parameter as one whole tensor: an FSDP2 shard (DTensor) is gathered, differentiably."""
    gather = getattr(param, "full_tensor", None)
    return gather() if callable(gather) else param


@contextmanager
def unsharded(root: nn.Module) -> Iterator[None]:
    """Whole parameters for the duration, and no collective inside (a no-op when ``root`` is not sharded).

    Generation calls the model outside the sharded forward, and ranks sampling responses of
    different lengths run different numbers of forwards: each unit gathers its shards once
    here and keeps them through every forward, instead of gathering again at each one.
    ``root`` is the module ``shard_fully`` sharded.
    """
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in root.modules() if isinstance(m, FSDPModule)]
    if units:
        # FSDP2 takes the first unit to run a forward for the root: a layer called by generation
        # before any training forward would take the root's place
        root._get_fsdp_state()._lazy_init()
    for unit in units:
        unit.set_reshard_after_forward(False, recurse=False)
        unit.unshard()
    try:
        yield
    finally:
        for unit in units:
            unit.reshard()
            if unit is not root:  # the root keeps its parameters after forward anyway (FSDP2's rule)
                unit.set_reshard_after_forward(True, recurse=False)


def gather_to_main(value: Item, world: World) -> list[Item] | None:
    """Every rank's ``value``, in rank order, on rank 0 (None on the others); every rank calls it."""
    if not world.active:
        return [value]
    gathered: list[Item] | None = [None] * world.size if world.is_main else None  # type: ignore[list-item]
    dist.gather_object(value, gathered, dst=0)
    return gathered


def broadcast_from_main(value: Item, world: World) -> Item:
    """Rank 0's ``value`` on every rank (what the others pass is ignored); every rank calls it."""
    if not world.active:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier(world: World) -> None:
    if world.active:
        dist.barrier()


def shutdown() -> None:
    """Leave the process group together, once the run's models and optimizers are no longer referenced.

    The barrier: a rank that tears the group down while another is still in a collective (the last
    gradient all-reduce) can leave that rank waiting for ever. The collection: a wrapped model's reference
    cycles (FSDP2's hooks and DTensors) keep gloo's work objects, and the tensors they hold, alive; left
    to the interpreter's finalization their destruction aborts a process whose run has finished
    (``terminate called without an active exception``).
    """
    if not dist.is_initialized():
        return
    dist.barrier()
    gc.collect()
    dist.destroy_process_group()
