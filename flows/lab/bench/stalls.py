"""``prmloop bench stalls``: can another user, or a query, stall the loop? (issue 54)

Three phases, one JSON line:

- **The flood.** The embedded broker (its gate logging to a ``broker.log``) and a sink in this process;
  ``threads`` threads as the local user ``nobody`` (``runuser``; needs root, else the phase is skipped,
  saying so) each connect to the gate's port once every ``interval`` seconds for ``flood_seconds``.
  Meanwhile this user publishes ``owner_rate`` events a second one at a time (produce-to-stored: from the
  send until the sink's transaction holding it returned), asks the broker ApiVersions on a fresh
  connection every 0.1 s and makes a fresh ``KafkaProducer`` every 2 s; any of these that fails is a
  failed owner request. Also: the gate's CPU share (``/proc/<pid>/stat``) and how much ``broker.log`` grew.
- **The long query.** A fresh store, ``prmloop sink`` as a process of its own, and ``prmloop sql`` running
  the runaway recursive query with ``--max-seconds query_seconds``; meanwhile ``rate`` events a second are
  published and a reader polls the store: publish-to-queryable percentiles while the query runs.
- **The runaway.** That query's exit code, wall time and its one line.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kafka import KafkaProducer

from prmloop.consumers.sink import Sink
from prmloop.flows.lab.bench.sink import latency_summary, percentile, publish_paced
from prmloop.flows.lab.bench.synthetic import synthetic_events
from prmloop.flows.ops.broker import EmbeddedBroker
from prmloop.store.events.topics import EVENT_TOPICS
from prmloop.store.kafka.producer import EventProducer, ensure_topics
from prmloop.store.kafka.runtime import ConsumedEvent, ConsumerRuntime
from prmloop.store.tables.duck import DuckEventStore, StoreLocked, query

__all__ = ["RUNAWAY", "bench_stalls"]

RUNAWAY = "WITH RECURSIVE t(n) AS (SELECT 1 UNION ALL SELECT n+1 FROM t) SELECT max(n) FROM t"

#: The attacker: THREADS threads, each connecting once every INTERVAL seconds for SECONDS seconds.
_FLOOD = """
import json, socket, sys, threading, time
host, port = sys.argv[1], int(sys.argv[2])
threads, seconds, interval = int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
made = [0]
lock = threading.Lock()
def hammer(i):
    end = time.monotonic() + seconds
    nxt = time.monotonic() + interval * i / threads
    while time.monotonic() < end:
        time.sleep(max(0.0, nxt - time.monotonic()))
        nxt += interval
        try:
            s = socket.create_connection((host, port), timeout=5)
            s.sendall(b"\\0\\0\\0\\x10" + b"x" * 16)
            s.recv(1)
        except OSError:
            pass
        else:
            s.close()
        with lock:
            made[0] += 1
workers = [threading.Thread(target=hammer, args=(i,)) for i in range(threads)]
for w in workers: w.start()
for w in workers: w.join()
print(json.dumps({"attempts": made[0]}))
"""


def _api_versions(host: str, port: int, correlation: int) -> float:
    start = time.perf_counter()
    request = struct.pack(">hhih", 18, 0, correlation, 5) + b"owner"
    with socket.create_connection((host, port), timeout=5) as s:
        s.sendall(struct.pack(">i", len(request)) + request)
        head = b""
        while len(head) < 4:
            chunk = s.recv(4 - len(head))
            if not chunk:
                raise ConnectionError("closed")
            head += chunk
        want, got = struct.unpack(">i", head)[0], 0
        while got < want:
            chunk = s.recv(want - got)
            if not chunk:
                raise ConnectionError("cut short")
            got += len(chunk)
    return time.perf_counter() - start


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _flood_phase(threads: int, seconds: float, interval: float, owner_rate: float) -> dict[str, Any]:
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        return {"flood": "skipped: acting as the user nobody needs root and runuser"}
    with tempfile.TemporaryDirectory(prefix="prmloop-bench-stalls-") as tmp:
        log = Path(tmp) / "broker.log"
        with EmbeddedBroker(log_path=log) as broker:
            servers = broker.bootstrap_servers
            ensure_topics(servers)
            assert broker.pid is not None
            stored_at: dict[str, float] = {}
            store = DuckEventStore(Path(tmp) / "flood.duckdb")
            sink = Sink(store)

            def handler(batch: list[ConsumedEvent]) -> None:
                sink(batch)
                now = time.perf_counter()
                for c in batch:
                    stored_at[str(c.event.event_id)] = now

            runtime = ConsumerRuntime(
                topics=EVENT_TOPICS,
                group_id=f"bench-stalls-{time.time_ns()}",
                bootstrap_servers=servers,
                handler=handler,
                assign_all=True,
                max_batch=5000,
                max_wait_s=0.05,
                name="sink",
            )
            sink_thread = threading.Thread(target=runtime.run, kwargs={"install_signal_handlers": False}, daemon=True)
            sink_thread.start()
            events = [
                e.model_copy(update={"event_id": uuid.uuid4()})
                for e in synthetic_events(int(owner_rate * (seconds + 10)) + 10, k=4, seed=5)
            ]
            with EventProducer(servers, linger_ms=0) as producer:  # warm: the sink is assigned, topics exist
                producer.publish(events[:5])
                deadline = time.monotonic() + 60
                while len(stored_at) < 5 and time.monotonic() < deadline:
                    time.sleep(0.05)
                log_before = log.stat().st_size
                cpu_before, wall_before = _cpu_seconds(broker.pid), time.monotonic()
                result: dict[str, Any] = {}

                def flood() -> None:
                    argv = ["runuser", "-u", "nobody", "--", "python3", "-c", _FLOOD, broker.host, str(broker.port)]
                    done = subprocess.run(
                        [*argv, str(threads), str(seconds), str(interval)],
                        capture_output=True,
                        text=True,
                        timeout=seconds + 120,
                        check=False,
                    )
                    result["flood"] = done

                attacker = threading.Thread(target=flood)
                attacker.start()
                sent_at: dict[str, float] = {}
                api_s: list[float] = []
                failures: list[str] = []
                produce_failures = 0
                i, last_api, last_client, start = 5, 0.0, 0.0, time.monotonic()
                while attacker.is_alive():
                    now = time.monotonic()
                    if now - last_api >= 0.1:
                        last_api = now
                        try:
                            api_s.append(_api_versions(broker.host, broker.port, len(api_s) + 1))
                        except OSError as exc:
                            failures.append(f"ApiVersions: {exc!r}")
                    if now - last_client >= 2.0:
                        last_client = now
                        try:
                            KafkaProducer(bootstrap_servers=servers, request_timeout_ms=5000).close(timeout=5)
                        except Exception as exc:  # noqa: BLE001 - a failed owner request, counted
                            failures.append(f"KafkaProducer: {exc!r}")
                    due = start + (i - 5) / owner_rate
                    if now >= due and i < len(events):
                        e = events[i]
                        sent_at[str(e.event_id)] = time.perf_counter()
                        try:
                            producer.publish([e])
                        except Exception as exc:  # noqa: BLE001 - a failed owner request, counted
                            produce_failures += 1
                            failures.append(f"publish: {exc!r}")
                        i += 1
                    time.sleep(0.005)
                attacker.join()
                cpu_after, wall_after = _cpu_seconds(broker.pid), time.monotonic()
                deadline = time.monotonic() + 30
                while any(k not in stored_at for k in sent_at) and time.monotonic() < deadline:
                    time.sleep(0.05)
            runtime.stop()
            sink_thread.join(timeout=30)
            store.close()
            log_growth = log.stat().st_size - log_before
            refusal_lines = log.read_text(errors="replace").count("refused")
    done = result["flood"]
    try:
        attempts = json.loads(done.stdout)["attempts"]
    except (ValueError, KeyError):
        attempts = f"the flood failed: {(done.stdout + done.stderr).strip()[-300:]}"
    stored = [(stored_at[k] - t) * 1000 for k, t in sent_at.items() if k in stored_at]
    return {
        "flood_threads": threads,
        "flood_seconds": seconds,
        "flood_interval_s": interval,
        "flood_connection_attempts": attempts,
        "owner_events_sent": len(sent_at),
        "owner_events_stored": len(stored),
        "owner_produce_to_stored_p50_ms": round(percentile(stored, 0.5), 1),
        "owner_produce_to_stored_p99_ms": round(percentile(stored, 0.99), 1),
        "owner_api_versions": len(api_s),
        "owner_api_versions_p99_ms": round(percentile(api_s, 0.99) * 1000, 1),
        "owner_failed_requests": len(failures) + (len(sent_at) - len(stored) - produce_failures),
        "owner_failures": failures[:5],
        "gate_cpu_share": round((cpu_after - cpu_before) / (wall_after - wall_before), 3),
        "broker_log_growth_bytes": log_growth,
        "broker_log_refusal_lines": refusal_lines,
    }


def _long_query_phase(query_seconds: float, rate: int) -> dict[str, Any]:
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory(prefix="prmloop-bench-stalls-") as tmp:
        servers = broker.bootstrap_servers
        ensure_topics(servers)
        env = {**os.environ, "PRMLOOP_HOME": tmp, "KAFKA_BOOTSTRAP_SERVERS": servers}
        env.pop("PRMLOOP_STORE", None)
        db = Path(tmp) / "prmloop.duckdb"
        # A store of some size to copy: 20,000 events first (the snapshot's cost grows with the file).
        seed_events = synthetic_events(20_000, k=8, seed=3)
        with EventProducer(servers, linger_ms=20) as producer:
            for s in range(0, len(seed_events), 5000):
                producer.publish(seed_events[s : s + 5000])
        sink = subprocess.Popen(
            [sys.executable, "-m", "prmloop.flows.cli", "sink"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 300
            while True:
                try:
                    if db.exists() and query(db, "SELECT count(*) FROM events", timeout_s=30).rows[0][0] >= 20_000:
                        break
                except (StoreLocked, FileNotFoundError):
                    pass
                if time.monotonic() > deadline or sink.poll() is not None:
                    raise RuntimeError("the sink did not store the first 20,000 events within 300 s")
                time.sleep(0.5)
            started = time.monotonic()
            runaway = subprocess.Popen(
                [sys.executable, "-m", "prmloop.flows.cli", "sql", "--max-seconds", f"{query_seconds:g}", RUNAWAY],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            time.sleep(min(5.0, query_seconds / 4))  # the query under way (the start of Python included)
            publish_for = max(1.0, query_seconds - 2 * min(5.0, query_seconds / 4))
            events = [
                e.model_copy(update={"event_id": uuid.uuid4()})
                for e in synthetic_events(int(rate * publish_for), seed=9)
            ]
            sent_at: dict[str, float] = {}
            seen_at: dict[str, float] = {}
            stop = threading.Event()
            waits: list[float] = []

            def reader() -> None:
                watermark = time.time() - 5
                while not stop.is_set():
                    try:
                        res = query(
                            db,
                            "SELECT CAST(event_id AS VARCHAR) FROM events WHERE ingested_at >= to_timestamp(?)",
                            [watermark],
                            timeout_s=30,
                            fresh=False,  # polling: what the newest snapshot holds, without waiting for the next
                        )
                    except StoreLocked:
                        continue
                    now = time.perf_counter()
                    waits.append(res.waited_s)
                    for (eid,) in res.rows:
                        if eid in sent_at and eid not in seen_at:
                            seen_at[eid] = now
                    time.sleep(0.05)

            reading = threading.Thread(target=reader, daemon=True)
            reading.start()
            achieved = publish_paced(servers, events, rate, sent_at)
            deadline = time.monotonic() + 30
            while len(seen_at) < len(sent_at) and time.monotonic() < deadline:
                time.sleep(0.1)
            query_running = runaway.poll() is None
            stop.set()
            reading.join(timeout=60)
            out, errors = runaway.communicate(timeout=query_seconds + 120)
            runaway_s = time.monotonic() - started
            size = db.stat().st_size
            meta = json.loads(db.with_name(db.name + ".snapshot.json").read_text())
        finally:
            sink.terminate()
            try:
                sink.wait(30)
            except subprocess.TimeoutExpired:
                sink.kill()
    lines = errors.strip().splitlines()
    return {
        "query_seconds": query_seconds,
        **{f"during_query_{k}": v for k, v in latency_summary(sent_at, seen_at, achieved).items()},
        "during_query_reader_wait_p95_ms": round(percentile(waits, 0.95) * 1000, 1),
        "query_still_running_when_all_seen": query_running,
        "store_bytes": size,
        "snapshot_copy_s": meta.get("copy_s"),
        "runaway_exit": runaway.returncode,
        "runaway_s": round(runaway_s, 1),
        "runaway_limit_s": query_seconds,
        "runaway_lines": len(lines),
        "runaway_line": lines[-1] if lines else out.strip()[-200:],
    }


def _copy_cost() -> dict[str, Any]:
    """How long publishing a read snapshot takes for a file of 64 MiB and 512 MiB (a plain copy here)."""
    from prmloop.store.tables.published import copy_file

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="prmloop-bench-copy-") as tmp:
        for mib in (64, 512):
            src, dst = Path(tmp) / "a", Path(tmp) / "b"
            with open(src, "wb") as f:
                for _ in range(mib):
                    f.write(os.urandom(1 << 20))
            a = os.open(src, os.O_RDONLY)
            b = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            t0 = time.perf_counter()
            copy_file(a, b)
            out[f"snapshot_copy_{mib}mib_s"] = round(time.perf_counter() - t0, 3)
            os.close(a)
            os.close(b)
            src.unlink()
            dst.unlink()
    return out


def bench_stalls(
    *,
    flood_seconds: float = 60.0,
    threads: int = 200,
    interval: float = 1.0,
    owner_rate: float = 20.0,
    query_seconds: float = 300.0,
    rate: int = 100,
    say: Callable[[str], None] = lambda _line: None,
) -> dict[str, Any]:
    """The three phases (see the module docstring), saying when each starts and what it found."""
    say(f"bench stalls: the flood: {threads} threads as nobody for {flood_seconds:g} s")
    flood = _flood_phase(threads, flood_seconds, interval, owner_rate)
    if "flood" in flood:
        say(f"bench stalls: {flood['flood']}")
    else:
        say(
            f"bench stalls: the flood: {flood['owner_failed_requests']} failed owner requests, produce-to-stored "
            f"p99 {flood['owner_produce_to_stored_p99_ms']} ms, gate {flood['gate_cpu_share']} of a core"
        )
    say(f"bench stalls: the long query: {query_seconds:g} s beside the sink at {rate} events/s")
    long_query = _long_query_phase(query_seconds, rate)
    say(
        f"bench stalls: the long query: publish-to-queryable p95 {long_query['during_query_p95_latency_ms']} ms; "
        f"the runaway's exit {long_query['runaway_exit']} after {long_query['runaway_s']} s; then the copy's cost"
    )
    return {"bench": "stalls", **flood, **long_query, **_copy_cost()}
