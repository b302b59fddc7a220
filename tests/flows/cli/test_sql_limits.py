"""A runaway query ends at its limit, and no query holds the sink up (issue 54, point 2).

As the issue found it: `prmloop sql` ran `WITH RECURSIVE t(n) AS (SELECT 1 UNION ALL SELECT n+1 FROM t)
SELECT max(n) FROM t` until it was killed from outside after 73 s, and a running sink stored none of the
100 events published meanwhile (DuckDB's file lock let the reader hold the writer off). Now the query
reads a snapshot the sink publishes, the sink goes on storing, and the query is stopped at its time
limit in one line, exit code 2. Real components: Tansu, `prmloop sink` and `prmloop sql` as processes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from prmloop.flows.lab.bench.synthetic import synthetic_events
from prmloop.flows.ops.broker import EmbeddedBroker
from prmloop.store.kafka.producer import EventProducer, ensure_topics
from prmloop.store.tables.duck import DuckEventStore, query

RUNAWAY = "WITH RECURSIVE t(n) AS (SELECT 1 UNION ALL SELECT n+1 FROM t) SELECT max(n) FROM t"


@pytest.fixture
def running_sink(tmp_path: Path) -> Iterator[tuple[str, Path, dict[str, str]]]:
    with EmbeddedBroker() as broker:
        ensure_topics(broker.bootstrap_servers)
        env = {**os.environ, "PRMLOOP_HOME": str(tmp_path), "KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap_servers}
        env.pop("PRMLOOP_STORE", None)
        sink = subprocess.Popen(
            [sys.executable, "-m", "prmloop.flows.cli", "sink"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        db = tmp_path / "prmloop.duckdb"
        try:
            deadline = time.monotonic() + 120
            while not db.with_name(db.name + ".snapshot.json").exists():
                assert sink.poll() is None, "the sink exited"
                assert time.monotonic() < deadline, "the sink created no store"
                time.sleep(0.2)
            yield broker.bootstrap_servers, db, env
        finally:
            sink.terminate()
            try:
                sink.wait(30)
            except subprocess.TimeoutExpired:
                sink.kill()
                sink.wait()


def _count(db: Path) -> int:
    return int(query(db, "SELECT count(*) FROM events", timeout_s=30).rows[0][0])


def test_a_runaway_query_ends_at_its_limit_while_the_sink_goes_on_storing(
    running_sink: tuple[str, Path, dict[str, str]],
) -> None:
    servers, db, env = running_sink
    runaway = subprocess.Popen(
        [sys.executable, "-m", "prmloop.flows.cli", "sql", "--max-seconds", "20", RUNAWAY],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(3)  # the query under way (Python's start included)
        with EventProducer(servers) as producer:
            producer.publish(synthetic_events(100, k=4, seed=54))
        deadline = time.monotonic() + 60
        while _count(db) < 100:
            assert runaway.poll() is None, "the query ended before the sink had stored the events"
            assert time.monotonic() < deadline, "the sink stored nothing while the query ran"
            time.sleep(0.2)
        assert runaway.poll() is None  # all 100 stored, and queryable, while the query still ran
        out, errors = runaway.communicate(timeout=120)
    finally:
        if runaway.poll() is None:
            runaway.kill()
            runaway.wait()
    assert runaway.returncode == 2, out + errors
    [line] = errors.strip().splitlines()
    assert "time limit of 20 s" in line and "--max-seconds" in line, line
    assert _count(db) == 100  # the sink still running: nothing lost or doubled


def test_a_query_over_its_memory_limit_is_one_line_naming_it(tmp_path: Path) -> None:
    db = tmp_path / "prmloop.duckdb"
    DuckEventStore(db).close()
    env = {**os.environ, "PRMLOOP_HOME": str(tmp_path)}
    env.pop("PRMLOOP_STORE", None)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "prmloop.flows.cli",
            "sql",
            "--max-memory",
            "32MB",
            "SELECT count(DISTINCT repeat(i::VARCHAR, 20)) FROM range(20000000) r(i)",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    [line] = done.stderr.strip().splitlines()
    assert "memory limit of 32MB" in line and "--max-memory" in line, line
