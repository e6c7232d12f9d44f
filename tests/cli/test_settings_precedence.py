"""Settings precedence, as most command-line tools order it: flags > environment > file > defaults."""

from __future__ import annotations

from cli.settings import load_settings
from trainer.config import TrainSettings
from transforms.config import IngestSettings


def test_the_environment_beats_the_file_and_a_flag_beats_both(tmp_path, monkeypatch):
    config = tmp_path / "run.toml"
    config.write_text("[train]\nsteps = 5\nlr = 0.5\n")
    assert load_settings(TrainSettings, "train", config).steps == 5  # the file over the default (40)
    monkeypatch.setenv("TRAJFORGE_TRAIN_STEPS", "77")
    from_env = load_settings(TrainSettings, "train", config)
    assert (from_env.steps, from_env.lr) == (77, 0.5)  # the file's other keys stay
    assert load_settings(TrainSettings, "train", config, steps=9).steps == 9
    assert load_settings(TrainSettings, "train", None).steps == 77


def test_a_nested_variable_overrides_one_key_of_the_files_table(tmp_path, monkeypatch):
    config = tmp_path / "run.toml"
    config.write_text("[ingest]\nbuckets = 3\ngeometry = {feed_viewport = 600, screen_width = 390}\n")
    monkeypatch.setenv("TRAJFORGE_GEOMETRY__FEED_VIEWPORT", "650")
    settings = load_settings(IngestSettings, "ingest", config)
    assert settings.buckets == 3
    assert (settings.geometry.feed_viewport, settings.geometry.screen_width) == (650, 390)
