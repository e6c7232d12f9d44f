"""Checkpoints: a Hugging Face model folder plus everything an exact resume needs.

``OUT/checkpoints/step-000040/`` holds the model (safetensors, config, generation
config, tokenizer, chat template: ``from_pretrained`` and vLLM load it as it is),
``trainer_state.pt`` (optimizer, scheduler, every rank's RNG states) and ``trainer.json``
(step, number of ranks, sampler position, exact settings, data hash). A folder is written
under a temporary name and renamed, so one that exists is complete.

Under ``torchrun`` every rank takes part: the weights and the optimizer state are gathered
whole from the shards (FSDP2) or taken from rank 0's replica (DDP), so the folder is the same
whatever the strategy; rank 0 writes it. On resume rank 0 reads the state and sends each rank
its part: the optimizer state resharded to its parameters, and its own RNG states.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from trainer.distributed import World, broadcast_from_main, gather_to_main
from trainer.loop import rng_state, set_rng_state
from trainer.models import save_model

FOLDER = re.compile(r"^step-(\d{6,})$")
STATE_FILE, META_FILE = "trainer_state.pt", "trainer.json"
ALONE = World()
# whole tensors, on CPU, on rank 0 only: the other ranks take part in the gathers and keep nothing
GATHERED_ON_MAIN = StateDictOptions(full_state_dict=True, cpu_offload=True)


@dataclass(frozen=True)
class Resumed:
    folder: Path
    step: int
    meta: dict[str, Any]


def checkpoints_dir(out: str | Path) -> Path:
    return Path(out) / "checkpoints"


def step_folders(out: str | Path) -> list[tuple[int, Path]]:
    root = checkpoints_dir(out)
    found = [(int(m.group(1)), p) for p in root.glob("step-*") if (m := FOLDER.match(p.name))]
    return sorted(found)


def latest(out: str | Path) -> Path | None:
    folders = step_folders(out)
    return folders[-1][1] if folders else None


def save_checkpoint(
    out: str | Path,
    step: int,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    meta: dict[str, Any],
    *,
    keep: int,
    world: World = ALONE,
) -> Path | None:
    """Write step ``step``'s checkpoint atomically; keep the newest ``keep`` step folders.

    Every rank calls it (the gathers are collective); rank 0 writes and returns the folder, the
    others return None.
    """
    weights = without_tied_copies(get_model_state_dict(model, options=GATHERED_ON_MAIN), model)
    optimizer_state = whole_optimizer_state(model, optimizer)
    rng_states = gather_to_main(rng_state(), world)
    if not world.is_main:
        return None
    final = checkpoints_dir(out) / f"step-{step:06d}"
    staging = final.with_name(f".{final.name}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    save_model(model, tokenizer, staging, weights)
    state = {"optimizer": optimizer_state, "scheduler": scheduler.state_dict(), "rng": rng_states}
    torch.save(state, staging / STATE_FILE)
    record = {"step": step, "world_size": world.size, **meta}
    (staging / META_FILE).write_text(json.dumps(record, indent=2, default=str))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(staging, final)
    for _, old in step_folders(out)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def without_tied_copies(weights: dict[str, torch.Tensor], model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """One entry per parameter: a tied head gathered from shards is a copy, not the embedding's storage,
    and would be written twice (Hugging Face drops the alias when the two share storage)."""
    names = {name for name, _ in model.named_parameters()} | {name for name, _ in model.named_buffers()}
    return {name: tensor for name, tensor in weights.items() if name in names}


def whole_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any] | None:
    """The optimizer state by parameter name, unsharded, on rank 0's CPU (None until an update is taken).

    An empty state is not asked for: the gather would first fill it by a step with zero gradients,
    which Adam's bias correction would count as an update the run never took.
    """
    if not optimizer.state:
        return None
    return get_optimizer_state_dict(model, optimizer, options=GATHERED_ON_MAIN)


def read_meta(folder: str | Path) -> dict[str, Any]:
    return json.loads((Path(folder) / META_FILE).read_text())


def restore_training_state(
    folder: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    world: World = ALONE,
) -> None:
    """Optimizer, scheduler and RNG states of ``folder`` (the model is loaded from the folder itself).

    Every rank calls it: rank 0 reads the file; the optimizer state is broadcast and each rank
    keeps its shard; each rank gets its own RNG states back.
    """
    saved = torch.load(Path(folder) / STATE_FILE, weights_only=False) if world.is_main else {}
    optimizer_state = saved.pop("optimizer", None)
    rest = broadcast_from_main({**saved, "has_optimizer": optimizer_state is not None}, world)
    if rest["has_optimizer"]:
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=world.active)
        set_optimizer_state_dict(model, optimizer, optimizer_state or {}, options=options)
    scheduler.load_state_dict(rest["scheduler"])
    set_rng_state(rest["rng"][world.rank])


def check_resumable(
    meta: dict[str, Any], settings: dict[str, Any], data_hash: str, world_size: int = 1
) -> None:
    """A resume continues the same run exactly: same settings, same data, same number of ranks."""
    saved_size = meta.get("world_size", 1)
    if saved_size != world_size:
        raise ValueError(
            f"cannot resume: the checkpoint's world size is {saved_size}, this run's {world_size}; "
            "each rank samples its shard of every update from its own RNG stream, saved per rank, so "
            "another number of ranks would draw other samples and the run would not continue exactly"
        )
    changed = sorted(
        k for k in settings.keys() | meta["settings"].keys() if settings.get(k) != meta["settings"].get(k)
    )
    if changed:
        raise ValueError(f"cannot resume: settings differ from the checkpoint's in {', '.join(changed)}")
    if meta["data_hash"] != data_hash:
        raise ValueError(
            "cannot resume: the training states (records, tokenizer) differ from the checkpoint's"
        )
