"""Reading the store: a read-only connection to the newest read snapshot the writer published (never the
writer's file, so no reader holds ingestion off), ``query`` with its time and memory limits, and the
counts ``prmloop status`` shows. See store/tables/published.py for the snapshots."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from prmloop.store.tables.access import (
    READER_CONFIG,
    QueryError,
    QueryIOError,
    QueryLimitExceeded,
    StoreLocation,
    connect_retrying,
    locate,
    snapshot_connect,
)
from prmloop.store.tables.lake import LakeStore, open_lake
from prmloop.store.tables.published import StoreLocked, reading_copy
from prmloop.store.tables.sql_guard import check_read_only

__all__ = ["QueryResult", "open_reader", "query", "store_health"]


def _quiet_and_locked(con: duckdb.DuckDBPyConnection, memory_limit: str | None = None) -> None:
    """No progress bar (a query over 2 s draws one on stdout, into a command's JSON: `prmloop status`
    printed one while the cluster's catalog was slowed by a kill), then no way to change any setting.
    The bar is a connection's setting, not one ``duckdb.connect``'s config takes. The lock is the
    database instance's, shared by every connection of this process to the file: where another
    reader locked it first, no setting can change, and the lock this function wants is already on."""
    try:
        con.execute("SET enable_progress_bar = false")
        if memory_limit is not None:
            _set_memory_limit(con, memory_limit)
    except duckdb.InvalidInputException:
        locked = con.execute("SELECT current_setting('lock_configuration')").fetchone()
        if not (locked and locked[0] is True):
            raise
        return
    con.execute("SET lock_configuration = true")


def _set_memory_limit(con: duckdb.DuckDBPyConnection, memory_limit: str) -> None:
    try:
        con.execute("SET memory_limit = ?", [memory_limit])
    except duckdb.Error as exc:
        raise QueryError(f"--max-memory {memory_limit!r} is no amount of memory: give e.g. 2GB or 500MB") from exc


@contextmanager
def open_reader(
    location: StoreLocation,
    *,
    timeout_s: float = 30.0,
    sandboxed: bool = False,
    memory_limit: str | None = None,
    fresh: bool = True,
) -> Iterator[tuple[duckdb.DuckDBPyConnection, float]]:
    """A read-only connection. Yields (connection, waited_s). On the DuckDB file it reads the newest
    read snapshot the writer published that holds everything stored before the call (waiting for the
    next publication if need be; ``fresh=False``: the newest as it is), never the writer's file.

    On a DuckLake it reads the newest committed snapshot at once: writers never hold readers up; it
    reaches the catalog as the reader role, and ``sandboxed`` (for someone's SQL) refuses a catalog
    role that can do more than read (see store/tables/lake_catalog.py)."""
    path = locate(location)
    if isinstance(path, LakeStore):
        with open_lake(path, read_only=True, sandboxed=sandboxed, memory_limit=memory_limit) as lake_con:
            yield lake_con, 0.0
        return
    if not path.exists():
        raise FileNotFoundError(
            f"no prmloop database at {path}: start `prmloop sink` (it creates it), or set PRMLOOP_HOME"
        )
    con, waited = _open_read_snapshot(path, timeout_s, fresh)
    try:
        _quiet_and_locked(con, memory_limit)
        yield con, waited
    finally:
        con.close()


def _open_read_snapshot(path: Path, timeout_s: float, fresh: bool = True) -> tuple[duckdb.DuckDBPyConnection, float]:
    """A read-only connection to the newest read snapshot of ``path`` that holds everything stored
    before this call (store/tables/published.py), else, where no copy can be made beside it, to the
    file itself (retried while a writer holds it)."""
    start = time.monotonic()
    for _ in range(20):
        copy, _waited = reading_copy(path, connect=snapshot_connect, timeout_s=timeout_s, fresh=fresh)
        if copy is None:
            con, _ = connect_retrying(path, read_only=True, timeout_s=timeout_s, config=READER_CONFIG)
            return con, time.monotonic() - start
        try:
            return duckdb.connect(str(copy), read_only=True, config=READER_CONFIG), time.monotonic() - start
        except (duckdb.IOException, duckdb.ConnectionException):
            if copy.exists():
                raise
            # a newer copy replaced it between looking and opening: look again
    raise StoreLocked(f"{path}: its read snapshots kept being replaced while this reader opened them")


def _one_line(text: str, limit: int = 400) -> str:
    return " ".join(str(text).split())[:limit]


@dataclass
class QueryResult:
    columns: list[str]
    rows: list[tuple[Any, ...]]
    waited_s: float


def query(
    path: StoreLocation,
    sql: str,
    params: Sequence[Any] | None = None,
    *,
    timeout_s: float = 30.0,
    sandboxed: bool = False,
    max_seconds: float | None = None,
    max_memory: str | None = None,
    fresh: bool = True,
) -> QueryResult:
    """Run read-only ``sql`` against the store; the last statement's result is returned.

    ``sandboxed``: the SQL is someone's (``prmloop sql``): on a DuckLake, refuse to run it as a
    catalog role that could do more than read. ``max_seconds``: the statements are interrupted
    (DuckDB's ``interrupt()``, from a timer) once they have run that long; ``max_memory``: DuckDB's
    ``memory_limit``. Either ends the query in :class:`QueryLimitExceeded`, one line naming the
    limit. ``fresh=False``: the newest read snapshot as it is (see :func:`reading_copy`), not one
    at least as new as the call. Every failure of the query is one line."""
    statements = check_read_only(sql)
    with open_reader(path, timeout_s=timeout_s, sandboxed=sandboxed, memory_limit=max_memory, fresh=fresh) as (
        con,
        waited,
    ):
        result: duckdb.DuckDBPyConnection | None = None
        stopped = threading.Event()

        def stop() -> None:
            stopped.set()
            con.interrupt()

        timer = threading.Timer(max_seconds, stop) if max_seconds else None
        if timer is not None:
            timer.daemon = True
            timer.start()
        try:
            for i, st in enumerate(statements):
                try:
                    result = con.execute(st, params if (params and i == len(statements) - 1) else None)
                    if i == len(statements) - 1:
                        columns = [d[0] for d in (result.description or [])]
                        rows = result.fetchall() if columns else []
                except duckdb.Error as exc:
                    where = f"statement {i + 1}: " if len(statements) > 1 else ""
                    if stopped.is_set() or isinstance(exc, duckdb.InterruptException):
                        raise QueryLimitExceeded(
                            f"the query was stopped at its time limit of {max_seconds:g} s: "
                            "give --max-seconds with more (0: no limit)"
                        ) from exc
                    if max_memory is not None and isinstance(exc, duckdb.OutOfMemoryException):
                        raise QueryLimitExceeded(
                            f"the query was stopped at its memory limit of {max_memory}: "
                            "give --max-memory with more (e.g. 8GB)"
                        ) from exc
                    problem = str(exc).split("\nLINE ")[0]  # DuckDB's caret drawing is no use on one line
                    io = isinstance(exc, duckdb.IOException | duckdb.ConnectionException)
                    raise (QueryIOError if io else QueryError)(
                        f"the query failed: {where}{_one_line(problem)}"
                    ) from exc
        finally:
            if timer is not None:
                timer.cancel()
    return QueryResult(columns, rows, waited)


def store_health(db_path: StoreLocation, *, timeout_s: float = 30.0) -> dict[str, Any]:
    """Counts for ``prmloop status``: events (in all and per topic and type), conflicting duplicates,
    and when the sink last stored one. Read-only; retried while the sink holds the file."""
    with open_reader(db_path, timeout_s=timeout_s) as (con, _):

        def scalar(sql: str) -> int:
            row = con.execute(sql).fetchone()
            return int(row[0]) if row and row[0] is not None else 0

        tables = {
            r[0]
            for r in con.execute(
                "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database()"
            ).fetchall()
        }
        per_topic = dict(
            con.execute("SELECT coalesce(topic, '?'), count(*) FROM events GROUP BY 1 ORDER BY 1").fetchall()
        )
        per_type = dict(con.execute("SELECT event_type, count(*) FROM events GROUP BY 1 ORDER BY 1").fetchall())
        has_conflicts = "conflicts" in tables
        conflicts = scalar("SELECT count(*) FROM conflicts") if has_conflicts else 0
        conflicting_events = scalar("SELECT count(DISTINCT event_id) FROM conflicts") if has_conflicts else 0
        last = con.execute("SELECT max(ingested_at) FROM events").fetchone()
    return {
        "db_path": str(db_path),
        "events": sum(per_topic.values()),
        "events_per_topic": per_topic,
        "events_per_type": per_type,
        "conflicts": conflicts,
        "conflicting_events": conflicting_events,
        "last_ingested_at": last[0].isoformat() if last and last[0] is not None else None,
    }
