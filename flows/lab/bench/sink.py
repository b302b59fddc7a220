"""``prmloop bench sink``: raw kafka-python consume rate vs the sink's rate into DuckDB, and how long
an event takes from ``publish()`` to being visible to a reader, all measured in one run.

With ``poison_fraction`` > 0 a second stream of ``n`` fresh events is mixed with that fraction of
hostile records (random bytes, deep nesting, wrong field types, events on another type's topic,
conflicting duplicates) and the sink's rate on it is compared with the clean stream's."""

from __future__ import annotations

import json
import random
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kafka import KafkaConsumer, TopicPartition
from rich.progress import Progress

from prmloop.consumers.sink import Sink, SinkSettings, run_sink
from prmloop.flows.lab.bench.synthetic import synthetic_events
from prmloop.flows.ops.broker import EmbeddedBroker
from prmloop.store.events import Envelope
from prmloop.store.events.codec import encode_event
from prmloop.store.events.topics import EVENT_TOPICS
from prmloop.store.kafka.producer import EventProducer, consumer_config, ensure_topics
from prmloop.store.kafka.runtime import ConsumerRuntime
from prmloop.store.settings import KafkaSettings
from prmloop.store.tables.duck import DuckEventStore, StoreLocked, query
from prmloop.store.tables.writer import WriteResult


@contextmanager
def bench_broker() -> Iterator[str]:
    settings = KafkaSettings()
    if settings.bootstrap_servers:
        yield settings.bootstrap_servers
        return
    with EmbeddedBroker() as b:
        yield b.bootstrap_servers


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def publish_paced(servers: str, events: Sequence[Envelope], rate: int, sent_at: dict[str, float]) -> float:
    """Publish ``events`` at ``rate`` per second in 20 ticks a second, noting each event's send time
    (``time.perf_counter``) in ``sent_at``; returns the rate achieved."""
    with EventProducer(servers, linger_ms=0) as producer:
        per_tick = max(1, rate // 20)
        start = time.perf_counter()
        for i in range(0, len(events), per_tick):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            chunk = events[i : i + per_tick]
            t = time.perf_counter()
            for e in chunk:
                sent_at[str(e.event_id)] = t
            producer.publish(chunk)
        return len(events) / (time.perf_counter() - start)


def latency_summary(sent_at: dict[str, float], seen_at: dict[str, float], achieved_eps: float) -> dict[str, Any]:
    """Publish-to-queryable percentiles of the events a reader saw (times in the same clock)."""
    latencies = [(seen_at[k] - sent_at[k]) * 1000 for k in sent_at if k in seen_at]
    return {
        "latency_rate_eps": round(achieved_eps, 1),
        "p50_latency_ms": round(percentile(latencies, 0.5), 1),
        "p95_latency_ms": round(percentile(latencies, 0.95), 1),
        "latency_events_seen": len(latencies),
        "latency_events_sent": len(sent_at),
    }


def raw_consume(servers: str, n: int, group: str) -> float:
    """Seconds for a bare kafka-python consumer (same settings as the runtime) to read ``n`` records,
    set-up and close included, as they are in the sink's figure."""
    t0 = time.perf_counter()
    consumer = KafkaConsumer(**consumer_config(KafkaSettings(), servers, group_id=group, max_poll_records=5000))
    parts = [TopicPartition(t, p) for t in EVENT_TOPICS for p in sorted(consumer.partitions_for_topic(t) or [])]
    consumer.assign(parts)
    seen = 0
    while seen < n:
        for recs in consumer.poll(timeout_ms=200, max_records=5000).values():
            seen += len(recs)
        if time.perf_counter() - t0 > 600:
            raise TimeoutError(f"raw consumer saw only {seen} of {n} records in 600 s")
    elapsed = time.perf_counter() - t0
    consumer.close(autocommit=False)
    return elapsed


def bench_sink(
    n: int = 100_000, rate: int = 1000, latency_seconds: float = 10.0, poison_fraction: float = 0.0
) -> dict[str, Any]:
    """Measure the sink; with ``poison_fraction`` > 0 also its rate on a stream with that share of
    hostile records (``poison_sink_eps``: records consumed per second, valid and hostile alike),
    against a clean stream of ``n`` events measured the same way just before it
    (``clean_reference_eps``; ``poison_to_clean_ratio`` is their quotient)."""
    if not 0.0 <= poison_fraction < 1.0:
        raise ValueError(f"poison_fraction must be in [0, 1), got {poison_fraction}")
    events = synthetic_events(n, seed=7)
    with bench_broker() as servers, tempfile.TemporaryDirectory(prefix="prmloop-bench-") as tmp:
        ensure_topics(servers)
        db = Path(tmp) / "bench.duckdb"
        t0 = time.perf_counter()
        with EventProducer(servers, linger_ms=20) as producer, Progress(transient=True) as bar:
            task = bar.add_task("publishing", total=n)
            for i in range(0, n, 5000):
                producer.publish(events[i : i + 5000])
                bar.advance(task, min(5000, n - i))
        publish_s = time.perf_counter() - t0

        raw_s = raw_consume(servers, n, group=f"bench-raw-{time.time_ns()}")

        inserted = 0

        def count(result: WriteResult) -> None:
            nonlocal inserted
            inserted += result.inserted

        group_id = f"bench-sink-{time.time_ns()}"
        t0 = time.perf_counter()
        sink_stats = run_sink(
            SinkSettings(group=group_id),
            bootstrap_servers=servers,
            db_path=db,
            until=lambda: inserted >= n,
            on_write=count,
            install_signal_handlers=False,
        )
        sink_s = time.perf_counter() - t0

        poison: dict[str, Any] = {}
        if poison_fraction > 0:
            # A clean reference measured exactly like the poisoned stream (same code path, a store of
            # about the same size), right before it: the ratio compares like with like.
            # Both are published in the same slices (one hostile record after each), since how records
            # are batched on the broker changes the consumer's rate as much as the poison might.
            chunk = max(1, round(1 / poison_fraction))
            reference = _poison_phase(servers, db, group_id, n, 0.0, seed=19, chunk=chunk)
            poison = _poison_phase(servers, db, group_id, n, poison_fraction, seed=13, chunk=chunk)
            poison["clean_reference_eps"] = reference["poison_sink_eps"]
        latency = _latency_phase(servers, db, group_id, rate, latency_seconds)
        stored = query(db, "SELECT count(*), count(DISTINCT event_id) FROM events").rows[0]

    raw_eps = n / raw_s
    sink_eps = n / sink_s
    return {
        "bench": "sink",
        "n": n,
        "publish_eps": round(n / publish_s, 1),
        "raw_consume_eps": round(raw_eps, 1),
        "sink_eps": round(sink_eps, 1),
        "sink_to_raw_ratio": round(sink_eps / raw_eps, 3),
        "sink_batches": sink_stats.batches,
        **(
            {**poison, "poison_to_clean_ratio": round(poison["poison_sink_eps"] / poison["clean_reference_eps"], 3)}
            if poison
            else {}
        ),
        **latency,
        "stored_events": int(stored[0]),
        "stored_distinct": int(stored[1]),
    }


def _hostile_records(events: list[Envelope], count: int, seed: int) -> list[tuple[str, bytes | None, bytes]]:
    """``count`` records (topic, key, value) that the sink must dead-letter or record as conflicts."""
    rng = random.Random(seed)
    topics = sorted({e.topic for e in events})
    out: list[tuple[str, bytes | None, bytes]] = []
    for i in range(count):
        e = events[rng.randrange(len(events))]
        kind = i % 5
        if kind == 0:  # random bytes
            out.append((rng.choice(topics), None, rng.randbytes(rng.randrange(1, 400))))
        elif kind == 1:  # nested far deeper than any parser should see
            depth = rng.choice([1_000, 10_000, 100_000])
            out.append((rng.choice(topics), None, b"[" * depth + b"]" * depth))
        elif kind == 2:  # wrong field types
            body = json.loads(encode_event(e))
            body["occurred_at"] = {"not": "a time"}
            out.append((e.topic, None, json.dumps(body).encode()))
        elif kind == 3:  # a valid event on another type's topic (a fresh id: not a duplicate)
            body = json.loads(encode_event(e))
            body["event_id"] = str(uuid.uuid4())
            out.append((next(t for t in topics if t != e.topic), None, json.dumps(body).encode()))
        else:  # the same event_id with other content, after the original (same key, same partition)
            body = json.loads(encode_event(e))
            body["producer"] = f"impostor-{i}"
            out.append((e.topic, e.correlation_id.encode(), json.dumps(body).encode()))
    return out


def _poison_phase(
    servers: str, db: Path, group_id: str, n: int, fraction: float, *, seed: int, chunk: int
) -> dict[str, Any]:
    """Publish ``n`` fresh events in slices of ``chunk`` with ``fraction`` hostile records among them
    (one after each slice, any rest at the end), then time the sink (set-up included, as in the
    clean phase) until every valid one is stored and every hostile one dead-lettered or recorded as
    a conflict."""
    events = [e.model_copy(update={"event_id": uuid.uuid4()}) for e in synthetic_events(n, seed=seed)]
    hostile = _hostile_records(events, round(n * fraction), seed=seed + 4)
    expected_conflicts = sum(1 for _, key, _ in hostile if key is not None)
    expected_dead = len(hostile) - expected_conflicts
    pending = list(hostile)
    with EventProducer(servers, linger_ms=20) as producer:
        for start in range(0, n, chunk):
            producer.publish(events[start : start + chunk])
            if pending:
                producer.send_raw(*pending.pop(0), [])
        for topic, key, value in pending:
            producer.send_raw(topic, key, value, [])

    store = DuckEventStore(db)
    sink = Sink(store)
    runtime = ConsumerRuntime(
        topics=EVENT_TOPICS,
        group_id=group_id,  # continue after the clean phase
        bootstrap_servers=servers,
        handler=sink,
        assign_all=True,
        max_batch=5000,
        max_wait_s=0.2,
        name="sink",
    )
    t0 = time.perf_counter()
    deadline = time.monotonic() + 600
    runtime.run(
        until=lambda: (
            (
                sink.stats.inserted >= n
                and runtime.stats.dead_lettered >= expected_dead
                and sink.stats.conflicts >= expected_conflicts
            )
            or time.monotonic() > deadline
        ),
        install_signal_handlers=False,
    )
    elapsed = time.perf_counter() - t0
    records = n + len(hostile)
    return {
        "poison_fraction": fraction,
        "poison_records": len(hostile),
        "poison_sink_eps": round(records / elapsed, 1),
        "poison_valid_eps": round(n / elapsed, 1),
        "poison_inserted": sink.stats.inserted,
        "poison_dead_lettered": runtime.stats.dead_lettered,
        "poison_conflicts": sink.stats.conflicts,
        "poison_sink_batches": sink.stats.batches,
    }


def _latency_phase(servers: str, db: Path, group_id: str, rate: int, seconds: float) -> dict[str, Any]:
    """Publish at ``rate`` events/s while the sink runs and a reader polls; time publish -> visible."""
    events = synthetic_events(int(rate * seconds) + 1, seed=11)
    # Fresh ids so these are new rows, not ignored duplicates of the throughput phase.
    events = [e.model_copy(update={"event_id": uuid.uuid4()}) for e in events]
    sent_at: dict[str, float] = {}
    seen_at: dict[str, float] = {}
    reader_waits: list[float] = []
    writer_waits: list[float] = []
    stop = threading.Event()

    store = DuckEventStore(db)
    sink = Sink(store, on_write=lambda r: writer_waits.append(r.open_wait_s))
    runtime = ConsumerRuntime(
        topics=EVENT_TOPICS,
        group_id=group_id,  # the throughput phase's group: start where it stopped
        bootstrap_servers=servers,
        handler=sink,
        assign_all=True,
        max_batch=5000,
        max_wait_s=0.05,
        name="sink",
    )
    sink_thread = threading.Thread(target=runtime.run, kwargs={"install_signal_handlers": False}, daemon=True)
    sink_thread.start()

    def reader() -> None:
        watermark = time.time() - 5
        while not stop.is_set() or len(seen_at) < len(sent_at):
            try:
                res = query(
                    db,
                    "SELECT CAST(event_id AS VARCHAR) FROM events WHERE ingested_at >= to_timestamp(?)",
                    [watermark],
                    timeout_s=10,
                    fresh=False,  # polling: the newest published snapshot, without waiting for the next one
                )
            except StoreLocked:
                continue
            now = time.perf_counter()
            reader_waits.append(res.waited_s)
            for (eid,) in res.rows:
                if eid in sent_at and eid not in seen_at:
                    seen_at[eid] = now
            if stop.is_set() and time.time() - stop_time[0] > 30:
                break
            time.sleep(0.02)

    stop_time = [0.0]
    reader_thread = threading.Thread(target=reader, daemon=True)
    reader_thread.start()
    achieved = publish_paced(servers, events, rate, sent_at)
    stop_time[0] = time.time()
    stop.set()
    reader_thread.join(timeout=60)
    runtime.stop()
    sink_thread.join(timeout=60)
    return {
        **latency_summary(sent_at, seen_at, achieved),
        "reader_wait_p50_ms": round(percentile(reader_waits, 0.5) * 1000, 2),
        "reader_wait_p95_ms": round(percentile(reader_waits, 0.95) * 1000, 2),
        "reader_wait_max_ms": round(max(reader_waits, default=0.0) * 1000, 2),
        "sink_stall_p95_ms": round(percentile(writer_waits, 0.95) * 1000, 2),
        "sink_stall_max_ms": round(max(writer_waits, default=0.0) * 1000, 2),
        "reader_queries": len(reader_waits),
        "sink_mean_stall_ms": round(statistics.fmean(writer_waits) * 1000, 2) if writer_waits else 0.0,
    }
