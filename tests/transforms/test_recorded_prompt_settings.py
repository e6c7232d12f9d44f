"""The evaluation shows a simulator the prompts its lake's records were rendered with."""

from __future__ import annotations

from evaluation.executable import lake_environment
from transforms.config import Geometry, IngestSettings
from transforms.manifest import new_manifest, write_manifest
from transforms.prompts import PromptSettings
from transforms.records import recorded_prompt_settings


def test_the_records_window_and_the_ingest_geometry_are_what_the_evaluation_renders(tmp_path):
    # a lake whose ingest used a 700 px viewport and whose records showed 3 past steps and 5 clicks
    ingested = IngestSettings(geometry=Geometry(feed_viewport=700.0)).model_dump(mode="json")
    write_manifest(new_manifest(tmp_path, "ingest", 1.0, {}, {}, settings=ingested))
    shown = PromptSettings(window_single=3, recent_clicks=5)  # rendered with the default geometry
    write_manifest(new_manifest(tmp_path, "records", 1.0, {}, {}, settings=shown.model_dump(mode="json")))
    settings = recorded_prompt_settings(tmp_path)
    assert (settings.window_single, settings.recent_clicks, settings.window_cross) == (3, 5, 20)
    assert settings.geometry.feed_viewport == 700.0  # the ingest's, whatever the records run says
    assert lake_environment(tmp_path).prompt == settings


def test_a_lake_whose_records_recorded_nothing_gets_the_reference_prompts(tmp_path):
    settings = recorded_prompt_settings(tmp_path)
    assert settings == PromptSettings()  # PROTOCOL §3: 10 past steps, 20 clicks, 20 purchases
