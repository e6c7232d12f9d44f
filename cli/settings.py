"""One settings loader for every command: defaults, then a TOML file's section, then the environment,
then flags, each above the one before (the order of most command-line tools).

A TOML file may hold every stage's section (``[ingest]``, ``[records]``, ``[extract]``, ``[train]``,
``[optd]``, ``[main_job]``, and ``[scale]``: where per-bucket tasks run); each command reads its own, so
one file can configure a whole run. A section or key that no stage declares is refused with the nearest
declared name: a misspelt one would otherwise be ignored and its stage run on defaults without a word.
"""

from __future__ import annotations

import difflib
import importlib
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_settings import BaseSettings, EnvSettingsSource

if TYPE_CHECKING:
    from flows.buckets import ScaleSettings

Settings = TypeVar("Settings", bound=BaseModel)

#: TOML section -> the settings model its keys are checked against (imported only when read)
SECTIONS: dict[str, str] = {
    "ingest": "transforms.config:IngestSettings",
    "records": "transforms.prompts.render:PromptSettings",
    "extract": "extractors.config:ExtractSettings",
    "train": "trainer.config:TrainSettings",
    "optd": "trainer.config:OPTDSettings",
    "main_job": "flows.main_job:MainJobSettings",
    "scale": "flows.buckets:ScaleSettings",
}


class ConfigError(ValueError):
    """A TOML config the commands cannot use, said in one line naming the file and the key."""


def load_settings(model: type[Settings], section: str, config: Path | None, /, **flags: object) -> Settings:
    """``model`` from ``[section]`` of the TOML file ``config`` (if given), a pydantic-settings model's
    environment variables over it, and the flags that were set (not None) over both.
    The first three are positional only: a flag may be called ``model`` (the extract model)."""
    values = merged(toml_section(config, section), environment_values(model))
    values.update({k: v for k, v in flags.items() if v is not None})
    return settings_from(model, values, f"[{section}]")


def environment_values(model: type[BaseModel]) -> dict[str, Any]:
    """The values ``model``'s environment variables set (pydantic-settings' own source reads them);
    none for a plain model."""
    if not issubclass(model, BaseSettings):
        return {}
    return EnvSettingsSource(model)()


def merged(below: dict[str, Any], above: dict[str, Any]) -> dict[str, Any]:
    """``above`` over ``below``, nested tables key by key (an environment variable for one nested key
    leaves the file's other keys of that table)."""
    out = dict(below)
    for key, value in above.items():
        nested = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = merged(out[key], value) if nested else value
    return out


def settings_from(model: type[Settings], values: dict[str, Any], where: str) -> Settings:
    """``model(**values)``; a value it refuses is one ConfigError naming ``where`` and the key."""
    try:
        return model(**values)
    except ValidationError as err:
        raise ConfigError(f"{where}: {validation_line(err)}") from None


def validation_line(err: ValidationError) -> str:
    """A pydantic error as one line: each refused key with pydantic's reason and the value given."""
    parts = []
    for problem in err.errors():
        key = ".".join(str(part) for part in problem["loc"]) or "value"
        given = f" (got {problem['input']!r})" if "input" in problem and problem["type"] != "missing" else ""
        parts.append(f"{key}: {problem['msg']}{given}")
    return "; ".join(parts)


def toml_section(config: Path | None, section: str) -> dict:
    """``[section]`` of the TOML file ``config`` (empty without one), every key one its model declares."""
    if config is None:
        return {}
    values = read_config(config).get(section, {})
    if section in SECTIONS:
        check_keys(values, settings_model(section), f"{config} [{section}]")
    return values


def read_config(config: Path) -> dict[str, Any]:
    """The TOML file ``config``, each top-level name a declared section; else one ConfigError."""
    try:
        content = tomllib.loads(Path(config).read_text(encoding="utf-8"))
    except OSError as err:
        raise ConfigError(f"--config {config} cannot be read ({err.strerror})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"--config {config} is not a text file") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"--config {config} is not valid TOML: {err}") from None
    for name, value in content.items():
        if name not in SECTIONS:
            raise ConfigError(f"--config {config}: unknown section [{name}]{nearest(name, SECTIONS)}")
        if not isinstance(value, dict):
            raise ConfigError(f"--config {config}: {name} must be a [{name}] table of settings")
    return content


def settings_model(section: str) -> type[BaseModel]:
    module, _, name = SECTIONS[section].partition(":")
    return getattr(importlib.import_module(module), name)


def check_keys(values: dict[str, Any], model: type[BaseModel], where: str) -> None:
    """Every key of ``values`` a field of ``model`` (nested models checked inside), else ConfigError."""
    fields = model.model_fields
    for key, value in values.items():
        if key not in fields:
            raise ConfigError(f"{where}: unknown key {key!r}{nearest(key, fields)}")
        nested = fields[key].annotation
        if isinstance(value, dict) and isinstance(nested, type) and issubclass(nested, BaseModel):
            check_keys(value, nested, f"{where} {key}")


def nearest(name: str, valid: object) -> str:
    """``"; did you mean 'x'?"`` for the declared name closest to ``name``, or the declared names."""
    names = sorted(valid)  # type: ignore[call-overload]
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.5)
    return f"; did you mean {close[0]!r}?" if close else f"; known: {', '.join(names)}"


def load_scale(config: Path | None, task_runner: str | None, ray_address: str | None) -> ScaleSettings:
    """Where the command's per-bucket tasks run (``flows.buckets.ScaleSettings``): ``[scale]`` of
    ``config``, the environment, then ``--task-runner`` and ``--ray-address``."""
    from flows.buckets import ScaleSettings

    runner = None if task_runner is None else str(task_runner)
    return load_settings(ScaleSettings, "scale", config, task_runner=runner, ray_address=ray_address)
