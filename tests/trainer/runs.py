"""Hand-written metrics rows in the shapes trainer/run.py (SFT) and trainer/optd_run.py (OPTD) write, and
run folders laid out as the trainer lays them out, for the curves, the artifacts and the report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def sft_train(step: int, loss: float) -> dict[str, Any]:
    return {"kind": "train", "step": step, "loss": loss, "nll": loss, "lr": 1e-3, "grad_norm": 1.5,
            "tokens_per_s": 900.0, "seconds": {"data": 0.01, "forward_backward": 0.2, "optimizer": 0.05},
            "skipped": False}  # fmt: skip


def shares(parse: float, executable: float | None, judged: int = 4) -> dict[str, Any]:
    return {"parse_share": parse, "executable_share": executable, "judged": judged,
            "rejected": {"unknown_item": 1} if judged else {}, "no_screen": {}}  # fmt: skip


def sft_rows() -> list[dict[str, Any]]:
    """Four updates, a held-out evaluation before the first and after every second."""
    return [
        {"kind": "eval", "step": 0, "held_out_loss": 6.0, **shares(0.0, None, judged=0)},
        sft_train(1, 5.9),
        sft_train(2, 4.1),
        {"kind": "eval", "step": 2, "held_out_loss": 4.5, **shares(0.5, 0.25)},
        sft_train(3, 3.2),
        sft_train(4, 2.7),
        {"kind": "eval", "step": 4, "held_out_loss": 3.0, **shares(0.75, 0.5)},
    ]


def optd_train(step: int, distillation: float, grounding: float, lam: float, binding: float, kl: float):
    return {"kind": "train", "step": step, "loss": distillation + 0.1 * grounding, "distillation": distillation,
            "grounding": grounding, "mean_lambda": lam, "binding_share": binding, "guidance_kl": kl,
            "sampled_tokens": 120.0, "lr": 1e-4, "grad_norm": 0.5, "tokens_per_s": 300.0,
            "seconds": {"data": 0.01, "generate": 0.4, "forward_backward": 0.3}, "skipped": False,
            "policy_version": step - 1, "forward_backward_detail": {"student_forward": 0.1}}  # fmt: skip


def optd_rows() -> list[dict[str, Any]]:
    """Two updates between a held-out evaluation before and after; the eval rows carry the objective
    and its parts, as trainer/optd_run.py writes them."""
    held_out = {"objective": 0.3, "distillation": 0.2, "grounding": 1.0, "mean_lambda": 0.5,
                "binding_share": 0.6, "guidance_kl": 0.02}  # fmt: skip
    after = {"objective": 0.18, "distillation": 0.1, "grounding": 0.8, "mean_lambda": 0.7,
             "binding_share": 0.4, "guidance_kl": 0.015}  # fmt: skip
    return [
        {"kind": "eval", "step": 0, **held_out, **shares(0.5, 0.25)},
        optd_train(1, 0.25, 1.0, 0.5, 0.6, 0.019),
        optd_train(2, 0.15, 0.9, 0.6, 0.5, 0.017),
        {"kind": "eval", "step": 2, **after, **shares(1.0, 0.75)},
    ]


def write_rows(run_dir: Path, rows: list[dict[str, Any]]) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "metrics.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def write_run(
    run_dir: Path,
    rows: list[dict[str, Any]],
    stage: str,
    step: int,
    meta_in: str = "checkpoint",
    **meta: Any,
) -> Path:
    """A run folder as the trainer leaves it: metrics, a checkpoint (a model folder: ``config.json``)
    and its ``trainer.json``, inside the checkpoint (``meta_in="checkpoint"``) or under
    ``RUN/trainer_state/`` (``"trainer_state"``). Returns the checkpoint folder."""
    write_rows(run_dir, rows)
    checkpoint = run_dir / "checkpoints" / f"step-{step:06d}"
    checkpoint.mkdir(parents=True)
    (checkpoint / "config.json").write_text("{}")
    state = checkpoint if meta_in == "checkpoint" else run_dir / "trainer_state" / checkpoint.name
    state.mkdir(parents=True, exist_ok=True)
    (state / "trainer.json").write_text(json.dumps({"step": step, "stage": stage, **meta}))
    return checkpoint
