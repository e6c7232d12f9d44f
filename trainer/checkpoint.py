"""Checkpoints: a Hugging Face model folder plus everything an exact resume needs.

``OUT/checkpoints/step-000040/`` holds the model (safetensors, config, generation
config, tokenizer, chat template: ``from_pretrained`` and vLLM load it as it is),
``trainer_state.pt`` (optimizer, scheduler, RNG states) and ``trainer.json`` (step,
sampler position, exact settings, data hash). A folder is written under a temporary
name and renamed, so one that exists is complete.
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
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from trainer.loop import rng_state, set_rng_state
from trainer.models import save_model

FOLDER = re.compile(r"^step-(\d{6,})$")
STATE_FILE, META_FILE = "trainer_state.pt", "trainer.json"


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
) -> Path:
    """Write step ``step``'s checkpoint atomically; keep the newest ``keep`` step folders."""
    final = checkpoints_dir(out) / f"step-{step:06d}"
    staging = final.with_name(f".{final.name}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    save_model(model, tokenizer, staging)
    state = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "rng": rng_state()}
    torch.save(state, staging / STATE_FILE)
    (staging / META_FILE).write_text(json.dumps({"step": step, **meta}, indent=2, default=str))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(staging, final)
    for _, old in step_folders(out)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def read_meta(folder: str | Path) -> dict[str, Any]:
    return json.loads((Path(folder) / META_FILE).read_text())


def restore_training_state(
    folder: str | Path,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
) -> None:
    """Optimizer, scheduler and RNG states of ``folder`` (the model is loaded from the folder itself)."""
    state = torch.load(Path(folder) / STATE_FILE, weights_only=False)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])


def check_resumable(meta: dict[str, Any], settings: dict[str, Any], data_hash: str) -> None:
    """A resume continues the same run exactly: same settings, same data."""
    changed = sorted(
        k for k in settings.keys() | meta["settings"].keys() if settings.get(k) != meta["settings"].get(k)
    )
    if changed:
        raise ValueError(f"cannot resume: settings differ from the checkpoint's in {', '.join(changed)}")
    if meta["data_hash"] != data_hash:
        raise ValueError(
            "cannot resume: the training states (records, tokenizer) differ from the checkpoint's"
        )
