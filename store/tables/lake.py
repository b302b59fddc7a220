"""DuckLake: the store for many writers and readers (``PRMLOOP_STORE=ducklake:...``).

A DuckLake catalog keeps the tables' metadata in a database (PostgreSQL in a cluster; a local
PostgreSQL from the ``pgserver`` package on a laptop and in tests) and their rows as Parquet files
under a data path. Every process attaches it through DuckDB: several sinks append at once (appends
never conflict), and readers query a committed snapshot while they write, without waiting.

The same schema as the DuckDB file, adapted to what DuckLake has and lacks:

- No primary keys. ``events_log`` holds every stored record; a sink inserts only event ids that no
  committed row has (the redeliveries a restart or a rebalance causes) and the view ``events`` keeps
  one row per ``event_id`` (the first stored), so a record two sinks stored at the same moment is
  still one event to every reader; compaction removes such doubles for good.
- Table-level write conflicts (an update anywhere in a table conflicts with any concurrent change
  to it), so the consumed offsets are appended to ``sink_offsets_log`` and ``sink_offsets`` is the
  newest per partition.
- The projections are the same views as on the DuckDB file (``projections.sql``).

Where the catalog is and as which PostgreSQL role writers and readers reach it: store/tables/lake_catalog.py.

The extensions come from Python packages (``duckdb-extension-ducklake``, ``-postgres-scanner``),
built for the pinned DuckDB version: nothing is downloaded.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import duckdb
import pyarrow as pa

from prmloop.store.kafka.poison import is_transient
from prmloop.store.tables.lake_catalog import (
    LAKE_PREFIX,
    LakeError,
    LakeStore,
    ReaderRoleError,
    is_lake_spec,
    local_postgres,
    parse_lake,
)
from prmloop.store.tables.lake_connect import (
    ALIAS,
    BASE_CONFIG,
    METADATA_CATALOG,
    attach,
    extension_file,
    is_conflict,
    one_line,
    open_lake,
    release,
    retrying,
)
from prmloop.store.tables.writer import WriteResult, stage_sql

__all__ = [  # with what lake_catalog.py and lake_connect.py define, re-exported: importers of this module need it
    "ALIAS",
    "CONFLICT_COLUMNS_SQL",
    "EVENT_COLUMNS_SQL",
    "LAKE_PREFIX",
    "METADATA_CATALOG",
    "SCHEMA_SQL",
    "STALE_CONFLICTS_WHERE",
    "LakeError",
    "LakeEventStore",
    "LakeStore",
    "ReaderRoleError",
    "compact",
    "drop_stale_conflicts",
    "ensure_schema",
    "extension_file",
    "fact_sql",
    "is_conflict",
    "is_lake_spec",
    "local_postgres",
    "open_lake",
    "parse_lake",
    "release",
    "retrying",
]

log = logging.getLogger(__name__)

#: The columns of a stored event and of a conflict row, the same on both stores (store/tables/duck.py adds its
#: keys; the lake has none).
EVENT_COLUMNS_SQL = """
    event_id UUID NOT NULL,
    event_type VARCHAR NOT NULL,
    schema_version INTEGER NOT NULL,
    occurred_at TIMESTAMPTZ NOT NULL,
    producer VARCHAR NOT NULL,
    causation_id UUID,
    correlation_id VARCHAR NOT NULL,
    payload JSON NOT NULL,
    topic VARCHAR,
    kafka_partition INTEGER,
    kafka_offset BIGINT,
    ingested_at TIMESTAMPTZ NOT NULL"""
CONFLICT_COLUMNS_SQL = """
    event_id UUID NOT NULL,
    event_type VARCHAR,
    topic VARCHAR,
    kafka_partition INTEGER,
    kafka_offset BIGINT,
    body VARCHAR NOT NULL,
    body_sha256 VARCHAR NOT NULL,
    stored_sha256 VARCHAR NOT NULL,
    stored_topic VARCHAR,
    stored_partition INTEGER,
    stored_offset BIGINT,
    detected_at TIMESTAMPTZ NOT NULL"""

SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS events_log (
{events},
    writer VARCHAR
);
CREATE TABLE IF NOT EXISTS conflicts (
{conflicts}
);
CREATE TABLE IF NOT EXISTS sink_offsets_log (
    topic VARCHAR NOT NULL,
    kafka_partition INTEGER NOT NULL,
    next_offset BIGINT NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL,
    writer VARCHAR
);
CREATE OR REPLACE VIEW events AS
SELECT event_id, event_type, schema_version, occurred_at, producer, causation_id, correlation_id, payload,
       topic, kafka_partition, kafka_offset, ingested_at
FROM events_log
QUALIFY row_number() OVER (PARTITION BY event_id ORDER BY ingested_at, topic, kafka_partition, kafka_offset) = 1;
CREATE OR REPLACE VIEW sink_offsets AS
SELECT topic, kafka_partition, max(next_offset) AS next_offset, max(updated_at) AS updated_at
FROM sink_offsets_log GROUP BY ALL;
""".format(events=EVENT_COLUMNS_SQL.strip("\n"), conflicts=CONFLICT_COLUMNS_SQL.strip("\n"))


def fact_sql(alias: str) -> str:
    """What makes two records with one ``event_id`` the same fact: the event type, the schema version
    and the payload (as JSON text normalised by DuckDB). The envelope's producer, time and cause are
    not part of it: the same fact published by two producers (``sample`` and ``prioritize`` both
    register a question under its deterministic id) is a redelivery, not a conflict."""
    a = alias
    return _fact(f"{a}.event_type", f"{a}.schema_version", f"{a}.payload")


def _fact(event_type: str, schema_version: str, payload: str) -> str:
    return f"concat_ws(chr(31), {event_type}, CAST({schema_version} AS VARCHAR), CAST({payload} AS VARCHAR))"


#: Rows an older sink added to ``conflicts`` for what is a redelivery by :func:`fact_sql` (it compared
#: the whole envelope): the kept record's fact equals the stored event's.
_STALE_CONFLICT_FACT = _fact(
    "c.event_type",
    "CAST(json_extract(c.body, '$.schema_version') AS INTEGER)",
    "CAST(json_extract(c.body, '$.payload') AS JSON)",
)
STALE_CONFLICTS_WHERE = f"""EXISTS (
    SELECT 1 FROM events e WHERE e.event_id = c.event_id AND {fact_sql("e")} = {_STALE_CONFLICT_FACT})"""


def drop_stale_conflicts(con: duckdb.DuckDBPyConnection) -> int:
    """Delete the rows :data:`STALE_CONFLICTS_WHERE` finds (counted first: a lake commits nothing when
    there are none); returns how many."""
    row = con.execute(f"SELECT count(*) FROM conflicts c WHERE {STALE_CONFLICTS_WHERE}").fetchone()
    stale = int(row[0]) if row else 0
    if stale:
        con.execute(f"DELETE FROM conflicts c WHERE {STALE_CONFLICTS_WHERE}")
    return stale


def ensure_schema(store: LakeStore, projections: str) -> None:
    """Create the tables and views (once; concurrent first starts retry)."""

    def create() -> None:
        with open_lake(store, read_only=False) as con:
            # One transaction: a reader never sees the tables without the views.
            con.execute("BEGIN TRANSACTION")
            con.execute(SCHEMA_SQL)
            con.execute(projections)
            drop_stale_conflicts(con)
            con.execute("COMMIT")

    retrying(create, what="creating the lake's tables")


# Only event ids no committed row has: a redelivery is a no-op. Two sinks storing the same id at the
# same moment both succeed; the view ``events`` still shows one (and compaction removes the other).
_INSERT_SQL = """
INSERT INTO events_log
SELECT s.event_id, s.event_type, s.schema_version, s.occurred_at, s.producer, s.causation_id, s.correlation_id,
       s.payload, s.topic, s.kafka_partition, s.kafka_offset, ?, ?
FROM staged s
WHERE s.rn = 1 AND s.event_id NOT IN (SELECT event_id FROM events_log WHERE event_id IN (SELECT event_id FROM staged))
"""


def _conflicts_sql(content: Callable[[str], str] = fact_sql) -> str:
    return f"""
INSERT INTO conflicts
SELECT s.event_id, s.event_type, s.topic, s.kafka_partition, s.kafka_offset, s.body,
       sha256({content("s")}) AS body_sha, sha256({content("e")}), e.topic, e.kafka_partition, e.kafka_offset, ?
FROM staged s JOIN events e ON e.event_id = s.event_id
WHERE {content("s")} <> {content("e")}
  AND NOT EXISTS (SELECT 1 FROM conflicts c WHERE c.event_id = s.event_id AND c.body_sha256 = sha256({content("s")}))
QUALIFY row_number() OVER (PARTITION BY s.event_id, sha256({content("s")})
                           ORDER BY s.topic, s.kafka_partition, s.kafka_offset) = 1
"""


@dataclass
class LakeEventStore:
    """The writer side on DuckLake; any number of them may write at once."""

    store: LakeStore
    projections: str
    writer: str = field(default_factory=lambda: f"{os.uname().nodename}:{os.getpid()}")

    def __post_init__(self) -> None:
        ensure_schema(self.store, self.projections)
        self._con: duckdb.DuckDBPyConnection | None = None

    @property
    def location(self) -> LakeStore:
        return self.store

    def _connection(self) -> duckdb.DuckDBPyConnection:
        # One attached connection per sink: attaching costs a catalog round trip per batch otherwise.
        if self._con is None:
            con = duckdb.connect(config=dict(BASE_CONFIG))
            try:
                attach(con, self.store, read_only=False)
            except BaseException:
                release(con)
                raise
            self._con = con
        return self._con

    def close(self) -> None:
        if self._con is not None:
            con, self._con = self._con, None
            release(con)

    def write_batch(self, rows: pa.Table, offsets: Sequence[tuple[str, int, int]]) -> WriteResult:
        t0 = time.monotonic()
        conflicts_sql = _conflicts_sql()
        off = pa.table(
            {
                "topic": pa.array([o[0] for o in offsets], pa.string()),
                "kafka_partition": pa.array([o[1] for o in offsets], pa.int32()),
                "next_offset": pa.array([o[2] for o in offsets], pa.int64()),
            }
        )

        def transaction() -> tuple[int, int]:
            con = self._connection()
            now = datetime.now(UTC)
            try:
                con.execute("BEGIN TRANSACTION")
                con.register("incoming", rows)
                con.register("incoming_offsets", off)
                con.execute(stage_sql(rows))
                inserted_row = con.execute(_INSERT_SQL, [now, self.writer]).fetchone()
                inserted = int(inserted_row[0]) if inserted_row else 0
                conflicts = 0
                if inserted < rows.num_rows:
                    row = con.execute(conflicts_sql, [now]).fetchone()
                    conflicts = int(row[0]) if row else 0
                con.execute(
                    "INSERT INTO sink_offsets_log "
                    "SELECT topic, kafka_partition, next_offset, ?, ? FROM incoming_offsets",
                    [now, self.writer],
                )
                con.execute("COMMIT")
                con.execute("DROP TABLE IF EXISTS temp.staged")
                con.unregister("incoming")
                con.unregister("incoming_offsets")
            except BaseException:
                # Whatever failed (a lost commit race, PostgreSQL gone mid-batch), nothing of this batch
                # stays on the connection: the next attempt attaches a new one. Rolling back and cleaning
                # up here could fail half-way and leave a view that makes every later batch fail.
                self.close()
                raise
            return inserted, conflicts

        try:
            inserted, conflicts = retrying(transaction)
        except duckdb.Error as exc:
            if is_transient(exc):
                raise
            # A catalog lost in the middle of a batch shows as any kind of DuckDB error (a COPY that
            # failed to prepare, statistics it could not read, an invalidated database), which the
            # consumer runtime would take for a poison batch and dead-letter. Once more on a fresh
            # connection: a lost catalog then fails to connect (transient) or is back and stores the
            # batch; a batch that fails twice the same way is what its error says.
            log.warning("the lake transaction failed (%s): trying once more on a new connection", one_line(exc))
            time.sleep(0.5)
            inserted, conflicts = retrying(transaction)
        return WriteResult(rows.num_rows, inserted, 0.0, time.monotonic() - t0, conflicts)


# ------------------------------------------------------------------------------------------- maintenance


def compact(store: LakeStore, *, keep_snapshots_for: timedelta = timedelta(days=7)) -> dict[str, Any]:
    """Remove doubled event ids (keeping the row the view shows), flush inlined rows to Parquet, merge
    small files, expire snapshots older than ``keep_snapshots_for`` and delete files no snapshot needs.

    Safe while sinks write: each step is its own DuckLake transaction, retried when a sink's commit
    won the race.
    """

    def step(sql: str) -> list[tuple[Any, ...]]:
        def run() -> list[tuple[Any, ...]]:
            with open_lake(store, read_only=False) as con:
                return con.execute(sql).fetchall()

        return retrying(run)

    def files() -> int:
        with open_lake(store, read_only=True) as con:
            row = con.execute(f"SELECT count(*) FROM ducklake_list_files('{ALIAS}', 'events_log')").fetchone()
            return int(row[0]) if row else 0

    files_before = files()
    doubles = step(
        """
        SELECT count(*) FROM (
            SELECT row_number() OVER (
                PARTITION BY event_id ORDER BY ingested_at, topic, kafka_partition, kafka_offset) AS rn
            FROM events_log) WHERE rn > 1
        """
    )[0][0]
    if doubles:
        step(
            """
            DELETE FROM events_log WHERE rowid IN (
                SELECT rowid FROM (
                    SELECT rowid, row_number() OVER (
                        PARTITION BY event_id ORDER BY ingested_at, topic, kafka_partition, kafka_offset) AS rn
                    FROM events_log) WHERE rn > 1)
            """
        )
        step(f"CALL ducklake_rewrite_data_files('{ALIAS}', 'events_log')")
    step(f"CALL ducklake_flush_inlined_data('{ALIAS}')")
    step(f"CALL ducklake_merge_adjacent_files('{ALIAS}')")
    cutoff = datetime.now(UTC) - keep_snapshots_for
    expired = step(f"CALL ducklake_expire_snapshots('{ALIAS}', older_than => TIMESTAMPTZ '{cutoff.isoformat()}')")
    removed = step(f"CALL ducklake_cleanup_old_files('{ALIAS}', cleanup_all => true)")
    return {
        "store": str(store),
        "doubled_events_removed": int(doubles),
        "files_before": files_before,
        "files_after": files(),
        "snapshots_expired": len(expired),
        "files_deleted": len(removed),
    }
