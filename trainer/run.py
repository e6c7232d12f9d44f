"""The run both training stages share, and the SFT stage on it: records in, a Hugging Face checkpoint out.

``TrainingRun`` is the skeleton: it reads the records, builds or loads the model, draws each
update's states from a pool that tokenizes a state the first time it is drawn, evaluates on the
held-out users, writes ``OUT/metrics.jsonl`` (one ``train`` row per update, one ``eval`` row per
held-out evaluation), checkpoints, resumes exactly, and ends with ``OUT/summary.json``. A stage
supplies its update and adds to the evaluation: the SFT warm-up is the skeleton itself (teacher-
forced NLL of the gold responses); OPTD (``trainer.optd_run``) extends it, as TRL's ``GKDTrainer``
extends its ``SFTTrainer``.

Held-out figures come from the users of ``eval_split`` (never trained on): the gold responses' NLL
on ``held_out_states`` states (one per session, a fixed choice: every run on a lake scores the
same states) and, with a response judge, the share of sampled responses that parse and that are
executable on their records' screens. The judge is passed in by the caller (the flow builds it
from the evaluation's environment): the trainer never imports the evaluation.

Probe states are intent-bearing states of training users that no update draws: on them a run
measures how much the intent tells the model (its gold NLL with and without the intent).

Under ``torchrun`` each rank trains on its shard of every update and scores its shard of the
held-out states (DDP or FSDP2, ``strategy``); rank 0 writes.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from trainer.anonymise import anonymised, id_token_table
from trainer.checkpoint import (
    check_resumable,
    checkpoints_dir,
    latest,
    read_meta,
    restore_training_state,
    save_checkpoint,
)
from trainer.copy_head import FixedWeights, copied_tokens, wire_copy_head
from trainer.curves import write_training_curves
from trainer.data import (
    Batch,
    EncodedState,
    RecordText,
    StatePool,
    StateSampler,
    check_users_apart,
    collate,
    data_hash,
    encode,
    load_records,
    power_law_weights,
    prompt_ids,
    records_hash,
    response_ids,
    spread_over_sessions,
)
from trainer.distributed import World, check_shards, device_for, init_world, sum_over_ranks, unsharded, wrap
from trainer.generation import HFGenerator
from trainer.loop import (
    MetricsLog,
    PhaseTimer,
    StepReport,
    Trainer,
    adam,
    autocast,
    schedule,
    seed_everything,
    seeded,
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
from trainer.pieces import ACTION_FIRST_PIECES
from trainer.prepared import PREPARED_FILE, load_prepared, save_prepared
from trainer.run_folder import SUMMARY_FILE, check_run_folder, start_afresh
from trainer.sft import (
    IdNotOneToken,
    ScreenIdBatch,
    SFTObjective,
    held_out_loss,
    screen_id_batch,
    screen_id_nll,
    state_nll,
    states_per_scored_token,
)
from trainer.tensorboard_log import tensorboard_mirrors

if TYPE_CHECKING:
    from trainer.config import TrainSettings

ROW_BOOKKEEPING = ("kind",)


class ResponseJudge(Protocol):
    """Judges sampled responses on their records' screens (PROTOCOL §2): the evaluation's check.

    Returns ``parse_share``, ``executable_share``, ``judged``, ``rejected`` (reason -> count) and
    ``no_screen`` (reason -> count) for the i-th text answering ``record_ids[i]``.
    """

    def __call__(self, record_ids: Sequence[str], texts: Sequence[str]) -> dict[str, Any]: ...


EvaluationHook = Callable[[dict[str, Any]], None]  # called on rank 0 with each eval row once written


@dataclass
class TrainSummary:
    """What a run trained on and what came out (``OUT/summary.json``)."""

    stage: str
    checkpoint: str
    steps: int
    skipped_steps: int
    train_states: int  # records the updates draw from
    prepared_states: int  # of those, the ones this run tokenized (every drawn one)
    held_out_states: int
    held_out_users: int
    held_out_start: dict[str, Any] | None
    held_out_end: dict[str, Any] | None
    left_out: dict[str, int] = field(default_factory=dict)  # reason -> records not trained on
    data_hash: str = ""
    seconds: dict[str, float] = field(default_factory=dict)  # set-up, updates, evaluations
    stage_figures: dict[str, Any] = field(default_factory=dict)  # what the stage adds (OPTD: part means)


def resolve_checkpoint(path: str | Path, what: str = "--base") -> Path:
    """A model folder as it is, or a run folder's newest checkpoint; anything else is one clear error."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{what} {path} does not exist")
    if (path / "config.json").is_file():
        return path
    newest = latest(path)
    if newest is not None:
        return newest
    raise ValueError(
        f"{what} {path} is neither a model folder (no config.json) nor a run folder "
        "(no checkpoints/step-* inside)"
    )


def run_folder_of(checkpoint: Path) -> Path | None:
    """The run folder a trajforge checkpoint sits in (``RUN/checkpoints/step-N``), or None."""
    if checkpoint.parent.name == "checkpoints" and (checkpoint.parent.parent / SUMMARY_FILE).exists():
        return checkpoint.parent.parent
    return None


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def micro_batches(
    states: Sequence[EncodedState],
    size: int,
    tokenizer: PreTrainedTokenizerBase,
    device: torch.device,
    unscored: torch.Tensor | None = None,
) -> list[Batch]:
    """``states`` in batches of ``size``; ``unscored``: response tokens not predicted (a copy head's ids)."""
    batches = [collate(chunk, tokenizer.pad_token_id).unscored(unscored) for chunk in split(states, size)]
    return [batch.to(device) for batch in batches]


def starting_model(
    records: Sequence[RecordText],
    settings: TrainSettings,
    base: str | Path | None,
    lake: str | Path | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """``base`` as it is, or the tiny default with a tokenizer trained on a sample of the records' texts
    (``tiny.tokenizer_records`` of them, drawn by the run's seed: the texts repeat, and a sample of a few
    thousand gives nearly the merges of the whole table in a fraction of the time). Each record's system
    prompt counts once per record, as often as the model reads it, so its words get tokens of their own."""
    if base is not None:
        return load_pretrained(base)
    generator = torch.Generator().manual_seed(settings.seed)
    order = torch.randperm(len(records), generator=generator)[: settings.tiny.tokenizer_records]
    sample = [records[i] for i in sorted(order.tolist())]
    texts = [text for r in sample for text in (r.system, r.prompt, r.response)]
    tiny = settings.tiny
    whole = [*tiny.whole_tokens, *(sorted({r.action for r in records}) if tiny.action_tokens else [])]
    if any(r.response.startswith('{"action":') for r in sample):
        whole += ACTION_FIRST_PIECES
    item_ids = catalog_item_ids(lake) if tiny.item_id_tokens else []
    tokenizer = train_tokenizer(texts, tiny.vocab_size, [*whole, *item_ids], split_digits=tiny.split_digits)
    model = build_tiny_model(tokenizer, settings.tiny.spec())
    if tiny.copy_head:
        wire_copy_head(model, tokenizer, item_ids)
    return model, tokenizer


def catalog_item_ids(lake: str | Path | None) -> list[str]:
    """Every item id of the lake's catalog, sorted (``tiny.item_id_tokens``)."""
    if lake is None:
        raise ValueError("tiny.item_id_tokens needs the lake whose catalog ids become tokens")
    import polars as pl

    from transforms.lake import scan_table

    return (
        scan_table(lake, "items", ["item_id"])
        .select(pl.col("item_id").unique().sort())
        .collect()["item_id"]
        .to_list()
    )


def settings_json(settings: TrainSettings) -> dict[str, Any]:
    return json.loads(json.dumps(settings.model_dump(mode="json")))


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


def intent_bearing(records: Sequence[RecordText]) -> list[RecordText]:
    return [r for r in records if r.intent]


class TrainingRun:
    """One training run: everything a stage shares (see the module's docstring); the SFT update."""

    stage: ClassVar[str] = "sft"

    def __init__(
        self,
        settings: TrainSettings,
        lake: str | Path,
        out: str | Path,
        start_from: str | Path | None,
        judge: ResponseJudge | None = None,
        on_evaluation: EvaluationHook | None = None,
    ) -> None:
        started = time.perf_counter()
        self.settings, self.lake, self.out = settings, Path(lake), Path(out)
        self.judge, self.on_evaluation = judge, on_evaluation
        self.world = init_world()
        check_shards(self.world, settings.strategy, settings.states_per_update, settings.micro_batch_states)
        self.device = device_for(self.world, pick_device(settings.device))
        if settings.torch_threads:
            torch.set_num_threads(settings.torch_threads)
        seed_everything(settings.seed)
        pool_records, held_out_records = self.read_records()
        self.records_hash = records_hash(self.lake)
        self.check_base()
        self.model, self.tokenizer = self.load_model(pool_records, start_from)
        self.model.to(self.device)
        if settings.activation_checkpointing:
            enable_activation_checkpointing(self.model)
        self.pool = self.build_pool(pool_records)
        self.id_tokens = self.anonymising_ids()
        self.held_out = self.held_out_states(held_out_records)
        check_users_apart(self.pool.records, [s.record for s in self.held_out])
        self.probe = self.encode_probe()
        self.body = HiddenStates(self.model)
        self.copied = copied_tokens(self.model)  # a copy head's ids: the circuit's, left out of the loss
        self.trainer = self.build_trainer()
        self.sampler = self.build_sampler()
        self.meta = self.base_meta()
        self._held_out_batches: list[Batch] | None = None
        self.seconds = {"set_up": time.perf_counter() - started, "updates": 0.0, "evaluations": 0.0}

    def read_records(self) -> tuple[list[RecordText], list[RecordText]]:
        """The pool's records (the probe states kept out) and the held-out users' records."""
        s = self.settings
        records, self.left_out = load_records(self.lake, [s.train_split], s.modes)
        held_out, _ = load_records(self.lake, [s.eval_split], s.modes)
        self.probe_records = spread_over_sessions(intent_bearing(records), s.probe_states)
        probe_keys = {r.key for r in self.probe_records}
        pool = self.pool_records([r for r in records if r.key not in probe_keys])
        if not pool:
            raise ValueError(
                f"no {s.train_split} states to train on in {self.lake} (left out: {dict(self.left_out)})"
            )
        return pool, held_out

    def build_trainer(self) -> Trainer:
        s = self.settings
        wrapped = wrap(self.body, self.world, s.strategy, self.device)
        # built after wrapping: FSDP2 replaces each parameter by its shard, and the optimiser steps those
        optimizer = adam(self.model, s.lr, s.adam_betas, s.adam_eps)
        fixed = FixedWeights.of(self.model)
        if fixed is not None and self.world.active and s.strategy == "fsdp":
            raise ValueError("a model with a copy head trains in one process or under ddp, not fsdp")
        return Trainer(
            wrapped,
            optimizer,
            schedule(optimizer, s.warmup_steps, s.steps),
            clip=s.clip_grad_norm,
            device=self.device,
            bf16=s.bf16,
            fixed=fixed,
        )

    def build_sampler(self) -> StateSampler:
        alpha = self.settings.class_resampling_alpha
        weights = None if alpha is None else power_law_weights([r.action for r in self.pool.records], alpha)
        return StateSampler(len(self.pool), self.settings.seed, weights)

    def base_meta(self) -> dict[str, Any]:
        """What every checkpoint records (trainer.json, the model card): settings, data, held-out users."""
        return {
            "stage": self.stage,
            "run": uuid.uuid4().hex,  # whose checkpoints pruning may remove; a resume keeps the saved one
            "settings": settings_json(self.settings),
            "data_hash": data_hash(self.pool.records, tokenizer_fingerprint(self.tokenizer)),
            "lake": str(self.lake),
            "records_hash": self.records_hash,
            "train_states": len(self.pool),
            "left_out": dict(self.left_out),
            "held_out": {
                "split": self.settings.eval_split,
                "states": len(self.held_out),
                "users": len({s.record.user_id for s in self.held_out}),
            },
        }

    # --- what a stage may change --------------------------------------------------------------

    def pool_records(self, records: list[RecordText]) -> list[RecordText]:
        """The records the updates draw from (SFT: every one with a gold response)."""
        return records

    def load_model(
        self, records: Sequence[RecordText], start_from: str | Path | None
    ) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
        return starting_model(records, self.settings, start_from, self.lake)

    def build_pool(self, records: list[RecordText]) -> StatePool:
        """SFT's pool: a share of the intent-bearing states (``teacher_intent_share``, chosen by a hash of
        the key and the seed) is trained with the intent in its prompt."""
        s = self.settings
        with_intent = frozenset(
            r.key for r in intent_bearing(records) if _unit_hash(s.seed, r.key) < s.teacher_intent_share
        )
        return StatePool(
            records, self.tokenizer, s.max_prompt_tokens, s.max_response_tokens, False, with_intent
        )

    def anonymising_ids(self) -> torch.Tensor | None:
        """The catalog's id tokens an SFT update anonymises with (``anonymise_item_ids``); None: off."""
        if not self.settings.anonymise_item_ids:
            return None
        return id_token_table(self.tokenizer, catalog_item_ids(self.lake))

    def drawn(self, k: int) -> list[EncodedState]:
        """``draw``, each state's ids anonymised where the settings say so."""
        states = self.draw(k)
        if self.id_tokens is None:
            return states
        return [anonymised(state, self.id_tokens) for state in states]

    def update(self, timer: PhaseTimer) -> tuple[StepReport, dict[str, Any]]:
        """One SFT update, its loss the mean over all ranks' states; no extra row values."""
        with timer.phase("data"):
            states = self.drawn(self.settings.states_per_update)
            batches: list[Batch | ScreenIdBatch] = list(
                micro_batches(
                    self.world.shard(states),
                    self.settings.micro_batch_states,
                    self.tokenizer,
                    self.device,
                    self.copied,
                )
            )
            batches += self.screen_id_batches(states)
        weight = self.settings.screen_id_weight
        per_token = None
        if self.settings.sft_averaging == "per_token":
            per_token = states_per_scored_token(states, self.copied)
        objective = SFTObjective(
            self.body.head, self.vocab, last=batches[-1], screen_id_weight=weight, states_per_token=per_token
        )
        report = self.trainer.step(batches, objective, self.world.divisor(len(states)), timer=timer)
        return with_sums_over_ranks(report, self.world, self.device), {}

    def screen_id_batches(self, states: list[EncodedState]) -> list[ScreenIdBatch]:
        """The screen-id loss's batch: the update's own states and ``screen_id_states`` more (off: none)."""
        s = self.settings
        if not s.screen_id_weight:
            return []
        drawn = self.world.shard([*states, *self.drawn(s.screen_id_states)])
        batch = screen_id_batch(drawn, self.tokenizer, s.screen_id_tail)
        return [] if batch is None else [batch.to(self.device)]

    def evaluate(self) -> dict[str, Any]:
        """One eval row's values: the held-out NLL, the sampled held-out responses judged, and the probe."""
        row: dict[str, Any] = {"held_out_loss": None}
        if self.held_out:
            batches = self.held_out_batches()
            row["held_out_loss"] = held_out_loss(self.body, batches, self.vocab, self.world, self.device)
        return row | (self.held_out_responses() or {}) | self.screen_id_values() | self.probe_values()

    @torch.no_grad()
    def screen_id_values(self) -> dict[str, float]:
        """Where the held-out prompts list the ids in view, each one token: the mean probability the model
        gives to writing one of them after a click's opening, reading the whole prompt (what a sampled
        click reads). Every rank scores all of them: a few dozen states, no collective."""
        try:
            batches = [screen_id_batch(chunk, self.tokenizer, None) for chunk in split(self.held_out, 8)]
        except IdNotOneToken:
            return {}
        batches = [b.to(self.device) for b in batches if b is not None]
        if not batches:
            return {}
        self.body.eval()
        with unsharded(self.body):
            nll = torch.cat([screen_id_nll(self.body, self.body.head, b, self.vocab) for b in batches])
        self.body.train()
        return {"screen_id_mass": float(torch.exp(-nll).mean())}

    def probe_values(self) -> dict[str, float]:
        """The model's own gold NLL on the probe states without and with the intent in the prompt."""
        if not self.probe:
            return {}
        plain, privileged = self.probe
        return intent_gain(
            self.body, self.body.head, plain, privileged, self.vocab, self.tokenizer, self.device
        )

    def stage_summary(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        return {}

    def check_lineage(self, meta: dict[str, Any]) -> None:
        """What a resume must find unchanged besides settings and data (OPTD: the teacher, the intents)."""

    def check_base(self) -> None:
        """Refuse a starting checkpoint the run must not build on, before any model is loaded (OPTD: a
        teacher trained on another lake's records); SFT starts from a pretrained model, no lineage."""

    # --- the skeleton -------------------------------------------------------------------------

    @property
    def vocab(self) -> int:
        return len(self.tokenizer)

    def draw(self, k: int) -> list[EncodedState]:
        """The next ``k`` states within the length limits (one too long is counted and another drawn)."""
        chosen: list[EncodedState] = []
        while len(chosen) < k:
            if self.pool.prepared == len(self.pool) and not any(self.pool.encoded.values()):
                raise ValueError(
                    f"no training state fits the length limits (dropped: {dict(self.pool.dropped)})"
                )
            for index in self.sampler.take(k - len(chosen)):
                state = self.pool.get(index)
                if state is not None:
                    chosen.append(state)
        return chosen

    def held_out_states(self, records: list[RecordText]) -> list[EncodedState]:
        s = self.settings
        chosen = spread_over_sessions(records, s.held_out_states)
        states, dropped = encode(chosen, self.tokenizer, s.max_prompt_tokens, s.max_response_tokens)
        self.left_out += Counter({f"held_out_{reason}": n for reason, n in dropped.items()})
        return states

    def encode_probe(self) -> tuple[list[EncodedState], list[EncodedState]] | None:
        """Each probe state twice: with the plain prompt and with the intent appended."""
        if not self.probe_records:
            return None
        plain = [
            EncodedState(
                r, prompt_ids(self.tokenizer, r.messages()), response_ids(self.tokenizer, r.response)
            )
            for r in self.probe_records
        ]
        privileged = [
            EncodedState(r, prompt_ids(self.tokenizer, r.privileged_messages()), s.response_ids)
            for r, s in zip(self.probe_records, plain, strict=True)
        ]
        return plain, privileged

    def held_out_batches(self) -> list[Batch]:
        """This rank's shard of the held-out states, batched once."""
        if self._held_out_batches is None:
            shard = self.world.shard(self.held_out)
            self._held_out_batches = micro_batches(
                shard, self.settings.micro_batch_states, self.tokenizer, self.device, self.copied
            )
        return self._held_out_batches

    def held_out_responses(self) -> dict[str, Any] | None:
        """Responses sampled from a fixed seed on the first ``held_out_sampled`` held-out states, judged.

        Every rank samples the same responses (same weights, same seed) with the weights gathered once
        under FSDP2; rank 0 writes the report."""
        chosen = self.held_out[: self.settings.held_out_sampled]
        if self.judge is None or not chosen:
            return None
        responses = self.sample([s.prompt_ids for s in chosen])
        texts = self.tokenizer.batch_decode(responses, skip_special_tokens=True)
        report = self.judge([s.record.record_id for s in chosen], texts)
        capped = sum(1 for r in responses if not r or r[-1] not in self.eos_ids())
        return report | {"sampled": len(chosen), "hit_token_cap": capped}

    def eos_ids(self) -> list[int]:
        return HFGenerator(self.model, self.tokenizer, self.settings.held_out_sampling).eos_ids

    def sample(self, prompts: list[list[int]]) -> list[list[int]]:
        """Held-out responses from the current weights, from their own seeded RNG stream."""
        generator = HFGenerator(self.model, self.tokenizer, self.settings.held_out_sampling)
        responses: list[list[int]] = []
        with (
            unsharded(self.body),
            seeded(self.settings.seed, self.device),
            autocast(self.device, self.settings.bf16),
        ):
            for chunk in split(prompts, 32):
                responses += generator.generate(list(chunk)).response_ids
        return responses

    def checkpoint(self, step: int) -> Path | None:
        """Every rank calls it (sharded weights and optimizer state are gathered together); rank 0 writes."""
        t, meta = self.trainer, {**self.meta, "sampler": self.sampler.state_dict()}
        parts = (self.model, self.tokenizer, t.optimizer, t.scheduler)
        keep = self.settings.keep_checkpoints
        return save_checkpoint(self.out, step, *parts, meta, keep=keep, world=self.world)

    def restore(self, folder: Path) -> int:
        """Continue ``folder``'s run: optimiser, schedule, RNG and sampler; returns its step."""
        meta = read_meta(folder)
        check_resumable(meta, self.meta["settings"], self.meta["data_hash"], self.world.size)
        self.check_lineage(meta)
        restore_training_state(folder, self.model, self.trainer.optimizer, self.trainer.scheduler, self.world)
        self.sampler.load_state_dict(meta["sampler"])
        self.trainer.updates = meta["step"]
        self.meta["run"] = meta.get("run")
        self.meta["held_out_start"] = meta.get("held_out_start")
        return meta["step"]

    def evaluation_row(self, step: int, metrics: MetricsLog | None) -> dict[str, Any] | None:
        """The evaluation at ``step``, written as an eval row; None (and no row) when it measured nothing
        (no held-out and no probe states)."""
        started = time.perf_counter()
        values = self.evaluate()
        self.seconds["evaluations"] += time.perf_counter() - started
        if all(value is None for value in values.values()):
            return None
        row = {"kind": "eval", "step": step, **values}
        if metrics:
            metrics.write(row)
            if self.on_evaluation:
                self.on_evaluation(row)
        return row

    def fit(
        self,
        resume_from: Path | None = None,
        stop_after: int | None = None,
        progress: bool = True,
        overwrite: bool = False,
    ) -> TrainSummary:
        """Updates up to ``settings.steps`` (or ``stop_after``), evaluations, checkpoints, the summary.

        A new run (no ``resume_from``) refuses an ``out`` holding another run, unless ``overwrite``:
        then that run's outputs are removed first."""
        s = self.settings
        start = self.restore(resume_from) if resume_from else 0
        # one writer: the other ranks' updates are the same update, and their file would race rank 0's
        metrics = None
        if self.world.is_main:
            if resume_from is None:
                start_afresh(self.out, overwrite)
            resumed_at = start if resume_from else None
            mirrors = tensorboard_mirrors(self.out, resumed_at)
            metrics = MetricsLog(self.out / "metrics.jsonl", resume_from=resumed_at, mirrors=mirrors)
        if start == 0:
            first = self.evaluation_row(0, metrics)
            self.meta["held_out_start"] = strip_bookkeeping(first) if first else None
        end = s.steps if stop_after is None else min(s.steps, stop_after)
        bar = tqdm(
            total=s.steps, initial=start, disable=not (progress and metrics), desc=self.stage, unit="update"
        )
        for step in range(start + 1, end + 1):
            started = time.perf_counter()
            report, extras = self.update(PhaseTimer(self.device))
            self.seconds["updates"] += time.perf_counter() - started
            if metrics:
                metrics.write({"kind": "train", **report.as_json(), **extras})
            bar.update(1)
            bar.set_postfix(loss=f"{report.loss:.4f}", lr=f"{report.lr:.2e}")
            if (s.eval_every and step % s.eval_every == 0) or step == s.steps:
                self.evaluation_row(step, metrics)
            if s.checkpoint_every and step % s.checkpoint_every == 0 and step != end:
                self.checkpoint(step)
        bar.close()
        rows = metrics.rows() if metrics else []
        evaluations = [row for row in rows if row["kind"] == "eval"]
        self.meta["held_out_end"] = strip_bookkeeping(evaluations[-1]) if evaluations else None
        summary = self.summary(rows, end, self.checkpoint(end))
        if metrics:
            metrics.close()
            save_prepared(self.out / PREPARED_FILE, self.pool, self.tokenizer)
            (self.out / SUMMARY_FILE).write_text(json.dumps(asdict(summary), indent=2))
            write_training_curves(self.out, self.stage)
        return summary

    def summary(self, rows: list[dict[str, Any]], steps: int, checkpoint: Path | None) -> TrainSummary:
        return TrainSummary(
            stage=self.stage,
            checkpoint=str(checkpoint or ""),
            steps=steps,
            skipped_steps=sum(row["skipped"] for row in rows if row["kind"] == "train"),
            train_states=len(self.pool),
            prepared_states=self.pool.prepared,
            held_out_states=len(self.held_out),
            held_out_users=self.meta["held_out"]["users"],
            held_out_start=self.meta.get("held_out_start"),
            held_out_end=self.meta["held_out_end"],
            left_out=dict(self.left_out + self.pool.dropped),
            data_hash=self.meta["data_hash"],
            seconds={k: round(v, 3) for k, v in self.seconds.items()},
            stage_figures=self.stage_summary(rows),
        )


def strip_bookkeeping(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in ROW_BOOKKEEPING}


def _unit_hash(seed: int, key: str) -> float:
    """A number in [0, 1) fixed by (seed, key): which states a share selects, the same on every rank."""
    digest = hashlib.sha256(f"{seed}\x00{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


@torch.no_grad()
def intent_gain(
    body: torch.nn.Module,
    head: Callable[[], tuple[torch.Tensor, torch.Tensor | None]],
    plain: list[EncodedState],
    privileged: list[EncodedState],
    vocab: int,
    tokenizer: PreTrainedTokenizerBase,
    device: torch.device,
) -> dict[str, float]:
    """Mean gold NLL (nats/token, state means) without and with the intent, and the gain between them."""
    body.eval()
    means = []
    for states in (plain, privileged):
        per_state = [
            state_nll(body, head, batch, vocab) for batch in micro_batches(states, 8, tokenizer, device)
        ]
        means.append(float(torch.cat(per_state).mean()))
    return {
        "probe_nll_plain": means[0],
        "probe_nll_intent": means[1],
        "probe_intent_gain": means[0] - means[1],
    }


def run_sft(
    settings: TrainSettings,
    lake: str | Path,
    out: str | Path,
    base: str | Path | None = None,
    resume: bool = False,
    stop_after: int | None = None,
    progress: bool = True,
    judge: ResponseJudge | None = None,
    on_evaluation: EvaluationHook | None = None,
    overwrite: bool = False,
) -> TrainSummary:
    """Train ``settings.steps`` updates on the lake's gold responses; return where the checkpoint is.

    ``base``: a pretrained model folder or a run folder (its newest checkpoint); the tiny default
    without one. ``resume`` continues from the newest checkpoint in ``out`` exactly (same settings
    and data required; ``base`` is then only recorded); ``overwrite`` replaces the run ``out`` holds,
    which is refused without one of the two; ``stop_after`` ends this call after that update, with a
    checkpoint. ``judge`` checks sampled held-out responses on their screens.
    """
    out = Path(out)
    check_run_folder(out, resume, overwrite)
    resume_from = resume_point(out) if resume else None
    base = resolve_checkpoint(base) if base is not None else None
    run = TrainingRun(settings, lake, out, resume_from or base, judge, on_evaluation)
    if base is not None:
        run.meta["base"] = str(base)
    return run.fit(resume_from, stop_after, progress, overwrite)


def resume_point(out: Path) -> Path:
    """The newest checkpoint in ``out``, where ``--resume`` continues; FileNotFoundError without one."""
    newest = latest(out)
    if newest is None:
        raise FileNotFoundError(
            f"--resume: no checkpoint under {checkpoints_dir(out)} to continue from; "
            "--overwrite starts the run over"
        )
    return newest


def previously_prepared(run_dir: Path | None, pool: StatePool, tokenizer: PreTrainedTokenizerBase) -> int:
    """Seed ``pool`` with the states a run in ``run_dir`` tokenized with the same tokenizer."""
    if run_dir is None:
        return 0
    return load_prepared(run_dir / PREPARED_FILE, pool, tokenizer)
