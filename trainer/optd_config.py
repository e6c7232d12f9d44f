"""Typed settings of the OPTD stage (TOML ``[optd]``); the optimiser's values come from ``[train]``.

Defaults are the paper's (UserArena OPTD; OPTD.md) where it has one. Imports pydantic only,
so the command line reads them without loading torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, Field

if TYPE_CHECKING:
    from trainer.config import TrainSettings
    from trainer.generation import SamplingSettings
    from trainer.objective import ObjectiveSettings


class OPTDSettings(BaseModel):
    """The OPTD stage's own values (TOML ``[optd]``); the optimiser's come from ``[train]``."""

    model_config = {"extra": "forbid"}

    epsilon: float = Field(0.02, ge=0, description="per-token bound on KL(q^lambda || q^0) (paper: 0.02)")
    lambda_max: float = Field(1.0, ge=0, description="largest guidance weight (paper: 1)")
    bisection_steps: int = Field(8, ge=0, description="error <= lambda_max / 2^steps (paper: 8)")
    beta: float = Field(
        0.5,
        ge=0,
        le=1,
        description="generalized-JSD mixture weight (paper: 0.5); 0: forward KL(q||p), 1: reverse KL(p||q)",
    )
    gamma: float = Field(0.1, ge=0, description="weight of the grounding NLL (paper: 0.1)")
    temperature: float = Field(0.8, gt=0, description="sampling temperature (reference: 0.8)")
    top_p: float = Field(1.0, gt=0, le=1)
    max_new_tokens: int = Field(512, ge=1, description="longest sampled response (reference: 512)")
    chunk_size: int = Field(256, ge=1, description="response positions projected through the head at once")
    held_out_states: int = Field(
        8, ge=0, description="intent-bearing train states (the last by key) kept out to measure the objective"
    )
    generator: Literal["hf", "vllm"] = Field("hf", description="vllm: GPU and the optional extra only")
    strategy: Literal["ddp", "fsdp"] | None = Field(
        None, description="read from [train] strategy (both stages); set here, it must agree with it"
    )

    def objective(self) -> ObjectiveSettings:
        from trainer.objective import ObjectiveSettings  # torch loads with a run, not with the settings

        return ObjectiveSettings(
            epsilon=self.epsilon,
            lambda_max=self.lambda_max,
            steps=self.bisection_steps,
            beta=self.beta,
            gamma=self.gamma,
        )

    def sampling(self) -> SamplingSettings:
        from trainer.generation import SamplingSettings

        return SamplingSettings(self.temperature, self.top_p, self.max_new_tokens)

    def train_settings(self, train: TrainSettings) -> TrainSettings:
        """``train`` with this section's ``strategy`` where it names one (the key's home is ``[train]``)."""
        if self.strategy is None or self.strategy == train.strategy:
            return train
        if "strategy" in train.model_fields_set:
            raise ValueError(
                f"[optd] strategy = {self.strategy!r} contradicts [train] strategy = {train.strategy!r}: "
                "both stages read it from [train]; set it there only"
            )
        return train.model_copy(update={"strategy": self.strategy})
