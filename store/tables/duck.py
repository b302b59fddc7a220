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
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path

import duckdb
import pyarrow as pa

from prmloop.store.tables.access import (
    DEFAULT_MAX_MEMORY,
    DEFAULT_MAX_SECONDS,
    READER_CONFIG,
    QueryError,
    QueryIOError,
    QueryLimitExceeded,
    StoreLocation,
    connect_retrying,
    locate,
    snapshot_connect,
    store_exists,
)
from prmloop.store.tables.lake import (
    CONFLICT_COLUMNS_SQL,
    EVENT_COLUMNS_SQL,
    LakeEventStore,
    LakeStore,
    drop_stale_conflicts,
    fact_sql,
)
from prmloop.store.tables.published import Freshness as _Freshness
from prmloop.store.tables.published import (
    Publisher,
    PublishStats,
    StoreLocked,
    WriterMark,
    current_snapshot,
    publish,
    register_writer,
    unregister_writer,
)
from prmloop.store.tables.reads import QueryResult, open_reader, query, store_health
from prmloop.store.tables.sql_guard import (
    ReadOnlyViolation,
)
from prmloop.store.tables.writer import ROW_SQL, EventStore, WriteResult, ids_unique, stage_sql

#: What callers import from here: the writer, and (re-exported) the location, the errors and the readers,
#: which live in store/tables/access.py and store/tables/reads.py.
__all__ = [
    "DEFAULT_MAX_MEMORY",
    "DEFAULT_MAX_SECONDS",
    "EVENT_SCHEMA",
    "PUBLISH_EVERY_S",
    "READER_CONFIG",
    "SCHEMA_SQL",
    "DuckEventStore",
    "QueryError",
    "QueryIOError",
    "QueryLimitExceeded",
    "QueryResult",
    "ReadOnlyViolation",
    "StoreLocation",
    "StoreLocked",
    "locate",
    "open_reader",
    "open_writer",
    "projection_sql",
    "query",
    "store_exists",
    "store_health",
]

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
                    connect=snapshot_connect,
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
                connect=snapshot_connect,
                timeout_s=timeout_s,
                stats=self.publish_stats,
            )
            self.publisher.ran()
            return True

    @contextmanager
    def _open(self) -> Iterator[tuple[duckdb.DuckDBPyConnection, float]]:
        con, waited = connect_retrying(self.path, read_only=False, timeout_s=self.lock_timeout_s, config={})
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
