"""Services follow a replaced embedded broker: `prmloop broker` SIGKILLed, a new one on another port
with a new cluster id (broker.json rewritten), and the running sink (every partition, no group) and
scorer (a consumer group that publishes) notice within seconds, say so, move to the new broker, and
everything published there is stored. A runtime that moves while its handler works commits nothing
of the old broker's on the new one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from kafka import KafkaConsumer, TopicPartition

from prmloop.flows.ops.broker import EmbeddedBroker
from prmloop.models.simulator import SimulatorOptions
from prmloop.producers.simulated import simulated_events
from prmloop.store.events import QuestionRegistered, make_event
from prmloop.store.events.codec import encode_event
from prmloop.store.events.topics import TopicSpec
from prmloop.store.kafka.broker_file import BrokerInfo, read_broker_file, require_bootstrap_servers, write_broker_file
from prmloop.store.kafka.follow import read_links
from prmloop.store.kafka.producer import EventProducer, consumer_config, ensure_topics
from prmloop.store.kafka.runtime import ConsumedEvent, ConsumerRuntime
from prmloop.store.settings import KafkaSettings, StateSettings
from prmloop.store.tables.duck import StoreLocked, query


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_", "PREFECT_API_URL"))}
    env["PRMLOOP_HOME"] = str(home)
    env.pop("PRMLOOP_STORE", None)
    return env


def _spawn(home: Path, log: Path, *args: str) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "prmloop.flows.cli", *args], env=_env(home), stdout=out, stderr=subprocess.STDOUT
        )


def _simulate(home: Path, n: int, seed: int) -> subprocess.CompletedProcess[bytes]:
    """`prmloop simulate`: ``n`` simulated questions and solutions, published to the broker of broker.json."""
    args = ["simulate", "--sim-n", str(n), "--sim-seed", str(seed)]
    return subprocess.run(
        [sys.executable, "-m", "prmloop.flows.cli", *args], env=_env(home), check=False, capture_output=True
    )


def _start_broker(home: Path, wait_for: Callable[..., None], previous: BrokerInfo | None) -> subprocess.Popen[bytes]:
    proc = _spawn(home, home / "broker-cli.log", "broker", "--partitions", "2")

    def announced() -> bool:
        info = read_broker_file(StateSettings(home=home))
        return info is not None and info != previous and info.pid == proc.pid and info.reachable

    wait_for(announced, 60, "the embedded broker to announce itself in broker.json")
    return proc


def _stored(home: Path, sql: str) -> int:
    db = home / "prmloop.duckdb"
    if not db.exists():
        return 0
    try:
        return int(query(db, sql, timeout_s=5).rows[0][0])
    except StoreLocked:
        return -1


def _solutions(seed: int, n: int) -> list[str]:
    events = simulated_events(SimulatorOptions(sim_n=n, sim_seed=seed).world()[1], seed)
    return [e.correlation_id for e in events if e.event_type == "SolutionSampled"]


def _all_scored_and_stored(home: Path, solution_ids: list[str]) -> Callable[[], bool]:
    ids = ",".join(f"'{s}'" for s in solution_ids)
    sql = (
        "SELECT count(DISTINCT correlation_id || event_type) FROM events "
        f"WHERE event_type IN ('SolutionSampled', 'StepsScored') AND correlation_id IN ({ids})"
    )
    return lambda: _stored(home, sql) == 2 * len(solution_ids)


def test_running_services_follow_a_replaced_broker_and_lose_nothing_published_after(
    tmp_path: Path, wait_until: Callable[..., None]
) -> None:
    home = tmp_path
    state = StateSettings(home=home)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        broker = _start_broker(home, wait_until, None)
        procs.append(broker)
        first = read_broker_file(state)
        assert first is not None and first.cluster_id
        sink_log, scorer_log = home / "sink.log", home / "scorer.log"
        procs.append(_spawn(home, sink_log, "sink"))
        procs.append(_spawn(home, scorer_log, "score", "--max-batch", "8"))

        assert _simulate(home, 6, 31).returncode == 0
        wait_until(_all_scored_and_stored(home, _solutions(31, 6)), 90, "the first solutions scored and stored")

        broker.send_signal(signal.SIGKILL)  # its Tansu dies with it; broker.json stays, naming a closed port
        broker.wait(timeout=10)
        wait_until(lambda: not first.reachable, 15, "the killed broker's port to close")
        for log in (sink_log, scorer_log):
            wait_until(lambda log=log: "is gone" in log.read_text(), 15, f"{log.name} to notice the broker is gone")

        procs.append(_start_broker(home, wait_until, first))
        second = read_broker_file(state)
        assert second is not None and second.bootstrap_servers != first.bootstrap_servers
        assert second.cluster_id and second.cluster_id != first.cluster_id

        published = _simulate(home, 20, 32)  # a fresh command: it finds the new broker in broker.json
        assert published.returncode == 0, published.stderr
        wait_until(_all_scored_and_stored(home, _solutions(32, 20)), 60, "every solution published after the restart")

        for log in (sink_log, scorer_log):
            text = log.read_text()
            assert f"the broker was replaced: {first.describe()} -> {second.describe()}" in text, text[-3000:]
        links = {link["service"]: link for link in read_links(state)}
        for service, proc in (("sink", procs[1]), ("scorer", procs[2])):
            assert links[service]["pid"] == proc.pid
            assert (links[service]["cluster_id"], links[service]["reachable"]) == (second.cluster_id, True)
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
    assert read_links(state) == [], "a stopped service left its link record behind"


def _committed(servers: str, group: str, topic: str) -> int | None:
    consumer = KafkaConsumer(**consumer_config(KafkaSettings(), servers, group_id=group))
    try:
        return consumer.committed(TopicPartition(topic, 0))
    finally:
        consumer.close(autocommit=False)


def _question(i: int) -> bytes:
    return encode_event(make_event(QuestionRegistered(question_id=f"q{i}", dataset="d", problem=f"p{i}"), producer="t"))


def test_a_switch_during_long_work_commits_nothing_of_the_old_broker_on_the_new_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, wait_until: Callable[..., None]
) -> None:
    """The runtime moves while its handler works (MC rollouts take minutes); the batch in hand is
    finished, but its offsets, which are the old broker's, are not committed on the new broker."""
    monkeypatch.setenv("PRMLOOP_HOME", str(tmp_path))
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    state = StateSettings(home=tmp_path)
    topic, group = "follow-test", "follow-test-group"
    seen: list[str] = []
    working, release = threading.Event(), threading.Event()

    def handler(batch: list[ConsumedEvent]) -> None:
        working.set()
        release.wait(60)
        seen.extend(c.event.correlation_id for c in batch)

    old = EmbeddedBroker().start()
    new = EmbeddedBroker()
    try:
        ensure_topics(old.bootstrap_servers, [TopicSpec(topic, 1), TopicSpec(f"{topic}.dlq", 1)])
        write_broker_file(old, state)
        with EventProducer(old.bootstrap_servers) as producer:
            for i in range(8):
                producer.send_raw(topic, b"k", _question(i), [])
        runtime = ConsumerRuntime(
            topics=[topic], group_id=group, bootstrap_servers=old.bootstrap_servers, handler=handler, assign_all=True
        )
        thread = threading.Thread(target=runtime.run, kwargs={"install_signal_handlers": False})
        thread.start()
        try:
            assert working.wait(30), "the handler never got the first batch"
            old.stop(kill=True)
            new.start()
            ensure_topics(new.bootstrap_servers, [TopicSpec(topic, 1), TopicSpec(f"{topic}.dlq", 1)])
            write_broker_file(new, state)
            wait_until(
                lambda: [link["cluster_id"] for link in read_links(state)] == [new.cluster_id],
                15,
                "the runtime to move while its handler still works",
            )
            assert seen == []  # the handler was still at work when the runtime moved
            release.set()
            wait_until(lambda: runtime.stats.batches >= 1, 30, "the old batch to finish")
            assert len(seen) >= 1 and _committed(new.bootstrap_servers, group, topic) is None

            with EventProducer(new.bootstrap_servers) as producer:
                for i in (100, 101, 102):
                    producer.send_raw(topic, b"k", _question(i), [])
            wait_until(lambda: seen[-3:] == ["q100", "q101", "q102"], 30, "the new broker's records")
            wait_until(lambda: _committed(new.bootstrap_servers, group, topic) == 3, 15, "the commit on the new broker")
        finally:
            release.set()
            runtime.stop()
            thread.join(30)
    finally:
        old.stop()
        new.stop()


def test_a_client_that_looked_its_broker_up_before_a_restart_starts_on_the_new_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A service looks its broker up, then loads its model for a minute; meanwhile the broker is
    replaced. Its consumer and producer then start on the new broker instead of failing on the old."""
    monkeypatch.setenv("PRMLOOP_HOME", str(tmp_path))
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    state = StateSettings(home=tmp_path)
    old, new = EmbeddedBroker().start(), EmbeddedBroker()
    try:
        ensure_topics(old.bootstrap_servers)
        write_broker_file(old, state)
        looked_up = require_bootstrap_servers()
        assert looked_up == old.bootstrap_servers
        old.stop(kill=True)
        new.start()
        ensure_topics(new.bootstrap_servers)
        write_broker_file(new, state)

        with EventProducer(looked_up) as producer:
            assert producer.bootstrap_servers == new.bootstrap_servers
            producer.publish(
                [make_event(QuestionRegistered(question_id="q-late", dataset="d", problem="p"), producer="t")]
            )
        runtime = ConsumerRuntime(
            topics=["questions.registered"],
            group_id="late",
            bootstrap_servers=looked_up,
            handler=lambda batch: None,
            assign_all=True,
        )
        deadline = time.monotonic() + 30
        runtime.run(
            until=lambda: runtime.stats.events >= 1 or time.monotonic() > deadline, install_signal_handlers=False
        )
        assert runtime.stats.events == 1
    finally:
        old.stop()
        new.stop()
