"""Replay shows the simulator the prompts its training records show: the same text, step for step,
history-window rationales included (PROTOCOL §3: the window holds observation, rationale, action),
but for what a detail page's layout decides, which replay takes from rollout's layout and the records
do not model (``tests.evaluation.test_environment.without_page_layout``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from evaluation.environment import EnvironmentSettings
from evaluation.loader import load_sessions
from evaluation.replay import ReplayCursor
from extractors.config import ExtractSettings
from extractors.pipeline import extract_lake
from synthetic.bundle import write_bundle
from tests.evaluation.test_environment import without_page_layout
from trainer.data import load_records
from transforms.ingest import ingest_bundle
from transforms.prompts import PromptSettings
from transforms.records import write_records

SHORT = PromptSettings(window_single=3, recent_clicks=5, recent_buys=5)


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> Path:
    """8 synthetic shoppers: ingest, records, offline extraction (rationales), records again."""
    root = tmp_path_factory.mktemp("replay-records")
    write_bundle(root / "raw", users=8, seed=3, fmt="parquet", parts_per_table=1)
    lake = root / "lake"
    ingest_bundle(root / "raw", lake)
    write_records(lake, modes=["single"], settings=SHORT)
    extract_lake(lake, ExtractSettings(progress=False, cache=False))
    write_records(lake, modes=["single"], settings=SHORT)
    return lake


def test_every_replayed_prompt_is_its_records_prompt(lake):
    records = {
        r.record_id: r
        for split in ("train", "val", "test")
        for r in load_records(lake, [split], ["single"])[0]
    }
    settings = EnvironmentSettings(prompt=SHORT)
    compared = with_thoughts = exact = 0
    for session in load_sessions(lake, settings=settings):
        for scored in ReplayCursor(session, settings):
            record = records.get(f"{session.session_id}:{scored.recorded.step}")
            if record is None:  # a state without a gold rationale is not a training record
                continue
            messages = scored.messages()
            as_recorded = [
                {"role": "system", "content": record.system},
                {"role": "user", "content": record.prompt},
            ]
            assert without_page_layout(messages) == without_page_layout(as_recorded), record.record_id
            compared += 1
            exact += messages == as_recorded
            user = messages[1]["content"]
            with_thoughts += "| thought: " in user
    # most states after the first of a session show an earlier step's rationale in their window
    assert compared > 50 and with_thoughts > compared // 2
    # every feed and review-list state, and every main-page one whose layout shows what the records do
    assert exact > compared // 2
