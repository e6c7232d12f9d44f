"""The sweep that chose the main job's training: SFT configurations on the demo's lake, side by side.

    python bench/demo_training.py --lake sample/lake --out bench/.work/demo-training \
        --config small '{"tiny": {"hidden_size": 64, "num_layers": 2}}' \
        --config wide '{"tiny": {"hidden_size": 128, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2}}'

Each configuration is the main job's training (``flows.main_job.DEMO_TRAINING``) with the given values on
top, trained by ``trainer.run.run_sft`` itself on the lake, held-out responses judged by the evaluation's
check. One JSON line per configuration: its values, the wall seconds of set-up, updates and evaluations,
and every held-out evaluation (NLL, parse share, executable share, rejections), so a configuration's
learning curve and its cost read side by side. ``--optd NAME`` also runs the main job's OPTD from that
configuration's checkpoint.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hostinfo import describe as machine  # noqa: E402 - bench/ is the script's folder

from evaluation.executable import ScreenJudge  # noqa: E402
from flows.main_job import DEMO_OPTD, DEMO_TRAINING  # noqa: E402
from trainer.config import TrainSettings, optd_settings  # noqa: E402
from trainer.optd_run import run_optd  # noqa: E402
from trainer.run import run_sft  # noqa: E402

EVAL_KEYS = (
    "step",
    "held_out_loss",
    "parse_share",
    "executable_share",
    "rejected",
    "hit_token_cap",
    "screen_id_mass",
)


def merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``extra`` over ``base``, nested tables merged key by key (``tiny``, ``held_out_sampling``)."""
    out = dict(base)
    for key, value in extra.items():
        out[key] = merged(out.get(key, {}), value) if isinstance(value, dict) else value
    return out


def evaluations(run: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: r.get(k) for k in EVAL_KEYS} for r in rows if r["kind"] == "eval"]


def one(lake: Path, out: Path, name: str, values: dict[str, Any], optd: bool) -> dict[str, Any]:
    settings = TrainSettings(**merged(DEMO_TRAINING, values))
    started = time.perf_counter()
    # the demo's run folders are its own: a rerun replaces its runs
    summary = run_sft(
        settings, lake, out / name / "sft", progress=False, judge=ScreenJudge(lake), overwrite=True
    )
    result: dict[str, Any] = {
        "name": name,
        "values": values,
        "wall_s": round(time.perf_counter() - started, 1),
        "seconds": summary.seconds,
        "prepared_states": summary.prepared_states,
        "evaluations": evaluations(out / name / "sft"),
    }
    if optd:
        started = time.perf_counter()
        chosen = optd_settings(merged(DEMO_TRAINING, values), DEMO_OPTD)
        distilled = run_optd(chosen, lake, out / name / "optd", summary.checkpoint, progress=False,
                             judge=ScreenJudge(lake), overwrite=True)  # fmt: skip
        result["optd"] = {
            "wall_s": round(time.perf_counter() - started, 1),
            "seconds": distilled.seconds,
            "evaluations": evaluations(out / name / "optd"),
            "updates_mean": distilled.stage_figures.get("updates_mean"),
        }
    return result


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--lake", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / ".work" / "demo-training")
    parser.add_argument("--config", nargs=2, action="append", metavar=("NAME", "JSON"), required=True)
    parser.add_argument("--optd", action="append", default=[], help="configurations also distilled")
    args = parser.parse_args()
    print(json.dumps({"machine": machine(), "lake": str(args.lake)}), flush=True)
    for name, values in args.config:
        print(json.dumps(one(args.lake, args.out, name, json.loads(values), name in args.optd)), flush=True)


if __name__ == "__main__":
    main()
