"""The DuckDB store: schema, the idempotent batch writer, and read-only access for everyone else.

DuckDB allows one writing process per file, and while any process has the file open, even to read,
no writer gets in. prmloop's answer: the sink is the only writer and holds the file only while it
writes one batch (open, one transaction, close); readers never open that file. They read a copy the
writer publishes after its batches (store/tables/published.py: at most every ``publish_every_s``,
and one at least as new as anything stored before the read started), so a query, an export or a
snapshot may run for minutes while the sink goes on storing (issue 54: a long query had stopped it).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any, TypeAlias

import duckdb
import pyarrow as pa

from prmloop.store.tables.lake import (
    CONFLICT_COLUMNS_SQL,
    EVENT_COLUMNS_SQL,
    LakeEventStore,
    LakeStore,
    drop_stale_conflicts,
    fact_sql,
    is_lake_spec,
    open_lake,
    parse_lake,
)
from prmloop.store.tables.published import Freshness as _Freshness
from prmloop.store.tables.published import (
    Publisher,
    PublishStats,
    StoreLocked,
    WriterMark,
    current_snapshot,
    publish,
    reading_copy,
    register_writer,
    unregister_writer,
)
from prmloop.store.tables.sql_guard import (
    ReadOnlyViolation,  # noqa: F401 - callers catch it from here
    check_read_only,
)
from prmloop.store.tables.writer import ROW_SQL, EventStore, WriteResult, ids_unique, stage_sql

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


SCHEMA_SQL = """
-- No PRIMARY KEY on event_id: DuckDB writes the whole key index again at every checkpoint, and the sink
-- checkpoints after every batch (it closes the file for readers), so each batch cost more as the table
-- grew (measured: 0.2 s per 5,000 events at first, 0.7 s at 100,000 stored). The single writer inserts
-- only event ids no stored row has (an anti-join in the same transaction): the same guarantee.
CREATE TABLE IF NOT EXISTS events (
{events}
);
-- Records whose event_id was already stored with another fact (or lost to another record of the
-- same batch): never silently dropped. One row per distinct conflicting version of an event.
CREATE TABLE IF NOT EXISTS conflicts (
{conflicts},
    PRIMARY KEY (event_id, body_sha256)
);
CREATE TABLE IF NOT EXISTS sink_offsets (
    topic VARCHAR NOT NULL,
    kafka_partition INTEGER NOT NULL,
    next_offset BIGINT NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (topic, kafka_partition)
);
""".format(events=EVENT_COLUMNS_SQL.strip("\n"), conflicts=CONFLICT_COLUMNS_SQL.strip("\n"))


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


def _is_lock_error(exc: BaseException) -> bool:
    text = str(exc).lower()
    # "different configuration": this process already holds the file open as the writer (DuckDB
    # shares one instance per file and process), which is the same situation as another process's lock.
    return any(m in text for m in ("lock", "conflicting", "another process", "different configuration"))


def _connect_retrying(
    path: Path, *, read_only: bool, timeout_s: float, config: dict[str, Any]
) -> tuple[duckdb.DuckDBPyConnection, float]:
    start = time.monotonic()
    delay = 0.002
    while True:
        try:
            con = duckdb.connect(str(path), read_only=read_only, config=config)
            return con, time.monotonic() - start
        except (duckdb.IOException, duckdb.ConnectionException) as exc:
            if not _is_lock_error(exc):
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


def projection_sql() -> str:
    return resources.files("prmloop.store.tables").joinpath("projections.sql").read_text()


_INSERT_SQL = """
INSERT INTO events
SELECT s.event_id, s.event_type, s.schema_version, s.occurred_at, s.producer, s.causation_id, s.correlation_id,
       s.payload, s.topic, s.kafka_partition, s.kafka_offset, ?
FROM staged s
WHERE s.rn = 1 AND s.event_id NOT IN (SELECT event_id FROM events WHERE event_id IN (SELECT event_id FROM staged))
"""

# A batch without repeated ids (nearly all) goes straight from Arrow into the table: staging it first
# copied every body once more (measured: a third of the write).
_DIRECT_INSERT_SQL = f"""
INSERT INTO events
SELECT {ROW_SQL}, ?
FROM incoming
WHERE CAST(event_id AS UUID) NOT IN (
    SELECT event_id FROM events WHERE event_id IN (SELECT CAST(event_id AS UUID) FROM incoming))
"""

# After the insert every staged event_id has exactly one stored row: a pre-existing one, or the
# batch's first record (by topic, partition, offset). A staged record whose fact differs from it
# is a conflict. Only run when the batch held an event_id twice or one already stored.
_CONFLICTS_SQL = f"""
INSERT OR IGNORE INTO conflicts
SELECT s.event_id, s.event_type, s.topic, s.kafka_partition, s.kafka_offset, s.body,
       sha256({fact_sql("s")}), sha256({fact_sql("e")}), e.topic, e.kafka_partition, e.kafka_offset, ?
FROM staged s JOIN events e ON e.event_id = s.event_id
WHERE {fact_sql("s")} <> {fact_sql("e")}
QUALIFY row_number() OVER (PARTITION BY s.event_id, sha256({fact_sql("s")})
                           ORDER BY s.topic, s.kafka_partition, s.kafka_offset) = 1
"""


def open_writer(location: StoreLocation) -> EventStore:
    """The sink's writer for ``location``: the single-writer DuckDB file, or a DuckLake writer (any
    number of them may write at once)."""
    where = locate(location)
    if isinstance(where, LakeStore):
        return LakeEventStore(where, projection_sql())
    return DuckEventStore(where)


#: Seconds between two read snapshots at least (store/tables/published.py; longer for a large file),
#: ``PRMLOOP_PUBLISH_EVERY_S`` in the writer's environment.
PUBLISH_EVERY_S = float(os.environ.get("PRMLOOP_PUBLISH_EVERY_S", "0.5"))
#: How long the writer waits for the file's lock to publish (someone else's read-only connection):
#: then it tries again later, and readers copy the file themselves.
_PUBLISH_LOCK_TIMEOUT_S = 5.0


def _snapshot_connect(path: Path, *, timeout_s: float) -> tuple[duckdb.DuckDBPyConnection, float]:
    """The writer's file, opened read-only to hold writers off while it is copied."""
    return _connect_retrying(path, read_only=True, timeout_s=timeout_s, config=READER_CONFIG)


class DuckEventStore:
    """The writer side. Only the sink uses it; it holds the file only inside :meth:`write_batch`, and
    publishes the read snapshots readers open (:meth:`publish_if_due`)."""

    def __init__(self, path: Path, *, lock_timeout_s: float = 600.0, publish_every_s: float = PUBLISH_EVERY_S) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.lock_timeout_s = lock_timeout_s
        self._lock = threading.RLock()
        self.mark = WriterMark(self.path)
        self.publish_stats = PublishStats()
        self.publisher = Publisher(self._publish_due, publish_every_s, self.publish_stats)
        with self._lock:
            with self._open() as (con, _):
                con.execute(SCHEMA_SQL)
                con.execute(projection_sql())
                drop_stale_conflicts(con)
            self.mark.committed()
        register_writer(self.path, self)
        self.publisher.changed()

    def _publish_due(self) -> None:
        with self._lock:
            if self.publisher.dirty:
                publish(
                    self.path,
                    self.mark.generation,
                    connect=_snapshot_connect,
                    timeout_s=_PUBLISH_LOCK_TIMEOUT_S,
                    stats=self.publish_stats,
                )
                self.publisher.ran()

    def publish_if_due(self, *, timeout_s: float) -> bool:
        """Publish a read snapshot now unless the current one holds every batch stored so far, or the
        last one is too recent (then the writer publishes once it is due); whether it published."""
        if time.monotonic() < self.publisher.due_at():
            return False
        with self._lock:
            found = current_snapshot(self.path)
            if found is not None and _Freshness.now(self.path).met_by(found[1]) and found[0].exists():
                return False
            publish(
                self.path,
                self.mark.generation,
                connect=_snapshot_connect,
                timeout_s=timeout_s,
                stats=self.publish_stats,
            )
            self.publisher.ran()
            return True

    @contextmanager
    def _open(self) -> Iterator[tuple[duckdb.DuckDBPyConnection, float]]:
        con, waited = _connect_retrying(self.path, read_only=False, timeout_s=self.lock_timeout_s, config={})
        try:
            yield con, waited
        finally:
            con.close()

    def write_batch(self, rows: pa.Table, offsets: Sequence[tuple[str, int, int]]) -> WriteResult:
        """Insert ``rows`` (columns as :data:`EVENT_SCHEMA`), record conflicts, and store the consumed
        ``offsets``, all in one transaction.

        Only event ids no stored row has are inserted, so the first version of an event stays: the
        stored one, else the batch's first by (topic, partition, offset), a deterministic order. A
        redelivery of the same fact (:func:`fact_sql`: type, version, payload; from any producer) is a
        no-op; another fact under the id is a row in ``conflicts`` (never silently dropped), written
        in the same transaction.
        """
        with self._lock:
            result = self._write_batch(rows, offsets)
            self.mark.committed()
            self.publisher.changed()
        return result

    def _write_batch(self, rows: pa.Table, offsets: Sequence[tuple[str, int, int]]) -> WriteResult:
        t0 = time.monotonic()
        conflicts = 0
        with self._open() as (con, waited):
            now = datetime.now(UTC)
            off = pa.table(
                {
                    "topic": pa.array([o[0] for o in offsets], pa.string()),
                    "kafka_partition": pa.array([o[1] for o in offsets], pa.int32()),
                    "next_offset": pa.array([o[2] for o in offsets], pa.int64()),
                }
            )
            con.execute("BEGIN TRANSACTION")
            try:
                con.register("incoming", rows)
                con.register("incoming_offsets", off)
                unique = ids_unique(rows)
                if unique:
                    inserted = _changed(con.execute(_DIRECT_INSERT_SQL, [now]))
                else:
                    con.execute(stage_sql(rows, unique=False))
                    inserted = _changed(con.execute(_INSERT_SQL, [now]))
                if inserted < rows.num_rows:  # an event_id seen twice or already stored: compare the facts
                    if unique:
                        con.execute(stage_sql(rows, unique=True))
                    con_before = _count(con, "conflicts")
                    con.execute(_CONFLICTS_SQL, [now])
                    conflicts = _count(con, "conflicts") - con_before
                con.execute("DROP TABLE IF EXISTS staged")
                con.execute(
                    "INSERT OR REPLACE INTO sink_offsets SELECT topic, kafka_partition, next_offset, ? "
                    "FROM incoming_offsets",
                    [now],
                )
                con.execute("COMMIT")
            except BaseException:
                # A failed COMMIT (a full disk) has ended the transaction already, and ROLLBACK would
                # then raise "no transaction is active" in place of the cause: report the first error.
                with suppress(duckdb.Error):
                    con.execute("ROLLBACK")
                raise
            finally:
                with suppress(duckdb.Error):  # the connection is closed next anyway
                    con.unregister("incoming")
                    con.unregister("incoming_offsets")
        return WriteResult(rows.num_rows, inserted, waited, time.monotonic() - t0 - waited, conflicts)

    @property
    def location(self) -> Path:
        return self.path

    def close(self) -> None:
        """Publish what readers have not seen yet; the file itself is not held between batches."""
        with self._lock:
            if self.publisher.dirty:
                with suppress(OSError, duckdb.Error):  # a reader publishes it then
                    self._publish_due()
            unregister_writer(self.path, self)
            self.mark.close()


def _changed(result: duckdb.DuckDBPyConnection) -> int:
    """The row count an INSERT reports."""
    row = result.fetchone()
    return int(row[0]) if row else 0


def _count(con: duckdb.DuckDBPyConnection, table: str = "events") -> int:
    row = con.execute(f"SELECT count(*) FROM {table}").fetchone()
    return int(row[0]) if row else 0


EVENT_SCHEMA = pa.schema(
    [
        ("event_id", pa.string()),
        ("event_type", pa.string()),
        ("schema_version", pa.int32()),
        ("occurred_at", pa.timestamp("us", tz="UTC")),
        ("producer", pa.string()),
        ("causation_id", pa.string()),
        ("correlation_id", pa.string()),
        ("body", pa.string()),
        ("topic", pa.string()),
        ("kafka_partition", pa.int32()),
        ("kafka_offset", pa.int64()),
    ]
)


# ------------------------------------------------------------------------------------------------ readers

READER_CONFIG: dict[str, Any] = {
    # No file, network or extension access from a query (and no way to switch it back on: see
    # _quiet_and_locked).
    "enable_external_access": False,
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
}


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
        copy, _waited = reading_copy(path, connect=_snapshot_connect, timeout_s=timeout_s, fresh=fresh)
        if copy is None:
            con, _ = _connect_retrying(path, read_only=True, timeout_s=timeout_s, config=READER_CONFIG)
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
