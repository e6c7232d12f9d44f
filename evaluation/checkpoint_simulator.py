"""The ``checkpoint:PATH`` simulator: a local Hugging Face causal-LM folder answering with ``generate``.

The prompts of a batch are rendered with the tokenizer's chat template and generated together, left
padded so every answer starts where its prompt ends; sampling follows PROTOCOL.md §3 (temperature
1.0, top-p 0.95, 512 new tokens, seed 42), all configurable. The seed is set once when the model is
loaded, so a run is reproducible for the same sessions in the same batches. torch and transformers
are imported only when a checkpoint is loaded.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import Field

from evaluation.simulators import Messages, Sampling


class CheckpointSettings(Sampling):
    """Sampling and batching of the ``checkpoint:`` simulator."""

    path: str
    max_batch: int = Field(32, ge=1, description="prompts generated together at most")
    device: str | None = Field(None, description="cuda when available, else cpu")
    dtype: str = Field("auto", description="auto (the checkpoint's) | float32 | bfloat16 | float16")

    def sampling(self) -> dict[str, Any]:
        return self.model_dump(include={"path", "temperature", "top_p", "max_new_tokens", "seed"})


class CheckpointSimulator:
    """A causal LM and its tokenizer, loaded once; ``act`` generates one answer per prompt."""

    def __init__(self, settings: CheckpointSettings) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        folder = Path(settings.path)
        if not (folder / "config.json").is_file():
            raise ValueError(f"checkpoint:{settings.path} is not a model folder (no config.json)")
        self.settings = settings
        self.parameters = {"spec": f"checkpoint:{settings.path}", **settings.sampling()}
        self.torch = torch
        self.device = settings.device or ("cuda" if torch.cuda.is_available() else "cpu")
        dtype = settings.dtype if settings.dtype == "auto" else getattr(torch, settings.dtype)
        self.tokenizer = AutoTokenizer.from_pretrained(folder, padding_side="left")
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(self.device).eval()
        torch.manual_seed(settings.seed)

    @classmethod
    def from_spec(
        cls, argument: str, sampling: Sampling | None = None, **settings: Any
    ) -> CheckpointSimulator:
        if not argument:
            raise ValueError("checkpoint:PATH needs the path of a model folder")
        chosen = (sampling or Sampling()).model_dump()
        return cls(CheckpointSettings(path=argument, **chosen, **settings))

    def act(self, prompts: Sequence[Messages]) -> list[str]:
        size = self.settings.max_batch
        return [
            text
            for start in range(0, len(prompts), size)
            for text in self.generate(prompts[start : start + size])
        ]

    def encode(self, prompts: Sequence[Messages]) -> Any:
        """The prompts in the model's own chat template, as one left-padded batch of token ids on the
        model's device. Chat templates write the special tokens a model expects (a begin-of-text token
        among them), so the tokenizer adds none of its own, as ``apply_chat_template`` itself does."""
        texts = [
            self.tokenizer.apply_chat_template(list(m), tokenize=False, add_generation_prompt=True)
            for m in prompts
        ]
        batch = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        return batch.to(self.device)

    def generate(self, prompts: Sequence[Messages]) -> list[str]:
        """One answer per prompt, the batch generated together."""
        batch = self.encode(prompts)
        sampled = self.settings.temperature > 0
        sampling = {"do_sample": True, "temperature": self.settings.temperature, "top_p": self.settings.top_p}
        with self.torch.inference_mode():
            out = self.model.generate(
                **batch,
                max_new_tokens=self.settings.max_new_tokens,
                pad_token_id=self.tokenizer.pad_token_id,
                **(sampling if sampled else {"do_sample": False}),
            )
        answers = out[:, batch["input_ids"].shape[1] :]
        return self.tokenizer.batch_decode(answers, skip_special_tokens=True)
