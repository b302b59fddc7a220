"""A sink whose store cannot be written says why: the write's own error (here "File too large": the
process may not grow a file past RLIMIT_FSIZE, what a full disk looks like to DuckDB), never the
"cannot rollback - no transaction is active" of the ROLLBACK that followed a failed COMMIT.

Real components: the `prmloop sink` process against the real broker, a DuckDB file or a DuckLake
(PostgreSQL catalog, Parquet files)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from prmloop.flows.lab.bench.synthetic import synthetic_events
from prmloop.store.kafka.producer import EventProducer
from prmloop.store.tables.duck import DuckEventStore
from prmloop.store.tables.lake import LakeStore


def _limited_sink(servers: str, store: str, home: Path, log: Path, max_file_bytes: int) -> subprocess.Popen[bytes]:
    """`prmloop sink` that may not write any file past ``max_file_bytes`` (Python ignores SIGXFSZ, so
    the write fails with EFBIG instead of killing the process)."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_file_bytes, max_file_bytes))

    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": servers, "PRMLOOP_HOME": str(home), "PRMLOOP_STORE": store}
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "prmloop.flows.cli", "sink", "--group", f"sink-{uuid.uuid4().hex[:8]}"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=limit,  # noqa: PLW1509 - only setrlimit runs between fork and exec
        )


@pytest.mark.parametrize("kind", ["duckdb", "ducklake"])
def test_a_failed_write_logs_its_cause_not_the_rollbacks(
    kind: str, kafka_bootstrap: str, tmp_path: Path, wait_until: Callable[..., None], request: pytest.FixtureRequest
) -> None:
    if kind == "duckdb":
        db = tmp_path / "store.duckdb"
        DuckEventStore(db).close()  # the schema fits; a batch of 3,000 events does not
        store, limit = str(db), db.stat().st_size + 256 * 1024
    else:
        lake: LakeStore = request.getfixturevalue("lake_store")
        store, limit = lake.spec, 256 * 1024  # its catalog is PostgreSQL's: only the Parquet files are limited
    log = tmp_path / "sink.log"
    sink = _limited_sink(kafka_bootstrap, store, tmp_path, log, limit)
    try:
        events = [e.model_copy(update={"event_id": uuid.uuid4()}) for e in synthetic_events(3000, seed=61)]
        with EventProducer(kafka_bootstrap) as producer:
            producer.publish(events)
        wait_until(lambda: "retrying in" in log.read_text(), 120, "the sink to fail a write and retry it")
        assert sink.poll() is None, "a failed write must not end the sink"
    finally:
        sink.kill()
        sink.wait(timeout=30)
    failures = [line for line in log.read_text().splitlines() if "retrying in" in line]
    assert "File too large" in failures[0], failures[0]
    assert not any("cannot rollback" in line for line in failures), failures
