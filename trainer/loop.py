"""The optimisation step every stage shares: accumulation, clipping, the non-finite guard, the schedule.

A stage supplies a loss function over one micro-batch that returns the *sum* over its
states of each state's loss (each state already averaged over its own tokens). The
step divides by the number of states in the whole update, fixed before the first
micro-batch, so the loss and the gradients are the same however the update is split.
"""

from __future__ import annotations

import json
import math
import random
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import numpy as np
import torch

if TYPE_CHECKING:
    from trainer.copy_head import FixedWeights

MicroBatch = TypeVar("MicroBatch")


@dataclass
class LossSums:
    """What a loss function returns for one micro-batch: sums over its states (divided later)."""

    total: torch.Tensor  # scalar with a graph: sum over states of the state's loss
    parts: dict[str, torch.Tensor] = field(default_factory=dict)  # detached sums, reported as means
    tokens: int = 0  # tokens processed (prompt + response), for throughput


class PhaseTimer:
    """Wall seconds per named phase of a step (synchronising CUDA so GPU work is counted where it runs)."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.seconds = device, {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self._sync()
        started = time.perf_counter()
        try:
            yield
        finally:
            self._sync()
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


@dataclass
class StepReport:
    step: int
    loss: float
    parts: dict[str, float]
    lr: float
    grad_norm: float
    skipped: bool
    tokens: int
    seconds: dict[str, float]

    @property
    def tokens_per_s(self) -> float:
        wall = sum(self.seconds.values())
        return self.tokens / wall if wall > 0 else 0.0

    def as_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "loss": self.loss,
            **self.parts,
            "lr": self.lr,
            "grad_norm": self.grad_norm,
            "tokens_per_s": round(self.tokens_per_s, 1),
            "seconds": {k: round(v, 4) for k, v in self.seconds.items()},
            "skipped": self.skipped,
        }


def adam(model: torch.nn.Module, lr: float, betas: tuple[float, float], eps: float) -> torch.optim.AdamW:
    """Adam with zero weight decay (the reference setting): decay would pull a warm-started model away."""
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=0.0)


class WarmupLinearDecay:
    """LR factor: linear from 1/warmup up to 1 over ``warmup`` updates, then linear down to 0 at ``total``."""

    def __init__(self, warmup: int, total: int) -> None:
        self.warmup, self.total = warmup, total

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        return max(0.0, (self.total - step) / max(1, self.total - self.warmup))


def schedule(optimizer: torch.optim.Optimizer, warmup: int, total: int) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, WarmupLinearDecay(warmup, total))


def autocast(device: torch.device, bf16: bool) -> AbstractContextManager[Any]:
    """bf16 autocast on CUDA (float32 master weights); a CPU run stays in float32."""
    if device.type == "cuda" and bf16:
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return nullcontext()


def clip_gradients(params: Sequence[torch.nn.Parameter], clip: float | None) -> float:
    """Total gradient norm before clipping; gradients above ``clip`` are scaled down to it (None: left)."""
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm=clip if clip else math.inf, foreach=True)
    return float(norm)


class Trainer(Generic[MicroBatch]):
    """One optimiser update per ``step`` call over a list of micro-batches; stage-agnostic."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        *,
        clip: float | None,
        device: torch.device,
        bf16: bool = True,
        fixed: FixedWeights | None = None,
    ) -> None:
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.fixed = fixed  # weights whose gradients are zeroed before every update
        self.clip, self.device, self.bf16 = clip, device, bf16
        self.params = [p for group in optimizer.param_groups for p in group["params"]]
        self.updates = 0  # optimiser updates attempted, skipped ones included

    def step(
        self,
        micro_batches: Sequence[MicroBatch],
        loss_fn: Callable[[torch.nn.Module, MicroBatch], LossSums],
        n_states: int,
        timer: PhaseTimer | None = None,
    ) -> StepReport:
        """Accumulate ``loss_fn`` over ``micro_batches`` (``n_states`` states in all), then update.

        A non-finite loss or gradient norm skips the update (gradients dropped) and says so;
        the schedule still advances, so the LR of step k does not depend on earlier skips.
        """
        timer = timer or PhaseTimer(self.device)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        with timer.phase("forward_backward"):
            cast = partial(autocast, self.device, self.bf16)
            total, parts, tokens = accumulate(self.model, micro_batches, loss_fn, n_states, cast)
        lr = self.optimizer.param_groups[0]["lr"]
        with timer.phase("optimizer"):
            if self.fixed is not None:
                self.fixed.zero_gradients()
            grad_norm = clip_gradients(self.params, self.clip)
            skipped = not (math.isfinite(total) and math.isfinite(grad_norm))
            if skipped:
                self.optimizer.zero_grad(set_to_none=True)
            else:
                self.optimizer.step()
            with warnings.catch_warnings():
                # torch warns when the schedule advances past a skipped update: that is intended here
                warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step")
                self.scheduler.step()
        self.updates += 1
        return StepReport(
            step=self.updates,
            loss=total / n_states,
            parts={k: v / n_states for k, v in parts.items()},
            lr=lr,
            grad_norm=grad_norm,
            skipped=skipped,
            tokens=tokens,
            seconds=dict(timer.seconds),
        )


def accumulate(
    model: torch.nn.Module,
    micro_batches: Sequence[MicroBatch],
    loss_fn: Callable[[torch.nn.Module, MicroBatch], LossSums],
    n_states: int,
    cast: Callable[[], AbstractContextManager[Any]] = nullcontext,
) -> tuple[float, dict[str, float], int]:
    """Backward of each micro-batch's state-loss sum over ``n_states``: the gradients add up to those of
    the mean over all the update's states. Returns the summed loss and parts (undivided) and tokens."""
    total, tokens, parts = 0.0, 0, {}
    for micro in micro_batches:
        with cast():
            sums = loss_fn(model, micro)
        (sums.total / n_states).backward()
        total += float(sums.total.detach())
        tokens += sums.tokens
        for name, value in sums.parts.items():
            parts[name] = parts.get(name, 0.0) + float(value)
    return total, parts, tokens


def split(items: Sequence[Any], size: int) -> list[Sequence[Any]]:
    """Consecutive pieces of at most ``size`` items."""
    return [items[i : i + size] for i in range(0, len(items), size)]


# --- reproducibility -----------------------------------------------------------------------

EVAL_SEED_OFFSET = 1_000_003  # the held-out samples' RNG stream, apart from the training one


@contextmanager
def seeded(seed: int, device: torch.device) -> Iterator[None]:
    """Sampling from its own stream (``seed`` offset): it neither depends on nor disturbs the training
    samples, so a resumed run samples what an uninterrupted one would."""
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed + EVAL_SEED_OFFSET)
        yield


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # all devices


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# --- metrics -----------------------------------------------------------------------------


class MetricsMirror(Protocol):
    """Somewhere else each metrics row goes as it is written (trainer.tensorboard_log.TensorBoardMirror)."""

    def write(self, row: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class MetricsLog:
    """Append-only JSONL of step and evaluation rows; on resume, rows after the restart step are dropped.

    Each row written is also handed to every one of ``mirrors``, after it is in the file."""

    def __init__(
        self, path: str | Path, resume_from: int | None = None, mirrors: Sequence[MetricsMirror] = ()
    ) -> None:
        self.path = Path(path)
        self.mirrors = tuple(mirrors)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_from is None:
            self.path.write_text("")
        elif self.path.exists():
            kept = [
                line for line in self.path.read_text().splitlines() if json.loads(line)["step"] <= resume_from
            ]
            self.path.write_text("".join(f"{line}\n" for line in kept))

    def write(self, row: dict[str, Any]) -> None:
        with self.path.open("a") as out:
            out.write(json.dumps(row) + "\n")
        for mirror in self.mirrors:
            mirror.write(row)

    def close(self) -> None:
        """Close the mirrors (the file itself is closed after every row)."""
        for mirror in self.mirrors:
            mirror.close()

    def rows(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.path.read_text().splitlines()]
