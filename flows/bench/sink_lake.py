"""``prmloop bench sink --store ducklake --sinks N``: N sink processes in one consumer group writing one
DuckLake (a real PostgreSQL catalog from pgserver, Parquet in a temporary folder), against the raw
kafka-python consume rate of the same records, and how long a reader's query takes while they write.

The sinks are separate processes (as in a cluster: one per node or per core), started after the
events are published. Their rate is measured in steady state, from the first stored event to the
last, since process start-up (imports, joining the group) is paid once per process, not per event.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from prmloop.flows.bench.sink import _broker, _pct, _raw_consume
from prmloop.flows.bench.synthetic import synthetic_events
from prmloop.store.duck import projection_sql, query
from prmloop.store.kafka import EventProducer, ensure_topics
from prmloop.store.lake import LakeStore, ensure_schema


def bench_sink_lake(
    n: int = 100_000, sinks: int = 1, *, max_batch: int = 5000, timeout_s: float = 900
) -> dict[str, Any]:
    """Publish ``n`` events, time a raw consumer on them, then ``sinks`` sink processes into a DuckLake."""
    import pgserver

    if sinks < 1:
        raise ValueError(f"--sinks must be at least 1, got {sinks}")
    events = synthetic_events(n, seed=7)
    with _broker() as servers, tempfile.TemporaryDirectory(prefix="prmloop-bench-lake-") as tmp:
        ensure_topics(servers)
        server = pgserver.get_server(Path(tmp) / "pg", cleanup_mode="stop")
        try:
            store = LakeStore(f"pgserver:{Path(tmp) / 'pg'}", Path(tmp) / "data")
            ensure_schema(store, projection_sql())
            with EventProducer(servers, linger_ms=20) as producer:
                for i in range(0, n, 5000):
                    producer.publish(events[i : i + 5000])
            raw_s = _raw_consume(servers, n, group=f"bench-raw-{time.time_ns()}")

            group = f"bench-lake-{time.time_ns()}"
            env = {
                **os.environ,
                "KAFKA_BOOTSTRAP_SERVERS": servers,
                "PRMLOOP_STORE": store.spec,
                "PRMLOOP_HOME": str(Path(tmp) / "home"),
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
            finally:
                for p in procs:
                    p.terminate()
                for p in procs:
                    try:
                        p.wait(timeout=60)
                    except subprocess.TimeoutExpired:
                        p.kill()
            first = next((t, c) for t, c in counts if c > 0)
            last_t = counts[-1][0]
            steady = (n - first[1]) / max(1e-9, last_t - first[0])
            visible = query(store, "SELECT count(*), count(DISTINCT event_id) FROM events").rows[0]
            writing = [q for (t, _), q in zip(counts, query_ms, strict=True) if t >= first[0]]
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
        "reader_query_p50_ms": round(_pct(writing, 0.5), 1),
        "reader_query_p95_ms": round(_pct(writing, 0.95), 1),
        "reader_wait_ms": 0.0,
        "stored_events": int(visible[0]),
        "stored_distinct": int(visible[1]),
        "cpu_count": os.cpu_count(),
    }
