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
    # jemalloc returns freed pages after 1 s: keeping them longer saves the stages a few percent of
    # their time (pages faulted back in) for a larger peak, and the peak is what bounds a run's
    # size on one machine (bench/RESULTS.md); a value set in the environment wins
    "_RJEM_MALLOC_CONF": "dirty_decay_ms:1000,muzzy_decay_ms:1000",
}
for _name, _value in _DEFAULTS.items():
    os.environ.setdefault(_name, _value)
