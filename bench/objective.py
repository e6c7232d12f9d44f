"""The OPTD objective from hidden states (trust region + generalized JSD, forward and backward).

    python bench/objective.py                      # V = 32k and 152k, T = 512 and 2048, hidden 896
    python bench/objective.py --quick              # toy sizes, a smoke run in seconds, nothing recorded
    python bench/objective.py --vocab 32000 --tokens 512 --methods optd,plain_jsd --no-record

Methods, all in float32 on the same inputs (response hidden states [T, H] of the student and of
the teacher with and without the intent, one LM head [V, H]), each timed over forward + backward
to the student's hidden states and head:

- ``optd``: ``trainer.objective.optd_loss_from_hidden`` (distillation term only), chunks of
  ``--chunk`` positions;
- ``plain_jsd`` (a): a plain full-vocabulary generalized JSD, TRL style: full [T, V] logits of
  the student and of one teacher, log-softmaxes, a log-space mixture, autograd;
- ``naive_trust_region`` (b): the unchunked trust region as the reference implementation does it:
  full logits of the student and both teachers, the endpoint and 8 bisection steps with a
  full-vocabulary log-softmax each on every token, then the JSD above;
- ``liger_jsd`` (c): Liger-Kernel's pure-torch chunked fused-linear JSD
  (``liger_kernel.chunked_loss.LigerFusedLinearJSDLoss``, ``compiled=False``, the same chunk),
  one teacher, no trust region; skipped where ``liger_kernel`` does not import.

Teacher states: the privileged teacher's hidden state is the plain one plus noise of a size drawn
per token, so that part of the tokens bind the trust region (the share is reported).

Every case runs in a fresh process with glibc's mmap threshold fixed at 128 KiB, so freed tensors
leave the resident set at once. Peak extra memory = the highest resident set seen by a 2 ms sampler
during the first forward + backward, minus the resident set just before it (inputs built). It
counts everything the call allocates, the head-weight gradient (V x H x 4 bytes) included, which
every method produces. Time = the median of ``--repeat`` further calls.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hostinfo import describe as machine  # noqa: E402 - bench/ is the script's folder

METHODS = ("optd", "plain_jsd", "naive_trust_region", "liger_jsd")
BASELINE = "plain_jsd"
MIB = 2**20
FULL = {"vocab": (32_000, 152_064), "tokens": (512, 2048), "hidden": 896, "chunk": 256, "states": 4}
QUICK = {"vocab": (2_000,), "tokens": (64, 256), "hidden": 64, "chunk": 32, "states": 4}
LOGIT_SCALE = 3.0  # standard deviation of the logits
INTENT_NOISE = 0.2  # the privileged teacher's hidden-state noise is uniform in [0, this] per token


# ---------------------------------------------------------------------------------------------
# one case, in its own process
# ---------------------------------------------------------------------------------------------


def make_inputs(vocab: int, tokens: int, hidden: int, seed: int = 0) -> dict:
    import torch

    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(vocab, hidden, generator=gen).mul_(LOGIT_SCALE / math.sqrt(hidden))
    base = torch.randn(tokens, hidden, generator=gen)
    intent = torch.randn(tokens, hidden, generator=gen).mul_(
        torch.rand(tokens, 1, generator=gen) * INTENT_NOISE
    )
    student = torch.randn(tokens, hidden, generator=gen).mul_(0.3).add_(base)
    return {
        "weight": weight.requires_grad_(),
        "student": student.requires_grad_(),
        "base": base,
        "intent": intent.add_(base),
    }


def run_optd(inputs: dict, chunk: int, states: int) -> dict:
    import torch

    from trainer.objective import optd_loss_from_hidden

    tokens = inputs["student"].shape[0]
    state_index = torch.arange(tokens) * states // tokens  # equal-length responses
    empty = inputs["student"][:0]
    loss = optd_loss_from_hidden(
        inputs["student"],
        inputs["base"],
        inputs["intent"],
        state_index,
        empty,
        torch.zeros(0, dtype=torch.long),
        torch.zeros(0, dtype=torch.long),
        inputs["weight"],
        chunk_size=chunk,
    )
    loss.total.backward()
    return {"binding_share": float(loss.binding_share)}


def _plain_jsd(target_logprobs, student_logits, beta: float = 0.5):
    import torch
    import torch.nn.functional as F

    student_logprobs = F.log_softmax(student_logits, -1)
    log_mix = torch.logsumexp(
        torch.stack([student_logprobs + math.log(1 - beta), target_logprobs + math.log(beta)]), 0
    )
    kl_target = F.kl_div(log_mix, target_logprobs, reduction="none", log_target=True).sum(-1)
    kl_student = F.kl_div(log_mix, student_logprobs, reduction="none", log_target=True).sum(-1)
    return (beta * kl_target + (1 - beta) * kl_student).mean()


def run_plain_jsd(inputs: dict, chunk: int, states: int) -> dict:
    import torch

    student_logits = inputs["student"] @ inputs["weight"].T
    with torch.no_grad():
        target = torch.log_softmax(inputs["base"] @ inputs["weight"].T, -1)
    _plain_jsd(target, student_logits).backward()
    return {}


def run_naive_trust_region(inputs: dict, chunk: int, states: int, epsilon=0.02, steps=8) -> dict:
    import torch

    student_logits = inputs["student"] @ inputs["weight"].T
    with torch.no_grad():
        log_q0 = torch.log_softmax(inputs["base"] @ inputs["weight"].T, -1)
        log_qi = torch.log_softmax(inputs["intent"] @ inputs["weight"].T, -1)

        def mixture(lam):
            return torch.log_softmax((1 - lam).unsqueeze(-1) * log_q0 + lam.unsqueeze(-1) * log_qi, -1)

        def kl(lam):
            log_q = mixture(lam)
            return (log_q.exp() * (log_q - log_q0)).sum(-1)

        ones = torch.ones(log_q0.shape[0])
        endpoint_feasible = kl(ones) <= epsilon
        low, high = torch.zeros_like(ones), ones.clone()
        for _ in range(steps):
            mid = (low + high) / 2
            feasible = kl(mid) <= epsilon
            low, high = torch.where(feasible, mid, low), torch.where(feasible, high, mid)
        lam = torch.where(endpoint_feasible, ones, low)
        target = mixture(lam)
    _plain_jsd(target, student_logits).backward()
    return {"binding_share": float((lam < 1).float().mean())}


def run_liger_jsd(inputs: dict, chunk: int, states: int) -> dict:
    import torch
    from liger_kernel.chunked_loss import LigerFusedLinearJSDLoss

    loss_fn = LigerFusedLinearJSDLoss(
        weight_hard_loss=0.0, weight_soft_loss=1.0, beta=0.5, compiled=False, chunk_size=chunk
    )
    labels = torch.zeros(inputs["student"].shape[0], dtype=torch.long)
    loss_fn(inputs["student"], inputs["weight"], inputs["base"], inputs["weight"].detach(), labels).backward()
    return {}


RUNNERS = {
    "optd": run_optd,
    "plain_jsd": run_plain_jsd,
    "naive_trust_region": run_naive_trust_region,
    "liger_jsd": run_liger_jsd,
}


class PeakRSS:
    """Highest resident set seen while the block runs, sampled every 2 ms."""

    def __init__(self) -> None:
        import psutil

        self.process = psutil.Process()
        self.peak = 0
        self._stop = threading.Event()

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(0.002)

    def __enter__(self) -> PeakRSS:
        self.before = self.process.memory_info().rss
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.process.memory_info().rss)


def run_case(method: str, vocab: int, tokens: int, hidden: int, chunk: int, states: int, repeat: int) -> dict:
    """``repeat`` = 0: the peak extra memory of one call; otherwise the median time of that many calls."""
    import torch

    torch.set_num_threads(2)
    runner = RUNNERS[method]
    runner(make_inputs(64, 8, 8), 4, 2)  # imports, kernels and thread pools set up outside the measurement
    inputs = make_inputs(vocab, tokens, hidden)

    def once() -> tuple[float, dict]:
        inputs["weight"].grad, inputs["student"].grad = None, None
        start = time.perf_counter()
        info = runner(inputs, chunk, states)
        return time.perf_counter() - start, info

    if repeat == 0:
        with PeakRSS() as memory:
            _, info = once()
        return {"extra_mib": (memory.peak - memory.before) / MIB, **info}
    once()
    return {"time_s": statistics.median(once()[0] for _ in range(repeat))}


# ---------------------------------------------------------------------------------------------
# the driver
# ---------------------------------------------------------------------------------------------


def liger_available() -> bool:
    probe = [sys.executable, "-c", "import liger_kernel.chunked_loss"]
    return subprocess.run(probe, capture_output=True, cwd=ROOT).returncode == 0


def spawn(method: str, vocab: int, tokens: int, sizes: dict, repeat: int) -> dict:
    """Memory in one fresh process (freed tensors unmapped at once), time in another (allocator as usual)."""
    result = {}
    for calls, extra_env in ((0, {"MALLOC_MMAP_THRESHOLD_": "131072"}), (repeat, {})):
        args = [method, vocab, tokens, sizes["hidden"], sizes["chunk"], sizes["states"], calls]
        command = [sys.executable, __file__, "--case", ",".join(map(str, args))]
        env = {**os.environ, "OMP_NUM_THREADS": "2", **extra_env}
        done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env)
        if done.returncode != 0:
            return {"error": (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]}
        result.update(json.loads(done.stdout.strip().splitlines()[-1]))
    return result


def too_big(results: dict, method: str, vocab: int, tokens: int) -> str | None:
    """A full-logit method at a larger T, from its smaller-T peak: refuse if it would not fit."""
    import psutil

    smaller = [(t, r) for (m, v, t), r in results.items() if m == method and v == vocab and "extra_mib" in r]
    if not smaller:
        return None
    t, r = max(smaller)
    estimate = r["extra_mib"] * tokens / t
    available = psutil.virtual_memory().available / MIB
    if estimate > 0.7 * available:
        return f"skipped: about {estimate / 1024:.1f} GiB needed, {available / 1024:.1f} GiB free"
    return None


def bench(methods: list[str], sizes: dict, repeat: int) -> dict:
    results = {}
    for vocab in sizes["vocab"]:
        for tokens in sizes["tokens"]:
            for method in methods:
                skip = too_big(results, method, vocab, tokens) if method != "optd" else None
                result = {"error": skip} if skip else spawn(method, vocab, tokens, sizes, repeat)
                results[(method, vocab, tokens)] = result
                print(f"V={vocab} T={tokens} {method}: {result}", file=sys.stderr, flush=True)
    return results


def cell(result: dict, key: str, fmt: str) -> str:
    return format(result[key], fmt) if key in result else "-"


def report(results: dict, methods: list[str], sizes: dict) -> str:
    lines = [
        "| V | T | method | time s | vs (a) | extra MiB | / (chunk V 4 B) | vs shortest T | binding |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    small, large = min(sizes["tokens"]), max(sizes["tokens"])
    for (method, vocab, tokens), result in results.items():
        if "error" in result:
            lines.append(f"| {vocab} | {tokens} | {method} | {result['error']} | | | | | |")
            continue
        baseline = results.get((BASELINE, vocab, tokens), {})
        speed = f"{result['time_s'] / baseline['time_s']:.2f}x" if "time_s" in baseline else "-"
        unit = sizes["chunk"] * vocab * 4 / MIB
        growth = "-"
        if tokens == large and "extra_mib" in results.get((method, vocab, small), {}):
            growth = f"{result['extra_mib'] / results[(method, vocab, small)]['extra_mib']:.2f}x"
        extra = result["extra_mib"]
        lines.append(
            f"| {vocab} | {tokens} | {method} | {result['time_s']:.2f} | {speed} | {extra:.0f} | "
            f"{extra / unit:.1f} | {growth} | {cell(result, 'binding_share', '.2f')} |"
        )
    return "\n".join(lines)


def record(table: str, command: str, sizes: dict, note: str) -> None:
    results = ROOT / "bench" / "RESULTS.md"
    today = datetime.now(UTC).strftime("%Y-%m-%d")
    header = [
        f"Command: `{command}`",
        f"Machine: {machine()}, torch threads 2",
        f"Hidden {sizes['hidden']}, float32, chunk {sizes['chunk']} positions, {sizes['states']} states; "
        "time = median of the timed calls, forward + backward",
        *([note] if note else []),
    ]
    section = (
        f"\n\n## objective — OPTD loss from hidden states ({today})\n\n"
        + "  \n".join(header)
        + f"\n\n{table}\n"
    )
    results.write_text(results.read_text().rstrip("\n") + section)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="toy sizes; never recorded")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--vocab", type=int, nargs="*", help="override the vocabulary sizes")
    parser.add_argument("--tokens", type=int, nargs="*", help="override the response lengths T")
    parser.add_argument("--chunk", type=int, help="positions per chunk (optd and liger)")
    parser.add_argument("--repeat", type=int, default=3, help="timed calls after a warm-up call")
    parser.add_argument("--no-record", action="store_true", help="do not append to bench/RESULTS.md")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        method, *numbers = args.case.split(",")
        print(json.dumps(run_case(method, *map(int, numbers))))
        return
    sizes = dict(QUICK if args.quick else FULL)
    sizes.update({k: tuple(v) for k, v in (("vocab", args.vocab), ("tokens", args.tokens)) if v})
    sizes["chunk"] = args.chunk or sizes["chunk"]
    methods = [m for m in args.methods.split(",") if m]
    note = ""
    if "liger_jsd" in methods and not liger_available():
        methods.remove("liger_jsd")
        note = "liger-kernel does not import here: (c) not measured."
    results = bench(methods, sizes, args.repeat)
    table = report(results, methods, sizes)
    print(table)
    if not (args.quick or args.no_record):
        record(table, "python bench/objective.py " + " ".join(sys.argv[1:]), sizes, note)


if __name__ == "__main__":
    main()
