"""Several sink processes writing one DuckLake through one consumer group, against a real broker and a
real PostgreSQL catalog: SIGKILL at random, and the store still ends equal to what was published,
each event once to every reader."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from prmloop.flows.bench.synthetic import synthetic_events
from prmloop.store.codec import encode_event
from prmloop.store.duck import query
from prmloop.store.events import Envelope
from prmloop.store.kafka import EventProducer
from prmloop.store.lake import LakeStore, compact


def fresh_events(n: int, seed: int) -> list[Envelope]:
    return [e.model_copy(update={"event_id": uuid.uuid4()}) for e in synthetic_events(n, seed=seed)]


def stored_count(store: LakeStore, ids: list[uuid.UUID]) -> int:
    wanted = ",".join(f"'{i}'" for i in ids)
    try:
        return int(query(store, f"SELECT count(*) FROM events WHERE event_id IN ({wanted})").rows[0][0])
    except Exception:  # noqa: BLE001 - the tables may not exist before the first sink created them
        return 0


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.5)


def sink_process(servers: str, store: LakeStore, group: str, home: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": servers, "PRMLOOP_HOME": str(home), "PRMLOOP_STORE": store.spec}
    return subprocess.Popen(
        [sys.executable, "-m", "prmloop.flows.cli", "sink", "--group", group, "--max-batch", "300"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def wait_started(proc: subprocess.Popen[bytes]) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith(b"sink:"), line
    assert b"ducklake:" in line


def assert_store_equals(store: LakeStore, events: list[Envelope]) -> None:
    ids = ",".join(f"'{e.event_id}'" for e in events)
    rows = query(store, f"SELECT event_id, payload FROM events WHERE event_id IN ({ids})").rows
    assert len(rows) == len(events), f"{len(events) - len(rows)} events lost"
    stored = {r[0]: json.loads(r[1]) for r in rows}
    for e in events:
        assert stored[e.event_id] == json.loads(encode_event(e))["payload"]


def _run(kafka_bootstrap: str, lake_store: LakeStore, tmp_path: Path, *, n: int, kills: int, seed: int) -> None:
    events = fresh_events(n, seed=seed)
    group = f"lake-sink-{uuid.uuid4().hex[:8]}"
    rng = random.Random(seed)

    def publish_slowly() -> None:
        with EventProducer(kafka_bootstrap) as producer:
            for i in range(0, len(events), 100):
                producer.publish(events[i : i + 100])
                time.sleep(0.3)

    publisher = threading.Thread(target=publish_slowly)
    publisher.start()
    sinks = [sink_process(kafka_bootstrap, lake_store, group, tmp_path) for _ in range(2)]
    for proc in sinks:
        wait_started(proc)
    for _ in range(kills):  # kill one of the two at random, start a new one in its place
        time.sleep(rng.uniform(0.5, 3.0))
        victim = rng.randrange(2)
        sinks[victim].kill()
        sinks[victim].wait(timeout=30)
        sinks[victim] = sink_process(kafka_bootstrap, lake_store, group, tmp_path)
        wait_started(sinks[victim])
    publisher.join()
    ids = [e.event_id for e in events]
    try:
        wait_for(lambda: stored_count(lake_store, ids) == len(ids), 180, "the sinks to catch up")
    finally:
        for proc in sinks:
            proc.send_signal(signal.SIGTERM)
        outs = [proc.communicate(timeout=60)[0] for proc in sinks]
    for proc, out in zip(sinks, outs, strict=True):
        assert proc.returncode == 0, out.decode()
        assert b"sink stopped" in out
    assert_store_equals(lake_store, events)
    assert query(lake_store, "SELECT count(*) = count(DISTINCT event_id) FROM events").rows == [(True,)]
    compact(lake_store)
    assert query(lake_store, "SELECT count(*) = count(DISTINCT event_id) FROM events_log").rows == [(True,)]


def test_two_sinks_in_one_group_killed_now_and_then_store_everything_once(
    kafka_bootstrap: str, lake_store: LakeStore, tmp_path: Path
) -> None:
    _run(kafka_bootstrap, lake_store, tmp_path, n=1200, kills=2, seed=301)


@pytest.mark.slow
def test_two_sinks_killed_ten_times_while_events_flow_lose_and_double_nothing(
    kafka_bootstrap: str, lake_store: LakeStore, tmp_path: Path
) -> None:
    _run(kafka_bootstrap, lake_store, tmp_path, n=4000, kills=10, seed=302)
