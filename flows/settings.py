"""One settings loader for every command: a TOML file's section, then the environment, then flags.

A TOML file may hold every stage's section (``[ingest]``, ``[records]``, ``[extract]``); each command
reads its own, so one file can configure a whole run.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel

Settings = TypeVar("Settings", bound=BaseModel)


def load_settings(model: type[Settings], section: str, config: Path | None, /, **flags: object) -> Settings:
    """``model`` from ``[section]`` of the TOML file ``config`` (if given), with the flags that were
    set (not None) on top; a pydantic-settings model adds its environment variables under both.
    The first three are positional only: a flag may be called ``model`` (the extract model)."""
    values = toml_section(config, section)
    values.update({k: v for k, v in flags.items() if v is not None})
    return model(**values)


def toml_section(config: Path | None, section: str) -> dict:
    """``[section]`` of the TOML file ``config`` (empty without one)."""
    return tomllib.loads(config.read_text()).get(section, {}) if config else {}
