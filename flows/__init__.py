"""Prefect flows, tasks, deployments and the ``trajforge`` CLI.

Importing this package sets the defaults that let Prefect's ephemeral API run
without a server or telemetry; any value already in the environment wins.
"""

import os
from pathlib import Path

_DEFAULTS = {
    "PREFECT_HOME": str(Path.cwd() / ".prefect"),
    "DO_NOT_TRACK": "1",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    "HF_HUB_OFFLINE": "1",
}
for _name, _value in _DEFAULTS.items():
    os.environ.setdefault(_name, _value)
