"""The durable embedded broker: Tansu on PostgreSQL (through the object gateway), for real.

A SIGKILLed broker restarted on the same storage serves every record and every committed offset
again; two brokers on one database are one cluster, and killing the one the clients use mid-stream
loses nothing: the producer and the consumer runtime move to the other (store/kafka/follow.py)."""

from __future__ import annotations

import threading
import time
import uuid

import httpx
import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.structs import OffsetAndMetadata

from prmloop.flows.lab.bench.synthetic import synthetic_events
from prmloop.flows.ops.broker import EmbeddedBroker
from prmloop.store.events.topics import EVENT_TOPICS, all_topic_specs
from prmloop.store.kafka.follow import BrokerWatch
from prmloop.store.kafka.producer import EventProducer, consumer_config, ensure_topics
from prmloop.store.kafka.records import ConsumedEvent
from prmloop.store.kafka.runtime import ConsumerRuntime
from prmloop.store.ports import free_port, port_open
from prmloop.store.settings import KafkaSettings


@pytest.fixture
def storage(postgres_catalog: str) -> str:
    """A database of its own on the session's PostgreSQL (the gateway creates it)."""
    import pgserver

    server = pgserver.get_server(postgres_catalog, cleanup_mode="stop")
    return str(server.get_uri(database=f"broker_{uuid.uuid4().hex[:8]}"))


class SignedRequests(httpx.Auth):
    """AWS Signature Version 4 with the gateway's key (the credentials of this session's home)."""

    def auth_flow(self, request: httpx.Request):  # type: ignore[no-untyped-def]
        from prmloop.store.auth.credentials import load_credentials
        from prmloop.store.auth.sigv4 import sign_headers

        credentials = load_credentials()
        body = request.read()
        request.headers.update(
            sign_headers(
                request.method,
                str(request.url),
                body,
                access_key_id=credentials.gateway_access_key_id,
                secret=credentials.gateway_secret_key,
            )
        )
        yield request


def _ids_in(servers: str, group: str, *, idle_s: float = 4.0, commit: int | None = None) -> list[str]:
    """Event ids a consumer of ``group`` reads until idle; commits after ``commit`` records if given."""
    consumer = KafkaConsumer(**consumer_config(KafkaSettings(), servers, group_id=group), consumer_timeout_ms=500)
    consumer.subscribe(list(EVENT_TOPICS))
    seen: list[str] = []
    read_up_to: dict[TopicPartition, int] = {}
    last = start = time.monotonic()
    # The group join takes seconds on Tansu (ARCHITECTURE.md): idleness counts from the first record.
    while (not seen or time.monotonic() - last < idle_s) and time.monotonic() - start < 60:
        for records in consumer.poll(timeout_ms=500).values():
            last = time.monotonic()
            for record in records:
                if commit is not None and len(seen) == commit:
                    # Exactly what was read: the position also covers the rest of the fetched batch.
                    consumer.commit({tp: OffsetAndMetadata(o + 1, None, -1) for tp, o in read_up_to.items()})
                    consumer.close(autocommit=False)
                    return seen
                seen.append(dict(record.headers)["event_id"].decode())
                read_up_to[TopicPartition(record.topic, record.partition)] = record.offset
    consumer.close(autocommit=False)
    return seen


def test_a_sigkilled_broker_restarted_on_its_storage_loses_nothing(storage: str) -> None:
    events = synthetic_events(300, seed=11)
    with EmbeddedBroker(storage=storage) as broker:
        assert broker.cluster_id == "prmloop"  # stable: the storage is the cluster
        ensure_topics(broker.bootstrap_servers, all_topic_specs(2))
        with EventProducer(broker.bootstrap_servers, follow_broker=False) as producer:
            producer.publish(events)
        first = _ids_in(broker.bootstrap_servers, "half", commit=100)
        assert len(first) == 100
        broker.restart(kill=True)  # SIGKILL, then a new Tansu on the same port and storage
        everything = _ids_in(broker.bootstrap_servers, "fresh")
        rest = _ids_in(broker.bootstrap_servers, "half")
    assert sorted(everything) == sorted(str(e.event_id) for e in events)
    assert sorted(first + rest) == sorted(everything)  # the committed offsets survived: nothing twice


@pytest.mark.slow
def test_two_brokers_on_one_storage_lose_nothing_when_one_is_killed_mid_stream(storage: str) -> None:
    events = synthetic_events(1200, seed=12)
    with EmbeddedBroker(storage=storage) as a, EmbeddedBroker(storage=storage) as b:
        ensure_topics(a.bootstrap_servers, all_topic_specs(2))
        both = f"{a.bootstrap_servers},{b.bootstrap_servers}"
        watch = BrokerWatch.for_servers(both)
        assert watch is not None and watch.current.bootstrap_servers == a.bootstrap_servers
        seen: set[str] = set()
        lock = threading.Lock()

        def handler(batch: list[ConsumedEvent]) -> None:
            with lock:
                seen.update(str(c.event.event_id) for c in batch)

        runtime = ConsumerRuntime(
            topics=list(EVENT_TOPICS), group_id="durable-pair", bootstrap_servers=both, handler=handler
        )
        thread = threading.Thread(target=runtime.run, kwargs={"install_signal_handlers": False}, daemon=True)
        thread.start()
        with EventProducer(both, timeout_s=60) as producer:
            for i in range(0, len(events), 100):
                if i == 600:
                    a.stop(kill=True)  # the broker both clients use
                producer.publish(events[i : i + 100])
            assert producer.bootstrap_servers == b.bootstrap_servers
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and len(seen) < len(events):
            time.sleep(0.5)
        runtime.stop()
        thread.join(timeout=30)
    assert seen == {str(e.event_id) for e in events}


def test_the_gateway_updates_objects_only_on_the_version_the_writer_read(storage: str) -> None:
    """The conditional writes Tansu's shared state relies on, and the listing it reads offsets from."""
    import subprocess
    import sys

    port = free_port()
    argv = [sys.executable, "-m", "prmloop.flows.ops.objectgate", "--dsn", storage, "--port", str(port)]
    gateway = subprocess.Popen(argv)
    try:
        deadline = time.monotonic() + 30
        while not port_open("127.0.0.1", port) and time.monotonic() < deadline:
            time.sleep(0.1)
        base = f"http://127.0.0.1:{port}/bucket"
        with httpx.Client(auth=SignedRequests()) as http:  # signed as Tansu's S3 client signs
            assert httpx.get(f"{base}/a/w.json").status_code == 403  # unsigned: refused
            created = http.put(f"{base}/a/w.json", content=b"1", headers={"If-None-Match": "*"})
            assert created.status_code == 200
            assert http.put(f"{base}/a/w.json", content=b"2", headers={"If-None-Match": "*"}).status_code == 412
            etag = created.headers["etag"]
            assert http.put(f"{base}/a/w.json", content=b"2", headers={"If-Match": etag}).status_code == 200
            assert http.put(f"{base}/a/w.json", content=b"3", headers={"If-Match": etag}).status_code == 412  # stale
            assert http.get(f"{base}/a/w.json").content == b"2"
            for name in ("a/r/1", "a/r/2", "a/r/3", "b/x"):
                http.put(f"{base}/{name}", content=name.encode())
            page = http.get(base, params={"list-type": "2", "prefix": "a/r/", "max-keys": "2"}).text
            assert "<Key>a/r/1</Key><" in page and "a/r/3" not in page and "<IsTruncated>true" in page
            nested = http.get(base, params={"list-type": "2", "prefix": "a/", "delimiter": "/"}).text
            assert "<Prefix>a/r/</Prefix>" in nested and "<Key>a/w.json</Key>" in nested and "a/r/1" not in nested
            assert http.get(f"{base}/a/r/2", headers={"Range": "bytes=2-"}).content == b"r/2"
            assert http.delete(f"{base}/a/r/2").status_code == 204
            assert http.get(f"{base}/a/r/2").status_code == 404
    finally:
        gateway.terminate()
        gateway.wait(timeout=10)
