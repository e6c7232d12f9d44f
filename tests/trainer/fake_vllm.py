"""A stand-in for the part of vLLM's offline API that ``trainer.generation.VLLMGenerator`` calls.

vLLM needs a GPU and cannot be installed here, so the tests put this module in ``sys.modules`` as
``vllm`` and ``vllm.inputs``. It runs no model: it records what it is sent (the engine's arguments,
the prompts, every ``SamplingParams``, the sleep and wake-up calls, the weights handed to
``collective_rpc``) and refuses what vLLM would refuse, as read in vLLM's source
(``vllm/sampling_params.py``: unknown fields, out-of-range values, ids outside the model's
vocabulary; ``vllm/entrypoints/llm.py``: the ``LLM`` methods' signatures). Its "responses" are a stub
drawn from each request's seed among the allowed ids, ending at a stop id: enough to show that the
caller returns what the engine produced, nothing about sampling from a model.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

# SamplingParams fields (vllm/sampling_params.py); a msgspec Struct refuses any other keyword
SAMPLING_FIELDS = {
    "n",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "max_tokens",
    "min_tokens",
    "logprobs",
    "prompt_logprobs",
    "detokenize",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "include_stop_str_in_output",
    "logit_bias",
    "allowed_token_ids",
    "bad_words",
    "extra_args",
}
# LLM(...) keywords the generator may pass (vllm/entrypoints/llm.py and EngineArgs)
ENGINE_ARGUMENTS = {
    "model",
    "dtype",
    "seed",
    "gpu_memory_utilization",
    "enable_sleep_mode",
    "skip_tokenizer_init",
    "distributed_executor_backend",
    "tensor_parallel_size",
    "enforce_eager",
    "max_model_len",
}
TAGS = ("weights", "kv_cache")

ENGINES: list[LLM] = []  # every engine built, in order (the tests clear it)


class SamplingParams:
    """Keeps its keywords as attributes (vLLM's defaults for the rest) after vLLM's own checks."""

    def __init__(self, **fields: Any) -> None:
        unknown = set(fields) - SAMPLING_FIELDS
        if unknown:
            raise TypeError(f"SamplingParams has no field {sorted(unknown)}")
        self.fields = dict(fields)
        self.temperature = fields.get("temperature", 1.0)
        self.top_p = fields.get("top_p", 1.0)
        self.top_k = fields.get("top_k", 0)
        self.max_tokens = fields.get("max_tokens", 16)
        self.seed = fields.get("seed")
        self.stop_token_ids = list(fields.get("stop_token_ids") or [])
        self.allowed_token_ids = fields.get("allowed_token_ids")
        # SamplingParams._verify_args
        assert 0.0 <= self.temperature <= 2.0, self.temperature
        assert 0.0 < self.top_p <= 1.0, self.top_p
        assert isinstance(self.top_k, int) and self.top_k >= -1, self.top_k
        assert self.max_tokens is None or self.max_tokens >= 1, self.max_tokens
        assert all(isinstance(i, int) for i in self.stop_token_ids), self.stop_token_ids
        # _validate_allowed_token_ids: None, or a non-empty list
        assert self.allowed_token_ids is None or len(self.allowed_token_ids) > 0


def TokensPrompt(*, prompt_token_ids: list[int]) -> dict[str, Any]:  # a TypedDict in vLLM
    return {"prompt_token_ids": prompt_token_ids}


@dataclass
class CompletionOutput:
    token_ids: list[int]


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]


@dataclass
class Call:
    """One ``generate``: the prompts' ids and the parameters sent with each."""

    prompts: list[list[int]]
    params: list[SamplingParams]

    @property
    def seeds(self) -> list[int]:
        return [p.seed for p in self.params]


@dataclass
class Runner:
    loaded: list[list[tuple[str, torch.Tensor]]] = field(default_factory=list)  # one list per rpc

    @property
    def model(self) -> Runner:
        return self

    def load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> set[str]:
        # vLLM copies each tensor into its own parameter at once: a copy here, as it was at the call
        self.loaded.append([(name, tensor.detach().clone()) for name, tensor in weights])
        return {name for name, _ in weights}


@dataclass
class Worker:
    model_runner: Runner = field(default_factory=Runner)


class LLM:
    def __init__(self, model: str, **arguments: Any) -> None:
        unknown = set(arguments) - ENGINE_ARGUMENTS
        if unknown:
            raise TypeError(f"LLM got unexpected arguments {sorted(unknown)}")
        self.arguments = {"model": model, **arguments}
        # ModelConfig.get_vocab_size(): the model's vocabulary (the logits' width), from its config
        self.vocab_size = json.loads((Path(model) / "config.json").read_text())["vocab_size"]
        self.asleep: set[str] = set()
        self.events: list[
            tuple[str, Any]
        ] = []  # ("sleep", level), ("wake_up", tags), ("rpc", n), ("generate", n)
        self.calls: list[Call] = []
        self.worker = Worker()
        # vLLM's worker seeds the process's generators when it starts (set_random_seed(model_config.seed));
        # in-process, those are the trainer's own
        seed = arguments.get("seed", 0)
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        ENGINES.append(self)

    def sleep(self, level: int = 1) -> None:
        assert level in (1, 2)
        assert not self.asleep, f"sleep() while {sorted(self.asleep)} already sleeps"
        self.events.append(("sleep", level))
        self.asleep = set(TAGS)

    def wake_up(self, tags: list[str] | None = None) -> None:
        wanted = set(TAGS if tags is None else tags)
        assert wanted <= set(TAGS), tags
        # waking memory that is awake: a no-op in the newest vLLM, an error in older ones; never asked
        assert wanted <= self.asleep, f"wake_up({tags}) while {sorted(wanted - self.asleep)} is awake"
        self.events.append(("wake_up", None if tags is None else list(tags)))
        self.asleep -= wanted

    def collective_rpc(
        self, method: Any, timeout: float | None = None, args: tuple = (), kwargs: dict | None = None
    ) -> list[Any]:
        assert callable(method)
        assert "weights" not in self.asleep, "weights loaded into sleeping memory"
        self.events.append(("rpc", len(args[0]) if args else 0))
        # run_method (vllm/v1/serial_utils.py): a callable is called with the worker first
        return [method(self.worker, *args, **(kwargs or {}))]

    @property
    def loaded(self) -> list[list[tuple[str, torch.Tensor]]]:
        """The weights of each ``collective_rpc``, in order."""
        return self.worker.model_runner.loaded

    def generate(
        self,
        prompts: list[dict[str, Any]],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        *,
        use_tqdm: bool = True,
        **_: Any,
    ) -> list[RequestOutput]:
        assert not self.asleep, f"generate() while {sorted(self.asleep)} sleeps"
        assert all(set(p) == {"prompt_token_ids"} for p in prompts), "skip_tokenizer_init takes ids only"
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        assert len(params) == len(prompts)
        for p in params:  # SamplingParams.verify: ids index the logits, whose width is the model's vocabulary
            assert all(0 <= i < self.vocab_size for i in p.stop_token_ids), p.stop_token_ids
            if p.allowed_token_ids is not None:
                assert all(0 <= i < self.vocab_size for i in p.allowed_token_ids)
            assert p.seed is None or 0 <= p.seed < 2**63, p.seed
        self.events.append(("generate", len(prompts)))
        self.calls.append(Call([list(p["prompt_token_ids"]) for p in prompts], list(params)))
        torch.rand(1)  # stands for any use the engine makes of the process's own generators
        return [
            RequestOutput(
                str(i), list(p["prompt_token_ids"]), [CompletionOutput(stub_tokens(sp, self.vocab_size))]
            )
            for i, (p, sp) in enumerate(zip(prompts, params, strict=True))
        ]


def stub_tokens(params: SamplingParams, vocab_size: int) -> list[int]:
    """Ids drawn from the request's seed among the allowed ones, up to a stop id (kept) or max_tokens."""
    pool = params.allowed_token_ids if params.allowed_token_ids is not None else list(range(vocab_size))
    generator = torch.Generator().manual_seed(params.seed if params.seed is not None else 0)
    picks = torch.randint(len(pool), (params.max_tokens,), generator=generator).tolist()
    out: list[int] = []
    for pick in picks:
        out.append(pool[pick])
        if pool[pick] in params.stop_token_ids:
            break
    return out
