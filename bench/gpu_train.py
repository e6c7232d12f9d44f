"""SFT and OPTD updates of a Qwen2.5-0.5B-shaped model on synthetic states, through the trainer's own code.

    python bench/gpu_train.py --steps 5            # on a GPU: results under $OUT (or --out)
    python bench/gpu_train.py --toy --out DIR      # the same code on CPU at a tiny size, in seconds

The model is random-initialised (``Qwen2Config`` -> ``Qwen2ForCausalLM``: hidden 896, 24 layers,
14 heads, 2 kv heads, intermediate 4864, vocabulary 151,936, tied embeddings), so no weights are
needed. Each state is an ``EncodedState`` with a random-id prompt of about 1.5k tokens and a gold
response of 60-120 tokens (the length of the records' JSON answers; no eos: the model has none),
wrapped in an ``OPTDState`` whose privileged prompt is the same prompt with about 100 intent tokens
in front.

The updates are the trainer's, called as its runs call them, so the figures measure what it runs:

- SFT (as ``TrainingRun.update``): the states ``collate``d into one micro-batch, then
  ``Trainer.step`` with ``SFTObjective`` on ``HiddenStates(model)``: response-position logits,
  per-state NLL means, backward, clipping, AdamW.
- OPTD (as ``OPTDRun.update``): the student samples the responses, ``build_rollouts`` has the frozen
  teacher score them after the plain and after the privileged prompt, then ``Trainer.step`` with
  ``OPTDObjective`` (chunked OPTD loss from the hidden states, grounding on the gold responses).
  Sampling is the bench's own (``sample_responses``), not the trainer's generator: a random-init
  model never emits eos, so the bench fixes each response's length to control the workload.

Phases are the trainer's timers: ``forward_backward`` and ``optimizer`` (``Trainer.step``),
``teacher_plain`` and ``teacher_intent`` (``build_rollouts``), ``generate`` (the bench's sampling,
where ``OPTDRun.update`` times its generator); inside ``forward_backward`` the OPTD objective's own
timer splits out ``student_forward``, ``grounding_forward`` and ``loss`` (the rest is the backward
through the decoder). The bench does not time drawing and collating its synthetic states.

One untimed warm-up update per stage, then ``--steps`` timed ones. Written to ``gpu_train.json``:
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
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
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

from trainer.data import EncodedState, RecordText, collate  # noqa: E402
from trainer.loop import PhaseTimer, StepReport, Trainer, adam, autocast  # noqa: E402
from trainer.objective import ObjectiveSettings  # noqa: E402
from trainer.optd import HiddenStates, OPTDObjective, OPTDState, build_rollouts  # noqa: E402
from trainer.sft import SFTObjective  # noqa: E402

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
    states: int  # per update, all in one micro-batch
    chunk: int  # response positions per chunk of the OPTD loss (the SFT loss is not chunked)


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


def draw_states(size: Size, gen: torch.Generator) -> list[OPTDState]:
    """``size.states`` synthetic training states, each with its privileged prompt (intent ids in front)."""
    spread = size.prompt_tokens // 12
    low, high = size.response_tokens

    def ids(n: int) -> list[int]:
        return torch.randint(0, pad_id(size), (n,), generator=gen).tolist()

    def length(lo: int, hi: int) -> int:
        return int(torch.randint(lo, hi + 1, (1,), generator=gen))

    states = []
    for index in range(size.states):
        prompt = ids(length(size.prompt_tokens - spread, size.prompt_tokens + spread))
        privileged = ids(size.intent_tokens) + prompt
        record = RecordText(
            key=f"bench/{index}", system="", prompt="", response="", action="bench", intent="", split="train"
        )
        states.append(OPTDState(EncodedState(record, prompt, ids(length(low, high))), privileged))
    return states


def sample_responses(
    model: Qwen2ForCausalLM, states: Sequence[OPTDState], size: Size, gen: torch.Generator
) -> list[list[int]]:
    """On-policy responses: one left-padded ``generate`` batch, each cut to a drawn response length.

    A random-init model has no eos, so ``generate`` runs the batch to its longest drawn length and
    each response is cut to its own, as if it had ended there: the lengths, not the model, set the
    workload."""
    prompts = [s.state.prompt_ids for s in states]
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_id(size), dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for row, prompt in enumerate(prompts):
        input_ids[row, width - len(prompt) :] = torch.tensor(prompt)
        attention_mask[row, width - len(prompt) :] = 1
    low, high = size.response_tokens
    lengths = torch.randint(low, high + 1, (len(prompts),), generator=gen).tolist()
    out = model.generate(
        input_ids=input_ids.to(model.device),
        attention_mask=attention_mask.to(model.device),
        do_sample=True,
        max_new_tokens=max(lengths),
        min_new_tokens=max(lengths),
        pad_token_id=pad_id(size),
    )
    return [out[row, width : width + n].tolist() for row, n in enumerate(lengths)]


# ---------------------------------------------------------------------------------------------
# updates: the trainer's
# ---------------------------------------------------------------------------------------------

# the optimiser of every update; a constant LR, since a schedule changes nothing a bench measures
LR, BETAS, ADAM_EPS, CLIP = 1e-5, (0.9, 0.999), 1e-8, 1.0


@dataclass
class StepCounts:
    trained_tokens: int = 0  # tokens of back-propagated forwards
    forward_only_tokens: int = 0  # teacher scoring, generation prefill + decode
    generated_tokens: int = 0
    skipped_steps: int = 0  # updates the trainer skipped for a non-finite loss or gradient norm
    loss: float = 0.0  # of the last step: a finite value says the step computed something real
    grad_norm: float = 0.0  # of the last step, before clipping
    parts: dict[str, float] = field(default_factory=dict)  # the objective's parts, last step

    def add(self, done: StepCounts) -> None:
        self.trained_tokens += done.trained_tokens
        self.forward_only_tokens += done.forward_only_tokens
        self.generated_tokens += done.generated_tokens
        self.skipped_steps += done.skipped_steps
        self.loss, self.grad_norm, self.parts = done.loss, done.grad_norm, done.parts


@dataclass
class Timers:
    phases: PhaseTimer  # the update's phases, one after another: they add up to its wall time
    detail: PhaseTimer  # the OPTD objective's student-side phases, inside ``forward_backward``


@dataclass
class Bench:
    """The student as the trainer holds it: its decoder body and a ``Trainer`` stepping its optimiser."""

    body: HiddenStates
    trainer: Trainer[Any]
    size: Size
    gen: torch.Generator

    @property
    def student(self) -> Qwen2ForCausalLM:
        return self.body.lm

    @property
    def device(self) -> torch.device:
        return self.trainer.device

    def cast(self) -> AbstractContextManager[Any]:
        """The trainer's autocast: bf16 on CUDA, nothing on CPU."""
        return autocast(self.device, self.trainer.bf16)


def make_bench(student: Qwen2ForCausalLM, size: Size, gen: torch.Generator) -> Bench:
    body = HiddenStates(student)
    optimizer = adam(student, lr=LR, betas=BETAS, eps=ADAM_EPS)
    constant = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _step: 1.0)
    trainer = Trainer(body, optimizer, constant, clip=CLIP, device=student.device, bf16=True)
    return Bench(body=body, trainer=trainer, size=size, gen=gen)


def counts_of(report: StepReport) -> StepCounts:
    return StepCounts(
        trained_tokens=report.tokens,
        skipped_steps=int(report.skipped),
        loss=report.loss,
        grad_norm=report.grad_norm,
        parts=dict(report.parts),
    )


def sft_step(bench: Bench, timers: Timers) -> StepCounts:
    """One SFT update as ``TrainingRun.update`` takes it: one micro-batch of all the states."""
    states = [s.state for s in draw_states(bench.size, bench.gen)]
    batches = [collate(states, pad_id(bench.size)).to(bench.device)]
    objective = SFTObjective(bench.body.head, bench.size.tokenizer_vocab, last=batches[-1])
    return counts_of(bench.trainer.step(batches, objective, len(states), timer=timers.phases))


def optd_objective(bench: Bench, teacher: HiddenStates) -> OPTDObjective:
    """The objective as ``OPTDRun`` builds it: the student's head, the teacher's detached, the paper's
    hyper-parameters, the bench's chunk of positions."""
    teacher_head = tuple(t.detach() if t is not None else None for t in teacher.head())
    return OPTDObjective(
        bench.body.head, teacher_head, bench.size.tokenizer_vocab, ObjectiveSettings(), bench.size.chunk
    )


def optd_step(bench: Bench, teacher: HiddenStates, objective: OPTDObjective, timers: Timers) -> StepCounts:
    """One OPTD update as ``OPTDRun.update`` takes it: sample, ``build_rollouts``, ``Trainer.step``."""
    size = bench.size
    states = draw_states(size, bench.gen)
    with timers.phases.phase("generate"), torch.no_grad(), bench.cast():
        bench.student.eval()
        responses = sample_responses(bench.student, states, size, bench.gen)
    rollouts = build_rollouts(
        states, responses, teacher, pad_id(size), len(states), bench.device, timers.phases, bench.cast
    )
    objective.timer = timers.detail
    report = bench.trainer.step(rollouts, objective, len(states), timer=timers.phases)
    generated = sum(len(r) for r in responses)
    prefill = sum(len(s.state.prompt_ids) for s in states)
    teacher_tokens = sum(r.sampled.n_tokens + r.privileged.n_tokens for r in rollouts)
    counts = counts_of(report)
    counts.forward_only_tokens = teacher_tokens + prefill + generated
    counts.generated_tokens = generated
    return counts


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
    step: Callable[[Timers], StepCounts], steps: int, device: torch.device, n_params: int
) -> dict[str, Any]:
    """One warm-up step, then ``steps`` timed ones; throughput, MFU and phase shares of the timed ones."""
    step(Timers(PhaseTimer(device), PhaseTimer(device)))
    timers, counts = Timers(PhaseTimer(device), PhaseTimer(device)), StepCounts()
    for _ in range(steps):
        counts.add(step(timers))
    seconds = timers.phases.seconds
    wall = sum(seconds.values())
    peak = H200_BF16_DENSE_TFLOPS * 1e12
    trained_per_s = counts.trained_tokens / wall
    report = {
        "steps": steps,
        "step_seconds": wall / steps,
        "tokens_per_s": trained_per_s,
        "mfu": 6 * n_params * trained_per_s / peak,
        "phase_seconds": dict(seconds),
        "phase_shares": {name: s / wall for name, s in seconds.items()},
        **asdict(counts),
        **peak_memory(device),
    }
    if timers.detail.seconds:
        report["forward_backward_detail_seconds"] = dict(timers.detail.seconds)
    if counts.forward_only_tokens:
        flops = 6 * n_params * counts.trained_tokens + 2 * n_params * counts.forward_only_tokens
        report["mfu_all_passes"] = flops / wall / peak
    if counts.generated_tokens:
        report["hf_generate_tokens_per_s"] = counts.generated_tokens / seconds["generate"]
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
    prompts = [{"prompt_token_ids": s.state.prompt_ids} for s in states]
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
    teacher_lm = copy.deepcopy(bench.student).to(
        torch.bfloat16 if bench.device.type == "cuda" else torch.float32
    )
    teacher = HiddenStates(teacher_lm).eval().requires_grad_(False)
    reset_peak_memory(bench.device)
    step = partial(optd_step, bench, teacher, optd_objective(bench, teacher))
    return run_stage(step, steps, bench.device, n_params)


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
    bench = make_bench(student, size, gen)
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
            "autocast_bf16": device.type == "cuda",  # the trainer's autocast, on under either weights
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
        detail = report.get("forward_backward_detail_seconds")
        if detail:
            total = report["phase_seconds"]["forward_backward"]
            inside = ", ".join(f"{name} {s / total:.0%}" for name, s in detail.items())
            rest = 1 - sum(detail.values()) / total
            lines.append(f"  inside forward_backward: {inside}, the rest (the backward) {rest:.0%}")
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
        help="student weights on GPU: bf16, or float32 master weights; the trainer's bf16 autocast on both",
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
