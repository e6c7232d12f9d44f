"""The ``trajforge`` command line: each command checks its inputs, runs a flow of ``flows`` and prints
what it returned.

Importing ``flows`` first sets its environment defaults (Prefect's home, telemetry off, Polars'
allocator), which must be in place before Prefect or Polars is imported.
"""

import flows  # noqa: F401
