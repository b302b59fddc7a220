"""What the sink's process-level fault suites share (the DuckDB file's and the DuckLake's): starting
`prmloop sink` processes, waiting for a condition, fresh events, and checking what a store holds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from prmloop.flows.lab.bench.synthetic import synthetic_events
from prmloop.store.events import Envelope
from prmloop.store.events.codec import encode_event
from prmloop.store.kafka.producer import EventProducer
from prmloop.store.tables.duck import StoreLocation, query


class SinkTools:
    """Helpers for tests that run sinks as separate processes against a real broker."""

    def __init__(self, wait_for: Callable[..., None]) -> None:
        #: the suite's one poll-until-true helper (tests/conftest.py)
        self.wait_for = wait_for

    @staticmethod
    def fresh_events(n: int, seed: int) -> list[Envelope]:
        """Synthetic events with ids no other test uses (the session broker is shared)."""
        return [e.model_copy(update={"event_id": uuid.uuid4()}) for e in synthetic_events(n, seed=seed)]

    @staticmethod
    def start(servers: str, store: str, group: str, home: Path, *, max_batch: int) -> subprocess.Popen[bytes]:
        """A `prmloop sink` process on ``store`` (a path or a ``ducklake:`` spec), returned once it has
        announced itself (imports done, about to consume) naming that store's kind."""
        env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": servers, "PRMLOOP_HOME": str(home), "PRMLOOP_STORE": store}
        proc = subprocess.Popen(
            [sys.executable, "-m", "prmloop.flows.cli", "sink", "--group", group, "--max-batch", str(max_batch)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith(b"sink:"), line
        if store.startswith("ducklake:"):
            assert b"ducklake:" in line, line
        return proc

    @staticmethod
    def publish_slowly(servers: str, events: list[Envelope], *, pause_s: float) -> threading.Thread:
        """A started thread publishing ``events`` 100 at a time, ``pause_s`` apart (join it when done)."""

        def publish() -> None:
            with EventProducer(servers) as producer:
                for i in range(0, len(events), 100):
                    producer.publish(events[i : i + 100])
                    time.sleep(pause_s)

        thread = threading.Thread(target=publish)
        thread.start()
        return thread

    @staticmethod
    def assert_store_equals(store: StoreLocation, events: list[Envelope]) -> None:
        """Every event is stored, with the payload it was published with."""
        ids = ",".join(f"'{e.event_id}'" for e in events)
        rows = query(store, f"SELECT event_id, payload FROM events WHERE event_id IN ({ids})").rows
        assert len(rows) == len(events), f"{len(events) - len(rows)} events lost"
        stored = {r[0]: json.loads(r[1]) for r in rows}
        for e in events:
            assert stored[e.event_id] == json.loads(encode_event(e))["payload"]


@pytest.fixture
def sink_tools(wait_until: Callable[..., None]) -> SinkTools:
    return SinkTools(wait_until)
