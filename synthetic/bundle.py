"""Write a synthetic world's logs as a raw log bundle (DATA.md input contract).

Layout::

    out_dir/
      manifest.json                 seed, users, geometry, counts, files, generator version
      profiles/part-00000.<ext>     RAW_PROFILES + extra column ab_arm
      items/part-00000.<ext>        RAW_ITEMS
      feeds/part-00000.<ext>        RAW_FEEDS
      events/part-YYYYMMDD.<ext>    RAW_EVENTS without visible_items, one part per UTC day
      history/part-00000.<ext>      RAW_HISTORY

``ext`` is ``parquet`` (zstd), ``jsonl``, ``jsonl.gz`` or ``csv``. In JSONL and CSV,
timestamps are ISO-8601 UTC strings ending in "Z"; in CSV the nested columns
(``params``, ``reviews``) are JSON strings. Output is byte-identical for a given
(users, seed, fmt, parts_per_table). Files are written to a temporary sibling
folder and moved into place at the end.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from synthetic.behaviour import BehaviourParams
from synthetic.feeds import FeedParams
from synthetic.world import World
from transforms.schemas import RAW_TABLES

GENERATOR_VERSION = "1.0.0"
Format = Literal["parquet", "jsonl", "jsonl.gz", "csv"]
FORMATS: tuple[str, ...] = ("parquet", "jsonl", "jsonl.gz", "csv")
ISO_MS = "%Y-%m-%dT%H:%M:%S%.3fZ"
TABLE_ORDER = ("profiles", "items", "feeds", "events", "history")


def bundle_schema(table: str) -> pa.Schema:
    """The exact Arrow schema written for a table: RAW_* (events without visible_items, profiles + ab_arm)."""
    schema = RAW_TABLES[table]
    if table == "events":
        return schema.remove(schema.get_field_index("visible_items"))
    if table == "profiles":
        return schema.append(pa.field("ab_arm", pa.string()))
    return schema


def _to_arrow(frame: pl.DataFrame, table: str) -> pa.Table:
    schema = bundle_schema(table)
    return frame.select(schema.names).to_arrow().cast(schema)


def _text_ready(frame: pl.DataFrame, nested_as_json: bool) -> pl.DataFrame:
    """ISO-8601 'Z' timestamps; for CSV also nested columns as JSON strings."""
    out = frame.with_columns(pl.col(pl.Datetime).dt.strftime(ISO_MS))
    if nested_as_json:
        nested = [c for c, t in out.schema.items() if isinstance(t, (pl.List, pl.Struct))]
        # {"col": value} -> value: reuses polars' JSON encoder (escaping included).
        out = out.with_columns(
            pl.struct(c).struct.json_encode().str.slice(len(c) + 4).str.head(-1).alias(c) for c in nested
        )
    return out


def _encode(frame: pl.DataFrame, table: str, fmt: Format) -> bytes:
    buf = io.BytesIO()
    if fmt == "parquet":
        pq.write_table(_to_arrow(frame, table), buf, compression="zstd")
    elif fmt == "csv":
        _text_ready(frame, nested_as_json=True).write_csv(buf)
    else:
        _text_ready(frame, nested_as_json=False).write_ndjson(buf)
    data = buf.getvalue()
    return gzip.compress(data, compresslevel=1, mtime=0) if fmt == "jsonl.gz" else data


def _parts(frame: pl.DataFrame, table: str, parts: int) -> list[tuple[str, pl.DataFrame]]:
    """(part name, rows): events by UTC day, other tables in ``parts`` contiguous chunks."""
    if table == "events":
        day = frame["ts"].dt.strftime("%Y%m%d")
        return [(f"part-{d}", frame.filter(day == d)) for d in day.unique().sort()]
    size = max(1, -(-frame.height // max(parts, 1)))
    starts = range(0, max(frame.height, 1), size)
    return [(f"part-{i:05d}", frame.slice(start, size)) for i, start in enumerate(starts)]


def _ordered(frame: pl.DataFrame, table: str) -> pl.DataFrame:
    return frame.select(bundle_schema(table).names)


def write_tables(tables: dict[str, pl.DataFrame], out_dir: Path, fmt: Format, parts_per_table: int) -> dict:
    """Write the five tables under ``out_dir``; returns {table: [relative file paths]}."""
    jobs: list[tuple[Path, pl.DataFrame, str]] = []
    files: dict[str, list[str]] = {}
    for table in TABLE_ORDER:
        (out_dir / table).mkdir(parents=True)
        for name, part in _parts(_ordered(tables[table], table), table, parts_per_table):
            path = out_dir / table / f"{name}.{fmt}"
            jobs.append((path, part, table))
            files.setdefault(table, []).append(path.relative_to(out_dir).as_posix())
    # Encoding releases the GIL (Arrow/Polars): a small pool keeps both cores busy.
    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(lambda job: job[0].write_bytes(_encode(job[1], job[2], fmt)), jobs))
    return files


def main() -> None:
    parser = argparse.ArgumentParser(description="Write a synthetic raw log bundle.")
    parser.add_argument("out_dir")
    parser.add_argument("--users", type=int, default=300)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--fmt", choices=FORMATS, default="parquet")
    parser.add_argument("--parts-per-table", type=int, default=1)
    parser.add_argument("--overwrite", action="store_true")
    parser.add_argument("--whole-px", action="store_true", help="whole px boxes (default: fractional)")
    args = parser.parse_args()
    summary = write_bundle(
        args.out_dir,
        args.users,
        args.seed,
        args.fmt,
        args.parts_per_table,
        overwrite=args.overwrite,
        fractional_px=not args.whole_px,
    )
    print(json.dumps({k: summary[k] for k in ("counts", "time_range", "timings_s")}, indent=2))


def write_bundle(
    out_dir: str | Path,
    users: int = 300,
    seed: int = 7,
    fmt: Format = "parquet",
    parts_per_table: int = 1,
    overwrite: bool = False,
    fractional_px: bool = True,
) -> dict[str, Any]:
    """Build a world, simulate every shopper under the per-user A/B arms, write the bundle
    (``fractional_px``: card boxes and offsets in fractional CSS px, as real logs have them).

    Returns the manifest plus ``timings_s`` (the manifest file itself has no timings,
    so it is deterministic).
    """
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}")
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise FileExistsError(f"{out} is not empty (pass overwrite=True)")
    t0 = time.perf_counter()
    params = BehaviourParams(feed=FeedParams(fractional_px=fractional_px))
    world = World.build(users, seed, params)
    bundle = world.simulate(policy="ab", seed=seed)
    t1 = time.perf_counter()
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    files = write_tables(bundle.tables(), tmp, fmt, parts_per_table)
    ts = bundle.events["ts"]
    manifest = {
        "generator": "trajforge.synthetic",
        "generator_version": GENERATOR_VERSION,
        "seed": seed,
        "users": users,
        "format": fmt,
        "policy": "ab",
        "ab_arms": dict(sorted(bundle.profiles.group_by("ab_arm").len().iter_rows())),
        "geometry": world.geometry.model_dump(),
        "counts": {t: bundle.tables()[t].height for t in TABLE_ORDER} | {"sessions": bundle.sessions.height},
        "time_range": pl.Series([ts.min(), ts.max()]).dt.strftime(ISO_MS).to_list(),
        "files": files,
        "ground_truth": f"synthetic.world.World.build({users}, {seed}).simulate(policy='ab', seed={seed})",
    }
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    out.mkdir(parents=True, exist_ok=True)
    for entry in [*TABLE_ORDER, "manifest.json"]:
        target = out / entry
        if target.is_dir():
            shutil.rmtree(target)
        target.unlink(missing_ok=True)
        (tmp / entry).rename(target)
    tmp.rmdir()
    timings = {"simulate": round(t1 - t0, 3), "write": round(time.perf_counter() - t1, 3)}
    return manifest | {"timings_s": timings}


if __name__ == "__main__":
    main()
