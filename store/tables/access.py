"""Where the store is and how its DuckDB file is opened: the location (a file or a DuckLake), the
errors a read reports in one line, the read-only configuration, and opening while a lock is held.

Below both the writer (:mod:`prmloop.store.tables.duck`) and the readers
(:mod:`prmloop.store.tables.reads`), so that neither imports the other.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, TypeAlias

import duckdb

from prmloop.store.tables.lake import LakeStore, is_lake_spec, open_lake, parse_lake
from prmloop.store.tables.published import StoreLocked

#: Where the store is: a DuckDB file (the default), or a DuckLake (``ducklake:...``, see store/tables/lake.py).
StoreLocation: TypeAlias = Path | str | LakeStore


def store_exists(location: StoreLocation) -> bool:
    """The DuckDB file exists, or the DuckLake's catalog has been created (by a sink)."""
    where = locate(location)
    if not isinstance(where, LakeStore):
        return where.exists()
    try:
        with open_lake(where, read_only=True) as con:
            found = con.execute(
                "SELECT count(*) FROM duckdb_views() WHERE database_name = current_database() AND view_name = 'events'"
            ).fetchone()
            return bool(found and found[0])
    except FileNotFoundError:
        return False


def locate(location: StoreLocation) -> Path | LakeStore:
    """A DuckDB file's path, or the DuckLake a ``ducklake:...`` spec names (data in ``<dir>/data``
    for ``ducklake:pgserver:<dir>``, else under ``$PRMLOOP_HOME/lake/data``, unless the spec says
    ``#data=<dir>``; see store/tables/lake_catalog.py)."""
    if isinstance(location, LakeStore):
        return location
    if is_lake_spec(str(location)):
        from prmloop.store.settings import StateSettings

        return parse_lake(str(location), default_data_path=StateSettings().home / "lake" / "data")
    return Path(location)


class QueryError(ValueError):
    """A read-only query DuckDB could not run (unknown table, type mismatch, ...): one line."""


class QueryLimitExceeded(QueryError):
    """A query that ran into its time or memory limit and was stopped: one line naming the limit."""


#: ``prmloop sql``'s limits unless told otherwise: a query's seconds, and its memory (DuckDB's syntax).
DEFAULT_MAX_SECONDS = 60.0
DEFAULT_MAX_MEMORY = "2GB"


class QueryIOError(QueryError, OSError):
    """A query that failed reading the store (a file, the catalog's server): one line, and an
    ``OSError`` too, so a service retries it as it retries any I/O failure."""


def is_lock_error(exc: BaseException) -> bool:
    text = str(exc).lower()
    # "different configuration": this process already holds the file open as the writer (DuckDB
    # shares one instance per file and process), which is the same situation as another process's lock.
    return any(m in text for m in ("lock", "conflicting", "another process", "different configuration"))


def connect_retrying(
    path: Path, *, read_only: bool, timeout_s: float, config: dict[str, Any]
) -> tuple[duckdb.DuckDBPyConnection, float]:
    start = time.monotonic()
    delay = 0.002
    while True:
        try:
            con = duckdb.connect(str(path), read_only=read_only, config=config)
            return con, time.monotonic() - start
        except (duckdb.IOException, duckdb.ConnectionException) as exc:
            if not is_lock_error(exc):
                raise
            waited = time.monotonic() - start
            if waited >= timeout_s:
                who = "another writer" if read_only else "a reader or another writer"
                raise StoreLocked(
                    f"{path} stayed locked by {who} for {waited:.1f}s; retry, or check that only one "
                    "`prmloop sink` runs and no long query holds the file"
                ) from exc
            time.sleep(delay)
            delay = min(delay * 2, 0.05)


READER_CONFIG: dict[str, Any] = {
    # No file, network or extension access from a query (and no way to switch it back on: see
    # _quiet_and_locked).
    "enable_external_access": False,
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
}


def snapshot_connect(path: Path, *, timeout_s: float) -> tuple[duckdb.DuckDBPyConnection, float]:
    """The writer's file, opened read-only to hold writers off while it is copied."""
    return connect_retrying(path, read_only=True, timeout_s=timeout_s, config=READER_CONFIG)
