"""The two generation paths agree: the same stop ids, the same masked padded rows, samples from the
current weights, and a resumed run that samples what an uninterrupted one would.

vLLM cannot run here (GPU only, not installable): the vLLM path runs against ``fake_vllm``, a stand-in
``vllm`` that records what it is sent. These tests check what ``VLLMGenerator`` sends (parameters,
prompts, seeds, weights, the sleep/wake order); whether vLLM samples correctly from it is a GPU run's.

The file is also the FSDP2 ranks' script: ``torchrun ... test_generation.py OUT`` syncs a sharded
tiny model into the stand-in engine on each rank and saves what was loaded.
"""

from __future__ import annotations

import hashlib
import os
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from transformers import PreTrainedModel
from typer.testing import CliRunner

from tests.trainer import fake_vllm as fake
from tests.trainer.test_optd import (
    TINY,
    lake_rows,
    metrics,
    optd_settings,
    parameters,
    write_lake,
)
from tests.trainer.torchrun import two_ranks
from trainer.generation import (
    VLLM_MISSING,
    HFGenerator,
    SamplingSettings,
    VLLMGenerator,
    VLLMUnavailable,
    require_generator,
)
from trainer.loop import rng_state, seeded, set_rng_state
from trainer.models import build_tiny_model, save_model, train_tokenizer
from trainer.optd_run import run_optd

SAMPLING = SamplingSettings(temperature=0.8, top_p=0.9, max_new_tokens=12)
CPU = torch.device("cpu")


def texts() -> list[str]:
    return [t for r in lake_rows() for t in (r["system"], r["prompt"], r["response"])]


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(texts(), 512)


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> Path:
    return write_lake(tmp_path_factory.mktemp("lake"))


def tiny(tokenizer, seed: int = 0) -> PreTrainedModel:
    """The tiny Llama with a padded vocabulary: 435 tokens, rows rounded up to 448 (a multiple of 64)."""
    torch.manual_seed(seed)
    model = build_tiny_model(tokenizer, TINY.spec())
    assert (len(tokenizer), model.config.vocab_size) == (435, 448) and model.config.tie_word_embeddings
    return model


@pytest.fixture
def folder(tokenizer, tmp_path) -> Path:
    """A checkpoint folder the engine is built from (the stand-in reads its config's vocabulary)."""
    return save_model(tiny(tokenizer), tokenizer, tmp_path / "ckpt")


@pytest.fixture
def engine_module(monkeypatch):
    """``fake_vllm`` installed as ``vllm`` and ``vllm.inputs``; the engines it builds, in order."""
    fake.ENGINES.clear()
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setitem(sys.modules, "vllm.inputs", fake)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "unset")
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING")  # restored (absent) after the test
    return fake


def prompts_of(tokenizer, n: int = 3) -> list[list[int]]:
    return [
        tokenizer(f"In view: Trail Boot. Step {i}.", add_special_tokens=False)["input_ids"] for i in range(n)
    ]


def expected_seed(draw: int, rank: int, index: int) -> int:
    # the documented formula: the first 8 bytes of blake2b("draw:rank:index"), shifted to 63 bits
    digest = hashlib.blake2b(f"{draw}:{rank}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def stream_draws(seed: int, n: int) -> list[int]:
    """The first ``n`` 63-bit draws of a torch stream seeded with ``seed`` (one per generate call)."""
    generator = torch.Generator().manual_seed(seed)
    return [int(torch.randint(2**63 - 1, (1,), generator=generator).item()) for _ in range(n)]


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# --- without vLLM ----------------------------------------------------------------------------------


def test_asking_for_vllm_without_it_is_one_line_before_any_model_is_loaded(monkeypatch, tokenizer, tmp_path):
    monkeypatch.setitem(sys.modules, "vllm", None)  # not importable, even on a machine that has it
    with pytest.raises(VLLMUnavailable) as raised:
        require_generator("vllm")
    message = str(raised.value)
    assert message == (
        'generator "vllm" needs vLLM, which is not installed (a GPU machine: pip install "trajforge[vllm]")'
    )
    require_generator("hf")  # the default needs nothing more
    with pytest.raises(VLLMUnavailable) as again:
        VLLMGenerator(tmp_path, tiny(tokenizer), tokenizer, SAMPLING)
    assert str(again.value) == message
    # neither the lake nor the SFT checkpoint exists: reading either would raise FileNotFoundError first
    with pytest.raises(VLLMUnavailable):
        run_optd(
            optd_settings(generator="vllm"),
            tmp_path / "no-lake",
            tmp_path / "out",
            tmp_path / "no-sft",
        )
    assert not (tmp_path / "out").exists()


def train_optd_with_vllm(monkeypatch, tmp_path) -> Any:
    """``trajforge train --stage optd`` with ``[optd] generator = "vllm"`` where vLLM cannot be imported."""
    from cli.app import app

    monkeypatch.setitem(sys.modules, "vllm", None)
    config = tmp_path / "optd.toml"
    config.write_text('[optd]\ngenerator = "vllm"\n')
    args = ["train", "--lake", str(tmp_path / "lake"), "--stage", "optd", "--out", str(tmp_path / "out")]
    return CliRunner().invoke(app, [*args, "--base", str(tmp_path / "sft"), "--config", str(config)])


def test_the_cli_prints_the_missing_vllm_as_one_stopped_line(prefect_harness, monkeypatch, tmp_path):
    result = train_optd_with_vllm(monkeypatch, tmp_path)
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)  # typer's exit: no traceback
    (line,) = result.output.splitlines()
    assert line.startswith('stopped: generator "vllm" needs vLLM, which is not installed (a GPU machine: pip')


def test_the_cli_keeps_the_install_hint_whole(prefect_harness, monkeypatch, tmp_path):
    assert train_optd_with_vllm(monkeypatch, tmp_path).output == f"stopped: {VLLM_MISSING}\n"


# --- the same stop ids and the same masked rows ------------------------------------------------------


def test_both_paths_stop_on_the_same_ids_and_mask_the_same_padded_rows(engine_module, tokenizer, folder):
    model = tiny(tokenizer)
    im_start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, im_start]  # a chat model's second stop
    stops = sorted({tokenizer.eos_token_id, im_start})  # the tokenizer's eos (3) and the config's (2)
    padded = list(range(435, 448))  # rows past the tokenizer's 435 tokens, up to the model's 448

    hf = HFGenerator(model, tokenizer, SAMPLING).config()
    assert hf.eos_token_id == stops and hf.suppress_tokens == padded

    generator = VLLMGenerator(folder, model, tokenizer, SAMPLING)
    prompts = prompts_of(tokenizer)
    generated = generator.generate(prompts)
    (engine,) = engine_module.ENGINES
    (call,) = engine.calls
    assert call.prompts == prompts
    for params in call.params:
        assert params.fields["stop_token_ids"] == stops
        # every id below the model's 448 rows but the padded ones: exactly the tokenizer's 435 ids
        assert params.fields["allowed_token_ids"] == list(range(435))
        # HF's config above: temperature and top-p as set, no top-k, no penalty, up to max_new_tokens
        assert {k: params.fields[k] for k in ("temperature", "top_p", "max_tokens")} == {
            "temperature": 0.8,
            "top_p": 0.9,
            "max_tokens": 12,
        }
        assert (params.fields["top_k"], params.fields["min_p"], params.fields["repetition_penalty"]) == (
            0,
            0.0,
            1.0,
        )
        assert params.fields["detokenize"] is False and params.fields["n"] == 1
    # what the engine returned (its stub ends at a stop id, kept) is what the caller gets
    assert generated.response_ids == [fake.stub_tokens(p, 448) for p in call.params]
    assert engine.arguments == {
        "model": str(folder),
        "dtype": "bfloat16",
        "enable_sleep_mode": True,
        "gpu_memory_utilization": 0.3,
        "seed": 0,
        "skip_tokenizer_init": True,
    }  # alone: no torchrun executor
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"  # in-process: weights pass as tensors
    # asleep once built; awake only to sample; asleep again after
    assert engine.events == [("sleep", 1), ("wake_up", None), ("generate", 3), ("sleep", 1)]


def test_hf_generation_never_emits_a_padded_row_even_when_the_head_prefers_one(tokenizer):
    model = tiny(tokenizer)
    # padded rows 435 and 436 get +-1000 u: whatever the hidden state h, one of them scores 1000 |h.u|,
    # far above every real row's h.w (the tied rows are only ever an output: no prompt holds those ids)
    with torch.no_grad():
        head = model.get_output_embeddings().weight
        u = torch.randn(head.shape[1], generator=torch.Generator().manual_seed(0))
        head[435], head[436] = 1000 * u, -1000 * u
    generator = HFGenerator(model, tokenizer, SamplingSettings(max_new_tokens=8))
    ids = torch.tensor([prompts_of(tokenizer, 1)[0]])
    greedy = model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=1, do_sample=False, suppress_tokens=None
    )
    assert greedy[0, -1].item() in (435, 436)  # control: unsuppressed, a padded row wins
    # from here the model's own config suppresses nothing (generate fills a passed config's unset
    # fields from it): what is suppressed below, the generator's config asks for itself
    model.generation_config.suppress_tokens = None
    # control: sampling as the generator samples, without the suppression, draws one too (the first
    # token; after it the padded row's embedding is an input, and nothing is promised)
    unsuppressed = generator.config()
    unsuppressed.suppress_tokens, unsuppressed.max_new_tokens = None, 1
    torch.manual_seed(0)
    sampled = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=unsuppressed)
    assert sampled[0, -1].item() in (435, 436)
    torch.manual_seed(0)
    responses = generator.generate(prompts_of(tokenizer, 4)).response_ids
    assert all(0 <= token < 435 for response in responses for token in response)


# --- weights ---------------------------------------------------------------------------------------


def test_sync_loads_whole_tensors_equal_to_the_weights_then_sampling_wakes_the_kv_cache(
    engine_module, tokenizer, folder
):
    model = tiny(tokenizer)
    generator = VLLMGenerator(folder, model, tokenizer, SAMPLING, sync_chunk_bytes=40_000)
    with torch.no_grad():  # an "update": the engine must get these weights, not the folder's
        for p in model.parameters():
            p.add_(0.5)
    generator.sync(model, 1)
    (engine,) = engine_module.ENGINES
    loaded = [pair for chunk in engine.loaded for pair in chunk]
    state = model.state_dict()
    # the tied head is the embedding's alias: sent once, under the embedding's name (vLLM's Llama
    # loader skips lm_head.* when the embeddings are tied)
    assert [name for name, _ in loaded] == [name for name in state if name != "lm_head.weight"]
    for name, tensor in loaded:
        assert type(tensor) is torch.Tensor and not tensor.requires_grad
        assert torch.equal(tensor, state[name]), name
    # 40 kB chunks: the embedding (448 x 32 float32 = 57 kB) goes alone, the rest in several groups
    sizes = [sum(t.numel() * t.element_size() for _, t in chunk) for chunk in engine.loaded]
    assert len(engine.loaded) > 2 and all(
        s <= 40_000 or len(c) == 1 for s, c in zip(sizes, engine.loaded, strict=True)
    )
    assert generator.generate(prompts_of(tokenizer, 2)).policy_version == 1
    rpcs = [("rpc", len(chunk)) for chunk in engine.loaded]
    # weights alone for the load, the KV cache only when sampling
    assert engine.events == [
        ("sleep", 1),
        ("wake_up", ["weights"]),
        *rpcs,
        ("wake_up", ["kv_cache"]),
        ("generate", 2),
        ("sleep", 1),
    ]


def test_sync_gathers_fsdp2_shards_into_whole_tensors_on_every_rank(tmp_path):
    two_ranks(__file__, str(tmp_path), timeout=600)
    for rank in (0, 1):
        report = torch.load(tmp_path / f"rank{rank}.pt")
        assert report["sharded"]  # the model's parameters were DTensor shards when sync ran
        assert report["backend"] == "external_launcher"  # one engine per torchrun rank
        whole = report["whole"]  # the weights before sharding
        loaded = report["loaded"]
        assert list(loaded) == [name for name in whole if name != "lm_head.weight"]
        for name, tensor in loaded.items():
            assert type(tensor) is torch.Tensor and tensor.shape == whole[name].shape, name
            assert torch.equal(tensor, whole[name]), name


def fsdp_worker(out: Path) -> None:
    """One rank: shard a tiny model with FSDP2, sync it into the stand-in engine, save what was loaded."""
    from torch.distributed.tensor import DTensor

    from trainer.distributed import init_world, shard_fully
    from trainer.optd import HiddenStates

    torch.set_num_threads(1)
    sys.modules["vllm"] = sys.modules["vllm.inputs"] = fake
    tokenizer = train_tokenizer(texts(), 512)
    model = tiny(tokenizer)
    # before the process group: save_pretrained under one writes on the main process only
    folder = save_model(model, tokenizer, out / f"ckpt{os.environ['RANK']}")
    world = init_world()
    whole = {name: t.detach().clone() for name, t in model.state_dict().items()}
    shard_fully(HiddenStates(model))
    sharded = all(isinstance(p, DTensor) for p in model.parameters())
    generator = VLLMGenerator(folder, model, tokenizer, SAMPLING, rank=world.rank)
    generator.sync(model, 1)
    (engine,) = fake.ENGINES
    loaded = {name: tensor for chunk in engine.loaded for name, tensor in chunk}
    backend = engine.arguments.get("distributed_executor_backend")
    torch.save(
        {"sharded": sharded, "backend": backend, "whole": whole, "loaded": loaded},
        out / f"rank{world.rank}.pt",
    )


# --- randomness ------------------------------------------------------------------------------------


def test_each_request_is_seeded_from_the_trainer_stream_the_rank_and_its_index(
    engine_module, tokenizer, folder
):
    model = tiny(tokenizer)
    alone = VLLMGenerator(folder, model, tokenizer, SAMPLING)
    other_rank = VLLMGenerator(folder, model, tokenizer, SAMPLING, rank=1)
    prompts = prompts_of(tokenizer)
    first, second = stream_draws(7, 2)
    torch.manual_seed(7)
    alone.generate(prompts)
    assert alone.llm.calls[0].seeds == [expected_seed(first, 0, i) for i in range(3)]
    assert len(set(alone.llm.calls[0].seeds)) == 3
    # the next policy version's call takes the stream's next draw (the engine's own use of torch's
    # generator while sampling is not the trainer's): other seeds
    alone.sync(model, 1)
    alone.generate(prompts)
    assert alone.llm.calls[1].seeds == [expected_seed(second, 0, i) for i in range(3)]
    assert not set(alone.llm.calls[0].seeds) & set(alone.llm.calls[1].seeds)
    # the same stream on another rank: that rank's own seeds
    torch.manual_seed(7)
    other_rank.generate(prompts)
    assert other_rank.llm.calls[0].seeds == [expected_seed(first, 1, i) for i in range(3)]
    assert not set(alone.llm.calls[0].seeds) & set(other_rank.llm.calls[0].seeds)


def test_building_and_running_the_engine_leaves_the_trainer_generators_as_they_were(
    engine_module, tokenizer, folder
):
    def draws() -> tuple:
        return random.random(), float(np.random.rand()), torch.rand(2).tolist()

    seed_all(5)
    expected = draws()
    model = tiny(tokenizer)
    seed_all(5)
    # the stand-in engine reseeds python, numpy and torch to its seed (3) on start, as vLLM's worker does,
    # and draws from torch's generator while sampling
    generator = VLLMGenerator(folder, model, tokenizer, SAMPLING, seed=3)
    generator.sync(model, 1)
    assert draws() == expected


def test_a_generator_rebuilt_at_version_k_draws_what_the_uninterrupted_one_does(
    engine_module, tokenizer, folder
):
    model = tiny(tokenizer)
    prompts = prompts_of(tokenizer)
    # uninterrupted: update k samples from version k-1, then syncs version k; a checkpoint after
    # update 1 keeps the RNG state (trainer.checkpoint)
    torch.manual_seed(11)
    whole = VLLMGenerator(folder, model, tokenizer, SAMPLING)
    for k in (1, 2, 3):
        whole.generate(prompts)
        whole.sync(model, k)
        if k == 1:
            saved = rng_state()
    # resumed in a fresh process: other RNG state, a new engine, then restore and the sync at version 1
    torch.manual_seed(12345)
    resumed = VLLMGenerator(folder, model, tokenizer, SAMPLING)
    set_rng_state(saved)
    resumed.sync(model, 1)
    versions = []
    for k in (2, 3):
        versions.append(resumed.generate(prompts).policy_version)
        resumed.sync(model, k)
    assert versions == [1, 2]
    assert [c.seeds for c in resumed.llm.calls] == [c.seeds for c in whole.llm.calls[1:]]


def test_evaluations_draw_the_same_seeds_every_time_and_leave_the_training_stream(
    engine_module, tokenizer, folder
):
    model = tiny(tokenizer)
    train, held_out = prompts_of(tokenizer, 3), prompts_of(tokenizer, 2)
    torch.manual_seed(11)
    plain = VLLMGenerator(folder, model, tokenizer, SAMPLING)
    for k in (1, 2):
        plain.generate(train)
        plain.sync(model, k)
    torch.manual_seed(11)
    evaluated = VLLMGenerator(folder, model, tokenizer, SAMPLING)
    for k in (1, 2):
        with seeded(0, CPU):  # OPTDRun's evaluations' fixed stream
            evaluated.generate(held_out)
        evaluated.generate(train)
        evaluated.sync(model, k)
    evaluations, trainings = evaluated.llm.calls[0::2], evaluated.llm.calls[1::2]
    assert evaluations[0].seeds == evaluations[1].seeds  # versions 0 and 1 alike: a fixed seed
    assert [c.seeds for c in trainings] == [c.seeds for c in plain.llm.calls]  # undisturbed


# --- a whole OPTD run on the vLLM path -------------------------------------------------------------


def test_a_resumed_vllm_run_sends_what_an_uninterrupted_one_sends(engine_module, lake, tokenizer, tmp_path):
    base = save_model(tiny(tokenizer), tokenizer, tmp_path / "sft")  # the SFT checkpoint: teacher and start
    # a model saved by hand records no lineage: distilling from it takes the explicit option
    optd = optd_settings(steps=3, lr=3e-3, checkpoint_every=1, eval_every=2, generator="vllm",
                         allow_foreign_base=True)  # fmt: skip
    run_optd(optd, lake, tmp_path / "whole", base, progress=False)
    first = run_optd(optd, lake, tmp_path / "parts", base, stop_after=1, progress=False)
    step1 = parameters(first.checkpoint)  # read now: the resumed run keeps only its newest checkpoints
    run_optd(optd, lake, tmp_path / "parts", base, resume=True, progress=False)
    whole, _, rest = engine_module.ENGINES  # the middle one ran update 1 alone
    # uninterrupted: held-out eval (version 0), updates 1-3 (versions 0-2), evals after updates 2 and 3;
    # the resumed run begins at update 2: the same calls from there on, prompts and seeds alike
    assert len(whole.calls) == 6 and len(rest.calls) == 4
    for sent, again in zip(whole.calls[2:], rest.calls, strict=True):
        assert sent.prompts == again.prompts and sent.seeds == again.seeds
    evaluations = [whole.calls[i] for i in (0, 3, 5)]
    assert all(c.seeds == evaluations[0].seeds for c in evaluations)  # every evaluation: the fixed seed
    # one load per sync (the tiny model fits one chunk): after updates 1-3; restore's, then updates 2-3.
    # The first of each is the weights after update 1, the checkpoint's
    assert len(whole.loaded) == len(rest.loaded) == 3
    for engine in (whole, rest):
        synced = dict(engine.loaded[0])
        assert synced.keys() == step1.keys() and all(torch.equal(synced[k], step1[k]) for k in step1)

    def rows(run: str) -> list[tuple]:
        return [
            (r["kind"], r["step"], r.get("loss", r.get("probe_objective"))) for r in metrics(tmp_path / run)
        ]

    assert rows("parts") == rows("whole")  # the same samples, updates and evaluations, row for row


if __name__ == "__main__":
    from trainer.distributed import shutdown

    fsdp_worker(Path(sys.argv[1]))
    shutdown()
