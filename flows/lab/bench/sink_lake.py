"""``prmloop bench sink --store ducklake --sinks N``: N sink processes in one consumer group writing one
DuckLake (a real PostgreSQL catalog from pgserver, Parquet in a temporary folder), against the raw
kafka-python consume rate of the same records, and how long a reader's query takes while they write.

The sinks are separate processes (as in a cluster: one per node or per core), started after the
events are published. Their rate is timed from the last poll that saw nothing stored to the poll
that saw every event, since process start-up (imports, joining the group) is paid once per process,
not per event.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from prmloop.flows.lab.bench.sink import bench_broker, latency_summary, percentile, publish_paced, raw_consume
from prmloop.flows.lab.bench.synthetic import synthetic_events
from prmloop.flows.ops.broker import parent_death_signal
from prmloop.store.kafka.producer import EventProducer, ensure_topics
from prmloop.store.settings import StateSettings
from prmloop.store.tables.duck import projection_sql, query
from prmloop.store.tables.lake import LakeStore, ensure_schema, local_postgres


def bench_sink_lake(
    n: int = 100_000,
    sinks: int = 1,
    *,
    rate: int = 1000,
    latency_seconds: float = 10.0,
    max_batch: int = 5000,
    timeout_s: float = 900,
) -> dict[str, Any]:
    """Publish ``n`` events, time a raw consumer on them, then ``sinks`` sink processes into a DuckLake;
    then, with the sinks still running, publish-to-queryable latency at ``rate`` events/s."""
    if sinks < 1:
        raise ValueError(f"--sinks must be at least 1, got {sinks}")
    events = synthetic_events(n, seed=7)
    with bench_broker() as servers, tempfile.TemporaryDirectory(prefix="prmloop-bench-lake-") as tmp:
        ensure_topics(servers)
        server = local_postgres(Path(tmp) / "pg")
        try:
            store = LakeStore(f"pgserver:{Path(tmp) / 'pg'}", Path(tmp) / "data")
            ensure_schema(store, projection_sql())
            with EventProducer(servers, linger_ms=20) as producer:
                for i in range(0, n, 5000):
                    producer.publish(events[i : i + 5000])
            raw_s = raw_consume(servers, n, group=f"bench-raw-{time.time_ns()}")

            group = f"bench-lake-{time.time_ns()}"
            env = {
                **os.environ,
                "KAFKA_BOOTSTRAP_SERVERS": servers,
                "PRMLOOP_STORE": store.spec,
                # The bench's own home: the sinks reach the catalog with the roles its credentials made.
                "PRMLOOP_HOME": str(StateSettings().home),
            }
            procs = [
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "prmloop.flows.cli",
                        "sink",
                        "--group",
                        group,
                        "--max-batch",
                        str(max_batch),
                    ],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    preexec_fn=parent_death_signal(),  # noqa: PLW1509 - never outlives the bench
                )
                for _ in range(sinks)
            ]
            counts: list[tuple[float, int]] = []
            query_ms: list[float] = []
            started = time.perf_counter()
            try:
                while True:
                    t = time.perf_counter()
                    stored = int(query(store, "SELECT count(*) FROM events_log").rows[0][0])
                    query_ms.append((time.perf_counter() - t) * 1000)
                    counts.append((time.perf_counter(), stored))
                    if stored >= n:
                        break
                    if time.perf_counter() - started > timeout_s:
                        raise TimeoutError(f"{sinks} lake sinks stored {stored} of {n} events in {timeout_s:.0f} s")
                    dead = [p for p in procs if p.poll() is not None]
                    if dead:
                        raise RuntimeError(
                            f"a sink exited: {dead[0].stderr.read().decode()[-500:] if dead[0].stderr else ''}"
                        )
                    time.sleep(0.05)
                latency = _latency(servers, store, rate, latency_seconds)
            finally:
                for p in procs:
                    p.terminate()
                for p in procs:
                    try:
                        p.wait(timeout=60)
                    except subprocess.TimeoutExpired:
                        p.kill()
            first = next((t, c) for t, c in counts if c > 0)
            # From the last poll that saw nothing stored (a poll takes a few hundred ms on the lake, so
            # small runs are timed coarsely; use tens of thousands of events for a figure).
            zero_t = max((t for t, c in counts if c == 0), default=started)
            last_t = counts[-1][0]
            steady = n / max(1e-9, last_t - zero_t)
            visible = query(store, "SELECT count(*), count(DISTINCT event_id) FROM events").rows[0]
            writing = [q for (t, _), q in zip(counts, query_ms, strict=True) if t >= zero_t]
        finally:
            server.cleanup()
    raw_eps = n / raw_s
    return {
        "bench": "sink",
        "store": "ducklake",
        "sinks": sinks,
        "n": n,
        "raw_consume_eps": round(raw_eps, 1),
        "sink_eps": round(steady, 1),
        "sink_to_raw_ratio": round(steady / raw_eps, 3),
        "first_event_after_s": round(first[0] - started, 1),
        "polls_while_writing": len(writing),
        "reader_query_p50_ms": round(percentile(writing, 0.5), 1),
        "reader_query_p95_ms": round(percentile(writing, 0.95), 1),
        "reader_wait_ms": 0.0,
        **latency,
        "stored_events": int(visible[0]),
        "stored_distinct": int(visible[1]),
        "cpu_count": os.cpu_count(),
    }


def _latency(servers: str, store: LakeStore, rate: int, seconds: float) -> dict[str, Any]:
    """Publish fresh events at ``rate``/s while the sinks run; a reader polls the lake for them:
    publish-to-queryable latency (a reader sees a sink's batch once its snapshot is committed)."""
    events = [
        e.model_copy(update={"event_id": uuid.uuid4()}) for e in synthetic_events(int(rate * seconds) + 1, seed=11)
    ]
    sent_at: dict[str, float] = {}
    seen_at: dict[str, float] = {}
    stop = threading.Event()
    since = datetime.now(UTC) - timedelta(seconds=5)

    def reader() -> None:
        deadline: float | None = None
        while len(seen_at) < len(events):
            if stop.is_set():
                deadline = deadline or time.monotonic() + 60
                if time.monotonic() > deadline:
                    return
            rows = query(store, "SELECT CAST(event_id AS VARCHAR) FROM events_log WHERE ingested_at >= ?", [since]).rows
            now = time.perf_counter()
            for (eid,) in rows:
                if eid in sent_at and eid not in seen_at:
                    seen_at[eid] = now
            time.sleep(0.02)

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    achieved = publish_paced(servers, events, rate, sent_at)
    stop.set()
    thread.join(timeout=90)
    return latency_summary(sent_at, seen_at, achieved)
