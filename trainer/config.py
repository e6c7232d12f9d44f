"""Typed settings of the trainer: ``TrainSettings`` for both stages, ``OPTDSettings`` extending it.

Defaults are sized for the tiny embedded model on a couple of CPU cores. The paper's
values (UserArena OPTD, a 2B backbone on a GPU cluster; OPTD.md) are given beside
each field where the paper has one: Adam with zero weight decay, linear warm-up then
linear decay, peak LR 2e-8, BF16; RecVerse's SFT warm-up resamples action classes with
q_i proportional to n_i^0.3 and uses LR 2e-7.

Imports pydantic only (and the torch-free sampling dataclass), so the command line reads the
settings without loading torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from trainer.pieces import RESPONSE_PIECES
from trainer.sampling import SamplingSettings

if TYPE_CHECKING:
    from trainer.models import TinyModelSpec
    from trainer.objective import ObjectiveSettings

#: PROTOCOL §3's evaluation sampling, with a shorter cap: a trained answer is under 100 tokens
HELD_OUT_SAMPLING = SamplingSettings(temperature=1.0, top_p=0.95, max_new_tokens=256)
#: the reference's on-policy sampling for OPTD (OPTD.md §2)
ROLLOUT_SAMPLING = SamplingSettings(temperature=0.8, top_p=1.0, max_new_tokens=512)


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
    tokenizer_records: int = Field(
        4000, ge=1, description="training records (sampled by seed) the BPE tokenizer is trained on"
    )
    whole_tokens: list[str] = Field(
        list(RESPONSE_PIECES),
        description="strings that are one token each: the response format's fixed pieces",
    )
    action_tokens: bool = Field(True, description="every action name of the records is one token too")
    item_id_tokens: bool = Field(
        False, description="every catalog item id of the lake one token: a click copies one token, not 16"
    )
    split_digits: bool = Field(
        True, description="every digit its own token: a distance or an id is copied digit by digit"
    )
    copy_head: bool = Field(
        False,
        description="a fixed circuit wired into the first layer writes one of the ids in view at a click's "
        "opening (trainer/copy_head.py): needs item_id_tokens, untied embeddings, 4 heads, a key/value "
        "head each; the click's id is then the circuit's, left out of the SFT loss",
    )

    @staticmethod
    def carries_copy_head(values: dict[str, object]) -> bool:
        """Whether a model of these values can be wired with the copy head (absent values: defaults)."""
        chosen = {name: field.default for name, field in TinyModelSettings.model_fields.items()} | values
        heads_fit = (
            chosen["num_heads"] == 4 and chosen["num_kv_heads"] == 4 and chosen["hidden_size"] % 4 == 0
        )
        return bool(chosen["item_id_tokens"]) and heads_fit and chosen["hidden_size"] >= 64

    @model_validator(mode="after")
    def _copy_head_fits(self) -> TinyModelSettings:
        if self.copy_head and not self.item_id_tokens:
            raise ValueError("tiny.copy_head needs tiny.item_id_tokens (each id one token)")
        if self.copy_head and not self.carries_copy_head(self.model_dump()):
            raise ValueError(
                "tiny.copy_head needs num_heads = num_kv_heads = 4 (two heads carry half the hidden size) "
                "and a hidden size that is a multiple of 64"
            )
        return self

    def spec(self) -> TinyModelSpec:
        from trainer.models import TinyModelSpec  # torch is imported by a run, not by the settings

        return TinyModelSpec(
            **self.model_dump(
                exclude={
                    "tokenizer_records",
                    "whole_tokens",
                    "action_tokens",
                    "item_id_tokens",
                    "split_digits",
                    "copy_head",
                }
            ),
            tie_embeddings=not self.copy_head,
        )


class TrainSettings(BaseSettings):
    """How a model is trained; every value is configuration (TOML ``[train]``, ``TRAJFORGE_TRAIN_*``)."""

    model_config = SettingsConfigDict(env_prefix="TRAJFORGE_TRAIN_", extra="forbid")

    seed: int = 0
    # --- data --------------------------------------------------------------------------
    modes: list[Literal["single", "cross"]] = Field(
        ["single", "cross"], description="record modes trained on"
    )
    train_split: str = "train"
    eval_split: str = Field("val", description="split of the held-out users (never trained on)")
    held_out_states: int = Field(
        64, ge=0, description="held-out states scored (NLL), one per session, sessions in a fixed hash order"
    )
    held_out_sampled: int = Field(
        16, ge=0, description="of those, the first whose sampled responses are judged (PROTOCOL §2)"
    )
    held_out_sampling: SamplingSettings = Field(
        HELD_OUT_SAMPLING, description="how held-out responses are sampled (the protocol's, 256 new tokens)"
    )
    probe_states: int = Field(
        8,
        ge=0,
        description="intent-bearing train states kept out of every update, to measure the intent's signal",
    )
    teacher_intent_share: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="SFT: share of intent-bearing states trained with the intent in the prompt "
        "(a teacher that can read an intent); 0: never",
    )
    max_prompt_tokens: int = Field(4096, ge=8, description="longer states are dropped and counted, never cut")
    max_response_tokens: int = Field(256, ge=2, description="longer gold responses are dropped and counted")
    sft_averaging: Literal["per_state", "per_token"] = Field(
        "per_state",
        description="SFT: per_state, each state's mean NLL over its response tokens, states weighted "
        "equally (OPTD.md's averaging); per_token, every scored response token of the update weighted "
        "equally. Per state, a short response's tokens count more each: a short answer (an `end`) "
        "is learnt as likelier than the data has it",
    )
    class_resampling_alpha: float | None = Field(
        None, ge=0.0, le=1.0, description="q_i ∝ n_i^alpha over action classes (RecVerse: 0.3); None: uniform"
    )
    screen_id_weight: float = Field(
        0.0,
        ge=0.0,
        description="SFT: weight of the screen-id loss, -log of the probability that after a click's "
        "opening the model writes one of the ids in view, on feed states whose click line lists them "
        "(PromptSettings.click_ids, action-first responses, ids one token each): every feed state "
        "teaches a small model to copy a card's id, not only the shopper's clicks; 0: off",
    )
    screen_id_states: int = Field(
        64, ge=0, description="states drawn for the screen-id loss per update, besides the update's own"
    )
    screen_id_tail: int | None = Field(
        48, ge=1, description="prompt tokens the screen-id loss reads before the click's opening (None: all)"
    )
    anonymise_item_ids: bool = Field(
        False,
        description="SFT: each drawn state's catalog ids (prompt, response, screen-id choices) replaced by "
        "random catalog ids, one map per state, so a model learns to copy an id from the screen, not to "
        "remember which screens show it (ids one token each: tiny.item_id_tokens); False: ids as recorded",
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
        "ddp", description="data parallelism under torchrun (fsdp: FSDP2, weights sharded)"
    )
    # --- bookkeeping -------------------------------------------------------------------
    eval_every: int = Field(20, ge=0, description="held-out evaluation every N updates (0: only at the end)")
    checkpoint_every: int = Field(20, ge=0, description="checkpoint every N updates (0: only at the end)")
    keep_checkpoints: int = Field(2, ge=1, description="step checkpoints kept (oldest removed first)")
    tiny: TinyModelSettings = TinyModelSettings()

    @model_validator(mode="after")
    def _micro_fits(self) -> TrainSettings:
        if self.micro_batch_states > self.states_per_update:
            raise ValueError("micro_batch_states cannot exceed states_per_update")
        if self.held_out_sampled > self.held_out_states:
            raise ValueError("held_out_sampled cannot exceed held_out_states")
        return self


class OPTDSettings(TrainSettings):
    """The OPTD stage: the training settings (TOML ``[train]``) with ``[optd]`` on top, and its own values.

    Defaults are the paper's (UserArena OPTD; OPTD.md) where it has one.
    """

    model_config = SettingsConfigDict(env_prefix="TRAJFORGE_OPTD_", extra="forbid")

    epsilon: float = Field(0.02, ge=0, description="per-token bound on KL(q^lambda || q^0) (paper: 0.02)")
    trust_region: bool = Field(
        True, description="False: lambda = lambda_max on every token (the ablation without a trust region)"
    )
    lambda_max: float = Field(1.0, ge=0, description="largest guidance weight (paper: 1)")
    bisection_steps: int = Field(8, ge=0, description="error <= lambda_max / 2^steps (paper: 8)")
    beta: float = Field(
        0.5, ge=0, le=1, description="generalized-JSD mixture weight (paper: 0.5); 0: KL(q||p), 1: KL(p||q)"
    )
    gamma: float = Field(0.1, ge=0, description="weight of the grounding NLL (paper: 0.1)")
    grounding_class_weights: bool = Field(
        False, description="grounding NLL weighted per state by freq(action)^-0.5, mean 1, capped at 2"
    )
    teacher_sees_intent: bool = Field(
        True, description="False: the teacher scores without the intent (self-distillation ablation)"
    )
    rollout_sampling: SamplingSettings = Field(
        ROLLOUT_SAMPLING, description="on-policy sampling (reference: temperature 0.8, 512 new tokens)"
    )
    chunk_size: int = Field(256, ge=1, description="response positions projected through the head at once")
    generator: Literal["hf", "vllm"] = Field("hf", description="vllm: GPU and the optional extra only")
    allow_foreign_base: bool = Field(
        False,
        description="distil from a base whose records are not this lake's, or that records none "
        "(refused by default; the run records that it did)",
    )

    def objective(self) -> ObjectiveSettings:
        import math

        from trainer.objective import ObjectiveSettings  # torch loads with a run, not with the settings

        return ObjectiveSettings(
            epsilon=self.epsilon if self.trust_region else math.inf,
            lambda_max=self.lambda_max,
            steps=self.bisection_steps,
            beta=self.beta,
            gamma=self.gamma,
        )


def optd_settings(train: dict | None = None, optd: dict | None = None) -> OPTDSettings:
    """OPTD settings from a ``[train]`` section with ``[optd]`` on top (OPTD extends the training)."""
    return OPTDSettings(**{**(train or {}), **(optd or {})})
