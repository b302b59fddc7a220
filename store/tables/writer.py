"""What every event store writes and how: the :class:`EventStore` protocol the sink writes through (the
DuckDB file, :class:`~prmloop.store.tables.duck.DuckEventStore`, and DuckLake,
:class:`~prmloop.store.tables.lake.LakeEventStore`), the result of one batch, and the staging statement
both run on a batch of consumed records."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa

__all__ = ["ROW_SQL", "EventStore", "WriteResult", "ids_unique", "stage_sql"]


class EventStore(Protocol):
    """A store the sink writes to: one batch of consumed records (columns as
    :data:`~prmloop.store.tables.duck.EVENT_SCHEMA`) and the offsets it consumed, in one transaction."""

    @property
    def location(self) -> Any: ...

    def write_batch(self, rows: pa.Table, offsets: Sequence[tuple[str, int, int]]) -> WriteResult: ...

    def close(self) -> None: ...


@dataclass
class WriteResult:
    received: int
    inserted: int
    open_wait_s: float
    write_s: float
    #: Records of this batch whose event_id is stored with another fact (new rows in ``conflicts``).
    conflicts: int = 0


#: One consumed record as a stored row (the event's columns; the payload cut out of the body by DuckDB).
ROW_SQL = """CAST(event_id AS UUID) AS event_id, event_type, schema_version, occurred_at, producer,
       CAST(causation_id AS UUID) AS causation_id, correlation_id,
       CAST(json_extract(body, '$.payload') AS JSON) AS payload, topic, kafka_partition, kafka_offset"""

_STAGE_SQL = "CREATE OR REPLACE TEMP TABLE staged AS SELECT " + ROW_SQL + ", body, {rank} AS rn FROM incoming"
_RANK_DUPLICATES = "row_number() OVER (PARTITION BY event_id ORDER BY topic, kafka_partition, kafka_offset)"


def ids_unique(rows: pa.Table) -> bool:
    """No event id occurs twice in ``rows`` (counted in Arrow)."""
    import pyarrow.compute as pc

    return bool(pc.count_distinct(rows.column("event_id")).as_py() == rows.num_rows)


def stage_sql(rows: pa.Table, *, unique: bool | None = None) -> str:
    """The staging statement; the window that ranks repeated event ids only when the batch repeats one
    (the window is a fifth of the write time otherwise)."""
    if unique is None:
        unique = ids_unique(rows)
    return _STAGE_SQL.format(rank="1" if unique else _RANK_DUPLICATES)
