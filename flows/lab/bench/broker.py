"""``prmloop bench broker``: produce and consume rates of the embedded broker, in memory and on PostgreSQL.

One run, the same events for both: each storage gets a fresh broker with the event topics, the
events are published with prmloop's own producer (acks from the broker, in batches of ``batch``), then
read back by a bare kafka-python consumer with the runtime's settings. The PostgreSQL storage is a
throw-away pgserver PostgreSQL in a temporary folder (or ``dsn``), reached through the object gateway.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from prmloop.flows.lab.bench.sink import raw_consume
from prmloop.flows.lab.bench.synthetic import synthetic_events
from prmloop.flows.ops.broker import EmbeddedBroker
from prmloop.store.events import Envelope
from prmloop.store.events.codec import encode_event
from prmloop.store.events.topics import all_topic_specs
from prmloop.store.kafka.producer import EventProducer, ensure_topics

__all__ = ["bench_broker_storage"]


@contextlib.contextmanager
def _throwaway_postgres() -> Iterator[str]:
    """A pgserver PostgreSQL in a temporary folder, as prmloop makes them (a password for every role; the
    brokers' storage owned by its role)."""
    from prmloop.store.auth.credentials import BROKER_ROLE, load_credentials
    from prmloop.store.tables.pg_local import start_local_postgres

    folder = Path(tempfile.mkdtemp(prefix="prmloop-bench-broker-"))
    credentials = load_credentials()
    server = start_local_postgres(folder / "pg", {"prmloop_broker": BROKER_ROLE}, credentials=credentials)
    socket_dir = server.get_postmaster_info().socket_dir
    try:
        yield f"postgresql://{BROKER_ROLE}@/prmloop_broker?host={socket_dir}&passfile={credentials.passfile(BROKER_ROLE)}"
    finally:
        server.cleanup()
        shutil.rmtree(folder, ignore_errors=True)


def _run(storage: str | None, events: Sequence[Envelope], batch: int, partitions: int) -> dict[str, Any]:
    with EmbeddedBroker(storage=storage, cluster_id=f"bench-{time.time_ns()}") as broker:
        servers = broker.bootstrap_servers
        ensure_topics(servers, all_topic_specs(partitions))
        with EventProducer(servers, follow_broker=False, timeout_s=120) as producer:
            producer.publish(events[: min(batch, len(events))])  # connections and metadata, not timed
            rest = events[min(batch, len(events)) :]
            t0 = time.perf_counter()
            for i in range(0, len(rest), batch):
                producer.publish(rest[i : i + batch])
            produce_s = time.perf_counter() - t0
        consume_s = raw_consume(servers, len(events), group=f"bench-broker-{time.time_ns()}")
    return {
        "produce_eps": round(len(rest) / produce_s, 1) if rest else None,
        "consume_eps": round(len(events) / consume_s, 1),
    }


def bench_broker_storage(
    n: int = 20_000, *, batch: int = 500, partitions: int = 4, dsn: str | None = None
) -> dict[str, Any]:
    """Produce and consume rates (events/s) of the memory and the PostgreSQL storage, one JSON object."""
    events = synthetic_events(n)
    mean_bytes = sum(len(encode_event(e)) for e in events[:1000]) / min(1000, len(events))
    result: dict[str, Any] = {"events": n, "batch": batch, "partitions": partitions, "event_bytes": round(mean_bytes)}
    result["memory"] = _run(None, events, batch, partitions)
    with contextlib.ExitStack() as stack:
        url = dsn or stack.enter_context(_throwaway_postgres())
        result["postgres"] = _run(url, events, batch, partitions)
    for key in ("produce_eps", "consume_eps"):
        memory, postgres = result["memory"][key], result["postgres"][key]
        if memory and postgres:
            result[f"postgres_to_memory_{key.removesuffix('_eps')}"] = round(postgres / memory, 3)
    return result
