"""Models and tokenizers: any local Hugging Face causal LM, or the tiny embedded default.

The tiny default is a small Llama-architecture model and a byte-level BPE tokenizer
trained on the records' own texts. A Llama config is used on purpose: a tokenizer
saved beside some other architectures' configs (Qwen2) is reloaded by
``AutoTokenizer`` as that family's own tokenizer, with different ids.

Everything here imports with torch, transformers and tokenizers alone.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

PAD, BOS, TURN_START, TURN_END = "<|pad|>", "<|bos|>", "<|im_start|>", "<|im_end|>"
# ChatML turns; the end of the assistant's turn is the eos token, so a response ends with eos. The
# generation markers around an assistant's answer (and its end of turn) let trainers that read them
# (transformers' ``return_assistant_tokens_mask``, TRL's ``assistant_only_loss``) train on the answer only;
# the newline after a tag is an expression because transformers renders with trim_blocks
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] }}<|im_end|>{% endgeneration %}"
    "{% else %}{{ message['content'] }}<|im_end|>{% endif %}{{ '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class VocabularyMismatch(ValueError):
    """Student and teacher do not share one tokenizer and vocabulary."""


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of the embedded default model and its tokenizer."""

    vocab_size: int = 2048  # BPE merges stop here (fewer if the texts run out of pairs)
    pad_vocab_multiple: int = 64  # the model's vocabulary is rounded up: rows past the tokenizer are padding
    hidden_size: int = 64
    intermediate_size: int = 256
    num_layers: int = 2
    num_heads: int = 2  # head size 32, the smallest vLLM's flash-attention kernels take
    num_kv_heads: int = 1
    max_positions: int = 4096
    tie_embeddings: bool = True  # untied: the copy head keeps the ids' input and output rows apart


def train_tokenizer(
    texts: Iterable[str], vocab_size: int, whole_tokens: Sequence[str] = (), split_digits: bool = False
) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer over ``texts`` with bos/eos/pad and the ChatML template; each of
    ``whole_tokens`` is one token (matched before the BPE, longest first), beyond ``vocab_size``;
    ``split_digits``: each digit is a token of its own, so numbers share ten tokens instead of a
    merge per frequent digit string."""
    backend = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    digits = [pre_tokenizers.Digits(individual_digits=True)] if split_digits else []
    backend.pre_tokenizer = pre_tokenizers.Sequence([*digits, byte_level]) if digits else byte_level
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, BOS, TURN_START, TURN_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=BOS, eos_token=TURN_END, pad_token=PAD
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    if whole_tokens:
        tokenizer.add_tokens(list(dict.fromkeys(whole_tokens)))
    return tokenizer


def padded_size(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def build_tiny_model(tokenizer: PreTrainedTokenizerBase, spec: TinyModelSpec) -> LlamaForCausalLM:
    """A freshly initialised Llama model sized by ``spec`` for ``tokenizer`` (seed the caller's RNG first)."""
    config = LlamaConfig(
        vocab_size=padded_size(len(tokenizer), spec.pad_vocab_multiple),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_positions,
        tie_word_embeddings=spec.tie_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(bos_token_id=tokenizer.bos_token_id)
    fit_generation_config(model.generation_config, tokenizer, config.vocab_size)
    return model


def fit_generation_config(
    config: GenerationConfig, tokenizer: PreTrainedTokenizerBase, model_vocab: int
) -> None:
    """Stop at the tokenizer's eos (every trained response ends with it), pad with its pad token, and
    never emit a padded-vocabulary row (rows past the tokenizer have no token to decode to).

    A pretrained base's own stop ids are kept (chat models often stop on two). Its generation
    config may lack the eos, the pad id or the suppression; a checkpoint is saved with this config,
    so a plain ``generate`` on it stops where the trained responses stop.
    """
    stops = config.eos_token_id if isinstance(config.eos_token_id, list) else [config.eos_token_id]
    stops = [s for s in stops if s is not None]
    if tokenizer.eos_token_id not in stops:
        stops.append(tokenizer.eos_token_id)
    config.eos_token_id = stops[0] if len(stops) == 1 else stops
    if config.pad_token_id is None:
        config.pad_token_id = tokenizer.pad_token_id
    padding_rows = range(len(tokenizer), model_vocab)
    suppressed = sorted({*(config.suppress_tokens or []), *padding_rows})
    config.suppress_tokens = suppressed or None


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """The tokenizer of a local model folder, as it is, with a pad token (eos when it has none)."""
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    if not tokenizer.chat_template:
        raise ValueError(f"the tokenizer in {path} has no chat template: states cannot be rendered")
    if tokenizer.eos_token_id is None:
        raise ValueError(f"the tokenizer in {path} has no eos token: responses could not end")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_pretrained(
    path: str | Path, dtype: torch.dtype = torch.float32
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A causal LM and its tokenizer from a local folder (a user's checkpoint or one of ours)."""
    tokenizer = load_tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    if model_vocab_size(model) < len(tokenizer):
        raise VocabularyMismatch(
            f"{path}: the model has {model_vocab_size(model)} vocabulary rows, "
            f"its tokenizer {len(tokenizer)} tokens"
        )
    fit_generation_config(model.generation_config, tokenizer, model_vocab_size(model))
    return model, tokenizer


def enable_activation_checkpointing(model: PreTrainedModel) -> None:
    """Recompute each decoder layer's activations in backward (transformers 5 name, 4.x fallback)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def model_vocab_size(model: PreTrainedModel) -> int:
    return int(model.get_output_embeddings().weight.shape[0])


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """Hash of the token -> id map, the special tokens and the chat template."""
    payload = {
        "vocab": sorted(tokenizer.get_vocab().items()),
        "special": {k: str(v) for k, v in sorted(tokenizer.special_tokens_map.items())},
        "chat_template": tokenizer.chat_template or "",
    }
    return hashlib.sha256(json.dumps(payload, ensure_ascii=False).encode()).hexdigest()


def check_same_vocabulary(
    student: PreTrainedModel,
    student_tokenizer: PreTrainedTokenizerBase,
    teacher: PreTrainedModel,
    teacher_tokenizer: PreTrainedTokenizerBase,
) -> None:
    """Fail at once unless student and teacher share tokenizer, vocabulary and model vocabulary rows.

    Distillation compares distributions row by row: a different id for the same token,
    or a different number of rows, silently compares unrelated tokens.
    """
    problems = []
    if len(student_tokenizer) != len(teacher_tokenizer):
        problems.append(
            f"tokenizer sizes differ: student {len(student_tokenizer)}, teacher {len(teacher_tokenizer)}"
        )
    if tokenizer_fingerprint(student_tokenizer) != tokenizer_fingerprint(teacher_tokenizer):
        problems.append("token -> id maps (or special tokens, chat template) differ")
    rows = model_vocab_size(student), model_vocab_size(teacher)
    if rows[0] != rows[1]:
        problems.append(f"model vocabulary rows differ: student {rows[0]}, teacher {rows[1]}")
    if problems:
        raise VocabularyMismatch("student and teacher cannot be distilled: " + "; ".join(problems))


def save_model(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    folder: str | Path,
    weights: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Hugging Face folder: safetensors, config, generation config, tokenizer and chat template.

    ``weights``: the whole state dict to write instead of the model's own (a sharded model's, gathered).
    The generation config samples as the protocol does; config and tokenizer load in transformers 4.x too.
    """
    folder = Path(folder)
    model.save_pretrained(folder, state_dict=weights)
    protocol_sampling(model.generation_config).save_pretrained(folder)
    portable_rope_config(folder / "config.json", getattr(model.config, "rope_parameters", None))
    tokenizer.save_pretrained(folder)
    portable_tokenizer_config(folder / "tokenizer_config.json", tokenizer.chat_template)
    return folder


# PROTOCOL.md §3: the evaluation's sampling
PROTOCOL_SAMPLING = {"do_sample": True, "temperature": 1.0, "top_p": 0.95, "top_k": 0, "max_new_tokens": 512}


def protocol_sampling(config: GenerationConfig) -> GenerationConfig:
    """A copy of ``config`` (its eos, pad and suppressed ids kept) that samples as the protocol does.

    A plain ``generate`` on the folder, and a server that fills what a request leaves out from it, then
    sample what the evaluation samples: ``transformers serve`` keeps the folder's ``do_sample`` even when
    sent a temperature, where vLLM samples whenever the temperature is above 0. ``top_k`` 0 and no
    repetition penalty: the plain distribution, whatever a pretrained base shipped with. A request with
    temperature 0 still decodes greedily, and callers passing their own settings are not affected.
    """
    sampling = copy.deepcopy(config)
    sampling.update(**PROTOCOL_SAMPLING, repetition_penalty=None)
    return sampling


def portable_rope_config(path: Path, rope_parameters: dict | None) -> None:
    """Write the RoPE base where transformers 4.x (and the vLLM builds on it) read it, beside 5's own.

    transformers 5 keeps it in ``rope_parameters``; 4.x reads a top-level ``rope_theta`` (10000 when
    absent) and ``rope_scaling`` (None for the plain rotation), and would rotate a model trained with
    another base by the wrong frequencies without a word. 5 reads both keys back to the same parameters.
    RoPE nested per layer type has no 4.x equivalent in these two keys and is left as it is.
    """
    if not rope_parameters or "rope_theta" not in rope_parameters:
        return
    config = json.loads(path.read_text())
    config["rope_theta"] = rope_parameters["rope_theta"]
    if "partial_rotary_factor" in rope_parameters:  # a top-level setting in 4.x
        config["partial_rotary_factor"] = rope_parameters["partial_rotary_factor"]
    if rope_parameters.get("rope_type", "default") != "default":
        legacy = ("rope_theta", "partial_rotary_factor")
        config["rope_scaling"] = {k: v for k, v in rope_parameters.items() if k not in legacy}
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def portable_tokenizer_config(path: Path, chat_template: str | None) -> None:
    """Make the saved tokenizer loadable by older transformers too (as a vLLM install may pin).

    transformers 5 names a plain ``tokenizers`` tokenizer ``TokenizersBackend``, a class 4.x
    lacks, and keeps the chat template only in ``chat_template.jinja``; both versions read
    ``PreTrainedTokenizerFast`` and an inline template.
    """
    config = json.loads(path.read_text())
    if config.get("tokenizer_class") == "TokenizersBackend":
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
    if chat_template and "chat_template" not in config:
        config["chat_template"] = chat_template
    for load_time_flag in ("is_local", "local_files_only"):  # how it was last loaded, not what it is
        config.pop(load_time_flag, None)
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
