"""Checkpoints: a Hugging Face model folder, and beside it everything an exact resume needs.

``OUT/checkpoints/step-000040/`` holds what a user of the model needs, nothing else: safetensors,
config, generation config (the protocol's sampling), tokenizer, chat template and a model card
``README.md`` (``from_pretrained``, vLLM and the Hub take it as it is). ``OUT/trainer_state/step-000040/``
holds ``trainer_state.pt`` (optimizer, scheduler, every rank's RNG states) and ``trainer.json`` (step,
number of ranks, sampler position, exact settings, data hash, and the run: an id a new run draws and a
resumed one keeps). Both are written under temporary names and renamed, the state first and the model
folder last, so a model folder that exists is complete and has its state. Pruning removes only the
steps of the run that saves.

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
from trainer.model_card import model_card
from trainer.models import save_model
from trainer.run_folder import CHECKPOINTS_DIR, STATES_DIR, discard

FOLDER = re.compile(r"^step-(\d{6,})$")
STATE_FILE, META_FILE, CARD_FILE = "trainer_state.pt", "trainer.json", "README.md"
ALONE = World()
# whole tensors, on CPU, on rank 0 only: the other ranks take part in the gathers and keep nothing
GATHERED_ON_MAIN = StateDictOptions(full_state_dict=True, cpu_offload=True)


@dataclass(frozen=True)
class Resumed:
    folder: Path
    step: int
    meta: dict[str, Any]


def checkpoints_dir(out: str | Path) -> Path:
    return Path(out) / CHECKPOINTS_DIR


def states_dir(out: str | Path) -> Path:
    return Path(out) / STATES_DIR


def state_folder(checkpoint: str | Path) -> Path:
    """The state folder of the model folder ``OUT/checkpoints/step-N``: ``OUT/trainer_state/step-N``."""
    checkpoint = Path(checkpoint)
    return states_dir(checkpoint.parent.parent) / checkpoint.name


def steps_in(root: Path) -> dict[int, Path]:
    return {int(m.group(1)): p for p in root.glob("step-*") if (m := FOLDER.match(p.name))}


def step_folders(out: str | Path) -> list[tuple[int, Path]]:
    """The complete checkpoints, oldest first: steps whose model folder and state both exist."""
    states = steps_in(states_dir(out))
    return sorted((step, p) for step, p in steps_in(checkpoints_dir(out)).items() if step in states)


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
    """Write step ``step``'s model folder and its state atomically; keep its run's newest ``keep`` steps.

    ``meta`` goes to ``trainer.json`` and, with the step, to the model card. Every rank calls it (the
    gathers are collective); rank 0 writes and returns the model folder, the others return None.
    """
    weights = without_tied_copies(get_model_state_dict(model, options=GATHERED_ON_MAIN), model)
    optimizer_state = whole_optimizer_state(model, optimizer)
    rng_states = gather_to_main(rng_state(), world)
    if not world.is_main:
        return None
    record = {"step": step, "world_size": world.size, **meta}
    final = checkpoints_dir(out) / f"step-{step:06d}"
    final_state = state_folder(final)
    staging, staging_state = (f.with_name(f".{f.name}.tmp") for f in (final, final_state))
    for folder in (staging, staging_state):
        shutil.rmtree(folder, ignore_errors=True)
    save_model(model, tokenizer, staging, weights)
    (staging / CARD_FILE).write_text(model_card(record))
    staging_state.mkdir(parents=True)
    state = {"optimizer": optimizer_state, "scheduler": scheduler.state_dict(), "rng": rng_states}
    torch.save(state, staging_state / STATE_FILE)
    (staging_state / META_FILE).write_text(json.dumps(record, indent=2, default=str))
    # the old model folder goes first and the new one comes last: no moment shows a model folder
    # beside a state that is not its own, or without one
    discard(final)
    discard(final_state)
    os.replace(staging_state, final_state)
    os.replace(staging, final)
    prune(out, keep, record.get("run"), step)
    return final


def prune(out: str | Path, keep: int, run: str | None, written: int) -> None:
    """Keep run ``run``'s newest ``keep`` complete steps up to ``written``, the step just saved (so it is
    always kept); remove that run's other steps before it, both halves (a state left alone by an
    interrupted save included).

    A step is the run's when its ``trainer.json`` names the run. Steps of other runs, steps after
    ``written`` and folders without a readable state are left as they are: a folder can hold step
    folders no run of this process wrote, and sorting them in with its own would remove its own.
    """
    ours = {step: state for step, state in states_of_run(out, run).items() if step <= written}
    complete = sorted(step for step, state in ours.items() if (checkpoints_dir(out) / state.name).is_dir())
    kept = {written, *complete[-keep:]}
    for step, state in ours.items():
        if step not in kept:
            discard(checkpoints_dir(out) / state.name)  # the model folder first, as a save removes it
            discard(state)


def states_of_run(out: str | Path, run: str | None) -> dict[int, Path]:
    """The state folders, by step, whose ``trainer.json`` names run ``run`` (None: records from before
    runs were named, which all share it)."""
    ours = {}
    for step, state in steps_in(states_dir(out)).items():
        try:
            meta = json.loads((state / META_FILE).read_text())
        except (OSError, ValueError):
            continue  # no record of whose it is: not this run's to remove
        if meta.get("run") == run:
            ours[step] = state
    return ours


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
    """``trainer.json`` of the model folder ``folder`` (read from its state folder)."""
    return json.loads((state_folder(folder) / META_FILE).read_text())


def restore_training_state(
    folder: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    world: World = ALONE,
) -> None:
    """Optimizer, scheduler and RNG states saved with the model folder ``folder`` (the model itself is
    loaded from the folder).

    Every rank calls it: rank 0 reads the file; the optimizer state is broadcast and each rank
    keeps its shard; each rank gets its own RNG states back.
    """
    saved = torch.load(state_folder(folder) / STATE_FILE, weights_only=False) if world.is_main else {}
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
