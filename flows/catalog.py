"""The catalog refresh run by every stage that writes a lake table, once its tables are in place."""

from __future__ import annotations

import duckdb
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from transforms.catalog import refresh_catalog


@task(name="refresh-catalog", cache_policy=NO_CACHE)
def refresh_catalog_task(lake: str) -> str | None:
    """Rebuild ``LAKE/warehouse.duckdb``; the catalog path, or None when it could not be rebuilt.

    A failed rebuild never fails the stage: its tables are already in place, the previous catalog
    file is left whole, and the next stage (or ``trajforge sql``) rebuilds it.
    """
    try:
        return str(refresh_catalog(lake))
    except (duckdb.Error, OSError) as err:
        get_run_logger().warning(
            "catalog not rebuilt, the lake tables are in place: %s; `trajforge sql --lake %s` rebuilds it",
            err,
            lake,
        )
        return None
