"""A client built while its broker does not answer yet waits for it (store/kafka/connect.py).

The scene of a chaos-test failure in CI: nineteen processes starting at once on two cores, the brokers
slow to answer, and both consensus processes exited with NoBrokersAvailable at start. Here the broker
really starts a few seconds after the service, on the port the service was given.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid

import pytest
from kafka.errors import NoBrokersAvailable

from prmloop.flows.ops.broker import EmbeddedBroker
from prmloop.store.events import QuestionRegistered, make_event
from prmloop.store.events.codec import encode_event
from prmloop.store.events.topics import TopicSpec, dlq_topic
from prmloop.store.kafka.connect import once_answering
from prmloop.store.kafka.producer import EventProducer, ensure_topics
from prmloop.store.kafka.runtime import ConsumedEvent, ConsumerRuntime
from prmloop.store.ports import free_port
from prmloop.store.settings import KafkaSettings


def test_a_service_started_before_its_broker_waits_for_it_then_reads_everything(
    caplog: pytest.LogCaptureFixture,
) -> None:
    port, topic = free_port(), f"test-{uuid.uuid4().hex[:10]}"
    servers = f"127.0.0.1:{port}"
    published = threading.Event()
    finished = threading.Event()
    failure: list[BaseException] = []

    def broker_later() -> None:
        try:
            time.sleep(4)
            with EmbeddedBroker(port=port) as broker:
                ensure_topics(broker.bootstrap_servers, [TopicSpec(topic, 1), TopicSpec(dlq_topic(topic), 1)])
                with EventProducer(broker.bootstrap_servers, follow_broker=False) as producer:
                    for i in range(5):
                        question = QuestionRegistered(question_id=f"q{i}", dataset="d", problem="p")
                        event = make_event(question, producer="t")
                        producer.send_raw(topic, b"k", encode_event(event), [])
                published.set()
                finished.wait(120)
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            failure.append(exc)
            published.set()

    thread = threading.Thread(target=broker_later, daemon=True)
    thread.start()
    seen: list[str] = []

    def handle(batch: list[ConsumedEvent]) -> None:
        seen.extend(e.event.payload.question_id for e in batch)  # type: ignore[union-attr]

    began = time.monotonic()
    try:
        with caplog.at_level(logging.WARNING, logger="prmloop.store.kafka.connect"):
            runtime = ConsumerRuntime(
                topics=[topic],
                group_id=f"g-{topic}",
                bootstrap_servers=servers,
                handler=handle,
                kafka=KafkaSettings(connect_wait_s=120),
                follow_broker=False,
                name="late-broker",
            )
        waited = time.monotonic() - began
        deadline = time.monotonic() + 90
        runtime.run(until=lambda: len(seen) >= 5 or time.monotonic() > deadline, install_signal_handlers=False)
    finally:
        finished.set()
        thread.join(timeout=60)
    assert not failure, failure
    assert waited >= 3, f"the runtime connected after {waited:.1f} s, before its broker started"
    assert sorted(seen) == [f"q{i}" for i in range(5)]
    said = [r.getMessage() for r in caplog.records]
    assert any(f"late-broker: no Kafka broker answers at {servers} yet" in m and "prmloop up" in m for m in said), said
    assert any(f"late-broker: the broker at {servers} answers" in m for m in said), said


def test_a_broker_that_never_answers_fails_the_client_after_its_wait(caplog: pytest.LogCaptureFixture) -> None:
    servers = f"127.0.0.1:{free_port()}"
    began = time.monotonic()
    with (
        caplog.at_level(logging.WARNING, logger="prmloop.store.kafka.connect"),
        pytest.raises(NoBrokersAvailable),
    ):
        EventProducer(servers, kafka=KafkaSettings(connect_wait_s=3), follow_broker=False)
    assert time.monotonic() - began >= 3
    assert any(f"producer: no Kafka broker answers at {servers} yet" in r.getMessage() for r in caplog.records)


def test_the_wait_is_bounded_by_its_stop_and_says_so_once_per_period(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[float] = []

    def refuse() -> int:
        calls.append(time.monotonic())
        raise NoBrokersAvailable()

    stop = threading.Event()
    threading.Timer(2.0, stop.set).start()
    with caplog.at_level(logging.WARNING, logger="prmloop.store.kafka.connect"), pytest.raises(NoBrokersAvailable):
        once_answering(refuse, "h:1", "t", wait_s=60, stop=stop, say_every_s=30)
    assert 2.0 <= calls[-1] - calls[0] < 10, "the stop ended the wait"
    assert len(calls) >= 3  # backing off 0.5 s, 1 s, 2 s ...
    assert sum("no Kafka broker answers" in r.getMessage() for r in caplog.records) == 1


def test_an_error_that_is_not_about_reaching_the_broker_is_not_retried() -> None:
    calls = []

    def broken() -> int:
        calls.append(1)
        raise ValueError("bad option")

    with pytest.raises(ValueError, match="bad option"):
        once_answering(broken, "h:1", "t", wait_s=60)
    assert calls == [1]
