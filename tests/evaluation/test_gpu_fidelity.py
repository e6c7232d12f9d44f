"""bench/gpu_fidelity.py at toy size on CPU: prepare, the GPU command (its workers without polars, duckdb,
prefect, pandas or great_expectations, as on the lent GPU machine), score; the JSON in fidelity.json's
shape, every arm present; the A/B arms and counts the same as effect_for_lake's."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time
import zipfile
from dataclasses import fields
from pathlib import Path

import pytest

from tests.hidden_modules import hiding

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

# what the lent GPU machine lacks (GPU.md, KINDS.md; pandas is there, but nothing here may need it);
# pydantic is allowed: the prepared folder carries its wheels
ABSENT = ("polars", "duckdb", "prefect", "great_expectations", "pandas")
# the modules the GPU command runs on (its own imports and the workers'), none of which may need ABSENT
GPU_PATH = (
    "gpu_fidelity",
    "evaluation.engine",
    "evaluation.rollout",
    "evaluation.replay",
    "evaluation.environment",
    "evaluation.session",
    "evaluation.simulators",
    "evaluation.checkpoint_simulator",
    "evaluation.traces",
    "evaluation.executable",
    "transforms.prompts",
    "transforms.config",
    "transforms.schemas",
    "trainer.config",
    "trainer.run",
    "trainer.optd_run",
    "trainer.pretrained",
)
TRAINED = ("sft", "optd", "optd_no_trust_region", "optd_no_grounding", "optd_plain_teacher",
           "optd_intent_teacher")  # fmt: skip
ARMS = {*TRAINED, "markov", "random", "world"}
# the keys of bench/fidelity.py's fidelity.json (run_study's result)
FIDELITY_KEYS = {"users", "sessions", "effect_users", "seeds", "resamples", "simulators", "diagnostics",
                 "goals", "size", "machine", "seconds", "run_dirs"}  # fmt: skip
METRICS = {"RVA", "OVA", "F1", "Acc", "DM-JSD", "TE", "PF", "dCTR", "dACR", "T-JSD", "effect_ratio",
           "effect_error"}  # fmt: skip


def blocked_env(folder: Path, also: tuple[str, ...] = ()) -> dict[str, str]:
    """The environment of an interpreter without ABSENT (and ``also``): a sitecustomize in ``folder`` on
    PYTHONPATH, so it holds in every interpreter the command starts, its worker processes too."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(hiding((*ABSENT, *also)))
    return {**os.environ, "PYTHONPATH": os.pathsep.join((str(folder), str(ROOT))), "OMP_NUM_THREADS": "1"}


def in_blocked_interpreter(code: str, env: dict[str, str], timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


@pytest.fixture(scope="module")
def gpu_fidelity():
    return importlib.import_module("gpu_fidelity")


@pytest.fixture(scope="module")
def toy(prefect_harness, tmp_path_factory, gpu_fidelity):
    """The three phases at toy size: prepare here, the GPU command on CPU without the data stack, score."""
    root = tmp_path_factory.mktemp("gpu_fidelity")
    size = gpu_fidelity.study_sizes()["toy"]
    manifest = gpu_fidelity.prepare(size, root / "prepared", root / "work", wheels=False, smollm2=False,
                                    log=lambda _line: None)  # fmt: skip
    command = [sys.executable, "bench/gpu_fidelity.py", "run", "--prepared", str(root / "prepared"),
               "--out", str(root / "out"), "--device", "cpu", "--base", "tiny", "--parallel", "2",
               "--threads", "1"]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, env=blocked_env(root / "blocker"), capture_output=True,
                          text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    result = gpu_fidelity.score(root / "prepared", root / "out", root / "results", root / "work",
                                log=lambda _line: None)  # fmt: skip
    return {"root": root, "manifest": manifest, "stdout": done.stdout, "result": result}


def test_the_gpu_path_imports_none_of_the_data_stack(tmp_path):
    code = (
        "import json, sys\n"
        + "".join(f"import {name}\n" for name in GPU_PATH)
        + (f"print(json.dumps(sorted(n for n in sys.modules if n.partition('.')[0] in {ABSENT!r})))")
    )
    env = blocked_env(tmp_path)
    env["PYTHONPATH"] += os.pathsep + str(ROOT / "bench")
    done = in_blocked_interpreter(code, env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_hidden_modules_are_absent_in_every_interpreter_started(tmp_path):
    # the checks above and below would pass vacuously if hiding did not work: a child of a child of the
    # blocked interpreter cannot import polars either, and pydantic (carried to the GPU) still imports
    code = (
        "import subprocess, sys\n"
        "child = subprocess.run([sys.executable, '-c', 'import polars'], capture_output=True, text=True)\n"
        "assert child.returncode == 1 and 'No module named' in child.stderr, child.stderr\n"
        "import pydantic\n"
        "print('hidden')\n"
    )
    done = in_blocked_interpreter(code, blocked_env(tmp_path))
    assert done.returncode == 0 and "hidden" in done.stdout, done.stderr


def test_without_pydantic_and_without_wheels_the_run_says_what_is_missing(tmp_path):
    code = (
        "import sys\nsys.path.insert(0, 'bench')\nfrom pathlib import Path\nimport gpu_fidelity\n"
        f"gpu_fidelity.ensure_pydantic(Path({str(tmp_path)!r}))\n"
    )
    done = in_blocked_interpreter(code, blocked_env(tmp_path / "blocker", also=("pydantic",)))
    assert done.returncode != 0
    assert "pydantic is not installed" in done.stderr and "holds no wheels" in done.stderr


def test_schedule_runs_after_needs_skips_after_failures_and_stops_at_the_deadline(gpu_fidelity, tmp_path):
    Task = gpu_fidelity.Task
    tasks = [
        Task("train", "a", 0),
        Task("train", "b", 0, ("train-a-seed0",)),
        Task("train", "c", 0),  # fails
        Task("rollout", "c", 0, ("train-c-seed0",)),
        Task("train", "slow", 0, ("train-b-seed0",)),
        Task("rollout", "slow", 0, ("train-slow-seed0",)),
    ]
    seconds = {"a": 0.1, "b": 0.1, "slow": 60}
    order: list[str] = []

    def command(task):
        if task.arm == "c":
            return [sys.executable, "-c", "raise SystemExit(3)"]
        return [sys.executable, "-c", f"import time; time.sleep({seconds[task.arm]})"]

    deadline = time.monotonic() + 6
    schedule = gpu_fidelity.Schedule(tasks, command, 4, deadline, tmp_path, lambda t: order.append(t.key))
    status = schedule.run()
    assert order[:2] == ["train-a-seed0", "train-b-seed0"]  # b started only once a had finished
    assert status["train-c-seed0"] == {
        "status": "failed",
        "returncode": 3,
        "seconds": pytest.approx(0, abs=5),
    }
    assert status["rollout-c-seed0"]["status"] == "skipped"
    assert status["train-slow-seed0"]["status"] == "stopped"  # still running at the deadline
    assert status["rollout-slow-seed0"]["status"] == "not started"
    assert time.monotonic() - deadline < 20  # stopped, not waited for


@pytest.mark.slow
def test_prepare_carries_records_sessions_screens_and_settings(toy):
    prepared, manifest = toy["root"] / "prepared", toy["manifest"]
    assert manifest["records"]["splits"] == ["train", "val"] and manifest["records"]["modes"] == ["single"]
    assert (prepared / "lake" / "records" / "part-0.parquet").is_file()
    assert len(manifest["sessions"]) == 4 and manifest["judged_records"] == 6  # QUICK's held-out states
    assert set(manifest["ab"]) == {"A", "B"}
    assert sorted(manifest["ab"]["A"]["users"] + manifest["ab"]["B"]["users"]) == manifest["effect_users"]
    seed = manifest["training"]["0"]
    assert set(seed["optd"]) == set(TRAINED) - {"sft"} and seed["sft"]["seed"] == 0
    assert seed["optd"]["optd_no_trust_region"]["trust_region"] is False
    assert seed["optd"]["optd_no_grounding"]["gamma"] == 0.0
    assert seed["optd"]["optd_plain_teacher"]["teacher_sees_intent"] is False
    assert seed["intent_teacher"]["teacher_intent_share"] == 0.5
    assert manifest["bytes"] < 40 * 2**20


@pytest.mark.slow
def test_the_gpu_command_finishes_every_task_and_packs_its_results(toy):
    out = toy["root"] / "out"
    run = json.loads((out / "gpu_fidelity_run.json").read_text())
    assert run["unfinished"] == [] and run["device"] == "cpu" and run["base"]["kind"] == "tiny"
    # SFT, the intent teacher, five OPTD arms; and for the six checkpoints a rollout and an A/B task each
    assert len(run["tasks"]) == 7 + 12 and all(t["status"] == "ok" for t in run["tasks"].values())
    names = set(zipfile.ZipFile(out / "traces.zip").namelist())
    for arm in TRAINED:
        for name in ("rollout.jsonl", "replay.jsonl", "ab.jsonl", "ab_counts.json"):
            assert f"seed-0/{arm}/eval/{name}" in names
        assert f"seed-0/{arm}/run/summary.json" in names and f"seed-0/{arm}/run/metrics.jsonl" in names
    assert not [n for n in names if "checkpoints" in n]  # weights stay on the device
    assert (out / "run.log").stat().st_size > 0


@pytest.mark.slow
def test_score_writes_fidelity_json_shape_with_every_arm(toy):
    from fidelity import StudySize

    results = toy["root"] / "results"
    saved = json.loads((results / "gpu_fidelity.json").read_text())
    assert set(saved) == FIDELITY_KEYS
    assert set(saved["simulators"]) == ARMS and set(saved["diagnostics"]) == set(TRAINED)
    assert set(saved["size"]) == {f.name for f in fields(StudySize)} and set(saved["seconds"]) == {
        "total",
        "scoring",
    }
    assert saved["sessions"] == 4 and saved["seeds"] == [0] and saved["users"] == 40
    for arm, figures in saved["simulators"].items():
        assert set(figures) == METRICS, arm
        for metric, value in figures.items():
            assert value.keys() == {"mean", "lo", "hi"}, (arm, metric)
            if value["lo"] is not None:
                assert value["lo"] <= value["hi"], (arm, metric)
    # the baselines ran here as in the CPU study: random always picks an executable action, the world's
    # shoppers never give an invalid answer and have no replay
    assert saved["simulators"]["random"]["RVA"]["mean"] == 1.0
    assert (
        saved["simulators"]["world"]["OVA"]["mean"] == 1.0
        and saved["simulators"]["world"]["RVA"]["mean"] is None
    )
    assert saved["diagnostics"]["optd_no_trust_region"]["mean_lambda"] == 1.0  # lambda = 1 on every token
    assert set(saved["goals"]) == {
        "markov_beats_random",
        "optd_at_least_sft",
        "optd_effect_error_below_paper",
    }
    assert "GPU run: cpu" in saved["machine"] and "tiny default" in saved["machine"]
    page = (results / "gpu_fidelity.html").read_text()
    assert page.count("data:image/png;base64,") == 2 and all(f"<th>{arm}</th>" in page for arm in ARMS)


@pytest.mark.slow
def test_prepared_arms_and_gpu_counts_are_effect_for_lakes(toy, gpu_fidelity, tmp_path):
    # the world's shoppers decide each session's steps from keyed draws, whatever else is in the batch:
    # rolled out on the prepared sessions in one pool and counted from the trace file, they give exactly
    # the per-user counts effect_for_lake gives from arms it builds itself and counts with rollout_counts
    import lzma
    import pickle

    from evaluation.engine import roll_out
    from evaluation.environment import EnvironmentSettings
    from worlds.shoppers import ARMS as POLICIES
    from worlds.shoppers import effect_for_lake, world_from_lake

    manifest = toy["manifest"]
    lake = Path(manifest["lake"])
    world = world_from_lake(lake)
    for policy in POLICIES:
        world.know(world.world.run(policy=policy, seed=world.seed, keyed_draws=world.stepwise_seed))
    with lzma.open(toy["root"] / "prepared" / "sessions.pkl.xz") as handle:
        sessions = pickle.load(handle)["ab"]
    environment = EnvironmentSettings.model_validate(manifest["environment"])
    roll_out(sessions, world, tmp_path / "ab.jsonl", source="world", settings=environment, batch_size=64)
    ours = gpu_fidelity.effect_frame(manifest, gpu_fidelity.per_user_counts(tmp_path / "ab.jsonl"))
    fresh = world_from_lake(lake)
    theirs = effect_for_lake(lake, fresh, fresh, split="test", users=manifest["effect_users"]).counts
    assert ours.sort("arm", "user_id").equals(theirs.sort("arm", "user_id"))
    assert ours["sim_clicks"].sum() > 0  # not vacuous: the shoppers clicked


def test_a_shaped_base_is_smollm2s_tokenizer_and_config_with_seeded_random_weights(
    gpu_fidelity, smollm2_folder, tmp_path
):
    import torch
    from transformers import AutoTokenizer

    from trainer.models import load_pretrained

    small = {"num_hidden_layers": 1, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2,
             "num_key_value_heads": 1, "head_dim": 32}  # fmt: skip
    built = {name: gpu_fidelity.build_shaped_base(smollm2_folder, tmp_path / name, seed, small)
             for name, seed in (("first", 0), ("again", 0), ("other", 1))}  # fmt: skip
    model, tokenizer = load_pretrained(built["first"])
    original = AutoTokenizer.from_pretrained(smollm2_folder)
    text = 'Shopper: {"rationale":"I like the socks","action":{"type":"click"}}'
    assert tokenizer(text)["input_ids"] == original(text)["input_ids"]
    assert tokenizer.chat_template == original.chat_template and len(tokenizer) == 49152
    assert model.config.vocab_size == 49152 and model.config.tie_word_embeddings
    assert model.config.num_hidden_layers == 1  # the overrides on SmolLM2's config
    again, _ = load_pretrained(built["again"])
    other, _ = load_pretrained(built["other"])
    weights = model.state_dict()
    assert all(torch.equal(weights[k], v) for k, v in again.state_dict().items())
    assert not torch.equal(weights["model.layers.0.mlp.up_proj.weight"],
                           other.state_dict()["model.layers.0.mlp.up_proj.weight"])  # fmt: skip
