"""On-policy sampling behind one interface: batched Hugging Face ``generate`` or a vLLM engine.

A generator turns a batch of prompt ids into response ids sampled from the student's current
weights, and stamps them with the policy version (the number of optimiser updates the weights
have seen). The OPTD step checks the stamp against the trainer's update count: a sample from
older weights would not be on-policy, and the step refuses it.

Both paths take what a response may contain from one place (``token_rules``): the ids it stops at
and the padded vocabulary rows it may never contain.

Only torch and transformers are imported here; vLLM is imported when a ``VLLMGenerator`` is built.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import random
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from trainer.distributed import full_tensor
from trainer.models import model_vocab_size
from trainer.sampling import SamplingSettings

ENGINE_MEMORY = ("weights", "kv_cache")  # vLLM's sleep-mode tags
VLLM_MISSING = (
    'generator "vllm" needs vLLM, which is not installed (a GPU machine: pip install "trajforge[vllm]")'
)


@dataclass(frozen=True)
class Generated:
    """Sampled responses, one id list per prompt (ending with eos unless cut at ``max_new_tokens``)."""

    response_ids: list[list[int]]
    policy_version: int


class Generator(Protocol):
    def generate(self, prompts: Sequence[Sequence[int]]) -> Generated: ...

    def sync(self, model: PreTrainedModel, policy_version: int) -> None:
        """Make the next samples come from ``model``'s weights, which have seen ``policy_version`` updates."""
        ...


class StalePolicy(RuntimeError):
    """Samples came from weights older than the ones being trained."""


class VLLMUnavailable(ImportError, ValueError):
    """``generator = "vllm"`` where vLLM is not installed.

    A ValueError as well: the command line prints every setting that cannot be honoured as one
    ``stopped:`` line, without a traceback; an ImportError for callers that catch a missing extra.
    """


def require_generator(name: str) -> None:
    """Stop at once if ``name``'s engine is not installed: called before any model is loaded."""
    if name == "vllm" and importlib.util.find_spec("vllm") is None:
        raise VLLMUnavailable(VLLM_MISSING)


def import_vllm() -> Any:
    """The ``vllm`` package, or the one-line ``VLLMUnavailable`` when it is not installed."""
    try:
        import vllm
        import vllm.inputs  # TokensPrompt lives there
    except ModuleNotFoundError as err:
        if err.name is not None and err.name.split(".")[0] == "vllm":
            raise VLLMUnavailable(VLLM_MISSING) from None
        raise  # vLLM is there and one of its own dependencies is not: that message is the useful one
    return vllm


def cut_at_eos(ids: Sequence[int], eos_ids: Sequence[int]) -> list[int]:
    """``ids`` up to and including the first eos (what follows is the batch's filler), or all of them:
    a row that ran to ``max_new_tokens`` has no filler, and every token of it was sampled."""
    for end, token in enumerate(ids):
        if token in eos_ids:
            return list(ids[: end + 1])
    return list(ids)


def left_padded(prompts: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompt ids padded on the left (so every row's next token is at the same column) and the mask."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(list(prompt), dtype=torch.long)
        mask[row, width - len(prompt) :] = 1
    return ids, mask


def eos_ids_of(tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel) -> list[int]:
    """The tokenizer's eos and any the model's generation config adds (chat models often stop on two)."""
    configured = model.generation_config.eos_token_id
    extra = configured if isinstance(configured, list) else [configured]
    return sorted({tokenizer.eos_token_id, *(e for e in extra if e is not None)})


@dataclass(frozen=True)
class TokenRules:
    """What a sampled response may contain, the same for every generation path.

    ``stop_ids``: a response ends at the first of them, kept as its last token. ``suppressed_ids``:
    ids never sampled (the padded rows past the tokenizer, which have no token to decode to; see
    ``trainer.models.fit_generation_config``). ``vocab_size``: the model's rows, the logits' width.
    """

    stop_ids: tuple[int, ...]
    suppressed_ids: tuple[int, ...]
    vocab_size: int

    def allowed_ids(self) -> list[int] | None:
        """Every id below the model's vocabulary except the suppressed ones (None: nothing to mask)."""
        if not self.suppressed_ids:
            return None
        banned = set(self.suppressed_ids)
        return [i for i in range(self.vocab_size) if i not in banned]


def token_rules(tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel) -> TokenRules:
    """The stop ids (``eos_ids_of``) and the suppressed rows of ``model``'s generation config."""
    suppressed = model.generation_config.suppress_tokens or []
    return TokenRules(
        tuple(eos_ids_of(tokenizer, model)), tuple(sorted(set(suppressed))), model_vocab_size(model)
    )


class HFGenerator:
    """Batched ``generate`` on the training model itself: always the current weights (no copy to sync)."""

    def __init__(
        self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, sampling: SamplingSettings
    ) -> None:
        self.model, self.tokenizer, self.sampling = model, tokenizer, sampling
        self.policy_version = 0
        self.rules = token_rules(tokenizer, model)
        self.eos_ids = list(self.rules.stop_ids)

    def config(self) -> GenerationConfig:
        """Plain sampling from the model's distribution: no top-k or repetition penalty a checkpoint
        may ship with (the loss compares full distributions); padded-vocabulary rows suppressed."""
        return GenerationConfig(
            do_sample=True,
            temperature=self.sampling.temperature,
            top_p=self.sampling.top_p,
            top_k=0,
            repetition_penalty=1.0,
            max_new_tokens=self.sampling.max_new_tokens,
            eos_token_id=self.eos_ids,
            pad_token_id=self.tokenizer.pad_token_id,
            bos_token_id=self.tokenizer.bos_token_id,
            suppress_tokens=list(self.rules.suppressed_ids) or None,
        )

    @torch.no_grad()
    def generate(self, prompts: Sequence[Sequence[int]]) -> Generated:
        if not prompts:
            return Generated([], self.policy_version)
        device = next(self.model.parameters()).device
        ids, mask = left_padded(prompts, self.tokenizer.pad_token_id)
        training = self.model.training
        self.model.eval()
        try:
            out = self.model.generate(
                input_ids=ids.to(device), attention_mask=mask.to(device), generation_config=self.config()
            )
        finally:
            self.model.train(training)
        new = out[:, ids.shape[1] :].tolist()
        return Generated([cut_at_eos(row, self.eos_ids) for row in new], self.policy_version)

    def sync(self, model: PreTrainedModel, policy_version: int) -> None:
        if model is not self.model:
            raise ValueError("an HFGenerator samples from the model it was built with")
        self.policy_version = policy_version


def whole_weights(model: PreTrainedModel) -> Iterator[tuple[str, torch.Tensor]]:
    """``model``'s state dict as whole tensors under its Hugging Face names (what a checkpoint holds
    and vLLM's ``load_weights`` reads), each tensor once (a tied head is the embedding's alias).

    Under FSDP2 each value is a DTensor shard and gathering it is a collective: every rank must run
    through the whole iterator, in the same order, whatever it does with the tensors.
    """
    seen: set[int] = set()
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        with torch.no_grad():
            whole = full_tensor(tensor.detach())
        yield name, whole


def in_chunks(
    weights: Iterator[tuple[str, torch.Tensor]], max_bytes: int
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Consecutive groups of at most ``max_bytes`` (a larger tensor alone): the gathered copies of
    one group are freed before the next is gathered."""
    group: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in weights:
        nbytes = tensor.numel() * tensor.element_size()
        if group and size + nbytes > max_bytes:
            yield group
            group, size = [], 0
        group.append((name, tensor))
        size += nbytes
    if group:
        yield group


def _load_weights_in_worker(worker: Any, weights: list[tuple[str, torch.Tensor]]) -> int:
    """Runs inside vLLM's worker (``collective_rpc``): load the trainer's named tensors into its model."""
    worker.model_runner.model.load_weights(weights=weights)
    return len(weights)


def request_seed(draw: int, rank: int, index: int) -> int:
    """The seed of one request: ``draw`` (from the trainer's torch stream) mixed with the rank and the
    prompt's index, in [0, 2**63) (a ``torch.Generator`` seed)."""
    digest = hashlib.blake2b(f"{draw}:{rank}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


@contextmanager
def trainer_rng_kept() -> Iterator[None]:
    """Leave the trainer's random generators as they were, whatever the engine does with them.

    vLLM's worker seeds python's, numpy's and torch's generators when the engine starts
    (``set_random_seed(model_config.seed)``, in-process here): that would replace the trainer's
    per-rank streams, which the checkpoints save and the samples' seeds are drawn from.
    """
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    python, numpy = random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        random.setstate(python)
        np.random.set_state(numpy)


class VLLMGenerator:
    """A vLLM engine in the training process, sharing the GPU by sleeping while the trainer works.

    Not run on a GPU by this project's tests. ``tests/trainer/test_generation.py`` runs it against a
    stand-in ``vllm`` module that records what this class sends: the sampling parameters (the same
    stop ids and the same masked padded rows as ``HFGenerator``, a seed per request), the prompts,
    the sleep and wake-up calls, and the weights ``sync`` loads (whole tensors equal to the model's,
    gathered from FSDP2 shards on two CPU ranks), and that a resumed run sends what an uninterrupted
    one sends. Only a GPU run with vLLM installed would show that vLLM accepts these calls as sent,
    that ``load_weights`` takes these names and the sampled tokens follow the synced weights, that
    sleep mode frees and restores the memory as documented, and that several ``torchrun`` ranks each
    run an engine (``distributed_executor_backend="external_launcher"``).

    Written against vLLM's offline API (``LLM(..., enable_sleep_mode=True)``, ``sleep(level=1)``,
    ``wake_up(tags=[...])``, ``collective_rpc``, ``TokensPrompt``, ``SamplingParams``); vLLM runs
    in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, so the weight tensors need no pickling).
    After every optimiser update ``sync`` wakes the engine's weights alone and loads the trainer's
    into them; ``generate`` wakes whatever still sleeps (the KV cache), samples and sleeps again.

    Randomness: each request carries its own seed (vLLM then samples it from a generator of its
    own, so the engine keeps no sampling state that a checkpoint would need). The seeds of one call
    are drawn from the trainer's torch stream, mixed with the rank and the prompt's index: the same
    stream ``HFGenerator`` samples from, which every checkpoint saves per rank and ``--resume``
    restores, so a resumed run sends the seeds an uninterrupted one would. Held-out evaluations
    sample inside ``responses.seeded``, the fixed stream of their own, so every evaluation draws the
    same seeds and leaves the training stream as it was, as on the HF path.
    """

    def __init__(
        self,
        checkpoint: str | Path,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        sampling: SamplingSettings,
        *,
        rank: int = 0,
        seed: int = 0,
        gpu_memory_utilization: float = 0.3,
        dtype: str = "bfloat16",
        sync_chunk_bytes: int = 1 << 30,
    ) -> None:
        vllm = import_vllm()  # optional extra: a GPU machine with vLLM installed
        # in-process engine: collective_rpc calls the loader directly with the trainer's tensors
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        self.sampling, self.rank, self.sync_chunk_bytes = sampling, rank, sync_chunk_bytes
        self.rules = token_rules(tokenizer, model)
        self.eos_ids = list(self.rules.stop_ids)
        self.allowed_ids = self.rules.allowed_ids()
        self.policy_version = 0
        engine: dict[str, Any] = dict(
            model=str(checkpoint),
            dtype=dtype,
            enable_sleep_mode=True,
            gpu_memory_utilization=gpu_memory_utilization,
            seed=seed,
            skip_tokenizer_init=True,  # prompts arrive as ids; responses leave as ids
        )
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        if distributed and torch.distributed.get_world_size() > 1:
            # one engine per torchrun rank, in the ranks' own process group (vLLM's torchrun executor)
            engine["distributed_executor_backend"] = "external_launcher"
        with trainer_rng_kept():
            self.llm = vllm.LLM(**engine)
            self.asleep: set[str] = set()
            self.sleep()

    def request_seeds(self, n: int) -> list[int]:
        """One seed per prompt of this call (one draw from the trainer's torch stream)."""
        draw = int(torch.randint(2**63 - 1, (1,)).item())
        return [request_seed(draw, self.rank, index) for index in range(n)]

    def sampling_params(self, seed: int) -> Any:
        """What ``HFGenerator.config`` asks of ``generate``: plain sampling at the temperature and top-p,
        the same stop ids, the padded rows masked out, and this request's seed."""
        from vllm import SamplingParams

        return SamplingParams(
            n=1,
            temperature=self.sampling.temperature,
            top_p=self.sampling.top_p,
            top_k=0,  # 0: every token (vLLM's preferred spelling of "no top-k")
            min_p=0.0,
            repetition_penalty=1.0,
            max_tokens=self.sampling.max_new_tokens,
            stop_token_ids=list(self.rules.stop_ids),
            allowed_token_ids=self.allowed_ids,
            seed=seed,
            skip_special_tokens=False,
            detokenize=False,
        )

    def wake(self, tags: Sequence[str]) -> None:
        """Wake the tagged memory that sleeps: waking memory that is awake is never asked for (a no-op
        in the newest vLLM, not in every version)."""
        sleeping = [tag for tag in ENGINE_MEMORY if tag in tags and tag in self.asleep]
        if sleeping:
            self.llm.wake_up(tags=None if len(sleeping) == len(ENGINE_MEMORY) else sleeping)
            self.asleep -= set(sleeping)

    def sleep(self) -> None:
        """Level 1: the weights wait in host memory (an evaluation may sample before the next sync),
        the KV cache is dropped."""
        self.llm.sleep(level=1)
        self.asleep = set(ENGINE_MEMORY)

    def generate(self, prompts: Sequence[Sequence[int]]) -> Generated:
        if not prompts:
            return Generated([], self.policy_version)
        from vllm.inputs import TokensPrompt

        params = [self.sampling_params(seed) for seed in self.request_seeds(len(prompts))]
        requests = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        with trainer_rng_kept():
            self.wake(ENGINE_MEMORY)
            try:
                outputs = self.llm.generate(requests, params, use_tqdm=False)
            finally:
                self.sleep()
        responses = [cut_at_eos(list(o.outputs[0].token_ids), self.eos_ids) for o in outputs]
        return Generated(responses, self.policy_version)

    def sync(self, model: PreTrainedModel, policy_version: int) -> None:
        """Load ``model``'s weights (the Hugging Face model, not a wrapper: its names are the
        checkpoint's) into the engine. Every rank calls it: under FSDP2 the gathers are collectives."""
        with trainer_rng_kept():
            # weights alone: the KV cache stays unallocated until generate, so the gathered tensors,
            # the trainer's state and the engine's weights never share the GPU with it
            self.wake(["weights"])
            for chunk in in_chunks(whole_weights(model), self.sync_chunk_bytes):
                self.llm.collective_rpc(_load_weights_in_worker, args=(chunk,))
        self.policy_version = policy_version


def check_on_policy(generated: Generated, trainer_updates: int) -> None:
    """Refuse samples from weights other than the current ones (zero staleness)."""
    if generated.policy_version != trainer_updates:
        raise StalePolicy(
            f"samples come from policy version {generated.policy_version}, "
            f"the student has had {trainer_updates} updates"
        )
