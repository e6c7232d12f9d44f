"""The ``checkpoint:PATH`` simulator: a local Hugging Face causal-LM folder answering with ``generate``.

The prompts of a batch are rendered with the tokenizer's chat template and generated together, left
padded so every answer starts where its prompt ends; sampling follows PROTOCOL.md §3 (temperature
1.0, top-p 0.95, 512 new tokens, seed 42), all configurable. The seed is set once when the model is
loaded, so a run is reproducible for the same sessions in the same batches. torch and transformers
are imported only when a checkpoint is loaded.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import Field

from evaluation.simulators import Messages, Sampling

#: below this many shared leading tokens a batch is left-padded as usual: sharing would save nothing
MIN_SHARED_TOKENS = 16


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
        import transformers
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
        self._prefix: tuple[tuple[int, ...], Any] | None = None  # the shared beginning and its KV cache
        # transformers 5 names generate's starting cache ``cache``; 4.x ``past_key_values``
        self.cache_argument = "past_key_values" if transformers.__version__.startswith("4.") else "cache"
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

    def rows(self, prompts: Sequence[Messages]) -> list[list[int]]:
        """Each prompt's token ids in the model's own chat template (which writes the special tokens a
        model expects, so the tokenizer adds none of its own, as ``apply_chat_template`` itself does)."""
        texts = [
            self.tokenizer.apply_chat_template(list(m), tokenize=False, add_generation_prompt=True)
            for m in prompts
        ]
        return [list(ids) for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]]

    def encode(self, prompts: Sequence[Messages]) -> dict[str, Any]:
        """The prompts as one left-padded batch (``input_ids``, ``attention_mask``) on the model's device:
        how a batch without a shared beginning is generated."""
        ids, mask = self.left_padded(self.rows(prompts))
        return {"input_ids": ids, "attention_mask": mask}

    def generate(self, prompts: Sequence[Messages]) -> list[str]:
        """One answer per prompt, the batch generated together.

        The prompts of a batch begin alike (the system turn: a few hundred tokens of every prompt), so
        that beginning is run through the model once and its KV cache shared by every row: the rows are
        laid out as [shared tokens][padding][own tokens], the padding masked, each row's positions
        counted over its unmasked tokens (what ``generate`` derives from the attention mask), so every
        row is computed as it would be alone."""
        rows = self.rows(prompts)
        shared = min(shared_prefix_length(rows), min(len(r) for r in rows) - 1)
        sampled = self.settings.temperature > 0
        options = {"do_sample": True, "temperature": self.settings.temperature, "top_p": self.settings.top_p}
        options = options if sampled else {"do_sample": False}
        with self.torch.inference_mode():
            if shared >= MIN_SHARED_TOKENS:
                ids, mask, cache = self.with_shared_prefix(rows, shared)
                options[self.cache_argument] = cache
            else:
                ids, mask = self.left_padded(rows)
            out = self.model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=self.settings.max_new_tokens,
                pad_token_id=self.tokenizer.pad_token_id,
                **options,
            )
        answers = out[:, ids.shape[1] :]
        return self.tokenizer.batch_decode(answers, skip_special_tokens=True)

    def left_padded(self, rows: list[list[int]]) -> tuple[Any, Any]:
        width, pad = max(map(len, rows)), self.tokenizer.pad_token_id
        ids = [[pad] * (width - len(r)) + r for r in rows]
        mask = [[0] * (width - len(r)) + [1] * len(r) for r in rows]
        return self.tensor(ids), self.tensor(mask)

    def with_shared_prefix(self, rows: list[list[int]], shared: int) -> tuple[Any, Any, Any]:
        """The batch laid out around the shared beginning, and a copy of that beginning's cache for
        every row (``generate`` appends to the cache it is given)."""
        prefix = rows[0][:shared]
        width, pad = max(len(r) - shared for r in rows), self.tokenizer.pad_token_id
        ids = [prefix + [pad] * (width - len(r) + shared) + r[shared:] for r in rows]
        mask = [[1] * shared + [0] * (width - len(r) + shared) + [1] * (len(r) - shared) for r in rows]
        cache = copy.deepcopy(self.prefix_cache(tuple(prefix)))
        cache.batch_repeat_interleave(len(rows))
        return self.tensor(ids), self.tensor(mask), cache

    def prefix_cache(self, prefix: tuple[int, ...]) -> Any:
        """The KV cache of ``prefix``, computed once (a lake's prompts share one system turn)."""
        if self._prefix is None or self._prefix[0] != prefix:
            ids = self.tensor([list(prefix)])
            with self.torch.no_grad():
                out = self.model(input_ids=ids, attention_mask=self.torch.ones_like(ids), use_cache=True)
            # transformers 5 returns the cache as ``cache``; 4.x as ``past_key_values``
            cache = out.get("cache")
            self._prefix = (prefix, out.past_key_values if cache is None else cache)
        return self._prefix[1]

    def tensor(self, rows: list[list[int]]) -> Any:
        return self.torch.tensor(rows, dtype=self.torch.long, device=self.device)


def shared_prefix_length(rows: Sequence[Sequence[int]]) -> int:
    """How many leading tokens every row has in common."""
    first = rows[0]
    for index, token in enumerate(first):
        if any(len(r) <= index or r[index] != token for r in rows[1:]):
            return index
    return len(first)
