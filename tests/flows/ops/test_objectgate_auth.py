"""The object gateway serves signed requests only (issue 39, point 2).

Reproduced as the issue found it: as another local user, ``curl -X DELETE`` on the durable broker's
object gateway deleted its record batches (204 each), and a consumer then read 0 of 50 events; a PUT to
any key answered 200. Now every request must carry an AWS Signature Version 4 by the gateway's key
(as Tansu's S3 client signs them); others get 403. Real components: the gateway on the session's
PostgreSQL, Tansu on it (through the broker gate), curl as ``nobody``.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from prmloop.flows.lab.bench.synthetic import synthetic_events
from prmloop.flows.ops.broker import BUCKET, EmbeddedBroker
from prmloop.store.auth.credentials import load_credentials
from prmloop.store.auth.sigv4 import check, sign_headers
from prmloop.store.events.topics import all_topic_specs
from prmloop.store.kafka.producer import EventProducer, ensure_topics
from prmloop.store.ports import free_port, port_open


def _signed(method: str, url: str, body: bytes = b"", **changes: object) -> dict[str, str]:
    credentials = load_credentials()
    options = {"access_key_id": credentials.gateway_access_key_id, "secret": credentials.gateway_secret_key}
    options.update(changes)  # type: ignore[arg-type]
    return sign_headers(method, url, body, **options)  # type: ignore[arg-type]


@pytest.fixture
def storage(postgres_catalog: str) -> str:
    import pgserver

    server = pgserver.get_server(postgres_catalog, cleanup_mode="stop")
    return str(server.get_uri(database=f"gate_{uuid.uuid4().hex[:8]}"))


@pytest.fixture
def gateway(storage: str) -> Iterator[str]:
    port = free_port()
    argv = [sys.executable, "-m", "prmloop.flows.ops.objectgate", "--dsn", storage, "--port", str(port)]
    process = subprocess.Popen(argv)
    try:
        deadline = time.monotonic() + 30
        while not port_open("127.0.0.1", port) and time.monotonic() < deadline:
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/{BUCKET}"
    finally:
        process.terminate()
        process.wait(timeout=30)


def _curl(run: Callable[..., subprocess.CompletedProcess[str]] | None, *args: str) -> str:
    argv = ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", *args]
    done = run(argv) if run is not None else subprocess.run(argv, capture_output=True, text=True, check=False)
    return done.stdout.strip()


def test_unsigned_put_and_delete_are_refused_and_signed_ones_served(gateway: str) -> None:
    key = f"{gateway}/clusters/prmloop/x"
    assert _curl(None, "-X", "PUT", "--data-binary", "forged", key) == "403"
    assert _curl(None, "-X", "DELETE", key) == "403"
    assert _curl(None, gateway + "?list-type=2") == "403"
    with httpx.Client() as http:
        assert http.put(key, content=b"ours", headers=_signed("PUT", key, b"ours")).status_code == 200
        assert http.get(key, headers=_signed("GET", key)).content == b"ours"
        assert http.get(key).status_code == 403
        wrong = _signed("GET", key, access_key_id="prmloop-guess", secret="guess")
        assert http.get(key, headers=wrong).status_code == 403
        forged = _signed("GET", key, secret="not-the-secret")
        assert http.get(key, headers=forged).status_code == 403
        stale = _signed("GET", key, now=datetime.now(UTC) - timedelta(hours=1))
        assert http.get(key, headers=stale).status_code == 403
        swapped = http.put(key, content=b"theirs", headers=_signed("PUT", key, b"ours"))
        assert swapped.status_code == 403  # the body is not the one signed
        assert http.delete(key).status_code == 403
        assert http.get(key, headers=_signed("GET", key)).content == b"ours"


def test_a_check_names_what_is_wrong() -> None:
    url = "http://127.0.0.1:9/prmloop/k?list-type=2&prefix=a%2Fb"
    headers = sign_headers("GET", url, b"", access_key_id="id", secret="s")
    args = ("GET", "/prmloop/k", "list-type=2&prefix=a%2Fb")
    assert check(*args, headers, b"", access_key_id="id", secret="s") is None
    assert "not signed" in str(check(*args, {}, b"", access_key_id="id", secret="s"))
    assert "unknown access key" in str(check(*args, headers, b"", access_key_id="other", secret="s"))
    assert "does not match" in str(check(*args, headers, b"", access_key_id="id", secret="t"))
    moved = ("GET", "/prmloop/other", "list-type=2&prefix=a%2Fb")
    assert "does not match" in str(check(*moved, headers, b"", access_key_id="id", secret="s"))


def test_another_user_cannot_delete_the_durable_brokers_record_batches(
    storage: str, as_nobody: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    events = synthetic_events(50, seed=21)
    with EmbeddedBroker(storage=storage) as broker:
        ensure_topics(broker.bootstrap_servers, all_topic_specs(1))
        with EventProducer(broker.bootstrap_servers, follow_broker=False) as producer:
            producer.publish(events)
        endpoint = broker._gateway_endpoint
        listing = f"{endpoint}/{BUCKET}?list-type=2&prefix=clusters%2F"
        keys = [
            el.text
            for el in ET.fromstring(httpx.get(listing, headers=_signed("GET", listing)).text).iter()
            if el.tag.endswith("Key") and el.text
        ]
        batches = [k for k in keys if "/records/" in k or k.endswith(".batch")] or keys
        assert batches, keys
        for key in batches:
            assert _curl(as_nobody, "-X", "DELETE", f"{endpoint}/{BUCKET}/{key}") == "403"
            assert _curl(as_nobody, "-X", "PUT", "--data-binary", "x", f"{endpoint}/{BUCKET}/{key}") == "403"
        from kafka import KafkaConsumer, TopicPartition

        consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap_servers, enable_auto_commit=False)
        parts = [
            TopicPartition(t, p) for t in {e.topic for e in events} for p in consumer.partitions_for_topic(t) or ()
        ]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        seen: set[str] = set()
        deadline = time.monotonic() + 60
        while len(seen) < len(events) and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                seen.update(dict(r.headers)["event_id"].decode() for r in records)
        consumer.close()
    assert seen == {str(e.event_id) for e in events}
