"""SFT and OPTD training steps of a Qwen2.5-0.5B-shaped model on synthetic states, timed per phase.

    python bench/gpu_train.py --steps 5            # on a GPU: results under $OUT (or --out)
    python bench/gpu_train.py --toy --out DIR      # the same code on CPU at a tiny size, in seconds

The model is random-initialised (``Qwen2Config`` -> ``Qwen2ForCausalLM``: hidden 896, 24 layers,
14 heads, 2 kv heads, intermediate 4864, vocabulary 151,936, tied embeddings), so no weights are
needed. Each state is a random-id prompt of about 1.5k tokens, a privileged prompt (the same with
about 100 intent tokens in front) and a gold response of 60-120 tokens, the length of the
records' JSON answers.

- SFT step: student forward on prompt + gold, ``grounding_nll_from_hidden`` (chunked, response
  positions only), backward, AdamW.
- OPTD step: the student samples responses with HF ``generate`` (one batch; it runs until the
  longest drawn length, then each response is cut to its own, as if it had ended there); the
  frozen teacher scores them with the plain and with the privileged prompt under no_grad; the
  student's forward on its sample and on the gold response (grounding); ``optd_loss_from_hidden``;
  the two backwards; AdamW.

Scoring batches are right-padded and run without an attention mask: under causal attention no
valid position sees the padding after it, and the fused SDPA kernels stay usable.

One untimed warm-up step per stage, then ``--steps`` timed ones. Written to ``gpu_train.json``:
tokens/s, MFU, peak memory, per-phase time shares, HF generate tokens/s and vLLM's where it
imports. Imports torch, transformers and the torch-only trainer modules, nothing else.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import os
import resource
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import Qwen2Config, Qwen2ForCausalLM

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hostinfo import describe as machine  # noqa: E402 - bench/ is the script's folder

from trainer.loop import PhaseTimer, adam, autocast, clip_gradients  # noqa: E402
from trainer.objective import grounding_nll_from_hidden, optd_loss_from_hidden  # noqa: E402

H200_BF16_DENSE_TFLOPS = 989.0
MFU_FORMULA = (
    "mfu = 6 * n_params * trained_tokens_per_s / (989e12 FLOP/s, the H200's bf16 dense peak); "
    "trained tokens = prompt + response tokens of every forward that is back-propagated; "
    "mfu_all_passes adds 2 * n_params per token of the forward-only passes (teacher scoring, "
    "generation prefill and decode); n_params counts the tied embedding once"
)


@dataclass(frozen=True)
class Size:
    """Model shape and workload of one benchmark size."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int  # the model's (padded) vocabulary
    tokenizer_vocab: int  # ids the tokenizer can produce: rows past it are masked in the loss
    prompt_tokens: int  # mean prompt length; each state draws within +-1/12 of it
    intent_tokens: int  # extra tokens of the privileged prompt
    response_tokens: tuple[int, int]  # gold and sampled response lengths, inclusive range
    states: int
    chunk: int


# Qwen2.5-0.5B's shape; its tokenizer has 151,665 ids in a 151,936-row embedding
FULL = Size(896, 24, 14, 2, 4864, 151_936, 151_665, 1536, 100, (60, 120), states=8, chunk=1024)
TOY = Size(64, 2, 4, 2, 128, 512, 500, 64, 8, (8, 16), states=2, chunk=16)


# ---------------------------------------------------------------------------------------------
# model and synthetic states
# ---------------------------------------------------------------------------------------------


def build_model(size: Size, device: torch.device, dtype: torch.dtype) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=size.vocab,
        hidden_size=size.hidden,
        intermediate_size=size.intermediate,
        num_hidden_layers=size.layers,
        num_attention_heads=size.heads,
        num_key_value_heads=size.kv_heads,
        max_position_embeddings=32_768,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        pad_token_id=pad_id(size),
        eos_token_id=None,
        bos_token_id=None,
    )  # attention: transformers' default, SDPA where torch has it
    with device:  # initialised where it runs: no CPU copy of the weights
        return Qwen2ForCausalLM(config).to(dtype)


def pad_id(size: Size) -> int:
    return size.tokenizer_vocab - 1  # reserved: prompts and responses draw ids below it


@dataclass
class State:
    prompt: torch.Tensor  # [P] ids
    privileged: torch.Tensor  # [I + P] ids: intent tokens, then the prompt
    gold: torch.Tensor  # [G] ids of the gold response


def draw_states(size: Size, gen: torch.Generator) -> list[State]:
    spread = size.prompt_tokens // 12
    low, high = size.response_tokens

    def ids(n: int) -> torch.Tensor:
        return torch.randint(0, pad_id(size), (n,), generator=gen)

    def length(lo: int, hi: int) -> int:
        return int(torch.randint(lo, hi + 1, (1,), generator=gen))

    states = []
    for _ in range(size.states):
        prompt = ids(length(size.prompt_tokens - spread, size.prompt_tokens + spread))
        states.append(State(prompt, torch.cat([ids(size.intent_tokens), prompt]), ids(length(low, high))))
    return states


# ---------------------------------------------------------------------------------------------
# batches and passes
# ---------------------------------------------------------------------------------------------


@dataclass
class ScoringBatch:
    """Contexts + responses right-padded, and where the positions predicting each response token are."""

    input_ids: torch.Tensor  # [S, T], row s holds state s
    positions: torch.Tensor  # [N]: position len(context) - 1 + j predicts response token j
    labels: torch.Tensor  # [N] the response tokens
    state_index: torch.Tensor  # [N]
    tokens: int  # context + response tokens in the batch, padding excluded


def scoring_batch(
    contexts: Sequence[torch.Tensor], responses: Sequence[torch.Tensor], pad: int, device: torch.device
) -> ScoringBatch:
    """Each response is indexed from the end of its own context, so contexts of different lengths
    (plain and privileged prompt) line up token by token on the same response ids."""
    sequences = [torch.cat([c, r]) for c, r in zip(contexts, responses, strict=True)]
    width = max(len(s) for s in sequences)
    input_ids = torch.full((len(sequences), width), pad, dtype=torch.long)
    for row, sequence in enumerate(sequences):
        input_ids[row, : len(sequence)] = sequence
    lengths = [len(r) for r in responses]
    state_index = torch.repeat_interleave(torch.arange(len(responses)), torch.tensor(lengths))
    positions = torch.cat(
        [torch.arange(len(r)) + len(c) - 1 for c, r in zip(contexts, responses, strict=True)]
    )
    return ScoringBatch(
        input_ids=input_ids.to(device),
        positions=positions.to(device),
        labels=torch.cat(list(responses)).to(device),
        state_index=state_index.to(device),
        tokens=sum(len(s) for s in sequences),
    )


def response_hidden(model: Qwen2ForCausalLM, batch: ScoringBatch) -> torch.Tensor:
    """Final hidden states [N, H] predicting the response tokens: no logits for any prompt position."""
    out = model.model(input_ids=batch.input_ids, use_cache=False)
    return out.last_hidden_state[batch.state_index, batch.positions]


def sample_responses(
    model: Qwen2ForCausalLM, states: Sequence[State], size: Size, gen: torch.Generator
) -> list[torch.Tensor]:
    """On-policy responses: one left-padded ``generate`` batch, each cut to a drawn response length."""
    device = model.device
    width = max(len(s.prompt) for s in states)
    input_ids = torch.full((len(states), width), pad_id(size), dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for row, state in enumerate(states):
        input_ids[row, width - len(state.prompt) :] = state.prompt
        attention_mask[row, width - len(state.prompt) :] = 1
    low, high = size.response_tokens
    lengths = torch.randint(low, high + 1, (len(states),), generator=gen).tolist()
    out = model.generate(
        input_ids=input_ids.to(device),
        attention_mask=attention_mask.to(device),
        do_sample=True,
        max_new_tokens=max(lengths),
        min_new_tokens=max(lengths),
        pad_token_id=pad_id(size),
    )
    return [out[row, width : width + n].cpu() for row, n in enumerate(lengths)]


# ---------------------------------------------------------------------------------------------
# steps
# ---------------------------------------------------------------------------------------------


@dataclass
class StepCounts:
    trained_tokens: int = 0  # tokens of back-propagated forwards
    forward_only_tokens: int = 0  # teacher scoring, generation prefill + decode
    generated_tokens: int = 0
    loss: float = 0.0  # of the last step: a finite value says the step computed something real


@dataclass
class Bench:
    student: Qwen2ForCausalLM
    optimizer: torch.optim.Optimizer
    size: Size
    cast: Callable[[], AbstractContextManager[Any]]
    gen: torch.Generator

    @property
    def device(self) -> torch.device:
        return self.student.device

    def optimise(self, timer: PhaseTimer) -> None:
        with timer.phase("optimizer"):
            clip_gradients([p for p in self.student.parameters() if p.grad is not None], 1.0)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)


def sft_step(bench: Bench, timer: PhaseTimer) -> StepCounts:
    states = draw_states(bench.size, bench.gen)
    batch = scoring_batch(
        [s.prompt for s in states], [s.gold for s in states], pad_id(bench.size), bench.device
    )
    with timer.phase("student_forward"), bench.cast():
        hidden = response_hidden(bench.student, batch)
    with timer.phase("grounding_loss"):
        leaf = hidden.detach().requires_grad_()
        loss = grounding_nll_from_hidden(
            leaf,
            batch.labels,
            batch.state_index,
            bench.student.lm_head.weight,
            vocab_size=bench.size.tokenizer_vocab,
            chunk_size=bench.size.chunk,
        )
        loss.backward()  # the chunked loss computed its gradients in forward: this hands them over
    with timer.phase("student_backward"):
        hidden.backward(leaf.grad)
    bench.optimise(timer)
    return StepCounts(trained_tokens=batch.tokens, loss=float(loss.detach()))


def optd_step(bench: Bench, teacher: Qwen2ForCausalLM, timer: PhaseTimer) -> StepCounts:
    size, device, pad = bench.size, bench.device, pad_id(bench.size)
    states = draw_states(size, bench.gen)
    with timer.phase("generate"), torch.no_grad(), bench.cast():
        bench.student.eval()
        sampled = sample_responses(bench.student, states, size, bench.gen)
        bench.student.train()
    plain = scoring_batch([s.prompt for s in states], sampled, pad, device)
    privileged = scoring_batch([s.privileged for s in states], sampled, pad, device)
    gold = scoring_batch([s.prompt for s in states], [s.gold for s in states], pad, device)
    with timer.phase("teacher_plain"), torch.no_grad():
        base_hidden = response_hidden(teacher, plain)
    with timer.phase("teacher_privileged"), torch.no_grad():
        intent_hidden = response_hidden(teacher, privileged)
    with timer.phase("student_forward"), bench.cast():
        student_hidden = response_hidden(bench.student, plain)
    with timer.phase("grounding_forward"), bench.cast():
        grounding_hidden = response_hidden(bench.student, gold)
    with timer.phase("optd_loss"):
        student_leaf = student_hidden.detach().requires_grad_()
        grounding_leaf = grounding_hidden.detach().requires_grad_()
        loss = optd_loss_from_hidden(
            student_leaf,
            base_hidden,
            intent_hidden,
            plain.state_index,
            grounding_leaf,
            gold.labels,
            gold.state_index,
            bench.student.lm_head.weight,
            teacher_head_weight=teacher.lm_head.weight,
            vocab_size=size.tokenizer_vocab,
            chunk_size=size.chunk,
        )
        loss.total.backward()
    with timer.phase("student_backward"):
        student_hidden.backward(student_leaf.grad)
    with timer.phase("grounding_backward"):
        grounding_hidden.backward(grounding_leaf.grad)
    bench.optimise(timer)
    generated = sum(len(r) for r in sampled)
    prefill = sum(len(s.prompt) for s in states)
    return StepCounts(
        trained_tokens=plain.tokens + gold.tokens,
        forward_only_tokens=plain.tokens + privileged.tokens + prefill + generated,
        generated_tokens=generated,
        loss=float(loss.total.detach()),
    )


# ---------------------------------------------------------------------------------------------
# measurement
# ---------------------------------------------------------------------------------------------


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: torch.device) -> dict[str, Any]:
    if device.type == "cuda":
        return {
            "peak_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30,
            "peak_memory_source": "torch.cuda.max_memory_allocated",
        }
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # Linux reports KiB
    return {"peak_memory_gib": kib / 2**20, "peak_memory_source": "ru_maxrss of the process (CPU run)"}


def run_stage(
    step: Callable[[PhaseTimer], StepCounts], steps: int, device: torch.device, n_params: int
) -> dict[str, Any]:
    """One warm-up step, then ``steps`` timed ones; throughput, MFU and phase shares of the timed ones."""
    step(PhaseTimer(device))
    timer, counts = PhaseTimer(device), StepCounts()
    for _ in range(steps):
        done = step(timer)
        counts.trained_tokens += done.trained_tokens
        counts.forward_only_tokens += done.forward_only_tokens
        counts.generated_tokens += done.generated_tokens
        counts.loss = done.loss
    wall = sum(timer.seconds.values())
    peak = H200_BF16_DENSE_TFLOPS * 1e12
    trained_per_s = counts.trained_tokens / wall
    report = {
        "steps": steps,
        "step_seconds": wall / steps,
        "tokens_per_s": trained_per_s,
        "mfu": 6 * n_params * trained_per_s / peak,
        "phase_seconds": dict(timer.seconds),
        "phase_shares": {name: seconds / wall for name, seconds in timer.seconds.items()},
        **asdict(counts),
        **peak_memory(device),
    }
    if counts.forward_only_tokens:
        flops = 6 * n_params * counts.trained_tokens + 2 * n_params * counts.forward_only_tokens
        report["mfu_all_passes"] = flops / wall / peak
    if counts.generated_tokens:
        report["hf_generate_tokens_per_s"] = counts.generated_tokens / timer.seconds["generate"]
    return report


def vllm_generate(model: Qwen2ForCausalLM, size: Size, gen: torch.Generator) -> dict[str, Any]:
    """vLLM's tokens/s on the same kind of batch, where vLLM imports and a GPU is there.

    Both figures count each response's own tokens: HF ``generate`` runs the batch to its longest
    response, so the rows that ended earlier cost it time that vLLM does not spend.
    """
    if importlib.util.find_spec("vllm") is None:
        return {"status": "not installed"}
    if model.device.type != "cuda":
        return {"status": "not measured: vLLM needs a GPU"}
    from vllm import LLM, SamplingParams

    states = draw_states(size, gen)
    low, high = size.response_tokens
    # one length per request, as in the HF batch: vLLM retires a request at its own end
    lengths = torch.randint(low, high + 1, (len(states),), generator=gen).tolist()
    params = [SamplingParams(max_tokens=n, min_tokens=n, ignore_eos=True, detokenize=False) for n in lengths]
    prompts = [{"prompt_token_ids": s.prompt.tolist()} for s in states]
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        engine = LLM(model=folder, skip_tokenizer_init=True, dtype="bfloat16", gpu_memory_utilization=0.3)
        engine.generate(prompts, params, use_tqdm=False)  # warm-up: graphs captured, cache allocated
        started = time.perf_counter()
        engine.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - started
    return {"status": "measured", "tokens_per_s": sum(lengths) / seconds, "states": len(states)}


def vllm_measurement(model: Qwen2ForCausalLM, size: Size, gen: torch.Generator) -> dict[str, Any]:
    """vLLM's figure, or why there is none: a failing engine must not lose the training figures."""
    try:
        return vllm_generate(model, size, gen)
    except Exception as error:  # reported in the output, whatever the engine raised
        return {"status": f"failed: {error!r}"}


def optd_stage(bench: Bench, steps: int, n_params: int) -> dict[str, Any]:
    """OPTD steps against a frozen bf16 copy of the student (the SFT checkpoint), freed on return."""
    teacher = copy.deepcopy(bench.student).to(
        torch.bfloat16 if bench.device.type == "cuda" else torch.float32
    )
    teacher.eval().requires_grad_(False)
    reset_peak_memory(bench.device)
    return run_stage(partial(optd_step, bench, teacher), steps, bench.device, n_params)


def settings_of(args: argparse.Namespace) -> tuple[Size, torch.device, torch.dtype]:
    size = TOY if args.toy else FULL
    if args.states:
        size = Size(**{**asdict(size), "states": args.states})
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() and not args.toy else "cpu"))
    dtype = torch.bfloat16 if device.type == "cuda" and args.weights == "bf16" else torch.float32
    return size, device, dtype


def benchmark(args: argparse.Namespace) -> dict[str, Any]:
    size, device, dtype = settings_of(args)
    gen = torch.Generator().manual_seed(args.seed)
    torch.manual_seed(args.seed)
    student = build_model(size, device, dtype)
    n_params = sum(p.numel() for p in student.parameters())  # parameters() yields a tied weight once
    use_autocast = device.type == "cuda" and args.weights == "fp32"
    bench = Bench(
        student=student,
        optimizer=adam(student, lr=1e-5, betas=(0.9, 0.999), eps=1e-8),
        size=size,
        cast=(lambda: autocast(device, True)) if use_autocast else nullcontext,
        gen=gen,
    )
    student.train()
    reset_peak_memory(device)
    sft = run_stage(partial(sft_step, bench), args.steps, device, n_params)
    optd = optd_stage(bench, args.steps, n_params)
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the training stages' cached blocks, so vLLM finds its share free
    return {
        "machine": machine(),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join(["python", "bench/gpu_train.py", *sys.argv[1:]]),
        "model": {
            **asdict(size),
            "n_params": n_params,
            "weights": str(dtype).removeprefix("torch."),
            "autocast_bf16": use_autocast,
        },
        "mfu_formula": MFU_FORMULA,
        "sft": sft,
        "optd": optd,
        "generation": {
            "hf_generate_tokens_per_s": optd["hf_generate_tokens_per_s"],
            "vllm": vllm_measurement(student, size, gen),
        },
    }


def summary(result: dict[str, Any]) -> str:
    model = result["model"]
    lines = [f"{result['device']}: {model['n_params'] / 1e6:.1f}M parameters, {model['weights']} weights"]
    for stage in ("sft", "optd"):
        report = result[stage]
        shares = ", ".join(f"{name} {share:.0%}" for name, share in report["phase_shares"].items())
        lines.append(
            f"{stage}: {report['tokens_per_s']:,.0f} tokens/s, MFU {report['mfu']:.1%}, "
            f"peak {report['peak_memory_gib']:.2f} GiB, {report['step_seconds']:.2f} s/step ({shares})"
        )
    vllm = result["generation"]["vllm"]
    lines.append(
        f"generate: HF {result['generation']['hf_generate_tokens_per_s']:,.0f} tokens/s; "
        f"vLLM {vllm.get('tokens_per_s', vllm['status'])}"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--toy", action="store_true", help="tiny model and states, on CPU, in seconds")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per stage (default 5, toy 1)")
    parser.add_argument("--states", type=int, default=None, help="states per step (default 8, toy 2)")
    parser.add_argument(
        "--weights",
        choices=("bf16", "fp32"),
        default="bf16",
        help="student weights on GPU: bf16, or float32 master weights under bf16 autocast",
    )
    parser.add_argument("--device", default=None, help="default: cuda where available (cpu for --toy)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--out", default=os.environ.get("OUT"), help="folder for gpu_train.json (default $OUT)"
    )
    args = parser.parse_args(argv)
    if not args.out:
        parser.error("give --out or set $OUT")
    args.steps = args.steps or (1 if args.toy else 5)
    if args.toy:
        torch.set_num_threads(min(2, torch.get_num_threads()))
    result = benchmark(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_train.json").write_text(json.dumps(result, indent=2) + "\n")
    print(summary(result))
    print(f"written: {out / 'gpu_train.json'}")


if __name__ == "__main__":
    main()
