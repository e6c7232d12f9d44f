"""Lakes and raw bundles on an object store (``s3://bucket/prefix``), worked on through a local copy.

Every stage writes its tables to staging, gates them and swaps them into place with renames, which an
object store does not have. A lake at a URI is therefore worked on in a local working copy (a folder
under ``TRAJFORGE_STORE_CACHE``, default ``~/.cache/trajforge/store``), in three steps:

1. **pull**: the copy is brought to what the store holds, downloading only the objects whose size or
   ETag changed since the copy last saw them. Files the copy holds that the store never had (a killed
   stage's staging, the extraction cache of a run cut short) are kept, so a rerun resumes from them
   as it would on a local lake;
2. the stage runs on the copy, exactly as on a local lake;
3. **push**: the files the stage changed are uploaded, Parquet first and the catalog last, then the
   objects of files it removed are deleted. A marker file says a push is under way: a push that was
   killed is finished by the next pull of that copy before anything is downloaded over it.

One writer per lake, as for a local one. DuckDB reads the Parquet on the store itself
(``store_connection``): the store's fsspec filesystem registered in DuckDB, so nothing is downloaded
to query it (DuckDB's httpfs extension is not installable from PyPI). Credentials and endpoint come
from the usual environment variables (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_ENDPOINT_URL`` for an S3-compatible server).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import polars as pl

#: the working copy's record of what it last exchanged with the store, and the marker of a push
INDEX_FILE = ".store-index.json"
PUSHING_FILE = ".store-pushing"
_OWN = {INDEX_FILE, PUSHING_FILE}
_PARTIAL = (".pulling", f"{INDEX_FILE}.tmp")


def is_store_uri(location: str | Path) -> bool:
    """``location`` names an object store (``scheme://...``, other than ``file://``)."""
    text = str(location)
    return "://" in text and not text.startswith("file://") and isinstance(location, str)


@dataclass(frozen=True)
class StoreLocation:
    """A folder on an object store: ``scheme://bucket/prefix``."""

    uri: str

    @property
    def scheme(self) -> str:
        return self.uri.split("://", 1)[0]

    @property
    def root(self) -> str:
        """The folder as the filesystem names it: ``bucket/prefix``, no trailing slash."""
        return self.uri.split("://", 1)[1].rstrip("/")

    def url(self, relative: str) -> str:
        return f"{self.scheme}://{self.root}/{relative}"

    def filesystem(self) -> Any:
        """The store's fsspec filesystem, listings never cached (another writer may have pushed)."""
        try:
            import fsspec

            return fsspec.filesystem(self.scheme, skip_instance_cache=True, use_listings_cache=False)
        except ImportError as err:
            raise RuntimeError(
                f"a {self.scheme}:// lake or bundle needs the s3 extra: pip install 'trajforge[s3]' ({err})"
            ) from err


def working_copy(location: StoreLocation) -> Path:
    """The local folder a store location is worked on in (one per URI)."""
    cache = Path(os.environ.get("TRAJFORGE_STORE_CACHE") or Path.home() / ".cache" / "trajforge" / "store")
    digest = hashlib.sha256(location.uri.rstrip("/").encode()).hexdigest()[:12]
    readable = location.root.replace("/", "_")[-48:]
    return cache / f"{readable}-{digest}"


@dataclass
class SyncSummary:
    """What one pull or push moved, by path relative to the lake."""

    transferred: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    finished_push: bool = False  # a pull that first finished a killed push


def _local_stat(path: Path) -> list[int]:
    stat = path.stat()
    return [stat.st_size, stat.st_mtime_ns]


def _local_files(local: Path) -> dict[str, Path]:
    """The lake's files in the copy: not the copy's own (the index, the push journal, and what a killed
    download or index write left half done)."""
    if not local.is_dir():
        return {}
    return {
        path.relative_to(local).as_posix(): path
        for path in local.rglob("*")
        if path.is_file()
        and path.relative_to(local).as_posix() not in _OWN
        and not path.name.endswith(_PARTIAL)
    }


def _remote_files(location: StoreLocation, fs: Any) -> dict[str, dict[str, Any]]:
    """Every object under the location: path relative to it -> {"etag", "size"}."""
    if not fs.exists(location.root):
        return {}
    found = fs.find(location.root, detail=True)
    prefix = location.root + "/"
    return {
        name[len(prefix) :]: _object_meta(info)
        for name, info in found.items()
        if info.get("type", "file") == "file" and name.startswith(prefix)
    }


def _object_meta(info: dict[str, Any]) -> dict[str, Any]:
    return {"etag": str(info.get("ETag", "")), "size": int(info.get("size", 0))}


def _same_object(known: dict[str, Any], meta: dict[str, Any]) -> bool:
    return (known["etag"], known["size"]) == (meta["etag"], meta["size"])


def _read_index(local: Path, location: StoreLocation) -> dict[str, dict[str, Any]]:
    path = local / INDEX_FILE
    if not path.is_file():
        return {}
    payload = json.loads(path.read_text())
    return payload["files"] if payload.get("uri") == location.uri else {}


def _write_index(local: Path, location: StoreLocation, files: dict[str, dict[str, Any]]) -> None:
    """The index beside the files it describes; none where there are none (an empty location's copy is
    an empty folder, which ingest takes for a new lake)."""
    if not files:
        (local / INDEX_FILE).unlink(missing_ok=True)
        return
    local.mkdir(parents=True, exist_ok=True)
    temporary = local / f"{INDEX_FILE}.tmp"
    temporary.write_text(json.dumps({"uri": location.uri, "files": files}, sort_keys=True))
    temporary.replace(local / INDEX_FILE)


#: objects in flight at once in a pull or a push: a store answers each request in tens of milliseconds,
#: and a lake is thousands of small files
TRANSFERS = 16


def _transfer(relatives: list[str], send: Callable[[str], Any], landed: Callable[[str, Any], None]) -> None:
    """``send`` every file, ``TRANSFERS`` at a time; ``landed`` here, in this thread, for each as it
    completes. A failed transfer is raised once every other one has finished and been recorded, so
    what landed is never sent again."""
    failure: BaseException | None = None
    with ThreadPoolExecutor(max_workers=TRANSFERS) as pool:
        futures = {pool.submit(send, relative): relative for relative in relatives}
        for future in as_completed(futures):
            try:
                landed(futures[future], future.result())
            except BaseException as err:  # a kill in a worker too: recorded, then raised
                failure = failure or err
    if failure is not None:
        raise failure


def _download(fs: Any, url: str, target: Path) -> None:
    """``url`` into ``target`` through a partial file, so a killed download never passes for the file."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".pulling")
    fs.get_file(url, str(partial))
    partial.replace(target)


def pull(location: StoreLocation, local: Path) -> SyncSummary:
    """Bring ``local`` to what the store holds (see the module's notes); a killed push is finished first."""
    if (local / PUSHING_FILE).exists():
        summary = push(location, local)
        summary.finished_push = True
        return summary
    fs = location.filesystem()
    remote = _remote_files(location, fs)
    index = _read_index(local, location)
    present = _local_files(local)
    summary = SyncSummary()

    def download(relative: str) -> None:
        _download(fs, location.url(relative), local / relative)

    def downloaded(relative: str, _: None) -> None:
        index[relative] = {**remote[relative], "local": _local_stat(local / relative)}
        summary.transferred.append(relative)

    # a file as the copy last saw it, or changed here since (work not pushed yet), is kept
    wanted = [
        relative
        for relative, meta in sorted(remote.items())
        if not (relative in index and relative in present and _same_object(index[relative], meta))
    ]
    try:
        _transfer(wanted, download, downloaded)
    finally:
        summary.transferred.sort()
        _write_index(local, location, index)  # what landed is known, even when a download failed
    for relative in sorted(set(index) - set(remote)):  # removed from the store since the copy saw it
        (local / relative).unlink(missing_ok=True)
        del index[relative]
        summary.deleted.append(relative)
    _remove_empty_folders(local)
    _write_index(local, location, index)
    return summary


def pull_object(location: StoreLocation, local: Path) -> Path:
    """One object (``location`` names a file, not a folder) into ``local``, downloaded again only when
    its size or ETag changed; its path in the copy."""
    fs = location.filesystem()
    name = location.root.rsplit("/", 1)[-1]
    meta, index, target = _object_meta(fs.info(location.root)), _read_index(local, location), local / name
    if not (target.is_file() and name in index and _same_object(index[name], meta)):
        _download(fs, location.uri, target)
        _write_index(local, location, {name: {**meta, "local": _local_stat(target)}})
    return target


def _upload_order(relative: str) -> tuple[int, str]:
    """Parquet first, then the rest, the catalog last: a reader of the store sees new tables before a
    catalog that names them."""
    if relative.endswith(".parquet"):
        return (0, relative)
    return (2, relative) if relative.endswith(".duckdb") else (1, relative)


def push(location: StoreLocation, local: Path) -> SyncSummary:
    """Upload what changed in ``local`` since the store last saw it, then delete what it removed.

    Each upload is journalled in the push marker as it lands, so a push killed part way and run again
    sends only what the killed one had not."""
    index = _read_index(local, location)
    journal = local / PUSHING_FILE
    if journal.exists():
        index.update(_journalled(journal))
        _write_index(local, location, index)
    fs = location.filesystem()
    present = _local_files(local)
    summary = SyncSummary()
    changed = [
        relative
        for relative in sorted(present, key=_upload_order)
        if index.get(relative) is None or index[relative]["local"] != _local_stat(present[relative])
    ]

    def upload(relative: str) -> dict[str, Any]:
        stat = _local_stat(present[relative])
        fs.put_file(str(present[relative]), location.url(relative))
        return {**_object_meta(fs.info(location.url(relative))), "local": stat}

    with journal.open("w") as log:

        def uploaded(relative: str, entry: dict[str, Any]) -> None:
            index[relative] = entry
            log.write(json.dumps({relative: entry}) + "\n")
            log.flush()
            summary.transferred.append(relative)

        for _, group in itertools.groupby(changed, key=lambda relative: _upload_order(relative)[0]):
            _transfer(list(group), upload, uploaded)  # the catalog's group only once the tables landed
    for relative in sorted(set(_remote_files(location, fs)) - set(present)):
        fs.rm_file(location.url(relative))
        summary.deleted.append(relative)
    index = {relative: entry for relative, entry in index.items() if relative in present}
    _write_index(local, location, index)
    journal.unlink()
    return summary


def _journalled(journal: Path) -> dict[str, dict[str, Any]]:
    """The uploads a killed push recorded (a last line cut short by the kill is left out)."""
    landed: dict[str, dict[str, Any]] = {}
    for line in journal.read_text().splitlines():
        try:
            landed.update(json.loads(line))
        except json.JSONDecodeError:
            continue
    return landed


def _remove_empty_folders(local: Path) -> None:
    if not local.is_dir():
        return
    folders = sorted((p for p in local.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
    for folder in folders:
        if not any(folder.iterdir()):
            folder.rmdir()


@contextmanager
def worked_on_locally(location: str | Path, write: bool = True) -> Iterator[Path]:
    """``location`` as a local folder for the block: itself when local; else its working copy, pulled
    before the block (a single object read without ``write``: that file in it) and, when ``write``,
    pushed after it (also after a clean stop such as a stopped gate, whose lake is consistent; not
    after a crash, whose work the next pull keeps)."""
    if not is_store_uri(location):
        yield Path(location)
        return
    store = StoreLocation(str(location))
    local = working_copy(store)
    with store_errors(store):
        one_object = not write and store.filesystem().isfile(store.root)
        if one_object:  # a raw file read as it is (a UserArena release's JSONL)
            here = pull_object(store, local)
        else:
            pull(store, local)
    if one_object:
        yield here
        return
    local.mkdir(parents=True, exist_ok=True)
    try:
        yield local
    except _clean_stops():
        if write:
            push(store, local)
        raise
    if write:
        push(store, local)


@contextmanager
def store_errors(store: StoreLocation) -> Iterator[None]:
    """A store that cannot be reached or read (refused credentials, no such bucket, no endpoint) as one
    InputError naming it; the store's client raises its own classes, most of them not OSError."""
    try:
        yield
    except Exception as err:
        if not (
            isinstance(err, OSError) or type(err).__module__.split(".")[0] in ("botocore", "aiobotocore")
        ):
            raise
        from flows.preflight import InputError

        raise InputError(f"{store.uri}: the store cannot be read ({type(err).__name__}: {err})") from None


def _clean_stops() -> tuple[type[BaseException], ...]:
    """The stops after which a stage's lake is consistent: a stopped gate, a command's chosen exit."""
    import click

    from validation.report import GateError

    return (GateError, click.exceptions.Exit, SystemExit)


def store_connection(location: str) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB whose views (one per lake table) and saved queries read the Parquet on the
    store in place, through the store's filesystem."""
    from transforms.catalog import define_lake_views, lake_table_names

    store = StoreLocation(location)
    fs = store.filesystem()
    with store_errors(store):
        tables = lake_table_names(_remote_tables(store, fs))
    connection = duckdb.connect()
    connection.register_filesystem(fs)
    folder = f"{store.scheme}://{store.root}".replace("'", "''")
    define_lake_views(connection, tables, f"'{folder}'")
    return connection


def _remote_tables(store: StoreLocation, fs: Any) -> list[str]:
    """Top-level folders of the location holding Parquet (``_``- and ``.``-folders are the lake's own)."""
    parquet = [relative for relative in _remote_files(store, fs) if relative.endswith(".parquet")]
    folders = {relative.split("/", 1)[0] for relative in parquet if "/" in relative}
    return sorted(f for f in folders if not f.startswith(("_", ".")))


def store_query(location: str, sql: str) -> pl.DataFrame:
    """Run SQL over ``store_connection``'s views and return the result."""
    with store_connection(location) as connection:
        relation = connection.sql(sql)
        return relation.pl() if relation is not None else pl.DataFrame()
