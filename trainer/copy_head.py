"""A copy head wired into the tiny model when it is built: the circuit that writes a listed item id at a
click's opening.

A click's id is a copy from the screen. Training rounds one to seven (bench/RESULTS.md) found that a tiny
model on a few CPU cores does not learn that copy within its budget; the eighth, that a copy wired into the
last layer is unlearnt within a few hundred updates, RMSNorm coupling it to everything that trains. Wired
into the first layer, which reads the embeddings alone, and with its weights kept, it stays what it was
built as:

- the embeddings are untied; every input lives in A = dims [0, d/2), the item ids' rows drawn larger and
  flagged; each id's output row lives in B = [d/2, d), its input row moved over, so an id's own position
  predicts nothing of it;
- two heads of the first layer attend, on RoPE's two lowest frequencies (which barely turn over a
  prompt), from the cue token (what a click writes just before its id) to the flagged ids, and from
  every other token to the bos token, whose value is empty; their values move the ids' A into B;
- nothing else writes into B or reads the special dims (flag, cue, sink, default).

The model stays a plain ``LlamaForCausalLM`` that transformers and vLLM load as any other. What the
circuit needs kept is recorded in its config (``copy_head``), so every stage that trains it, resumed or
not, zeroes those gradients (``FixedWeights``), and SFT leaves the copied id out of its loss
(``copied_tokens``): which listed card a click copies is the circuit's, not learnt.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from transforms.click_line import CLICK_ID_PREFIX

CONFIG_KEY = "copy_head"
COPY_LAYER = 0  # the first layer reads the embeddings alone: its copy depends on nothing that trains
COPY_HEADS = 2  # their head dims together are A's
SPECIAL_DIMS = 4  # at A's top: flag, cue, sink, default
# the scales: ids drawn 15x the init's std so they dominate their own positions; the cue and the bos sink
# large enough that their normalised rows are theirs alone; the copy's output 100x, so the rest of the
# residual would have to grow as large to dilute it in the final norm
ID_STD, FLAG, CUE, SINK, DEFAULT = 0.3, 1.0, 5.0, 500.0, 0.5
SCORE, COPY_OUT, ID_OUT = 12.0, 100.0, 3.0


class CopyHeadMismatch(ValueError):
    """The model or tokenizer cannot carry the copy head."""


@dataclass(frozen=True)
class Layout:
    """Where the circuit lives in a model of this shape."""

    hidden: int
    head_dim: int

    @property
    def half(self) -> int:
        return self.hidden // 2

    @property
    def content(self) -> int:  # the ids' own dims: [0, content)
        return self.half - SPECIAL_DIMS

    def dim(self, name: str) -> int:
        return self.half - 1 - ("flag", "cue", "sink", "default").index(name)

    @property
    def lowest(self) -> tuple[int, int]:  # the two query/key dims on RoPE's lowest frequencies
        return self.head_dim // 2 - 1, self.head_dim // 2 - 2


def layout_of(model: PreTrainedModel) -> Layout:
    config = model.config
    return Layout(config.hidden_size, config.hidden_size // config.num_attention_heads)


def id_token_rows(tokenizer: PreTrainedTokenizerBase, item_ids: Sequence[str]) -> torch.Tensor:
    rows = tokenizer.convert_tokens_to_ids(list(item_ids))
    missing = None in rows or (tokenizer.unk_token_id is not None and tokenizer.unk_token_id in rows)
    if missing:
        raise CopyHeadMismatch("the copy head needs every item id as one token (tiny.item_id_tokens)")
    return torch.tensor(sorted(set(rows)))


def cue_token(tokenizer: PreTrainedTokenizerBase, some_id: int) -> int:
    """The token a click's response writes just before its item id."""
    text = CLICK_ID_PREFIX + tokenizer.convert_ids_to_tokens(some_id)
    tokens = tokenizer(text, add_special_tokens=False)["input_ids"]
    if tokens[-1] != some_id or len(tokens) < 2:
        raise CopyHeadMismatch(f"a click's opening does not end in a token of its own before {text!r}")
    return tokens[-2]


def check_shape(model: PreTrainedModel) -> Layout:
    config, layout = model.config, layout_of(model)
    if config.tie_word_embeddings:
        raise CopyHeadMismatch("the copy head needs untied input and output embeddings")
    if config.num_key_value_heads != config.num_attention_heads:
        raise CopyHeadMismatch("the copy head needs a key/value head per query head (tiny.num_kv_heads)")
    if COPY_HEADS * layout.head_dim != layout.half or layout.content < 8:
        raise CopyHeadMismatch(
            f"the copy head needs hidden size = 4 x head size ({COPY_HEADS} copy heads carry half of it); "
            f"got hidden {layout.hidden}, head {layout.head_dim}"
        )
    return layout


def ranges(rows: torch.Tensor) -> list[list[int]]:
    """Sorted token ids as [start, stop) runs: a catalog's ids are added together, so one or a few."""
    runs: list[list[int]] = []
    for row in rows.tolist():
        if runs and runs[-1][1] == row:
            runs[-1][1] = row + 1
        else:
            runs.append([row, row + 1])
    return runs


@torch.no_grad()
def wire_copy_head(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, item_ids: Sequence[str]
) -> None:
    """Wire the circuit into a freshly built ``model`` and record it in its config (seed the RNG first)."""
    layout = check_shape(model)
    rows = id_token_rows(tokenizer, item_ids)
    cue, bos = cue_token(tokenizer, int(rows[0])), tokenizer.bos_token_id
    place_embeddings(model, layout, rows, cue, bos)
    for layer in model.model.layers:  # B and the special dims are the circuit's alone
        layer.self_attn.o_proj.weight[layout.half :] = 0.0
        layer.mlp.down_proj.weight[layout.half :] = 0.0
        for weight in readers(layer):
            weight[:, layout.content : layout.half] = 0.0
    wire_heads(model.model.layers[COPY_LAYER].self_attn, layout)
    model.config.copy_head = {"layer": COPY_LAYER, "heads": COPY_HEADS, "id_tokens": ranges(rows),
                              "cue_token": cue, "bos_token": bos}  # fmt: skip


def place_embeddings(model: PreTrainedModel, layout: Layout, rows: torch.Tensor, cue: int, bos: int) -> None:
    inputs, outputs = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    half, content = layout.half, layout.content
    inputs[:, content:] = 0.0
    inputs[rows, :content] = torch.randn(len(rows), content) * ID_STD
    inputs[rows, layout.dim("flag")] = FLAG
    inputs[:, layout.dim("default")] = DEFAULT  # every query but the cue's looks at the bos token
    inputs[cue, layout.dim("default")] = 0.0
    inputs[cue, layout.dim("cue")] = CUE
    inputs[bos, :half] = 0.0
    inputs[bos, layout.dim("sink")] = SINK
    outputs[rows] = 0.0
    outputs[rows, half : half + content] = inputs[rows, :content] * ID_OUT


def wire_heads(attention: torch.nn.Module, layout: Layout) -> None:
    hd, low, next_low = layout.head_dim, *layout.lowest
    q, k, v, o = (attention.q_proj.weight, attention.k_proj.weight, attention.v_proj.weight,
                  attention.o_proj.weight)  # fmt: skip
    for head in range(COPY_HEADS):
        span = slice(head * hd, (head + 1) * hd)
        q[span], k[span], v[span], o[:, span] = 0.0, 0.0, 0.0, 0.0
        q[head * hd + low, layout.dim("cue")] = SCORE
        k[head * hd + low, layout.dim("flag")] = SCORE
        q[head * hd + next_low, layout.dim("default")] = SCORE
        k[head * hd + next_low, layout.dim("sink")] = SCORE
        for j in range(hd):  # the ids' content only: the special dims stay in A
            v[head * hd + j, head * hd + j] = float(head * hd + j < layout.content)
            o[layout.half + head * hd + j, head * hd + j] = COPY_OUT


def readers(layer: torch.nn.Module) -> list[torch.Tensor]:
    attention, mlp = layer.self_attn, layer.mlp
    projections = (attention.q_proj, attention.k_proj, attention.v_proj, mlp.gate_proj, mlp.up_proj)
    return [projection.weight for projection in projections]


def record_of(model: PreTrainedModel) -> dict | None:
    return getattr(model.config, CONFIG_KEY, None)


def copied_tokens(model: PreTrainedModel) -> torch.Tensor | None:
    """The item-id tokens a model with a copy head copies (left out of its SFT loss); None without one."""
    record = record_of(model)
    if not record:
        return None
    return torch.cat([torch.arange(start, stop) for start, stop in record["id_tokens"]])


@dataclass
class FixedWeights:
    """The slices of parameters the copy head needs kept: their gradients are zeroed before each update,
    so the optimiser (no weight decay) never moves them."""

    slices: list[tuple[torch.nn.Parameter, int, torch.Tensor]]

    @classmethod
    def of(cls, model: PreTrainedModel) -> FixedWeights | None:
        record = record_of(model)
        if not record:
            return None
        layout = check_shape(model)
        rows = copied_tokens(model)
        special = torch.arange(layout.content, layout.hidden)
        read_only = torch.arange(layout.content, layout.half)
        kept_rows = torch.cat([rows, torch.tensor([record["cue_token"], record["bos_token"]])])
        slices = [
            (model.get_input_embeddings().weight, 0, kept_rows),
            (model.get_input_embeddings().weight, 1, special),
            (model.get_output_embeddings().weight, 0, rows),
            (model.model.norm.weight, 0, special),
        ]
        for layer in model.model.layers:
            for writer in (layer.self_attn.o_proj.weight, layer.mlp.down_proj.weight):
                slices.append((writer, 0, special))
            for norm in (layer.input_layernorm.weight, layer.post_attention_layernorm.weight):
                slices.append((norm, 0, special))
            slices += [(weight, 1, read_only) for weight in readers(layer)]
        heads = torch.arange(record["heads"] * layout.head_dim)
        attention = model.model.layers[record["layer"]].self_attn
        slices += [(attention.q_proj.weight, 0, heads), (attention.k_proj.weight, 0, heads),
                   (attention.v_proj.weight, 0, heads), (attention.o_proj.weight, 1, heads)]  # fmt: skip
        return cls(slices)

    def zero_gradients(self) -> None:
        for parameter, dim, index in self.slices:
            if parameter.grad is not None:
                parameter.grad.index_fill_(dim, index.to(parameter.grad.device), 0.0)
