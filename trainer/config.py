"""Typed settings of the trainer (one model, written into every checkpoint).

Defaults are sized for the tiny embedded model on a couple of CPU cores. The paper's
values (UserArena OPTD, a 2B backbone on a GPU cluster; OPTD.md) are given beside
each field where the paper has one: Adam with zero weight decay, linear warm-up then
linear decay, peak LR 2e-8, BF16; RecVerse's SFT warm-up resamples action classes with
q_i proportional to n_i^0.3 and uses LR 2e-7.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

if TYPE_CHECKING:
    from trainer.models import TinyModelSpec


class TinyModelSettings(BaseModel):
    """The embedded default model, built when no ``--base`` is given."""

    model_config = {"extra": "forbid"}

    vocab_size: int = Field(2048, ge=300, description="BPE vocabulary trained on the records' texts")
    pad_vocab_multiple: int = Field(64, ge=1, description="model vocabulary rounded up to this multiple")
    hidden_size: int = Field(64, ge=8)
    intermediate_size: int = Field(256, ge=8)
    num_layers: int = Field(2, ge=1)
    num_heads: int = Field(
        2, ge=1, description="head size hidden/heads = 32: the smallest vLLM's kernels take"
    )
    num_kv_heads: int = Field(1, ge=1)
    max_positions: int = Field(4096, ge=64)

    def spec(self) -> TinyModelSpec:
        from trainer.models import TinyModelSpec  # torch is imported by a run, not by the settings

        return TinyModelSpec(**self.model_dump())


class TrainSettings(BaseSettings):
    """How a model is trained; every value is configuration (TOML ``[train]``, ``TRAJFORGE_TRAIN_*``)."""

    model_config = SettingsConfigDict(env_prefix="TRAJFORGE_TRAIN_", extra="forbid")

    seed: int = 0
    # --- data --------------------------------------------------------------------------
    modes: list[Literal["single", "cross"]] = Field(
        ["single", "cross"], description="record modes trained on"
    )
    train_split: str = "train"
    eval_split: str = Field("val", description="held-out split whose loss is reported")
    eval_max_states: int = Field(64, ge=1, description="held-out states scored (the first by key)")
    eval_sample_states: int = Field(
        8, ge=0, description="of those, the first whose sampled responses are judged (PROTOCOL §2); 0: none"
    )
    eval_max_new_tokens: int = Field(256, ge=1, description="longest held-out response sampled")
    max_prompt_tokens: int = Field(4096, ge=8, description="longer states are dropped and counted, never cut")
    max_response_tokens: int = Field(256, ge=2, description="longer gold responses are dropped and counted")
    class_resampling_alpha: float | None = Field(
        None, ge=0.0, le=1.0, description="q_i ∝ n_i^alpha over action classes (RecVerse: 0.3); None: uniform"
    )
    # --- optimisation ------------------------------------------------------------------
    steps: int = Field(40, ge=1, description="optimiser updates")
    states_per_update: int = Field(8, ge=1, description="states in one update (the effective batch)")
    micro_batch_states: int = Field(4, ge=1, description="states per forward pass; the rest is accumulated")
    lr: float = Field(3e-3, gt=0, description="peak LR (paper, 2B: 2e-8 OPTD; RecVerse SFT 2e-7)")
    warmup_steps: int = Field(4, ge=0, description="linear warm-up updates, then linear decay to 0")
    adam_betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8
    clip_grad_norm: float | None = Field(
        1.0, gt=0, description="None: no clipping (the norm is still logged)"
    )
    bf16: bool = Field(True, description="bf16 autocast on CUDA (paper: BF16); CPU runs in float32")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    activation_checkpointing: bool = Field(
        False, description="recompute activations in backward (long prompts)"
    )
    torch_threads: int | None = Field(2, ge=1, description="CPU threads for torch (None: torch's default)")
    strategy: Literal["ddp", "fsdp"] = Field(
        "ddp", description="data parallelism under torchrun, both stages (fsdp: FSDP2, weights sharded)"
    )
    # --- bookkeeping -------------------------------------------------------------------
    eval_every: int = Field(20, ge=0, description="held-out loss every N updates (0: only at the end)")
    checkpoint_every: int = Field(20, ge=0, description="checkpoint every N updates (0: only at the end)")
    keep_checkpoints: int = Field(2, ge=1, description="step checkpoints kept (oldest removed first)")
    tiny: TinyModelSettings = TinyModelSettings()

    @model_validator(mode="after")
    def _micro_fits(self) -> TrainSettings:
        if self.micro_batch_states > self.states_per_update:
            raise ValueError("micro_batch_states cannot exceed states_per_update")
        return self
