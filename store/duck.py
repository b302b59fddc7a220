"""The DuckDB store: schema, the idempotent batch writer, and read-only access for everyone else.

DuckDB allows one writing process per file, and while it holds the file no other process may open
it, not even to read. prmloop's answer: the sink is the only writer and holds the file only while
it writes one batch (open, one transaction, close); readers open it read-only between batches and
retry while the sink holds it. Both waits are measured (``prmloop bench sink`` reports them). A
long-running reader therefore stalls ingestion (the sink keeps consuming into memory and retries),
so readers are short: ``prmloop sql`` opens, queries, closes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS events (
    event_id UUID PRIMARY KEY,
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
    ingested_at TIMESTAMPTZ NOT NULL
);
CREATE TABLE IF NOT EXISTS sink_offsets (
    topic VARCHAR NOT NULL,
    kafka_partition INTEGER NOT NULL,
    next_offset BIGINT NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (topic, kafka_partition)
);
"""

#: What ``prmloop sql`` accepts; anything else (INSERT, COPY, ATTACH, SET, PRAGMA, CALL, ...) is refused.
READ_ONLY_STATEMENTS = frozenset({duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN})


class StoreLocked(TimeoutError):
    pass


class ReadOnlyViolation(ValueError):
    pass


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
    return resources.files("prmloop.store").joinpath("projections.sql").read_text()


@dataclass
class WriteResult:
    received: int
    inserted: int
    open_wait_s: float
    write_s: float


class EventStore:
    """The writer side. Only the sink uses it; it holds the file only inside :meth:`write_batch`."""

    def __init__(self, path: Path, *, lock_timeout_s: float = 600.0) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.lock_timeout_s = lock_timeout_s
        with self._open() as (con, _):
            con.execute(SCHEMA_SQL)
            con.execute(projection_sql())

    @contextmanager
    def _open(self) -> Iterator[tuple[duckdb.DuckDBPyConnection, float]]:
        con, waited = _connect_retrying(self.path, read_only=False, timeout_s=self.lock_timeout_s, config={})
        try:
            yield con, waited
        finally:
            con.close()

    def write_batch(self, rows: pa.Table, offsets: Sequence[tuple[str, int, int]]) -> WriteResult:
        """Insert ``rows`` (columns as :data:`EVENT_COLUMNS`) and the consumed ``offsets`` atomically.

        ``INSERT OR IGNORE`` on the ``event_id`` primary key makes a redelivered or duplicated event a
        no-op; duplicates inside the batch are dropped before (DuckDB rejects them in one statement).
        """
        t0 = time.monotonic()
        with self._open() as (con, waited):
            before = _count(con)
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
                con.execute(
                    """
                    INSERT OR IGNORE INTO events
                    SELECT CAST(event_id AS UUID), event_type, schema_version, occurred_at, producer,
                           CAST(causation_id AS UUID), correlation_id, json_extract(body, '$.payload'),
                           topic, kafka_partition, kafka_offset, ?
                    FROM incoming
                    QUALIFY row_number() OVER (PARTITION BY event_id ORDER BY kafka_offset) = 1
                    """,
                    [now],
                )
                con.execute(
                    "INSERT OR REPLACE INTO sink_offsets SELECT topic, kafka_partition, next_offset, ? "
                    "FROM incoming_offsets",
                    [now],
                )
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise
            finally:
                con.unregister("incoming")
                con.unregister("incoming_offsets")
            inserted = _count(con) - before
        return WriteResult(rows.num_rows, inserted, waited, time.monotonic() - t0 - waited)


def _count(con: duckdb.DuckDBPyConnection) -> int:
    row = con.execute("SELECT count(*) FROM events").fetchone()
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
    # No file, network or extension access from a query, and no way to switch it back on.
    "enable_external_access": False,
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "lock_configuration": True,
}


@contextmanager
def open_reader(path: Path, *, timeout_s: float = 30.0) -> Iterator[tuple[duckdb.DuckDBPyConnection, float]]:
    """A read-only connection, retried while the sink holds the file. Yields (connection, waited_s)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(
            f"no prmloop database at {path}: start `prmloop sink` (it creates it), or set PRMLOOP_HOME"
        )
    con, waited = _connect_retrying(path, read_only=True, timeout_s=timeout_s, config=READER_CONFIG)
    try:
        yield con, waited
    finally:
        con.close()


def check_read_only(sql: str) -> list[str]:
    """The statements of ``sql`` if every one only reads; otherwise :class:`ReadOnlyViolation`."""
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise ReadOnlyViolation(f"the query does not parse: {exc}") from exc
    if not statements:
        raise ReadOnlyViolation("the query is empty: give a SELECT statement")
    for i, st in enumerate(statements, 1):
        if st.type not in READ_ONLY_STATEMENTS:
            raise ReadOnlyViolation(
                f"statement {i} is {st.type.name}: `prmloop sql` only reads (SELECT, WITH, FROM, DESCRIBE, "
                "SHOW, SUMMARIZE, EXPLAIN). The store is changed only by events, through the sink; "
                "export results with --format csv/json instead of COPY."
            )
    return [st.query for st in statements]


@dataclass
class QueryResult:
    columns: list[str]
    rows: list[tuple[Any, ...]]
    waited_s: float


def query(path: Path, sql: str, params: Sequence[Any] | None = None, *, timeout_s: float = 30.0) -> QueryResult:
    """Run read-only ``sql`` against the store; the last statement's result is returned."""
    statements = check_read_only(sql)
    with open_reader(path, timeout_s=timeout_s) as (con, waited):
        result: duckdb.DuckDBPyConnection | None = None
        for i, st in enumerate(statements):
            result = con.execute(st, params if (params and i == len(statements) - 1) else None)
        assert result is not None
        columns = [d[0] for d in (result.description or [])]
        rows = result.fetchall() if columns else []
    return QueryResult(columns, rows, waited)
