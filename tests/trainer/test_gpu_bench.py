"""bench/gpu_train.py at its toy size on CPU: every reported field present and sane, the updates the
trainer's own, and nothing imported that the GPU machine lacks."""

from __future__ import annotations

import copy
import importlib
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.hidden_modules import hiding
from trainer.data import collate
from trainer.loop import PhaseTimer, Trainer, adam
from trainer.optd import HiddenStates, OPTDObjective, Rollout
from trainer.sft import SFTObjective

ROOT = Path(__file__).resolve().parents[2]
# the trainer's timers: Trainer.step's two, build_rollouts' teacher passes, the update's sampling
PHASES = {
    "sft": {"forward_backward", "optimizer"},
    "optd": {"generate", "teacher_plain", "teacher_intent", "forward_backward", "optimizer"},
}
OPTD_DETAIL = {"student_forward", "grounding_forward", "loss"}  # OPTDObjective's own timer
# the toy Qwen2: hidden 64, 2 layers, 4 heads of 16, 2 kv heads, intermediate 128, vocabulary 512, tied.
# per layer: q 64*64+64 = 4160, k and v 64*32+32 = 2080 each, o 64*64 = 4096, MLP 3*64*128 = 24576,
# two norms 128 -> 37120; two layers 74240 + embedding 512*64 = 32768 + final norm 64 = 107072
TOY_PARAMS = 107_072
TOY_STATES, TOY_STEPS = 2, 1
PROMPT_RANGE, RESPONSE_RANGE, INTENT_TOKENS = (59, 69), (8, 16), 8  # 64 +- 64 // 12

# what the lent GPU machine does not have (GPU.md), made unimportable as if not installed
ABSENT = ("polars", "prefect", "duckdb", "pydantic", "pydantic_settings", "pandas", "great_expectations")
# the trainer modules that must import with torch, transformers and pyarrow alone
TORCH_ONLY = (
    "trainer.loop",
    "trainer.sft",
    "trainer.optd",
    "trainer.data",
    "trainer.objective",
    "trainer.distributed",
    "trainer.generation",
    "trainer.models",
    "trainer.sampling",
)
#: an interpreter without ABSENT, then json and runpy for the body (REPORT_MODULES uses both)
WITHOUT_DATA_STACK = hiding(ABSENT) + "import json, runpy\n"
REPORT_MODULES = """
loaded = sorted(name for name in sys.modules if name.partition(".")[0] in (*ABSENT, "trainer"))
print("modules:", json.dumps(loaded))
"""


def run_without_data_stack(body: str, timeout: int = 600) -> tuple[str, list[str]]:
    """``body`` in a fresh interpreter without ABSENT; its stdout and the trainer/ABSENT modules loaded."""
    code = WITHOUT_DATA_STACK + body + REPORT_MODULES
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stderr
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("modules: ")
    return done.stdout, json.loads(last.removeprefix("modules: "))


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory) -> tuple[dict, list[str]]:
    out = tmp_path_factory.mktemp("gpu_bench")
    argv = ["bench/gpu_train.py", "--toy", "--out", str(out)]
    # as `python bench/gpu_train.py` runs it: the script's folder first on the path
    body = f"sys.argv = {argv!r}\nsys.path.insert(0, 'bench')\nrunpy.run_path(sys.argv[0], run_name='__main__')\n"
    _, modules = run_without_data_stack(body)
    return json.loads((out / "gpu_train.json").read_text()), modules


@pytest.fixture(scope="module")
def result(toy_run) -> dict:
    return toy_run[0]


@pytest.fixture(scope="module")
def gpu_train():
    """The bench as a module; bench/ is on the path only while it imports (its hostinfo is there)."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        return importlib.import_module("gpu_train")
    finally:
        sys.path.remove(str(ROOT / "bench"))


def positive(value: float) -> bool:
    return math.isfinite(value) and value > 0


def test_run_describes_itself(result):
    assert result["device"] == "cpu"
    for field in ("machine", "torch", "transformers", "date", "mfu_formula"):
        assert result[field]
    assert result["command"] == f"python bench/gpu_train.py --toy --out {result['command'].split()[-1]}"
    assert result["model"]["n_params"] == TOY_PARAMS
    assert result["model"]["weights"] == "float32"  # bf16 is for the GPU only
    assert result["model"]["autocast_bf16"] is False  # the trainer's autocast is CUDA-only


@pytest.mark.parametrize("stage", ["sft", "optd"])
def test_stage_reports_sane_throughput_memory_and_phases(result, stage):
    report = result[stage]
    assert report["steps"] == TOY_STEPS
    for field in ("step_seconds", "tokens_per_s", "mfu", "peak_memory_gib", "trained_tokens", "grad_norm"):
        assert positive(report[field]), field
    assert math.isfinite(report["loss"])
    assert report["skipped_steps"] == 0  # the trainer took every update: loss and gradients finite
    assert set(report["phase_seconds"]) == PHASES[stage]
    assert all(positive(seconds) for seconds in report["phase_seconds"].values())
    assert sum(report["phase_shares"].values()) == pytest.approx(1.0)
    # the stated formula, from the reported throughput
    assert report["mfu"] == pytest.approx(6 * TOY_PARAMS * report["tokens_per_s"] / 989e12)
    assert report["tokens_per_s"] == pytest.approx(
        report["trained_tokens"] / sum(report["phase_seconds"].values())
    )


def test_sft_trains_on_prompt_and_gold_tokens(result):
    sft = result["sft"]
    per_state = (PROMPT_RANGE[0] + RESPONSE_RANGE[0], PROMPT_RANGE[1] + RESPONSE_RANGE[1])
    assert (
        TOY_STATES * TOY_STEPS * per_state[0]
        <= sft["trained_tokens"]
        <= TOY_STATES * TOY_STEPS * per_state[1]
    )
    assert sft["forward_only_tokens"] == sft["generated_tokens"] == 0  # no generation, no teacher
    assert "forward_backward_detail_seconds" not in sft  # SFTObjective has no timer of its own
    # a fresh model (weights of std 0.02 on unit-RMS hidden states: logits of std about 0.16) is
    # close to uniform over the 500 tokenizer ids, so NLL ~ ln 500 = 6.215 (+ var/2 ~ 0.013)
    assert sft["loss"] == pytest.approx(math.log(500), abs=0.1)
    assert sft["parts"] == {"nll": sft["loss"]}  # SFTObjective's one part is the loss itself


def test_optd_counts_generation_and_teacher_passes(result):
    optd, runs = result["optd"], TOY_STATES * TOY_STEPS
    assert runs * RESPONSE_RANGE[0] <= optd["generated_tokens"] <= runs * RESPONSE_RANGE[1]
    # trained: student on prompt + sample and on prompt + gold; forward only: teacher on prompt + sample
    # and intent + prompt + sample, then the prefill (prompt) and the sampled tokens themselves
    sampled = optd["generated_tokens"]
    low, high = runs * PROMPT_RANGE[0], runs * PROMPT_RANGE[1]
    assert 2 * low + sampled + runs * RESPONSE_RANGE[0] <= optd["trained_tokens"]
    assert optd["trained_tokens"] <= 2 * high + sampled + runs * RESPONSE_RANGE[1]
    assert 3 * low + runs * INTENT_TOKENS + 3 * sampled <= optd["forward_only_tokens"]
    assert optd["forward_only_tokens"] <= 3 * high + runs * INTENT_TOKENS + 3 * sampled
    assert positive(optd["mfu_all_passes"]) and optd["mfu_all_passes"] > optd["mfu"]
    # the teacher is a copy of the student and both are near uniform, so the JSD is ~0 and the loss is
    # gamma * NLL ~ 0.1 * ln 500 = 0.621
    assert optd["loss"] == pytest.approx(0.1 * math.log(500), abs=0.02)
    assert optd["parts"]["grounding"] == pytest.approx(math.log(500), abs=0.1)
    generate_rate = sampled / optd["phase_seconds"]["generate"]
    assert optd["hf_generate_tokens_per_s"] == pytest.approx(generate_rate)


def test_optd_detail_is_the_objectives_timer_inside_forward_backward(result):
    detail = result["optd"]["forward_backward_detail_seconds"]
    assert set(detail) == OPTD_DETAIL
    assert all(positive(seconds) for seconds in detail.values())
    # nested in forward_backward, which also holds the backward through the decoder
    assert sum(detail.values()) < result["optd"]["phase_seconds"]["forward_backward"]


def test_generation_compares_hf_with_vllm(result):
    generation = result["generation"]
    assert generation["hf_generate_tokens_per_s"] == result["optd"]["hf_generate_tokens_per_s"]
    assert generation["vllm"]["status"] in {"not installed", "not measured: vLLM needs a GPU"}


def test_bench_runs_without_the_data_stack_on_torch_only_trainer_modules(toy_run):
    _, modules = toy_run
    assert not [name for name in modules if name.partition(".")[0] in ABSENT]
    trainer_modules = {name for name in modules if name != "trainer"}
    # what the bench's updates are made of, and nothing beyond the torch-only set
    assert {"trainer.loop", "trainer.sft", "trainer.optd", "trainer.data"} <= trainer_modules
    assert trainer_modules <= set(TORCH_ONLY)


def test_torch_only_trainer_modules_import_without_the_data_stack():
    _, modules = run_without_data_stack("".join(f"import {name}\n" for name in TORCH_ONLY), timeout=300)
    assert set(TORCH_ONLY) <= set(modules)
    assert not [name for name in modules if name.partition(".")[0] in ABSENT]


def test_hidden_modules_are_absent_as_if_not_installed():
    # the check above would pass vacuously if hiding did not work: a hidden module must not import
    body = (
        "import importlib.util\n"
        "assert all(importlib.util.find_spec(name) is None for name in ABSENT)\n"
        "try:\n    import pydantic\nexcept ModuleNotFoundError:\n    print('pydantic absent')\n"
    )
    stdout, _ = run_without_data_stack(body, timeout=120)
    assert "pydantic absent" in stdout


def test_bench_sft_step_is_trainer_step_with_sft_objective(gpu_train):
    # the bench's update and Trainer.step + SFTObjective run directly here, from the same weights on
    # the same states: same loss, same gradients, same weights after the step
    size, device, seed = gpu_train.TOY, torch.device("cpu"), 3
    torch.manual_seed(seed)
    student = gpu_train.build_model(size, device, torch.float32)
    reference, initial = copy.deepcopy(student), copy.deepcopy(student)
    bench = gpu_train.make_bench(student, size, torch.Generator().manual_seed(seed))
    timers = gpu_train.Timers(PhaseTimer(device), PhaseTimer(device))
    counts = gpu_train.sft_step(bench, timers)

    states = [s.state for s in gpu_train.draw_states(size, torch.Generator().manual_seed(seed))]
    body = HiddenStates(reference)
    optimizer = adam(reference, lr=gpu_train.LR, betas=gpu_train.BETAS, eps=gpu_train.ADAM_EPS)
    constant = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _step: 1.0)
    trainer = Trainer(body, optimizer, constant, clip=gpu_train.CLIP, device=device)
    batch = collate(states, gpu_train.pad_id(size))
    report = trainer.step([batch], SFTObjective(body.head, size.tokenizer_vocab, last=batch), len(states))

    assert not report.skipped and counts.skipped_steps == 0
    assert counts.loss == report.loss and counts.trained_tokens == report.tokens
    assert counts.grad_norm == report.grad_norm
    pairs = list(zip(student.named_parameters(), reference.parameters(), strict=True))
    for (name, ours), theirs in pairs:
        assert torch.equal(ours.grad, theirs.grad), name
        assert torch.equal(ours, theirs), name
    # not vacuous: the step moved the weights (Adam's first step moves each by about the LR)
    moved = [not torch.equal(p, q) for p, q in zip(student.parameters(), initial.parameters(), strict=True)]
    assert all(moved)


def test_bench_optd_step_is_one_trainer_step_on_rollouts(gpu_train, monkeypatch):
    size, device = gpu_train.TOY, torch.device("cpu")
    torch.manual_seed(0)
    bench = gpu_train.make_bench(
        gpu_train.build_model(size, device, torch.float32), size, torch.Generator().manual_seed(0)
    )
    teacher = HiddenStates(copy.deepcopy(bench.student)).eval().requires_grad_(False)
    calls = []
    step = Trainer.step

    def recording(self, micro_batches, loss_fn, n_states, timer=None):
        calls.append((self, list(micro_batches), loss_fn, n_states))
        return step(self, micro_batches, loss_fn, n_states, timer)

    monkeypatch.setattr(Trainer, "step", recording)
    timers = gpu_train.Timers(PhaseTimer(device), PhaseTimer(device))
    counts = gpu_train.optd_step(bench, teacher, gpu_train.optd_objective(bench, teacher), timers)

    assert len(calls) == 1
    trainer, micro_batches, objective, n_states = calls[0]
    assert trainer is bench.trainer and n_states == size.states
    assert isinstance(objective, OPTDObjective) and objective.timer is timers.detail
    # one micro-batch of build_rollouts holding every state, the teacher's passes done
    assert len(micro_batches) == 1 and isinstance(micro_batches[0], Rollout)
    rollout = micro_batches[0]
    assert rollout.n_states == size.states and rollout.last
    assert rollout.base_hidden.shape == (len(rollout.sampled.labels), size.hidden)
    assert counts.trained_tokens == rollout.sampled.n_tokens + rollout.gold.n_tokens
    assert counts.generated_tokens == len(rollout.sampled.labels)
