"""How responses are sampled: one settings type for every sampler of the trainer.

A plain dataclass (no pydantic, no torch), so the torch-only modules that run on a GPU machine
and the typed settings that the command line reads share it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SamplingSettings:
    """Temperature, nucleus and the new-token limit (reference for OPTD: 0.8, 1.0, 512)."""

    temperature: float = 0.8
    top_p: float = 1.0
    max_new_tokens: int = 512

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
