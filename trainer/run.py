"""The SFT run: records -> states -> updates, with held-out loss, metrics and checkpoints.

``OUT/metrics.jsonl`` gets one row per update (kind ``train``) and per held-out
evaluation (kind ``eval``: the held-out loss, and the shares of responses sampled from a fixed
seed that parse and that are executable on their records' screens, rejection reasons counted);
``OUT/summary.json`` says what went in and what came out.
Under ``torchrun`` each rank trains on its shard of every update and scores its shard of
the held-out states (DDP or FSDP2, ``strategy``; the OPTD run is wired the same way, by
``prepare_sft_run``); rank 0 writes.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from trainer.checkpoint import check_resumable, latest, read_meta, restore_training_state, save_checkpoint
from trainer.data import (
    Batch,
    EncodedState,
    RecordText,
    StateSampler,
    collate,
    data_hash,
    encode,
    load_records,
    power_law_weights,
)
from trainer.distributed import World, check_shards, device_for, init_world, sum_over_ranks, unsharded, wrap
from trainer.generation import HFGenerator, SamplingSettings
from trainer.loop import (
    MetricsLog,
    PhaseTimer,
    StepReport,
    Trainer,
    adam,
    autocast,
    schedule,
    seed_everything,
    split,
)
from trainer.models import (
    build_tiny_model,
    enable_activation_checkpointing,
    load_pretrained,
    tokenizer_fingerprint,
    train_tokenizer,
)
from trainer.optd import HiddenStates
from trainer.responses import record_screens_for, response_shares, seeded
from trainer.sft import SFTObjective, held_out_loss

if TYPE_CHECKING:
    from evaluation.executable import RecordScreens
    from trainer.config import TrainSettings

LOSS_ROW_KEYS = ("kind", "step", "held_out_loss")  # an eval row's other values are the responses' report


@dataclass
class TrainSummary:
    checkpoint: str
    steps: int
    skipped_steps: int
    train_states: int
    held_out_states: int
    held_out_loss_start: float | None
    held_out_loss_end: float | None
    left_out: dict[str, int] = field(default_factory=dict)  # reason -> records not trained on
    data_hash: str = ""
    # sampled held-out responses: parse and executable shares, rejections (trainer.responses)
    held_out_responses_start: dict[str, Any] | None = None
    held_out_responses_end: dict[str, Any] | None = None


@dataclass
class SftRun:
    """Everything one run holds: the model, its states, the sampler and the optimiser.

    ``trainer.model`` is ``body`` made ready for data parallelism (DDP, or ``body`` itself sharded
    by FSDP2); ``body`` is the decoder without the LM head, whose weights ``body.head`` gives whole.
    """

    settings: TrainSettings
    out: Path
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    states: list[EncodedState]
    eval_batches: list[Batch]  # this rank's shard of the held-out states
    held_out_states: int  # over all ranks
    sampler: StateSampler
    world: World
    body: HiddenStates
    trainer: Trainer
    meta: dict[str, Any]  # what every checkpoint records besides the step and the sampler
    left_out: Counter[str]
    lake: Path
    sample_states: list[EncodedState]  # held-out states whose sampled responses are judged
    screens: RecordScreens | None = None  # their records' screens, placed at the first evaluation

    @property
    def vocab(self) -> int:
        return len(self.tokenizer)

    def next_update(self) -> tuple[list[Batch], int]:
        """This rank's micro-batches of the next update, and the update's number of states (all ranks)."""
        chosen = [self.states[i] for i in self.sampler.take(self.settings.states_per_update)]
        size, device = self.settings.micro_batch_states, self.trainer.device
        return micro_batches(self.world.shard(chosen), size, self.tokenizer, device), len(chosen)

    def update(self, timer: PhaseTimer) -> StepReport:
        """One update, its loss the mean over all ranks' states."""
        with timer.phase("data"):
            batches, n_states = self.next_update()
        objective = SFTObjective(self.body.head, self.vocab, last=batches[-1])
        report = self.trainer.step(batches, objective, self.world.divisor(n_states), timer=timer)
        return with_sums_over_ranks(report, self.world, self.trainer.device)

    def held_out(self) -> dict[str, Any]:
        """One eval row's values: the held-out loss (each rank scores its shard of the states, summed
        over the ranks) and the sampled responses' report."""
        loss = None
        if self.held_out_states:
            loss = held_out_loss(self.body, self.eval_batches, self.vocab, self.world, self.trainer.device)
        return {"held_out_loss": loss, **(self.held_out_responses() or {})}

    def held_out_responses(self) -> dict[str, Any] | None:
        """Responses sampled from a fixed seed on ``sample_states``, judged on their screens.

        Every rank samples the same responses (same weights, same seed) with the weights gathered once
        under FSDP2; rank 0 writes the report."""
        if not self.sample_states:
            return None
        records = [s.record for s in self.sample_states]
        if self.screens is None:
            self.screens = record_screens_for(self.lake, records)
        sampling = SamplingSettings(max_new_tokens=self.settings.eval_max_new_tokens)
        generator = HFGenerator(self.model, self.tokenizer, sampling)
        device = self.trainer.device
        with unsharded(self.body), seeded(self.settings.seed, device), autocast(device, self.settings.bf16):
            responses = generator.generate([s.prompt_ids for s in self.sample_states]).response_ids
        return response_shares(self.tokenizer, records, responses, self.screens)

    def checkpoint(self, step: int) -> Path | None:
        """Every rank calls it (sharded weights and optimizer state are gathered together); rank 0 writes."""
        t, meta = self.trainer, {**self.meta, "sampler": self.sampler.state_dict()}
        parts = (self.model, self.tokenizer, t.optimizer, t.scheduler)
        keep = self.settings.keep_checkpoints
        return save_checkpoint(self.out, step, *parts, meta, keep=keep, world=self.world)


def with_sums_over_ranks(report: StepReport, world: World, device: torch.device) -> StepReport:
    """The step's loss and parts over all ranks' states (each rank reported its own share)."""
    if not world.active:
        return report
    local = {"loss": report.loss, **report.parts, "tokens": float(report.tokens)}
    # each rank's values are its sums / (global / world): summed and divided by world, the global mean
    summed = sum_over_ranks(local, world, device)
    report.loss = summed.pop("loss") / world.size
    report.tokens = int(summed.pop("tokens"))
    report.parts = {k: v / world.size for k, v in summed.items()}
    return report


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def micro_batches(
    states: list[EncodedState], size: int, tokenizer: PreTrainedTokenizerBase, device: torch.device
) -> list[Batch]:
    return [collate(chunk, tokenizer.pad_token_id).to(device) for chunk in split(states, size)]


def starting_model(
    records: list[RecordText], settings: TrainSettings, base: str | Path | None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """``base`` as it is, or the tiny default with a tokenizer trained on the records' texts."""
    if base is not None:
        return load_pretrained(base)
    systems = dict.fromkeys(r.system for r in records)  # a handful of system prompts, each once
    texts = [*systems, *(text for r in records for text in (r.prompt, r.response))]
    tokenizer = train_tokenizer(texts, settings.tiny.vocab_size)
    return build_tiny_model(tokenizer, settings.tiny.spec()), tokenizer


def settings_json(settings: TrainSettings) -> dict[str, Any]:
    return json.loads(json.dumps(settings.model_dump(mode="json")))


def prepare_sft_run(
    settings: TrainSettings, lake: str | Path, out: Path, start_from: str | Path | None
) -> SftRun:
    """Seed, read and encode the states, build or load the model, wrap it for data parallelism under
    ``torchrun`` (``settings.strategy``), build the sampler and the optimiser."""
    world = init_world()
    check_shards(world, settings.strategy, settings.states_per_update, settings.micro_batch_states)
    device = device_for(world, pick_device(settings.device))
    if settings.torch_threads:
        torch.set_num_threads(settings.torch_threads)
    seed_everything(settings.seed)
    records, left_out = load_records(lake, [settings.train_split], settings.modes)
    eval_records, _ = load_records(lake, [settings.eval_split], settings.modes)
    model, tokenizer = starting_model(records, settings, start_from)
    model.to(device)
    if settings.activation_checkpointing:
        enable_activation_checkpointing(model)
    limits = settings.max_prompt_tokens, settings.max_response_tokens
    states, dropped = encode(records, tokenizer, *limits)
    if not states:
        left = dict(left_out + dropped)
        raise ValueError(f"no {settings.train_split} states to train on in {lake} (left out: {left})")
    eval_states, _ = encode(eval_records, tokenizer, *limits)
    weights = None
    if settings.class_resampling_alpha is not None:
        weights = power_law_weights([s.record.action for s in states], settings.class_resampling_alpha)
    body = HiddenStates(model)
    wrapped = wrap(body, world, settings.strategy, device)
    # built after wrapping: FSDP2 replaces each parameter by its shard, and the optimiser steps those
    optimizer = adam(model, settings.lr, settings.adam_betas, settings.adam_eps)
    trainer = Trainer(
        wrapped,
        optimizer,
        schedule(optimizer, settings.warmup_steps, settings.steps),
        clip=settings.clip_grad_norm,
        device=device,
        bf16=settings.bf16,
    )
    digest = data_hash(states, tokenizer_fingerprint(tokenizer))
    eval_states = eval_states[: settings.eval_max_states]
    return SftRun(
        settings=settings,
        out=out,
        model=model,
        tokenizer=tokenizer,
        states=states,
        eval_batches=micro_batches(world.shard(eval_states), settings.micro_batch_states, tokenizer, device),
        held_out_states=len(eval_states),
        sampler=StateSampler(len(states), settings.seed, weights),
        world=world,
        body=body,
        trainer=trainer,
        meta={
            "stage": "sft",
            "settings": settings_json(settings),
            "data_hash": digest,
            # what the model card says of the data
            "lake": str(lake),
            "train_states": len(states),
            "held_out_states": len(eval_states),
            "left_out": dict(left_out + dropped),
        },
        left_out=left_out + dropped,
        lake=Path(lake),
        sample_states=eval_states[: min(settings.eval_sample_states, settings.eval_max_states)],
    )


def restore(run: SftRun, folder: Path) -> int:
    """Continue ``folder``'s run: optimiser, schedule, RNG and sampler; returns its step."""
    meta = read_meta(folder)
    check_resumable(meta, run.meta["settings"], run.meta["data_hash"], run.world.size)
    restore_training_state(folder, run.model, run.trainer.optimizer, run.trainer.scheduler, run.world)
    run.sampler.load_state_dict(meta["sampler"])
    run.trainer.updates = meta["step"]
    run.meta["held_out_loss_start"] = meta["held_out_loss_start"]
    run.meta["held_out_start"] = meta["held_out_start"]
    return meta["step"]


def run_sft(
    settings: TrainSettings,
    lake: str | Path,
    out: str | Path,
    base: str | Path | None = None,
    resume: bool = False,
    stop_after: int | None = None,
    progress: bool = True,
) -> TrainSummary:
    """Train ``settings.steps`` updates on the lake's gold responses; return where the checkpoint is.

    ``resume`` continues from the newest checkpoint in ``out`` exactly (same settings and
    data required; ``base`` is then only recorded); ``stop_after`` ends this call after
    that update, with a checkpoint.
    """
    out = Path(out)
    resume_from = latest(out) if resume else None
    if resume and resume_from is None:
        raise FileNotFoundError(f"--resume: no checkpoint under {out / 'checkpoints'}")
    run = prepare_sft_run(settings, lake, out, resume_from or base)
    if base is not None:
        run.meta["base"] = str(base)
    start = restore(run, resume_from) if resume_from else 0
    # one writer: the other ranks' updates are the same update, and their file would race rank 0's
    metrics = (
        MetricsLog(out / "metrics.jsonl", resume_from=start if resume_from else None)
        if run.world.is_main
        else None
    )
    if start == 0:
        evaluation = run.held_out()
        run.meta["held_out_loss_start"] = evaluation["held_out_loss"]
        run.meta["held_out_start"] = evaluation
        if metrics:
            metrics.write({"kind": "eval", "step": 0, **evaluation})
    end = settings.steps if stop_after is None else min(settings.steps, stop_after)
    train_updates(run, metrics, start, end, progress)
    rows = metrics.rows() if metrics else []
    evaluations = [row for row in rows if row["kind"] == "eval"]
    responses = [{k: v for k, v in row.items() if k not in LOSS_ROW_KEYS} for row in evaluations]
    if evaluations:  # for the final checkpoint's model card
        run.meta["held_out_end"] = evaluations[-1]
    summary = TrainSummary(
        checkpoint=str(run.checkpoint(end) or ""),
        steps=end,
        skipped_steps=sum(row["skipped"] for row in rows if row["kind"] == "train"),
        train_states=len(run.states),
        held_out_states=run.held_out_states,
        held_out_loss_start=run.meta["held_out_loss_start"],
        held_out_loss_end=evaluations[-1]["held_out_loss"] if evaluations else None,
        left_out=dict(run.left_out),
        data_hash=run.meta["data_hash"],
        held_out_responses_start=(responses[0] or None) if responses else None,
        held_out_responses_end=(responses[-1] or None) if responses else None,
    )
    if run.world.is_main:
        (out / "summary.json").write_text(json.dumps(asdict(summary), indent=2))
    return summary


def train_updates(run: SftRun, metrics: MetricsLog | None, start: int, end: int, progress: bool) -> None:
    """Updates ``start+1 .. end`` with their metrics rows, held-out evaluations and step checkpoints
    (every rank runs them; rank 0, the one with ``metrics``, writes)."""
    s = run.settings
    bar = tqdm(total=s.steps, initial=start, disable=not (progress and metrics), desc="sft", unit="update")
    for step in range(start + 1, end + 1):
        report = run.update(PhaseTimer(run.trainer.device))
        if metrics:
            metrics.write({"kind": "train", **report.as_json()})
        bar.update(1)
        bar.set_postfix(loss=f"{report.loss:.3f}", lr=f"{report.lr:.2e}")
        if (s.eval_every and step % s.eval_every == 0) or step == s.steps:
            evaluation = run.held_out()
            if metrics:
                metrics.write({"kind": "eval", "step": step, **evaluation})
        if s.checkpoint_every and step % s.checkpoint_every == 0 and step != end:
            run.checkpoint(step)
    bar.close()
