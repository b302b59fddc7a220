"""The store sink: the only process that writes the store (on a DuckLake: the sinks, any number).

It reads every event topic, and for each batch runs one transaction that inserts the events
(only event ids not stored yet, from an Arrow table), records conflicting duplicates (same
``event_id``, other content) in ``conflicts``, and records the consumed offsets; the offsets are
committed to Kafka only after that transaction. Records that can never be stored (undecodable,
above the limits, an event on another type's topic) go to ``<topic>.dlq`` through the runtime.
Killed at any point, it loses nothing and duplicates nothing: a batch is either stored with its
offsets or redelivered and ignored. On a DuckLake (``PRMLOOP_STORE=ducklake:...``) the sinks join one
consumer group and split the partitions; see store/tables/lake.py for how event ids stay unique there.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pyarrow as pa
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from prmloop.store.events.codec import encode_event
from prmloop.store.events.topics import EVENT_TOPICS
from prmloop.store.kafka.records import collected_between_batches
from prmloop.store.kafka.runtime import ConsumedEvent, paused_gc
from prmloop.store.kafka.service import ServiceStats, run_service
from prmloop.store.settings import KafkaSettings
from prmloop.store.tables.duck import EVENT_SCHEMA, StoreLocation, locate, open_writer
from prmloop.store.tables.lake import LakeStore
from prmloop.store.tables.writer import EventStore, WriteResult

log = logging.getLogger(__name__)

SINK_GROUP = "prmloop-sink"


@dataclass
class SinkStats:
    batches: int = 0
    received: int = 0
    inserted: int = 0
    #: Records stored under an existing event_id with other content: rows added to ``conflicts``.
    conflicts: int = 0
    open_wait_s: list[float] = field(default_factory=list)
    write_s: list[float] = field(default_factory=list)


def events_to_arrow(batch: Sequence[ConsumedEvent]) -> pa.Table:
    """The batch as an Arrow table in :data:`EVENT_SCHEMA` (the body is the current-version envelope)."""
    cols: dict[str, list[object]] = {name: [] for name in EVENT_SCHEMA.names}
    for c in batch:
        e = c.event
        cols["event_id"].append(str(e.event_id))
        cols["event_type"].append(e.event_type)
        cols["schema_version"].append(e.schema_version)
        cols["occurred_at"].append(e.occurred_at)
        cols["producer"].append(e.producer)
        cols["causation_id"].append(str(e.causation_id) if e.causation_id else None)
        cols["correlation_id"].append(e.correlation_id)
        cols["body"].append((c.body or encode_event(e)).decode())
        cols["topic"].append(c.topic)
        cols["kafka_partition"].append(c.partition)
        cols["kafka_offset"].append(c.offset)
    return pa.Table.from_pydict(cols, schema=EVENT_SCHEMA)


class Sink:
    """The batch handler: one DuckDB transaction per batch."""

    def __init__(
        self,
        store: EventStore,
        on_write: Callable[[WriteResult], None] | None = None,
        *,
        after_batch: Callable[[], object] | None = None,
    ) -> None:
        self.store = store
        self.stats = SinkStats()
        self.on_write = on_write
        #: Called once the batch is stored (run_sink: a garbage collection, see collected_between_batches).
        self.after_batch = after_batch

    def __call__(self, batch: list[ConsumedEvent]) -> None:
        next_offsets: dict[tuple[str, int], int] = {}
        for c in batch:
            key = (c.topic, c.partition)
            next_offsets[key] = max(next_offsets.get(key, 0), c.offset + 1)
        with paused_gc():
            rows = events_to_arrow(batch)
        result = self.store.write_batch(rows, [(t, p, o) for (t, p), o in next_offsets.items()])
        self.stats.batches += 1
        self.stats.received += result.received
        self.stats.inserted += result.inserted
        self.stats.conflicts += result.conflicts
        self.stats.open_wait_s.append(result.open_wait_s)
        self.stats.write_s.append(result.write_s)
        if self.on_write is not None:
            self.on_write(result)
        if self.after_batch is not None:
            self.after_batch()


class SinkSettings(BaseSettings):
    """Options of the store sink (``prmloop sink``; environment ``PRMLOOP_SINK_*``)."""

    model_config = SettingsConfigDict(env_prefix="PRMLOOP_SINK_", frozen=True, extra="ignore")

    group: str = Field(default=SINK_GROUP, description="consumer group the offsets are committed under")
    max_batch: int = Field(default=5000, ge=1, description="events per store transaction at most")
    max_wait: float = Field(default=0.2, gt=0, description="seconds a batch waits to fill")
    topics: tuple[str, ...] = Field(default=EVENT_TOPICS, description="the topics it stores (every event topic)")


def run_sink(
    settings: SinkSettings | None = None,
    *,
    bootstrap_servers: str,
    db_path: StoreLocation,
    kafka: KafkaSettings | None = None,
    until: Callable[[], bool] | None = None,
    on_write: Callable[[WriteResult], None] | None = None,
    install_signal_handlers: bool = True,
) -> ServiceStats:
    """Run the sink into ``db_path`` until SIGTERM/SIGINT (or ``until()``); its counters are ``received``,
    ``inserted`` and ``conflicts`` (records stored under an existing event id with other content).

    On a DuckDB file the sink is the single writer and reads every partition; on a DuckLake it joins
    the consumer group ``settings.group``, so several sinks share the partitions and write at once.
    """
    settings = settings or SinkSettings()
    started = time.monotonic()
    lake = isinstance(locate(db_path), LakeStore)
    store = open_writer(db_path)
    sink = Sink(store, on_write=on_write)

    def counters() -> dict[str, int]:
        return {"received": sink.stats.received, "inserted": sink.stats.inserted, "conflicts": sink.stats.conflicts}

    with collected_between_batches() as collect:
        sink.after_batch = collect
        try:
            return run_service(
                "sink",
                sink,
                topics=settings.topics,
                group_id=settings.group,
                bootstrap_servers=bootstrap_servers,
                counters=counters,
                kafka=kafka,
                max_batch=settings.max_batch,
                until=until,
                install_signal_handlers=install_signal_handlers,
                close=[store.close],
                started=started,
                assign_all=not lake,
                max_wait_s=settings.max_wait,
            )
        finally:
            sink.after_batch = None
