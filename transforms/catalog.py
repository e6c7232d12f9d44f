"""The DuckDB catalog: ``LAKE/warehouse.duckdb`` with one view per lake table and
saved queries as table macros.

Views read the Parquet files in place (nothing is copied) and find them next to
the catalog file they are opened from, so a copied or moved lake opened with a
plain ``duckdb.connect(LAKE/warehouse.duckdb)`` reads its own tables, never the
original's. A catalog opened some other way (attached to another database, or
with ``temp_directory`` set) stops every query with the remedy instead.

Every stage that writes a table rebuilds the catalog: beside the old file, then
renamed over it, so a reader holding the old one open never blocks a stage and
never sees a half-built catalog (on Linux it keeps reading the file it opened).

The file is written in DuckDB 1.0's storage format, which every DuckDB from 0.10 on
reads (the 1.x command line, DBeaver's driver), rather than 2.0's, which only 2.0 reads.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import duckdb
import polars as pl

from transforms.files import atomic_file
from transforms.schemas import LAKE_TABLES

WAREHOUSE = "warehouse.duckdb"
#: the storage format the catalog is written in (DuckDB's header calls it version 64)
STORAGE_FORMAT = "v1.0.0"

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
        """SELECT stage, table_name, reason, kept, count(*) AS rows
           FROM quarantine GROUP BY ALL ORDER BY rows DESC""",
    ),
}


def warehouse_path(lake: str | Path) -> Path:
    return Path(lake) / WAREHOUSE


#: bumped when views change how they locate their files: an older catalog is rebuilt on open
LAYOUT = "views-beside-the-catalog-file/1"

# A view cannot ask which database file holds it (a table function's arguments admit no subquery
# of duckdb_databases()), but DuckDB's temp_directory defaults to "<database file>.tmp" and a
# setting may be read there; when it is not that default the views cannot tell where their lake
# is, and say so instead of reading whatever a relative path would find.
LAKE_FOLDER_MACRO = """CREATE MACRO lake_folder() AS
    CASE WHEN current_setting('temp_directory') LIKE '%.duckdb.tmp'
         THEN parse_dirpath(current_setting('temp_directory'))
         ELSE error('{remedy}') END"""
REMEDY = (
    "the lake views find their tables next to the catalog file, which DuckDB tells them only when "
    "that file is opened as the main database with temp_directory left at its default: open it with "
    "duckdb.connect('LAKE/warehouse.duckdb', read_only=True), or run trajforge sql --lake LAKE"
)


def _has_parquet(lake: Path, name: str) -> bool:
    folder = lake / name
    return folder.is_dir() and any(folder.rglob("*.parquet"))


def lake_tables(lake: str | Path) -> list[str]:
    """The tables on disk: declared ones first, then folders written by later stages."""
    lake = Path(lake)
    return lake_table_names(name for name in (*LAKE_TABLES, *_extra_tables(lake)) if _has_parquet(lake, name))


def lake_table_names(found: Iterable[str]) -> list[str]:
    """The table folders ``found`` (holding Parquet) in the catalog's order: declared tables first."""
    found = set(found)
    return [name for name in dict.fromkeys((*LAKE_TABLES, *sorted(found))) if name in found]


def refresh_catalog(lake: str | Path) -> Path:
    """Rebuild the catalog: a view per lake table found on disk, plus the saved-query macros.

    Built under a temporary name and renamed into place, so readers of the previous catalog
    (other processes included) neither block the rebuild nor see it half done.
    """
    lake = Path(lake).resolve()
    target = warehouse_path(lake)
    # ends in .duckdb: its temp_directory default then locates the lake while the views are bound
    with atomic_file(target, suffix=".duckdb") as building:
        try:
            _build(building, lake)
        finally:
            Path(f"{building}.wal").unlink(missing_ok=True)
    return target


def _build(path: Path, lake: Path) -> None:
    tables = lake_tables(lake)
    with duckdb.connect(str(path), config={"storage_compatibility_version": STORAGE_FORMAT}) as con:
        con.execute(LAKE_FOLDER_MACRO.format(remedy=REMEDY.replace("'", "''")))
        define_lake_views(con, tables, "lake_folder()")
        con.execute("CREATE TABLE _catalog (key VARCHAR PRIMARY KEY, value VARCHAR)")
        con.execute("INSERT INTO _catalog VALUES ('layout', ?), ('tables', ?)", [LAYOUT, ",".join(tables)])


def define_lake_views(con: duckdb.DuckDBPyConnection, tables: Sequence[str], folder_sql: str) -> None:
    """A view per table over the Parquet under ``folder_sql`` (an SQL expression naming the lake's folder),
    and the saved queries whose tables are there."""
    for name in tables:
        # union_by_name: files of one table may come from stages that add columns later
        con.execute(
            f"CREATE VIEW {name} AS SELECT * FROM read_parquet("
            f"{folder_sql} || '/{name}/**/*.parquet', hive_partitioning = false, union_by_name = true)"
        )
    for macro, (_, body) in MACROS.items():
        if all(t in tables for t in tables_used(body)):
            con.execute(f"CREATE MACRO {macro}() AS TABLE {body}")


def _extra_tables(lake: Path) -> list[str]:
    """Table folders written by later stages that are not (yet) declared here."""
    return sorted(p.name for p in lake.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))


def tables_used(body: str) -> list[str]:
    return [t for t in ("steps", "sessions", "quarantine") if f"FROM {t}" in body]


def open_catalog(lake: str | Path) -> duckdb.DuckDBPyConnection:
    """A read-only connection; rebuilds the catalog first when it is missing, of an older layout,
    or does not list the tables on disk."""
    lake = Path(lake).resolve()
    if not lake.is_dir():
        raise FileNotFoundError(f"no lake at {lake}")
    path = warehouse_path(lake)
    if _recorded(path) != {"layout": LAYOUT, "tables": ",".join(lake_tables(lake))}:
        refresh_catalog(lake)
    return duckdb.connect(str(path), read_only=True)


def _recorded(path: Path) -> dict[str, str]:
    """What the catalog file says it was built from (empty when it is missing or predates that)."""
    if not path.exists():
        return {}
    with duckdb.connect(str(path), read_only=True) as con:
        try:
            return dict(con.execute("SELECT key, value FROM _catalog").fetchall())
        except duckdb.CatalogException:
            return {}


def query(lake: str | Path, sql: str) -> pl.DataFrame:
    """Run read-only SQL against the catalog and return the result."""
    with open_catalog(lake) as con:
        relation = con.sql(sql)
        return relation.pl() if relation is not None else pl.DataFrame()
