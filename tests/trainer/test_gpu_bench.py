"""bench/gpu_train.py at its toy size on CPU: every reported field present and sane."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PHASES = {
    "sft": {"student_forward", "grounding_loss", "student_backward", "optimizer"},
    "optd": {
        "generate",
        "teacher_plain",
        "teacher_privileged",
        "student_forward",
        "grounding_forward",
        "optd_loss",
        "student_backward",
        "grounding_backward",
        "optimizer",
    },
}
# the toy Qwen2: hidden 64, 2 layers, 4 heads of 16, 2 kv heads, intermediate 128, vocabulary 512, tied.
# per layer: q 64*64+64 = 4160, k and v 64*32+32 = 2080 each, o 64*64 = 4096, MLP 3*64*128 = 24576,
# two norms 128 -> 37120; two layers 74240 + embedding 512*64 = 32768 + final norm 64 = 107072
TOY_PARAMS = 107_072
TOY_STATES, TOY_STEPS = 2, 1
PROMPT_RANGE, RESPONSE_RANGE, INTENT_TOKENS = (59, 69), (8, 16), 8  # 64 +- 64 // 12


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("gpu_bench")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    subprocess.run(
        [sys.executable, "bench/gpu_train.py", "--toy", "--out", str(out)],
        cwd=ROOT,
        env=env,
        check=True,
        timeout=600,
        capture_output=True,
    )
    return json.loads((out / "gpu_train.json").read_text())


def positive(value: float) -> bool:
    return math.isfinite(value) and value > 0


def test_run_describes_itself(result):
    assert result["device"] == "cpu"
    for field in ("machine", "torch", "transformers", "date", "mfu_formula"):
        assert result[field]
    assert result["command"] == f"python bench/gpu_train.py --toy --out {result['command'].split()[-1]}"
    assert result["model"]["n_params"] == TOY_PARAMS
    assert result["model"]["weights"] == "float32"  # bf16 is for the GPU only


@pytest.mark.parametrize("stage", ["sft", "optd"])
def test_stage_reports_sane_throughput_memory_and_phases(result, stage):
    report = result[stage]
    assert report["steps"] == TOY_STEPS
    for field in ("step_seconds", "tokens_per_s", "mfu", "peak_memory_gib", "trained_tokens", "loss"):
        assert positive(report[field]), field
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
    # a fresh model (weights of std 0.02 on unit-RMS hidden states: logits of std about 0.16) is
    # close to uniform over the 500 tokenizer ids, so NLL ~ ln 500 = 6.215 (+ var/2 ~ 0.013)
    assert sft["loss"] == pytest.approx(math.log(500), abs=0.1)


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
    generate_rate = sampled / optd["phase_seconds"]["generate"]
    assert optd["hf_generate_tokens_per_s"] == pytest.approx(generate_rate)


def test_generation_compares_hf_with_vllm(result):
    generation = result["generation"]
    assert generation["hf_generate_tokens_per_s"] == result["optd"]["hf_generate_tokens_per_s"]
    assert generation["vllm"]["status"] in {"not installed", "not measured: vLLM needs a GPU"}
