"""`prmloop status` on a cluster of `prmloop up --cluster` whose processes died: it tells the truth (each
process dead, with its log's last line; no broker answering; a store that cannot be read) and exits 0."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prmloop.flows.cli import app
from prmloop.flows.ops.cluster import BROKERS, cluster_connection, process_names
from prmloop.store.ports import free_port
from prmloop.store.settings import StateSettings


def _dead_pid() -> int:
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    return done.pid


@pytest.fixture
def dead_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> StateSettings:
    """Records of every cluster process, each for a pid that has exited, and ports nothing listens on."""
    for name in ("PRMLOOP_STORE", "KAFKA_BOOTSTRAP_SERVERS", "PREFECT_API_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PRMLOOP_HOME", str(tmp_path / "home"))
    state = StateSettings()
    folder = state.run_dir / "cluster"
    folder.mkdir(parents=True)
    ports = {"postgres": free_port(), "prefect": free_port(), **{b: free_port() for b in BROKERS}}
    (folder / "ports.json").write_text(json.dumps(ports))
    logs = state.home / "logs"
    logs.mkdir(parents=True)
    for name in process_names():
        log = logs / f"{name}.log"
        log.write_text(f"started\n{name}: the last words\n\n")
        record = {"name": name, "pid": _dead_pid(), "argv": ["prmloop", name], "started_at": 0.0, "log": str(log)}
        (folder / f"{name}.json").write_text(json.dumps(record))
    return state


def test_status_of_a_dead_cluster_says_what_is_dead_and_what_cannot_be_read(dead_cluster: StateSettings) -> None:
    connection = cluster_connection(dead_cluster)
    assert connection is not None and connection["store"].startswith("ducklake:postgres:")

    result = CliRunner().invoke(app, ["status", "--timeout", "5"])

    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert set(report["cluster"]) == set(process_names())
    for name, process in report["cluster"].items():
        assert process["state"] == "dead", name
        assert process["last_log_line"] == f"{name}: the last words"
    assert report["broker"]["from"] == "up --cluster" and report["broker"]["reachable"] == []
    assert "no broker reachable" in report["consumers"]
    assert report["store"].startswith("cannot be read: "), report["store"]
    assert "\n" not in report["store"]


def test_sql_reads_the_clusters_lake_and_says_so_when_it_cannot(dead_cluster: StateSettings) -> None:
    """Without --db or PRMLOOP_STORE, `prmloop sql` reads what `status` reads: the cluster's DuckLake
    (here its PostgreSQL is dead, so one line saying so), not an empty DuckDB file of the home."""
    command = [sys.executable, "-m", "prmloop.flows.cli", "sql", "SELECT count(*) FROM events", "--timeout", "5"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)

    assert result.returncode != 0
    message = result.stderr.strip()
    assert "ducklake" in message.lower() or "postgres" in message.lower(), message
    assert len(message.splitlines()) == 1, message
    assert not (dead_cluster.home / "prmloop.duckdb").exists()


def test_no_cluster_no_cluster_in_status(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRMLOOP_HOME", str(tmp_path / "home"))
    assert cluster_connection(StateSettings()) is None


def test_status_gives_up_on_a_broker_whose_storage_died(
    postgres_catalog: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Tansu broker whose PostgreSQL storage is gone takes connections and answers every metadata
    request with an error; the Kafka client asked again for minutes and `prmloop status` hung (over
    240 s in the chaos test, PostgreSQL killed). It must say the broker did not answer within
    --timeout, and report the rest. Here the broker's storage gateway is killed (the session's
    PostgreSQL is shared by other tests)."""
    import signal
    import time
    import uuid

    import pgserver

    from prmloop.flows.ops.broker import EmbeddedBroker
    from prmloop.store.kafka.producer import ensure_topics
    from prmloop.store.tables.duck import DuckEventStore

    storage = str(
        pgserver.get_server(postgres_catalog, cleanup_mode="stop").get_uri(database=f"st_{uuid.uuid4().hex[:8]}")
    )
    DuckEventStore(tmp_path / "store.duckdb").close()
    monkeypatch.setenv("PRMLOOP_HOME", str(tmp_path / "home"))
    with EmbeddedBroker(storage=storage) as broker:
        ensure_topics(broker.bootstrap_servers)
        assert broker._gateway is not None
        broker._gateway.send_signal(signal.SIGKILL)
        broker._gateway.wait(10)
        monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", broker.bootstrap_servers)
        started = time.monotonic()
        result = CliRunner().invoke(app, ["status", "--timeout", "5", "--db", str(tmp_path / "store.duckdb")])
        took = time.monotonic() - started
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["broker"]["reachable"] is True
    assert "no answer within 5 s" in report["consumers"], report["consumers"]
    assert report["events"] == 0  # the store is still reported
    assert took < 60, f"status took {took:.0f} s"  # without the bound: minutes
