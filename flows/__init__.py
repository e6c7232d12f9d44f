"""Prefect flows, tasks and deployments (the ``trajforge`` command line that runs them is ``cli``).

Importing this package sets the defaults that let Prefect's ephemeral API run
without a server or telemetry, and Polars' allocator settings (read when Polars is
first imported); any value already in the environment wins.
"""

import os
from pathlib import Path

_DEFAULTS = {
    "PREFECT_HOME": str(Path.cwd() / ".prefect"),
    "DO_NOT_TRACK": "1",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    "HF_HUB_OFFLINE": "1",
    # jemalloc keeps freed pages 5 s (Polars' own default: 0.5-1 s): the stages free and reuse
    # gigabytes within seconds, and faulting pages back in cost ~10 % of an ingest's time
    # (bench/RESULTS.md), for ~10-25 % more peak memory
    "_RJEM_MALLOC_CONF": "dirty_decay_ms:5000,muzzy_decay_ms:5000",
}
for _name, _value in _DEFAULTS.items():
    os.environ.setdefault(_name, _value)
