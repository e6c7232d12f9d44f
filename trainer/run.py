"""The SFT run: records -> states -> updates, with held-out loss, metrics and checkpoints.

``OUT/metrics.jsonl`` gets one row per update (kind ``train``) and per held-out
evaluation (kind ``eval``); ``OUT/summary.json`` what went in and what came out.
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
from trainer.data import RecordText, State, StateSampler, collate, data_hash, encode, load_records
from trainer.data import power_law_weights
from trainer.loop import MetricsLog, PhaseTimer, Trainer, adam, schedule, seed_everything, split
from trainer.models import build_tiny_model, load_pretrained, tokenizer_fingerprint, train_tokenizer
from trainer.sft import held_out_loss, sft_loss

if TYPE_CHECKING:
    from trainer.config import TrainSettings


@dataclass
class RunSummary:
    checkpoint: str
    steps: int
    skipped_steps: int
    train_states: int
    held_out_states: int
    held_out_loss_start: float | None
    held_out_loss_end: float | None
    left_out: dict[str, int] = field(default_factory=dict)  # reason -> records not trained on
    data_hash: str = ""

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def starting_model(
    records: list[RecordText], settings: TrainSettings, base: str | Path | None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """``base`` as it is, or the tiny default with a tokenizer trained on the records' texts."""
    if base is not None:
        return load_pretrained(base)
    texts = (text for r in records for text in (r.system, r.prompt, r.response))
    tokenizer = train_tokenizer(texts, settings.tiny.vocab_size)
    return build_tiny_model(tokenizer, settings.tiny.spec()), tokenizer


def batches(states: list[State], size: int, pad_id: int, device: torch.device) -> list:
    return [collate(chunk, pad_id).to(device) for chunk in split(states, size)]


def settings_json(settings: TrainSettings) -> dict[str, Any]:
    return json.loads(json.dumps(settings.model_dump(mode="json")))


def run_sft(
    settings: TrainSettings,
    lake: str | Path,
    out: str | Path,
    base: str | Path | None = None,
    resume: bool = False,
    stop_after: int | None = None,
    progress: bool = True,
) -> RunSummary:
    """Train ``settings.steps`` updates on the lake's gold responses; return where the checkpoint is.

    ``resume`` continues from the newest checkpoint in ``out`` exactly (same settings and
    data required); ``stop_after`` ends this call after that update, with a checkpoint.
    """
    out = Path(out)
    device = pick_device(settings.device)
    if settings.torch_threads:
        torch.set_num_threads(settings.torch_threads)
    seed_everything(settings.seed)
    train_records, left_out = load_records(lake, [settings.train_split], settings.modes)
    eval_records, _ = load_records(lake, [settings.eval_split], settings.modes)
    resume_from = latest(out) if resume else None
    if resume and resume_from is None:
        raise FileNotFoundError(f"--resume: no checkpoint under {out}/checkpoints")
    model, tokenizer = starting_model(train_records, settings, resume_from or base)
    model.to(device)
    vocab = len(tokenizer)
    limits = settings.max_prompt_tokens, settings.max_response_tokens
    states, dropped = encode(train_records, tokenizer, *limits)
    eval_states, _ = encode(eval_records, tokenizer, *limits)
    eval_batches = batches(
        eval_states[: settings.eval_max_states], settings.micro_batch_states, tokenizer.pad_token_id, device
    )
    digest = data_hash(states, tokenizer_fingerprint(tokenizer))
    weights = None
    if settings.class_resampling_alpha is not None:
        weights = power_law_weights([s.record.action for s in states], settings.class_resampling_alpha)
    sampler = StateSampler(len(states), settings.seed, weights)
    optimizer = adam(model, settings.lr, settings.adam_betas, settings.adam_eps)
    scheduler = schedule(optimizer, settings.warmup_steps, settings.steps)
    trainer = Trainer(
        model, optimizer, scheduler, clip=settings.clip_grad_norm, device=device, bf16=settings.bf16
    )
    meta_base = {
        "stage": "sft",
        "settings": settings_json(settings),
        "data_hash": digest,
        "base": str(base or ""),
    }
    start, start_loss = 0, None
    if resume_from is not None:
        meta = read_meta(resume_from)
        check_resumable(meta, meta_base["settings"], digest)
        restore_training_state(resume_from, optimizer, scheduler)
        sampler.load_state_dict(meta["sampler"])
        start, start_loss = meta["step"], meta.get("held_out_loss_start")
        trainer.updates = start
    metrics = MetricsLog(out / "metrics.jsonl", resume_from=start if resume_from else None)

    def evaluate(step: int) -> float | None:
        if not eval_batches:
            return None
        loss = held_out_loss(model, eval_batches, vocab)
        metrics.write(
            {
                "kind": "eval",
                "step": step,
                "held_out_loss": loss,
                "states": len(eval_states[: settings.eval_max_states]),
            }
        )
        return loss

    def checkpoint(step: int) -> Path:
        meta = {**meta_base, "sampler": sampler.state_dict(), "held_out_loss_start": start_loss}
        return save_checkpoint(
            out, step, model, tokenizer, optimizer, scheduler, meta, settings.keep_checkpoints
        )

    if start == 0:
        start_loss = evaluate(0)
    end = settings.steps if stop_after is None else min(settings.steps, stop_after)
    skipped, saved, last_loss = 0, None, start_loss

    def loss_fn(m, b):
        return sft_loss(m, b, vocab)

    bar = tqdm(total=settings.steps, initial=start, disable=not progress, desc="sft", unit="update")
    for step in range(start + 1, end + 1):
        timer = PhaseTimer(device)
        with timer.phase("data"):
            chosen = [states[i] for i in sampler.take(settings.states_per_update)]
            micro = batches(chosen, settings.micro_batch_states, tokenizer.pad_token_id, device)
        report = trainer.step(micro, loss_fn, n_states=len(chosen), timer=timer)
        skipped += report.skipped
        metrics.write({"kind": "train", **report.as_json()})
        bar.update(1)
        bar.set_postfix(loss=f"{report.loss:.3f}", lr=f"{report.lr:.2e}")
        if settings.eval_every and step % settings.eval_every == 0 and step != settings.steps:
            last_loss = evaluate(step)
        if settings.checkpoint_every and step % settings.checkpoint_every == 0:
            saved = checkpoint(step)
    bar.close()
    if end == settings.steps:
        last_loss = evaluate(end)
    if saved is None or not saved.name.endswith(f"{end:06d}"):
        saved = checkpoint(end)
    summary = RunSummary(
        checkpoint=str(saved),
        steps=end,
        skipped_steps=skipped,
        train_states=len(states),
        held_out_states=len(eval_states[: settings.eval_max_states]),
        held_out_loss_start=start_loss,
        held_out_loss_end=last_loss,
        left_out=dict(Counter(left_out) + Counter(dropped)),
        data_hash=digest,
    )
    (out / "summary.json").write_text(json.dumps(summary.as_json(), indent=2))
    return summary
