"""The evaluation shows a simulator the prompts its lake's records were rendered with."""

from __future__ import annotations

import json

from evaluation.executable import lake_environment
from transforms.config import Geometry, IngestSettings
from transforms.lake import manifest_path
from transforms.prompts import PromptSettings
from transforms.records import recorded_prompt_settings, records_summary_path


def test_the_records_window_and_the_ingest_geometry_are_what_the_evaluation_renders(tmp_path):
    # a lake whose ingest used a 700 px viewport and whose records showed 3 past steps and 5 clicks
    manifest = manifest_path(tmp_path)
    manifest.parent.mkdir(parents=True)
    geometry = Geometry(feed_viewport=700.0)
    manifest.write_text(json.dumps({"settings": IngestSettings(geometry=geometry).model_dump(mode="json")}))
    shown = PromptSettings(window_single=3, recent_clicks=5)  # rendered with the default geometry
    summary = records_summary_path(tmp_path)
    summary.parent.mkdir(parents=True)
    summary.write_text(json.dumps({"records": {"settings": shown.model_dump(mode="json")}}))
    settings = recorded_prompt_settings(tmp_path)
    assert (settings.window_single, settings.recent_clicks, settings.window_cross) == (3, 5, 20)
    assert settings.geometry.feed_viewport == 700.0  # the ingest's, whatever the records run says
    assert lake_environment(tmp_path).prompt == settings


def test_a_lake_whose_records_recorded_nothing_gets_the_reference_prompts(tmp_path):
    settings = recorded_prompt_settings(tmp_path)
    assert settings == PromptSettings()  # PROTOCOL §3: 10 past steps, 20 clicks, 20 purchases
