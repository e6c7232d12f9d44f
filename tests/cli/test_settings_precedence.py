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


def test_where_buckets_run_from_the_scale_section_the_environment_and_the_flags(tmp_path, monkeypatch):
    from cli.settings import ConfigError, load_scale

    config = tmp_path / "run.toml"
    config.write_text('[scale]\ntask_runner = "ray"\nray_address = "ray://file:10001"\nlocal_workers = 3\n')
    from_file = load_scale(config, None, None)
    assert (from_file.task_runner, from_file.address(), from_file.local_workers) == (
        "ray",
        "ray://file:10001",
        3,
    )
    monkeypatch.setenv("TRAJFORGE_RAY_ADDRESS", "ray://env:10001")
    assert load_scale(config, None, None).address() == "ray://env:10001"
    flagged = load_scale(config, "local", "ray://flag:10001")
    assert (flagged.task_runner, flagged.address(), flagged.local_workers) == ("local", "ray://flag:10001", 3)
    config.write_text("[scale]\ntask_runners = 'ray'\n")
    try:
        load_scale(config, None, None)
    except ConfigError as err:
        assert "unknown key 'task_runners'; did you mean 'task_runner'?" in str(err)
    else:
        raise AssertionError("a misspelt [scale] key must be refused")
