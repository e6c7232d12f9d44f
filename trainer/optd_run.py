"""The OPTD run: the training run of ``trainer.run`` with OPTD's update and its measurements added.

The student starts from an SFT checkpoint, which is also frozen as the teacher. Each update draws
intent-bearing training states, samples a response for each from the student, has the teacher
score it with and without the trajectory's intent, and takes one optimiser step on the OPTD
objective (OPTD.md). Train rows add the objective's parts (distillation, grounding, mean lambda*,
binding share, guidance KL), the samples' policy version and the seconds of each phase.

Eval rows are the SFT run's (held-out NLL and sampled responses of the held-out users, the same
states as the teacher's run) plus the privileged signal on the probe states: the teacher's gold NLL
with and without the intent (fixed: the teacher is frozen) and the objective with its parts on
responses sampled from the student from a fixed seed. Held-out samples are drawn from their own
seeded RNG stream, so evaluations neither depend on nor disturb the training samples: a resumed
run samples what an uninterrupted one would.

The teacher must come from this lake: a base trained on another lake's records is refused before any
model is loaded (``OPTDRun.check_base``), unless ``allow_foreign_base``, which the run then records.
"""

from __future__ import annotations

from collections import Counter
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from trainer.checkpoint import read_meta
from trainer.data import EncodedState, RecordText, StatePool, intents_hash
from trainer.distributed import unsharded
from trainer.generation import (
    Generated,
    Generator,
    HFGenerator,
    VLLMGenerator,
    check_on_policy,
    require_generator,
)
from trainer.loop import PhaseTimer, StepReport, autocast, seeded
from trainer.models import check_same_vocabulary, load_pretrained
from trainer.optd import (
    HiddenStates,
    OPTDObjective,
    OPTDState,
    build_rollouts,
    grounding_class_weights,
    objective_value,
)
from trainer.run import (
    EvaluationHook,
    ResponseJudge,
    TrainingRun,
    TrainSummary,
    intent_bearing,
    intent_gain,
    previously_prepared,
    resolve_checkpoint,
    resume_point,
    run_folder_of,
    with_sums_over_ranks,
)
from trainer.run_folder import check_run_folder

if TYPE_CHECKING:
    from trainer.config import OPTDSettings


def weights_hash(folder: Path) -> str:
    """sha256 over a model folder's weight files: which teacher a run distils from."""
    import hashlib

    digest = hashlib.sha256()
    for path in sorted(folder.glob("*.safetensors")) or sorted(folder.glob("*.bin")):
        with path.open("rb") as weights:
            for block in iter(lambda: weights.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


class ForeignBase(ValueError):
    """The OPTD base (the teacher) was not trained on this lake's records, or cannot say what it was."""


def recorded_records_hash(checkpoint: Path) -> str | None:
    """The ``records_hash`` a checkpoint's run recorded in its ``trainer.json``; None where it records
    none (not a trajforge checkpoint, or one written before runs recorded it)."""
    try:
        return read_meta(checkpoint).get("records_hash")
    except FileNotFoundError:
        return None


def foreign_base_message(teacher: Path, theirs: str | None, lake: Path, ours: str) -> str:
    allow = "set allow_foreign_base = true under [optd] to distil from it anyway"
    if theirs is None:
        return (
            f"cannot distil from {teacher}: it records no records_hash, so whether it was trained on the "
            f"records of {lake} (records_hash {ours[:12]}) cannot be told; {allow}"
        )
    return (
        f"cannot distil from {teacher}: it was trained on other records than those of {lake} "
        f"(records_hash {theirs[:12]} there, {ours[:12]} here); {allow}"
    )


class OPTDRun(TrainingRun):
    """On-policy trajectory distillation from a frozen SFT teacher (see the module's docstring)."""

    stage: ClassVar[str] = "optd"
    settings: OPTDSettings

    def __init__(
        self,
        settings: OPTDSettings,
        lake: str | Path,
        out: str | Path,
        teacher: Path,
        start_from: Path,
        judge: ResponseJudge | None = None,
        on_evaluation: EvaluationHook | None = None,
    ) -> None:
        self.teacher_path = teacher
        require_generator(settings.generator)  # a missing engine stops the run before any model is loaded
        super().__init__(settings, lake, out, start_from, judge, on_evaluation)
        if self.world.rank > 0:  # each rank samples its own states with its own noise
            torch.manual_seed(settings.seed + self.world.rank)
        teacher_lm, teacher_tokenizer = load_pretrained(teacher)
        check_same_vocabulary(self.model, self.tokenizer, teacher_lm, teacher_tokenizer)
        self.teacher = HiddenStates(teacher_lm.to(self.device)).eval().requires_grad_(False)
        teacher_head = tuple(t.detach() if t is not None else None for t in self.teacher.head())
        self.objective = OPTDObjective(
            self.body.head, teacher_head, self.vocab, settings.objective(), settings.chunk_size
        )
        self.generator = self.build_generator(start_from)
        self.action_counts = Counter(r.action for r in self.pool.records)
        self.reused_states = previously_prepared(run_folder_of(teacher), self.pool, self.tokenizer)
        self._teacher_probe: dict[str, float] | None = None
        self.meta |= {
            "stage": "optd",
            "teacher": str(teacher),
            "teacher_weights": weights_hash(teacher),
            "teacher_records_hash": self.teacher_records_hash,
            "foreign_base": self.teacher_records_hash != self.records_hash,
            "intents_hash": intents_hash(self.pool.records),
        }

    # --- the pieces the skeleton asks for -----------------------------------------------------

    def pool_records(self, records: list[RecordText]) -> list[RecordText]:
        """Only states with an intent can be distilled; the others are counted as left out."""
        kept = intent_bearing(records)
        if len(kept) < len(records):
            self.left_out["no_intent"] += len(records) - len(kept)
        if not kept:
            raise ValueError(
                f"no train states with an intent in {self.lake} (left out: {dict(self.left_out)})"
            )
        return kept

    def load_model(
        self, records: list[RecordText], start_from: str | Path | None
    ) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
        return load_pretrained(start_from)

    def build_pool(self, records: list[RecordText]) -> StatePool:
        s = self.settings
        return StatePool(records, self.tokenizer, s.max_prompt_tokens, s.max_response_tokens, privileged=True)

    def build_generator(self, checkpoint: Path) -> Generator:
        sampling = self.settings.rollout_sampling
        if self.settings.generator == "vllm":
            return VLLMGenerator(
                checkpoint,
                self.model,
                self.tokenizer,
                sampling,
                rank=self.world.rank,
                seed=self.settings.seed,
            )
        return HFGenerator(self.model, self.tokenizer, sampling)

    def check_base(self) -> None:
        """Refuse a teacher whose run read another records table than this lake's.

        The rule compares :func:`trainer.data.records_hash` (which recorded steps, users and splits the
        records table holds) as the teacher's run recorded it with this lake's. Not ``data_hash``: that
        hashes a run's own pool (SFT trains on every state, OPTD on the intent-bearing ones, each with
        its settings' splits and modes, rendered texts and tokenizer), so it differs between an SFT run
        and an OPTD run on one lake; what both read is the records table, and its identity is what
        must agree. A teacher that records no hash is refused too: its lineage cannot be told."""
        self.teacher_records_hash = recorded_records_hash(self.teacher_path)
        if self.teacher_records_hash != self.records_hash and not self.settings.allow_foreign_base:
            raise ForeignBase(
                foreign_base_message(
                    self.teacher_path, self.teacher_records_hash, self.lake, self.records_hash
                )
            )

    def check_lineage(self, meta: dict[str, Any]) -> None:
        for key, what in (("teacher_weights", "teacher's weights"), ("intents_hash", "intents")):
            if meta.get(key) != self.meta[key]:
                raise ValueError(
                    f"cannot resume: the {what} differ from the checkpoint's ({key} "
                    f"{str(meta.get(key))[:12]} there, {self.meta[key][:12]} now)"
                )

    def update(self, timer: PhaseTimer) -> tuple[StepReport, dict[str, Any]]:
        """Sample, score with the teacher twice, accumulate the student's loss, step.

        Returns the report (loss and parts over all ranks) and what the metrics row adds: the samples'
        policy version and the seconds of the student-side phases inside ``forward_backward``."""
        detail = PhaseTimer(self.device)
        global_states = self.settings.states_per_update
        with timer.phase("data"):
            drawn = self.distillation_states(self.draw(global_states))
            weights = self.grounding_weights([s.record.action for s in drawn])
            chosen = self.world.shard(drawn)
            chosen_weights = None if weights is None else weights[self.world.rank :: self.world.size]
        with timer.phase("generate"):
            generated = self.generate(chosen)
        responses = generated.response_ids
        rollouts = self.rollouts(chosen, responses, timer, chosen_weights)
        self.objective.timer = detail
        report = self.trainer.step(rollouts, self.objective, self.world.divisor(global_states), timer=timer)
        self.generator.sync(self.model, self.trainer.updates)
        extras = {
            "policy_version": generated.policy_version,
            "forward_backward_detail": {k: round(v, 4) for k, v in detail.seconds.items()},
        }
        # sampled tokens are a plain count: multiplied by the ranks here, summed over them, divided back
        report.parts["sampled_tokens"] = float(sum(len(r) for r in responses) * self.world.size)
        return with_sums_over_ranks(report, self.world, self.device), extras

    def probe_values(self) -> dict[str, float]:
        """On the probe states: the teacher's intent gain, and the objective on student samples."""
        if not self.probe:
            return {}
        plain, privileged = self.probe
        if self._teacher_probe is None:  # frozen: measured once
            gain = intent_gain(
                self.teacher, self.teacher.head, plain, privileged, self.vocab, self.tokenizer, self.device
            )
            self._teacher_probe = {f"teacher_{k}": v for k, v in gain.items()}
        states = [
            OPTDState(p, q.prompt_ids if self.settings.teacher_sees_intent else p.prompt_ids)
            for p, q in zip(plain, privileged, strict=True)
        ]
        with seeded(self.settings.seed, self.device):
            responses = self.generate(states).response_ids
        rollouts = self.rollouts(states, responses, PhaseTimer(self.device), None)
        value = objective_value(self.body, self.objective, rollouts)
        return self._teacher_probe | {f"probe_{k}": v for k, v in value.items()}

    def stage_summary(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """The mean of each objective part over the run's updates, and the teacher's probe figures."""
        train = [r for r in rows if r["kind"] == "train"]
        parts = ("distillation", "grounding", "mean_lambda", "binding_share", "guidance_kl")
        means = {p: sum(r[p] for r in train) / len(train) for p in parts} if train else {}
        return {"teacher": str(self.teacher_path), "updates_mean": means, "reused_states": self.reused_states}

    # --- OPTD's own pieces ----------------------------------------------------------------------

    def distillation_states(self, states: list[EncodedState]) -> list[OPTDState]:
        """Drawn states with the teacher's context: the privileged prompt, or the plain one when the
        teacher is not to see the intent (the self-distillation ablation)."""
        sees = self.settings.teacher_sees_intent
        return [
            OPTDState(s, self.pool.privileged_ids[s.record.key] if sees else s.prompt_ids) for s in states
        ]

    def grounding_weights(self, actions: list[str]) -> torch.Tensor | None:
        if not self.settings.grounding_class_weights:
            return None
        return grounding_class_weights(actions, self.action_counts)

    def generate(self, states: list[OPTDState]) -> Generated:
        """Samples from the current weights; refused if the generator's are older (zero staleness)."""
        with unsharded(self.body), autocast(self.device, self.settings.bf16):
            generated = self.generator.generate([s.state.prompt_ids for s in states])
        check_on_policy(generated, self.trainer.updates)
        return generated

    def rollouts(
        self,
        states: list[OPTDState],
        responses: list[list[int]],
        timer: PhaseTimer,
        grounding_weights: torch.Tensor | None,
    ):
        s = self.settings
        cast = partial(autocast, self.device, s.bf16)
        return build_rollouts(
            states,
            responses,
            self.teacher,
            self.tokenizer.pad_token_id,
            s.micro_batch_states,
            self.device,
            timer,
            cast,
            grounding_weights=grounding_weights,
        )

    def restore(self, folder: Path) -> int:
        step = super().restore(folder)
        self.generator.sync(self.model, self.trainer.updates)
        return step


def run_optd(
    settings: OPTDSettings,
    lake: str | Path,
    out: str | Path,
    base: str | Path,
    resume: bool = False,
    stop_after: int | None = None,
    progress: bool = True,
    judge: ResponseJudge | None = None,
    on_evaluation: EvaluationHook | None = None,
    student: str | Path | None = None,
    overwrite: bool = False,
) -> TrainSummary:
    """``settings.steps`` OPTD updates from the SFT checkpoint ``base`` (teacher and student start).

    ``base`` may be the SFT run folder (its newest checkpoint). ``student``: another checkpoint for
    the student to start from (with the teacher's tokenizer), e.g. the plain SFT model distilled from
    a teacher that learnt to read intents. ``resume`` continues from the newest checkpoint in ``out``
    exactly (same settings, data, teacher and intents); ``overwrite`` replaces the run ``out`` holds,
    which is refused without one of the two; ``stop_after`` ends this call after that update, with a
    checkpoint.
    """
    require_generator(settings.generator)  # a missing engine is the first thing said, before any path
    out = Path(out)
    check_run_folder(out, resume, overwrite)
    teacher = resolve_checkpoint(base)
    start = resolve_checkpoint(student, "--student") if student is not None else teacher
    resume_from = resume_point(out) if resume else None
    run = OPTDRun(settings, lake, out, teacher, resume_from or start, judge, on_evaluation)
    run.meta["student_start"] = str(start)
    return run.fit(resume_from, stop_after, progress, overwrite)
