"""The OPTD run: an SFT checkpoint -> a frozen teacher and a student, on-policy updates, checkpoints.

``OUT/metrics.jsonl`` gets one row per update (kind ``train``: the loss parts, mean lambda*,
binding share, guidance KL, tokens/s, seconds per phase) and per held-out evaluation (kind
``eval``: the objective on held-out states; the shares of the sampled responses that parse and that
are executable on their records' screens, with the rejection reasons counted).
Held-out samples are drawn from their own seeded RNG stream, so evaluations neither depend on
nor disturb the training samples: a resumed run samples what an uninterrupted one would.
Under ``torchrun`` each rank trains on its shard of every update; rank 0 writes.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from tqdm.auto import tqdm

from trainer.checkpoint import check_resumable, latest, read_meta, restore_training_state, save_checkpoint
from trainer.data import StateSampler, power_law_weights
from trainer.distributed import World, unsharded
from trainer.generation import (
    Generated,
    Generator,
    HFGenerator,
    VLLMGenerator,
    check_on_policy,
    require_generator,
)
from trainer.loop import MetricsLog, PhaseTimer, StepReport, Trainer, autocast
from trainer.models import check_same_vocabulary, load_pretrained
from trainer.optd import (
    HiddenStates,
    OPTDObjective,
    OPTDState,
    build_rollouts,
    objective_value,
    optd_states,
)
from trainer.optd_config import OPTDSettings
from trainer.responses import record_screens_for, response_shares, seeded
from trainer.run import SftRun, prepare_sft_run, with_sums_over_ranks

if TYPE_CHECKING:
    from evaluation.executable import RecordScreens
    from trainer.config import TrainSettings


@dataclass
class OPTDSummary:
    checkpoint: str
    steps: int
    skipped_steps: int
    train_states: int
    held_out_states: int
    held_out_start: dict[str, Any] | None
    held_out_end: dict[str, Any] | None
    left_out: dict[str, int] = field(default_factory=dict)
    data_hash: str = ""


@dataclass
class OPTDRun:
    base: SftRun  # the student (loaded from the SFT checkpoint), its states, optimiser and schedule
    optd: OPTDSettings
    world: World
    teacher: HiddenStates
    student: HiddenStates  # the unwrapped body: generation and evaluation use it directly
    trainer: Trainer
    objective: OPTDObjective
    generator: Generator
    train_states: list[OPTDState]
    held_out: list[OPTDState]
    sampler: StateSampler
    meta: dict[str, Any]
    screens: RecordScreens | None = None  # the held-out records' screens, placed at the first evaluation

    @property
    def device(self) -> torch.device:
        return self.trainer.device

    def generate(self, states: list[OPTDState]) -> Generated:
        """Samples from the current weights; refused if the generator's are older (zero staleness)."""
        with unsharded(self.student), autocast(self.device, self.base.settings.bf16):
            generated = self.generator.generate([s.state.prompt_ids for s in states])
        check_on_policy(generated, self.trainer.updates)
        return generated

    def rollouts(self, states: list[OPTDState], responses: list[list[int]], timer: PhaseTimer):
        s = self.base.settings
        pad = self.base.tokenizer.pad_token_id
        cast = partial(autocast, self.device, s.bf16)
        return build_rollouts(
            states, responses, self.teacher, pad, s.micro_batch_states, self.device, timer, cast
        )

    def evaluate(self) -> dict[str, Any] | None:
        """The objective on the held-out states and their sampled responses judged on their screens,
        from a fixed sampling seed."""
        if not self.held_out:
            return None
        records = [s.record for s in self.held_out]
        if self.screens is None:
            self.screens = record_screens_for(self.base.lake, records)
        with seeded(self.base.settings.seed, self.device):
            responses = self.generate(self.held_out).response_ids
        rollouts = self.rollouts(self.held_out, responses, PhaseTimer(self.device))
        shares = response_shares(self.base.tokenizer, records, responses, self.screens)
        return objective_value(self.student, self.objective, rollouts) | shares

    def checkpoint(self, step: int) -> Path | None:
        """Every rank calls it (sharded weights and optimizer state are gathered together); rank 0 writes."""
        meta = {**self.meta, "sampler": self.sampler.state_dict()}
        b = self.base
        return save_checkpoint(
            b.out,
            step,
            b.model,
            b.tokenizer,
            self.trainer.optimizer,
            self.trainer.scheduler,
            meta,
            keep=b.settings.keep_checkpoints,
            world=self.world,
        )


def build_generator(run_base: SftRun, optd: OPTDSettings, checkpoint: Path) -> Generator:
    if optd.generator == "vllm":
        seed, rank = run_base.settings.seed, run_base.world.rank
        return VLLMGenerator(
            checkpoint, run_base.model, run_base.tokenizer, optd.sampling(), rank=rank, seed=seed
        )
    return HFGenerator(run_base.model, run_base.tokenizer, optd.sampling())


def prepare_optd(
    settings: TrainSettings, optd: OPTDSettings, lake: str | Path, out: Path, sft: Path, start: Path
) -> OPTDRun:
    """Student from ``start`` (the SFT checkpoint, or the one resumed), frozen teacher from ``sft``; the
    student's wrapping for data parallelism, its optimiser and schedule are the SFT run's."""
    require_generator(optd.generator)  # a missing engine stops the run before any model is loaded
    settings = optd.train_settings(settings)
    base = prepare_sft_run(settings, lake, out, start)
    world = base.world
    if world.rank > 0:  # each rank samples its own states with its own noise
        torch.manual_seed(settings.seed + world.rank)
    teacher_lm, teacher_tokenizer = load_pretrained(sft)
    check_same_vocabulary(base.model, base.tokenizer, teacher_lm, teacher_tokenizer)
    teacher = HiddenStates(teacher_lm.to(base.trainer.device)).eval().requires_grad_(False)
    states, left_out = optd_states(base.states, base.tokenizer, settings.max_prompt_tokens)
    cut = max(len(states) - optd.held_out_states, 0)
    train_states, held_out = states[:cut], states[cut:]
    if not train_states:
        raise ValueError(f"no train states with an intent in {lake} (left out: {dict(left_out)})")
    weights = None
    if settings.class_resampling_alpha is not None:
        weights = power_law_weights([s.record.action for s in train_states], settings.class_resampling_alpha)
    student = base.body
    teacher_head = tuple(t.detach() if t is not None else None for t in teacher.head())
    objective = OPTDObjective(
        student.head, teacher_head, len(base.tokenizer), optd.objective(), optd.chunk_size
    )
    base.left_out += left_out
    meta = {
        **base.meta,
        "stage": "optd",
        "teacher": str(sft),
        "settings": {**base.meta["settings"], "optd": optd.model_dump(mode="json")},
    }
    return OPTDRun(
        base,
        optd,
        world,
        teacher,
        student,
        base.trainer,
        objective,
        build_generator(base, optd, start),
        train_states,
        held_out,
        StateSampler(len(train_states), settings.seed, weights),
        meta,
    )


def restore(run: OPTDRun, folder: Path) -> int:
    """Continue ``folder``'s run exactly: optimiser, schedule, RNG, sampler and the policy version."""
    meta = read_meta(folder)
    check_resumable(meta, run.meta["settings"], run.meta["data_hash"], run.world.size)
    restore_training_state(folder, run.base.model, run.trainer.optimizer, run.trainer.scheduler, run.world)
    run.sampler.load_state_dict(meta["sampler"])
    run.trainer.updates = meta["step"]
    run.meta["held_out_start"] = meta["held_out_start"]
    run.generator.sync(run.base.model, run.trainer.updates)
    return meta["step"]


def optd_update(run: OPTDRun) -> tuple[StepReport, dict[str, Any]]:
    """One update: sample, score with the teacher twice, accumulate the student's loss, step.

    Returns the report (loss and parts over all ranks) and what the metrics row adds: the
    samples' policy version and the seconds of the student-side phases inside ``forward_backward``."""
    timer, detail = PhaseTimer(run.device), PhaseTimer(run.device)
    global_states = run.base.settings.states_per_update
    with timer.phase("data"):
        chosen = run.world.shard([run.train_states[i] for i in run.sampler.take(global_states)])
    with timer.phase("generate"):
        generated = run.generate(chosen)
    responses = generated.response_ids
    rollouts = run.rollouts(chosen, responses, timer)
    run.objective.timer = detail
    report = run.trainer.step(rollouts, run.objective, run.world.divisor(global_states), timer=timer)
    run.generator.sync(run.base.model, run.trainer.updates)
    extras = {
        "policy_version": generated.policy_version,
        "forward_backward_detail": {k: round(v, 4) for k, v in detail.seconds.items()},
    }
    return with_global_sums(report, run, sum(len(r) for r in responses)), extras


def with_global_sums(report: StepReport, run: OPTDRun, sampled: int) -> StepReport:
    """The step's loss and parts over all ranks' states (each rank reported its own share)."""
    # sampled tokens are a plain count: multiplied by the ranks here, summed over them, divided back there
    report.parts["sampled_tokens"] = float(sampled * run.world.size)
    return with_sums_over_ranks(report, run.world, run.device)


def run_optd(
    settings: TrainSettings,
    optd: OPTDSettings,
    lake: str | Path,
    out: str | Path,
    base: str | Path,
    resume: bool = False,
    stop_after: int | None = None,
    progress: bool = True,
) -> OPTDSummary:
    """``settings.steps`` OPTD updates from the SFT checkpoint ``base`` (teacher and student start).

    ``resume`` continues from the newest checkpoint in ``out`` exactly (same settings, data and
    teacher); ``stop_after`` ends this call after that update, with a checkpoint.
    """
    out, base = Path(out), Path(base)
    resume_from = latest(out) if resume else None
    if resume and resume_from is None:
        raise FileNotFoundError(f"--resume: no checkpoint under {out / 'checkpoints'}")
    run = prepare_optd(settings, optd, lake, out, base, resume_from or base)
    start = restore(run, resume_from) if resume_from else 0
    # one writer: the other ranks' updates are the same update, and their file would race rank 0's
    metrics = (
        MetricsLog(out / "metrics.jsonl", resume_from=start if resume_from else None)
        if run.world.is_main
        else None
    )
    if start == 0:
        run.meta["held_out_start"] = run.evaluate()
        if metrics and run.meta["held_out_start"] is not None:  # no held-out states: no eval row
            metrics.write({"kind": "eval", "step": 0, **run.meta["held_out_start"]})
    end = settings.steps if stop_after is None else min(settings.steps, stop_after)
    train_updates(run, metrics, start, end, progress)
    rows = metrics.rows() if metrics else []
    evaluations = [row for row in rows if row["kind"] == "eval"]
    summary = OPTDSummary(
        checkpoint=str(run.checkpoint(end) or ""),
        steps=end,
        skipped_steps=sum(row["skipped"] for row in rows if row["kind"] == "train"),
        train_states=len(run.train_states),
        held_out_states=len(run.held_out),
        held_out_start=run.meta["held_out_start"],
        held_out_end={k: v for k, v in evaluations[-1].items() if k not in ("kind", "step")}
        if evaluations
        else None,
        left_out=dict(run.base.left_out),
        data_hash=run.meta["data_hash"],
    )
    if run.world.is_main:
        (out / "summary.json").write_text(json.dumps(asdict(summary), indent=2))
    return summary


def train_updates(run: OPTDRun, metrics: MetricsLog | None, start: int, end: int, progress: bool) -> None:
    """Updates ``start+1 .. end`` with their metrics rows, held-out evaluations and step checkpoints."""
    s = run.base.settings
    bar = tqdm(total=s.steps, initial=start, disable=not (progress and metrics), desc="optd", unit="update")
    for step in range(start + 1, end + 1):
        report, extras = optd_update(run)
        if metrics:
            metrics.write({"kind": "train", **report.as_json(), **extras})
        bar.update(1)
        bar.set_postfix(loss=f"{report.loss:.4f}", lam=f"{report.parts['mean_lambda']:.3f}")
        if (s.eval_every and step % s.eval_every == 0) or step == s.steps:
            evaluation = run.evaluate()
            if metrics and evaluation is not None:
                metrics.write({"kind": "eval", "step": step, **evaluation})
        if s.checkpoint_every and step % s.checkpoint_every == 0 and step != end:
            run.checkpoint(step)
    bar.close()
