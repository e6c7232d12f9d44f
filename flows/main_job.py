"""The main job on the embedded default: the dataset pipeline, then a trained simulator and its
evaluation report, each stage a subflow exchanging paths.

    raw bundle -pipeline-> lake -train sft-> teacher -train optd-> checkpoint
        -evaluate-> report.json + report.html (the checkpoint against world, markov and random)

The training and evaluation sizes here are the demo's, small enough for a couple of CPU cores;
every value can be changed in the run's TOML (``[train]``, ``[optd]``, ``[main_job]``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow
from pydantic import BaseModel, Field

from extractors.config import ExtractSettings
from flows.evaluate import evaluate_flow
from flows.pipeline import pipeline_flow
from flows.train import train_flow
from trainer.config import TrainSettings
from trainer.optd_config import OPTDSettings
from transforms.config import IngestSettings
from transforms.prompts import PromptSettings

#: the demo's sizes: a few updates of a few states, short sampled answers (the defaults are larger)
DEMO_OPTD: dict[str, Any] = {"max_new_tokens": 64}
DEMO_TRAINING: dict[str, Any] = {
    "steps": 6,
    "states_per_update": 4,
    "micro_batch_states": 4,
    "eval_max_states": 16,
}


class MainJobSettings(BaseModel):
    """How much of the lake the main job's evaluation looks at (TOML ``[main_job]``)."""

    model_config = {"extra": "forbid"}

    baselines: list[str] = Field(
        ["world", "markov", "random"], description="simulators beside the checkpoint"
    )
    sessions: int = Field(24, ge=1, description="held-out sessions rolled out and replayed")
    effect_users: int = Field(16, ge=2, description="held-out users in the A/B effect test")
    max_new_tokens: int = Field(64, ge=1, description="tokens a checkpoint may write per answer")
    optd_steps: int = Field(2, ge=1, description="OPTD updates after the SFT warm-up")


def demo_training(values: dict[str, Any] | None = None) -> TrainSettings:
    """The demo's training size under the run's own ``[train]`` values."""
    return TrainSettings(**{**DEMO_TRAINING, **(values or {})})


def demo_optd(values: dict[str, Any] | None = None) -> OPTDSettings:
    """The demo's OPTD sampling under the run's own ``[optd]`` values."""
    return OPTDSettings(**{**DEMO_OPTD, **(values or {})})


@flow(name="main-job")
def main_job_flow(
    raw: str,
    workdir: str,
    settings: IngestSettings | None = None,
    records: PromptSettings | None = None,
    extract: ExtractSettings | None = None,
    train: TrainSettings | None = None,
    optd: OPTDSettings | None = None,
    job: MainJobSettings | None = None,
) -> dict[str, Any]:
    """Raw logs -> lake -> SFT teacher -> OPTD checkpoint -> evaluation report; returns every stage's
    summary and the paths."""
    job, train = job or MainJobSettings(), train or demo_training()
    root = Path(workdir)
    lake = str(root / "lake")
    dataset = pipeline_flow(raw, lake, settings=settings, extract=extract, records=records)
    teacher = train_flow(lake, str(root / "train" / "sft"), stage="sft", settings=train)
    distilled = train.model_copy(update={"steps": job.optd_steps, "warmup_steps": 0})
    checkpoint = train_flow(
        lake,
        str(root / "train" / "optd"),
        stage="optd",
        base=teacher,
        settings=distilled,
        optd=optd or demo_optd(),
    )
    evaluation = evaluate_flow(
        lake,
        [f"checkpoint:{checkpoint}", *job.baselines],
        str(root / "evaluation"),
        sessions=job.sessions,
        sampling={"max_new_tokens": job.max_new_tokens},
        effect_users=job.effect_users,
    )
    return {**dataset, "teacher": teacher, "checkpoint": checkpoint, "evaluation": evaluation}
