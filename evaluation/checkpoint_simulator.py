"""The ``checkpoint:PATH`` simulator: a local Hugging Face causal-LM folder decoding its answers.

The prompts of a batch are rendered with the tokenizer's chat template and decoded together, left
padded so every answer starts where its prompt ends; sampling follows PROTOCOL.md §3 (temperature
1.0, top-p 0.95, 512 new tokens, seed 42), all configurable, and temperature 0 decodes greedily.

Each row samples from a random stream of its own, seeded by (seed, its session, its step): an
answer does not depend on which batch it is decoded in or what was decoded before, so a killed
evaluation resumed writes what one never stopped would have. Up to floating point: batches of
other shapes sum a row's logits in another order, which moves a draw whose uniform falls on a
boundary of the nucleus (rarely). ``generate`` draws every row from one
generator, so the decoding loop is this module's own: the model's forward with its KV cache, the
temperature and top-p filter as ``generate`` applies them, then each row's token by inverse
transform sampling with one uniform from its own stream, all rows in one tensor operation. torch
and transformers are imported only when a checkpoint is loaded.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import Field

from evaluation.simulators import Key, Messages, Sampling, derived_seed, keys_or_positions

#: below this many shared leading tokens a batch is left-padded as usual: sharing would save nothing
MIN_SHARED_TOKENS = 16
#: the likeliest tokens a row's top-p nucleus is looked for among before the whole vocabulary is
#: sorted: a trained model's nucleus is seldom wider, and on a small model with a large vocabulary a
#: sort of every row's whole vocabulary costs several forward passes
NUCLEUS_CANDIDATES = 64


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
        # transformers 5 names the forward's cache ``cache``; 4.x ``past_key_values``
        self.cache_argument = "past_key_values" if transformers.__version__.startswith("4.") else "cache"
        self.stop_ids = stop_token_ids(self.tokenizer.eos_token_id, self.model.generation_config.eos_token_id)

    @classmethod
    def from_spec(
        cls, argument: str, sampling: Sampling | None = None, **settings: Any
    ) -> CheckpointSimulator:
        if not argument:
            raise ValueError("checkpoint:PATH needs the path of a model folder")
        chosen = (sampling or Sampling()).model_dump()
        return cls(CheckpointSettings(path=argument, **chosen, **settings))

    def act(self, prompts: Sequence[Messages], keys: Sequence[Key] | None = None) -> list[str]:
        size, keyed = self.settings.max_batch, keys_or_positions(keys, len(prompts))
        return [
            text
            for start in range(0, len(prompts), size)
            for text in self.generate(prompts[start : start + size], keyed[start : start + size])
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

    def generate(self, prompts: Sequence[Messages], keys: Sequence[Key] | None = None) -> list[str]:
        """One answer per prompt, the batch decoded together, each row sampled by its own key.

        The prompts of a batch begin alike (the system turn: a few hundred tokens of every prompt), so
        that beginning is run through the model once and its KV cache shared by every row: the rows are
        laid out as [shared tokens][padding][own tokens], the padding masked, each row's positions
        counted over its unmasked tokens, so every row is computed as it would be alone."""
        rows = self.rows(prompts)
        shared = min(shared_prefix_length(rows), min(len(r) for r in rows) - 1)
        with self.torch.inference_mode():
            if shared >= MIN_SHARED_TOKENS:
                ids, mask, cache = self.with_shared_prefix(rows, shared)
                fed = slice(shared, None)  # the cache holds the shared tokens already
            else:
                (ids, mask), cache, fed = self.left_padded(rows), None, slice(None)
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            streams = [random.Random(self.row_seed(key)) for key in keys_or_positions(keys, len(rows))]
            answers = self.decode(ids[:, fed], mask, positions[:, fed], cache, streams)
        return [self.tokenizer.decode(answer, skip_special_tokens=True) for answer in answers]

    def row_seed(self, key: Key) -> int:
        return derived_seed(self.settings.seed, "checkpoint", *key)

    def decode(
        self, ids: Any, mask: Any, positions: Any, cache: Any, streams: list[random.Random]
    ) -> list[list[int]]:
        """Up to ``max_new_tokens`` tokens per row after ``ids`` (``mask`` covers the cache's tokens
        too), a row ending at its first stop token (not kept); greedy at temperature 0."""
        torch, rows = self.torch, ids.shape[0]
        answers: list[list[int]] = [[] for _ in range(rows)]
        live = list(range(rows))
        for _ in range(self.settings.max_new_tokens):
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                             logits_to_keep=1, **{self.cache_argument: cache})  # fmt: skip
            cache = out.get("cache")
            cache = out.past_key_values if cache is None else cache  # transformers 4.x
            chosen = self.next_tokens(out.logits[:, -1, :], [streams[i] for i in live]).tolist()
            kept = [k for k, token in enumerate(chosen) if token not in self.stop_ids]
            for k in kept:
                answers[live[k]].append(chosen[k])
            if not kept:
                break
            if len(kept) < len(live):  # the finished rows leave the batch and the cache
                index = torch.tensor(kept, device=self.device)
                mask, positions = mask[index], positions[index]
                cache.batch_select_indices(index)
            live = [live[k] for k in kept]
            ids = torch.tensor([[chosen[k]] for k in kept], dtype=torch.long, device=self.device)
            mask = torch.cat([mask, mask.new_ones((len(live), 1))], dim=-1)
            positions = positions[:, -1:] + 1
        return answers

    def next_tokens(self, logits: Any, streams: list[random.Random]) -> Any:
        """One token per row of ``logits``: the most likely at temperature 0, else drawn from the
        temperature-scaled distribution cut to its top-p nucleus (the smallest set of most likely
        tokens whose mass reaches top-p, as ``generate``'s TopPLogitsWarper keeps it), by inverse
        transform sampling with the next uniform of the row's own stream."""
        torch = self.torch
        if self.settings.temperature == 0:
            return logits.argmax(dim=-1)
        probs = torch.softmax(logits.float() / self.settings.temperature, dim=-1)
        ordered, order, before = self.most_likely_first(probs)
        kept = before < self.settings.top_p
        ordered = ordered.masked_fill(~kept, 0.0)
        cdf = ordered.cumsum(dim=-1)
        uniform = torch.tensor([[s.random()] for s in streams], dtype=cdf.dtype, device=cdf.device)
        at = torch.searchsorted(cdf, uniform * cdf[:, -1:], right=True)
        # a uniform rounded onto the nucleus's total mass still picks within the nucleus
        at = torch.minimum(at, kept.sum(dim=-1, keepdim=True) - 1)
        return order.gather(-1, at)[:, 0]

    def most_likely_first(self, probs: Any) -> tuple[Any, Any, Any]:
        """``probs`` in descending order, their token ids and the mass before each, as far as every
        row's nucleus reaches: the ``NUCLEUS_CANDIDATES`` likeliest and one more where each row's
        nucleus ends among them (the one more, left out, shows it ends), else the whole vocabulary."""
        candidates = NUCLEUS_CANDIDATES + 1
        if candidates < probs.shape[-1]:
            ordered, order = probs.topk(candidates, dim=-1)
            before = ordered.cumsum(dim=-1) - ordered
            if bool((before[:, -1] >= self.settings.top_p).all()):
                return ordered, order, before
        ordered, order = probs.sort(dim=-1, descending=True)
        return ordered, order, ordered.cumsum(dim=-1) - ordered

    def left_padded(self, rows: list[list[int]]) -> tuple[Any, Any]:
        width, pad = max(map(len, rows)), self.tokenizer.pad_token_id
        ids = [[pad] * (width - len(r)) + r for r in rows]
        mask = [[0] * (width - len(r)) + [1] * len(r) for r in rows]
        return self.tensor(ids), self.tensor(mask)

    def with_shared_prefix(self, rows: list[list[int]], shared: int) -> tuple[Any, Any, Any]:
        """The batch laid out around the shared beginning, and a copy of that beginning's cache for
        every row (decoding appends to the cache it is given)."""
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


def stop_token_ids(*found: int | list[int] | None) -> frozenset[int]:
    """The ids that end an answer: the tokenizer's end of sequence and the model's (one or a list)."""
    ids: set[int] = set()
    for value in found:
        ids.update([value] if isinstance(value, int) else value or [])
    return frozenset(ids)


def shared_prefix_length(rows: Sequence[Sequence[int]]) -> int:
    """How many leading tokens every row has in common."""
    first = rows[0]
    for index, token in enumerate(first):
        if any(len(r) <= index or r[index] != token for r in rows[1:]):
            return index
    return len(first)
