"""The DuckDB catalog: ``LAKE/warehouse.duckdb`` with one view per lake table and
saved queries as table macros.

Views read the Parquet files in place (nothing is copied); they are recreated
after every stage and whenever the lake folder has moved, so the catalog always
describes what is on disk.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import polars as pl

from transforms.schemas import LAKE_TABLES

WAREHOUSE = "warehouse.duckdb"

#: name -> (description, body of a DuckDB table macro)
MACROS: dict[str, tuple[str, str]] = {
    "action_mix": (
        "share of each action over all steps",
        """SELECT action, action_group, count(*) AS steps,
                  round(100.0 * count(*) / sum(count(*)) OVER (), 2) AS pct
           FROM steps GROUP BY ALL ORDER BY steps DESC""",
    ),
    "session_length_distribution": (
        "sessions per length (actions), with the cumulative share",
        """SELECT length, count(*) AS sessions,
                  round(100.0 * sum(count(*)) OVER (ORDER BY length) / sum(count(*)) OVER (), 2) AS cum_pct
           FROM sessions GROUP BY length ORDER BY length""",
    ),
    "funnel": (
        "sessions reaching each stage: feed -> click -> cart -> buy",
        """SELECT 'sessions' AS stage, count(*) AS sessions FROM sessions
           UNION ALL SELECT 'clicked', count(*) FILTER (WHERE clicks > 0) FROM sessions
           UNION ALL SELECT 'carted', count(*) FILTER (WHERE carts > 0) FROM sessions
           UNION ALL SELECT 'bought', count(*) FILTER (WHERE buys > 0) FROM sessions""",
    ),
    "terminal_mix": (
        "share of sessions per terminal state",
        """SELECT terminal, count(*) AS sessions,
                  round(100.0 * count(*) / sum(count(*)) OVER (), 2) AS pct
           FROM sessions GROUP BY terminal ORDER BY sessions DESC""",
    ),
    "quarantine_by_reason": (
        "rejected and flagged rows per stage, table and reason",
        """SELECT stage, "table", reason, kept, count(*) AS rows
           FROM quarantine GROUP BY ALL ORDER BY rows DESC""",
    ),
}


def warehouse_path(lake: str | Path) -> Path:
    return Path(lake) / WAREHOUSE


def _glob(lake: Path, name: str) -> str | None:
    folder = lake / name
    if not folder.is_dir() or not any(folder.rglob("*.parquet")):
        return None
    return (folder / "**" / "*.parquet").as_posix()


def refresh_catalog(lake: str | Path) -> Path:
    """(Re)create a view per lake table found on disk, plus the saved-query macros."""
    lake = Path(lake).resolve()
    path = warehouse_path(lake)
    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE IF NOT EXISTS _catalog (key VARCHAR PRIMARY KEY, value VARCHAR)")
        tables = [n for n in (*LAKE_TABLES, *_extra_tables(lake)) if _glob(lake, n)]
        for name in dict.fromkeys(tables):
            # union_by_name: files of one table may come from stages that add columns later
            con.execute(
                f"CREATE OR REPLACE VIEW {name} AS SELECT * FROM read_parquet("
                f"'{_glob(lake, name)}', hive_partitioning = false, union_by_name = true)"
            )
        for macro, (_, body) in MACROS.items():
            if all(t in tables for t in _tables_used(body)):
                con.execute(f"CREATE OR REPLACE MACRO {macro}() AS TABLE {body}")
        con.execute("INSERT OR REPLACE INTO _catalog VALUES ('lake', ?)", [str(lake)])
    return path


def _extra_tables(lake: Path) -> list[str]:
    """Table folders written by later stages that are not (yet) declared here."""
    return sorted(p.name for p in lake.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))


def _tables_used(body: str) -> list[str]:
    return [t for t in ("steps", "sessions", "quarantine") if f"FROM {t}" in body]


def open_catalog(lake: str | Path) -> duckdb.DuckDBPyConnection:
    """A read-only connection; refreshes the views first if the lake moved or has no catalog."""
    lake = Path(lake).resolve()
    if not lake.is_dir():
        raise FileNotFoundError(f"no lake at {lake}")
    path = warehouse_path(lake)
    if not path.exists() or _recorded_lake(path) != str(lake):
        refresh_catalog(lake)
    return duckdb.connect(str(path), read_only=True)


def _recorded_lake(path: Path) -> str | None:
    with duckdb.connect(str(path), read_only=True) as con:
        try:
            row = con.execute("SELECT value FROM _catalog WHERE key = 'lake'").fetchone()
        except duckdb.CatalogException:
            return None
    return row[0] if row else None


def query(lake: str | Path, sql: str) -> pl.DataFrame:
    """Run read-only SQL against the catalog and return the result."""
    with open_catalog(lake) as con:
        relation = con.sql(sql)
        return relation.pl() if relation is not None else pl.DataFrame()
