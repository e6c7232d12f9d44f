"""What the stages record beside the lake (``LAKE/_runs``), and the settings a lake was built with."""

from __future__ import annotations

import json
from pathlib import Path

from transforms.config import IngestSettings

RUNS = "_runs"


def manifest_path(lake: str | Path) -> Path:
    """The last ingest's summary, with the settings it ran with."""
    return Path(lake) / RUNS / "ingest" / "latest.json"


def recorded_settings(lake: str | Path) -> IngestSettings:
    """The settings of the ingest that built ``lake`` (the key itself is never recorded: it comes
    from the environment); defaults for a lake no ingest has recorded."""
    path = manifest_path(lake)
    recorded = json.loads(path.read_text()).get("settings", {}) if path.exists() else {}
    return IngestSettings(**recorded)
