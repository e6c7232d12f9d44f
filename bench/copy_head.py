"""The demo's training with a copy head wired into the tiny model's initial weights (bench/RESULTS.md,
"Eighth round"): does SFT keep a circuit that writes a screen's id at a click's opening?

    python bench/copy_head.py LAKE OUT NAME WIRING VALUES

WIRING is a JSON object (the scales below), VALUES the training's values over ``DEMO_TRAINING`` as in
bench/demo_training.py (``{"tiny": {"num_kv_heads": 4}}`` at least: each copy head carries 32 dims). One
JSON line per run, as demo_training.py writes it.

The wiring: untied embeddings; every input lives in A = dims [0, d/2), the ids' rows drawn at ``id_std``
with a ``flag`` dim; the ids' output rows live in B = [d/2, d), each the id's input row moved over and
scaled by ``out_scale``, so an id's own position predicts nothing of it. Two heads of the layer ``layer``
(0, the first, by default; -1, the last) attend, on RoPE's two lowest frequencies (which barely rotate
over a prompt), from the cue token (the piece a click writes before its id, dim ``const``) to the flag
(score scale ``kappa``), and from every other token to the bos token (``sink``), whose value is empty;
their values copy A into B (``out``). Nothing else writes into B at first. ``freeze``: "circuit" keeps the
ids' rows, the copy heads, every write into B and the special dims and their norm weights as wired
("circuit_choosing": all but the copy heads' query and key rows off RoPE's two lowest frequencies, so they
can learn which listed id to copy); ``mask_ids``: the click's id is left out of the SFT loss. The first
layer, fixed, without the id in the loss, is what ``tiny.copy_head`` builds (trainer/copy_head.py); this
script's own wiring is the experiments' (its tiny model has the trainer's copy head off).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import demo_training  # noqa: E402 - bench/ is the script's folder

import trainer.run  # noqa: E402
from trainer.copy_head import cue_token, readers  # noqa: E402
from trainer.models import build_tiny_model  # noqa: E402


def id_rows(tokenizer: Any) -> torch.Tensor:
    return torch.tensor(
        sorted(i for t, i in tokenizer.get_added_vocab().items() if t.startswith("i_") and len(t) == 18)
    )


def wire(model: Any, tokenizer: Any, wiring: dict[str, float]) -> int:
    """Wire the copy head into ``model`` (untied, freshly initialised); the ids' content dims."""
    rows = id_rows(tokenizer)
    config = model.config
    d, hd = config.hidden_size, config.hidden_size // config.num_attention_heads
    half = d // 2
    flag, const, sink, default = half - 1, half - 2, half - 3, half - 4
    content = default
    low, low2 = hd // 2 - 1, hd // 2 - 2
    attention = model.model.layers[wiring.get("layer", 0)].self_attn
    per_kv = config.num_attention_heads // config.num_key_value_heads
    with torch.no_grad():
        inputs, outputs = model.get_input_embeddings().weight, model.get_output_embeddings().weight
        inputs[:, content:] = 0.0
        inputs[rows, :content] = torch.randn(len(rows), content) * wiring["id_std"]
        inputs[rows, flag] = wiring["flag"]
        cue = cue_token(tokenizer, int(rows[0]))
        inputs[cue, const] = wiring["const"]
        inputs[:, default] = wiring["const"]
        inputs[cue, default] = 0.0
        inputs[tokenizer.bos_token_id, :half] = 0.0
        inputs[tokenizer.bos_token_id, sink] = wiring["sink"]
        outputs[rows] = 0.0
        outputs[rows, half : half + content] = inputs[rows, :content] * wiring["out_scale"]
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[half:] = 0.0
            layer.mlp.down_proj.weight[half:] = 0.0
            for weight in readers(layer):  # the special dims are the copy heads' alone to read
                weight[:, content:half] = 0.0
        for head in range(half // hd):
            kv = head // per_kv
            q, k = attention.q_proj.weight, attention.k_proj.weight
            v, o = attention.v_proj.weight, attention.o_proj.weight
            q[head * hd : (head + 1) * hd] = 0.0
            q[head * hd + low, const] = wiring["kappa"]
            q[head * hd + low2, default] = wiring["kappa"]
            k[kv * hd : (kv + 1) * hd] = 0.0
            k[kv * hd + low, flag] = wiring["kappa"]
            k[kv * hd + low2, sink] = wiring["kappa"]
            v[kv * hd : (kv + 1) * hd] = 0.0
            o[:, head * hd : (head + 1) * hd] = 0.0
            for j in range(hd):  # the ids' content only: the flag, cue, sink and default dims stay in A
                v[kv * hd + j, head * hd + j] = float(head * hd + j < content)
                o[half + head * hd + j, head * hd + j] = wiring["out"]
    return content


def freeze_circuit(model: Any, tokenizer: Any, content: int, copy_layer: int, choose: bool = False) -> None:
    """Zero the gradients of everything the copy depends on, so Adam never moves it."""
    rows, d = id_rows(tokenizer), model.config.hidden_size
    hd = d // model.config.num_attention_heads
    per_kv = model.config.num_attention_heads // model.config.num_key_value_heads
    special = torch.arange(content, d)
    copy_heads = range((d // 2) // hd)
    heads = torch.arange(0, d // 2)  # the copy heads' query rows and output columns
    kv_rows = torch.tensor(sorted({(h // per_kv) * hd + j for h in copy_heads for j in range(hd)}))

    def rows_of(index: torch.Tensor) -> Any:
        return lambda grad: grad.index_fill(0, index, 0.0)

    fixed_rows = torch.cat([rows, torch.tensor([cue_token(tokenizer, int(rows[0])), tokenizer.bos_token_id])])
    model.get_input_embeddings().weight.register_hook(
        lambda grad: grad.index_fill(0, fixed_rows, 0.0).index_fill(1, special, 0.0)
    )
    model.get_output_embeddings().weight.register_hook(rows_of(rows))
    for layer in model.model.layers:
        for weight in (layer.self_attn.o_proj.weight, layer.mlp.down_proj.weight):
            weight.register_hook(rows_of(special))
        for norm in (layer.input_layernorm.weight, layer.post_attention_layernorm.weight):
            norm.register_hook(rows_of(special))
        for weight in readers(layer):
            weight.register_hook(lambda grad: grad.index_fill(1, special[: d // 2 - content], 0.0))
    model.model.norm.weight.register_hook(rows_of(special))
    attention = model.model.layers[copy_layer].self_attn
    if choose:  # the copy heads' other query and key rows learn which listed id to copy
        low = torch.tensor([hd // 2 - 1, hd // 2 - 2])
        heads_qk = torch.cat([h * hd + low for h in copy_heads])
        kv_qk = torch.cat([kv * hd + low for kv in sorted({h // per_kv for h in copy_heads})])
        attention.q_proj.weight.register_hook(rows_of(heads_qk))
        attention.k_proj.weight.register_hook(rows_of(kv_qk))
    else:
        attention.q_proj.weight.register_hook(rows_of(heads))
        attention.k_proj.weight.register_hook(rows_of(kv_rows))
    attention.v_proj.weight.register_hook(rows_of(kv_rows))
    attention.o_proj.weight.register_hook(lambda grad: grad.index_fill(1, heads, 0.0))


def wired_builder(wiring: dict[str, Any]) -> Any:
    def build(tokenizer: Any, spec: Any) -> Any:
        from transformers import LlamaForCausalLM

        plain = build_tiny_model(tokenizer, spec)
        plain.config.tie_word_embeddings = False
        model = LlamaForCausalLM(plain.config)
        model.generation_config = plain.generation_config
        content = wire(model, tokenizer, wiring)
        if wiring.get("freeze") in ("circuit", "circuit_choosing"):
            choose = wiring["freeze"] == "circuit_choosing"
            freeze_circuit(model, tokenizer, content, wiring.get("layer", 0), choose)
        if wiring.get("mask_ids"):  # the trainer's own way of leaving a copy head's ids unscored
            trainer.run.copied_tokens = lambda _model: id_rows(tokenizer)
        return model

    return build


def main() -> None:
    lake, out, name = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    wiring = {"id_std": 0.1, "out_scale": 3.0, "flag": 0.5, "const": 0.5, "kappa": 12.0, "sink": 5.0,
              "out": 1.0, **json.loads(sys.argv[4])}  # fmt: skip
    trainer.run.build_tiny_model = wired_builder(wiring)
    values = demo_training.merged(json.loads(sys.argv[5]), {"tiny": {"copy_head": False}})
    print(json.dumps(demo_training.one(lake, out, name, values, False)), flush=True)


if __name__ == "__main__":
    main()
