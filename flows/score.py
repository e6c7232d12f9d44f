"""``trajforge score``: the UserArena figures of simulated traces against real ones, as one JSON object.

Scoring is local and takes seconds, so this is a plain function rather than a Prefect flow: a flow
run would add its start-up and its log lines to a command whose stdout is meant to be piped.
"""

from __future__ import annotations

import json
from pathlib import Path

from evaluation.metrics import rounded, score
from evaluation.traces import load_replay, load_traces


def score_files(real: str | Path, sim: str | Path, replay: str | Path | None = None) -> dict[str, object]:
    """Every figure of ``sim`` against ``real`` (either trace format), rounded for reporting."""
    replay_frame = load_replay(replay) if replay is not None else None
    return rounded(score(load_traces(real), load_traces(sim), replay_frame))


def score_command(real: str | Path, sim: str | Path, replay: str | Path | None = None) -> dict[str, object]:
    """CLI entry: print the figures as one JSON object on stdout."""
    figures = score_files(real, sim, replay)
    print(json.dumps(figures, indent=2))
    return figures
