"""Connecting to a DuckLake: the extensions from their wheels, attaching the catalog (as the reader role
for readers), retrying a lost commit race, and releasing a connection without aborting the process
when its catalog is gone. The lake's tables and its writer: :mod:`prmloop.store.tables.lake`."""

from __future__ import annotations

import ctypes
import importlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import duckdb

from prmloop.store.tables.lake_catalog import LakeError, LakeStore, check_reader_role, conninfo, pgserver_folders

__all__ = [
    "ALIAS",
    "BASE_CONFIG",
    "METADATA_CATALOG",
    "attach",
    "extension_file",
    "is_conflict",
    "one_line",
    "open_lake",
    "quote",
    "release",
    "retrying",
]

log = logging.getLogger(__name__)

ALIAS = "lake"
#: The PostgreSQL database DuckLake attaches for the catalog (the name ``prmloop sql`` must not reach).
METADATA_CATALOG = f"__ducklake_metadata_{ALIAS}"

T = TypeVar("T")

#: Every connection: no extension installed or loaded behind prmloop's back (they come from wheels).
BASE_CONFIG: dict[str, Any] = {"autoinstall_known_extensions": False, "autoload_known_extensions": False}


def extension_file(package: str, name: str) -> str:
    """The extension binary a ``duckdb-extension-*`` package ships for this DuckDB version."""
    try:
        module = importlib.import_module(package)
    except ImportError as exc:
        raise LakeError(
            f"the DuckDB extension {name} is not installed: "
            f"pip install {package.replace('_', '-')}=={duckdb.__version__}"
        ) from exc
    folder = Path(module.__file__ or "").parent / "extensions" / f"v{duckdb.__version__}"
    path = folder / f"{name}.duckdb_extension"
    if not path.exists():
        raise LakeError(
            f"{package} has no {name} extension for DuckDB {duckdb.__version__} (looked in {folder}): "
            f"install the {package.replace('_', '-')} version equal to duckdb's"
        )
    return str(path)


def attach(con: duckdb.DuckDBPyConnection, store: LakeStore, *, read_only: bool) -> None:
    """Attach ``store`` as :data:`ALIAS` and use it; readers reach the catalog as the reader role."""
    con.execute(f"LOAD '{extension_file('duckdb_extension_postgres_scanner', 'postgres_scanner')}'")
    con.execute(f"LOAD '{extension_file('duckdb_extension_ducklake', 'ducklake')}'")
    kind, _, where = store.catalog.partition(":")
    if kind == "pgserver":
        folder = pgserver_folders(Path(where))[0]
        if store.data_path == folder or folder in store.data_path.parents:
            raise LakeError(
                f"the DuckLake data folder {store.data_path} is inside the catalog's PostgreSQL folder {folder}: "
                "PostgreSQL needs that folder for itself; give #data= a folder outside it"
            )
    store.data_path.mkdir(parents=True, exist_ok=True)
    options = f"DATA_PATH '{quote(str(store.data_path))}'" + (", READ_ONLY" if read_only else "")
    target = quote(f"ducklake:postgres:{conninfo(store, reader=read_only)}")
    for attempt in range(5):
        try:
            con.execute(f"ATTACH '{target}' AS {ALIAS} ({options})")
            break
        except duckdb.Error as exc:
            # Two sinks starting at once both create the catalog's tables; the loser sees PostgreSQL's
            # duplicate-key or "relation ... already exists" error (the chaos test's sink-2 exited on the
            # second), and finds the winner's catalog when it attaches again.
            if ("duplicate key value" in str(exc) or "already exists" in str(exc)) and attempt < 4:
                time.sleep(0.5 * (attempt + 1))
                continue
            _attach_failed(exc, store, read_only=read_only)
    con.execute(f"USE {ALIAS}")


def _attach_failed(exc: duckdb.Error, store: LakeStore, *, read_only: bool) -> NoReturn:
    if read_only and "does not exist" in str(exc):
        raise FileNotFoundError(
            f"no prmloop store in {store} yet: start `prmloop sink` with the same PRMLOOP_STORE (it creates it)"
        ) from exc
    raise LakeError(f"cannot attach the DuckLake catalog {store}: {one_line(exc)}") from exc


def quote(text: str) -> str:
    return text.replace("'", "''")


def one_line(exc: BaseException, limit: int = 300) -> str:
    return " ".join(str(exc).split())[:limit]


def is_conflict(exc: BaseException) -> bool:
    """A DuckLake commit lost to a concurrent one (retry the transaction)."""
    text = str(exc).lower()
    return "conflict" in text or "failed to commit" in text


def retrying(action: Callable[[], T], *, attempts: int = 20, what: str = "the lake transaction") -> T:
    """Run ``action`` again while it loses a commit race (with a growing, jittered pause)."""
    delay = 0.01
    for attempt in range(attempts):
        try:
            return action()
        except duckdb.Error as exc:
            if not is_conflict(exc) or attempt == attempts - 1:
                raise
            time.sleep(delay * (1 + (os.getpid() % 7) / 7))
            delay = min(delay * 2, 1.0)
    raise AssertionError("unreachable")


def release(con: duckdb.DuckDBPyConnection) -> None:
    """Close ``con``, unless it cannot roll back (its catalog lost, or its database invalidated): then
    closing it, or freeing it, throws inside DuckDB's destructor and aborts the process (a sink died so
    when PostgreSQL was killed). Such a connection is set aside for good, at the cost of its memory."""
    try:
        con.execute("ROLLBACK")
    except duckdb.Error as exc:
        if "no transaction is active" not in str(exc):
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(con))
            _SET_ASIDE.append(one_line(exc))
            log.warning(
                "a DuckDB connection to the lake cannot roll back (%s): set aside, not closed (%d so far)",
                one_line(exc),
                len(_SET_ASIDE),
            )
            return
    con.close()


#: Why each connection :func:`release` set aside did (this process).
_SET_ASIDE: list[str] = []


@contextmanager
def open_lake(
    store: LakeStore, *, read_only: bool, sandboxed: bool = False, memory_limit: str | None = None
) -> Iterator[duckdb.DuckDBPyConnection]:
    """A connection with the lake attached and selected. Readers get no file, network or extension
    access beyond the lake itself, and cannot switch it back on. ``sandboxed`` (a reader running
    someone's SQL) also refuses a catalog role that can do more than read (:class:`ReaderRoleError`).
    ``memory_limit``: DuckDB's, for a reader's queries (``prmloop sql --max-memory``)."""
    con = duckdb.connect(config=dict(BASE_CONFIG))
    try:
        # A query over 2 s draws a progress bar on stdout, into a command's JSON (`prmloop status` printed
        # one while a kill slowed the catalog); duckdb.connect's config does not take this setting.
        con.execute("SET enable_progress_bar = false")
        if memory_limit is not None:
            con.execute("SET memory_limit = ?", [memory_limit])
        attach(con, store, read_only=read_only)
        if read_only:
            if sandboxed:
                check_reader_role(con, METADATA_CATALOG, store)
            # The lake's Parquet files stay readable; nothing else on the file system or network is.
            con.execute(f"SET allowed_directories = ['{quote(str(store.data_path))}/']")
            con.execute("SET enable_external_access = false")
            con.execute("SET lock_configuration = true")
        yield con
    finally:
        release(con)
