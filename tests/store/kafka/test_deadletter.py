"""Dead-letter counts per topic with the newest error type, read back from a real broker after the real
consumer runtime dead-lettered records there (`prmloop status` shows them)."""

from __future__ import annotations

import json
import threading
import uuid
from pathlib import Path

from kafka import KafkaProducer
from typer.testing import CliRunner

from prmloop.flows.cli import app
from prmloop.flows.ops.broker import EmbeddedBroker
from prmloop.store.events import QuestionRegistered, make_event
from prmloop.store.events.codec import encode_event
from prmloop.store.events.topics import EVENT_TOPICS, dlq_topic
from prmloop.store.kafka.deadletter import dead_letter_summary
from prmloop.store.kafka.producer import ensure_topics
from prmloop.store.kafka.runtime import ConsumerRuntime
from prmloop.store.tables.duck import DuckEventStore

LABELED, JUDGED = "steps.labeled", "steps.judged"


def _send(servers: str, topic: str, values: list[bytes]) -> None:
    producer = KafkaProducer(bootstrap_servers=servers, linger_ms=50)
    try:
        for value in values:
            producer.send(topic, key=b"same-partition", value=value)  # one partition: several records a batch
        producer.flush(timeout=30)
    finally:
        producer.close()


def _dead_letter_all(servers: str, group: str, expected: int) -> None:
    """Run the real runtime on the event topics until ``expected`` more records were dead-lettered."""
    runtime = ConsumerRuntime(
        topics=[LABELED, JUDGED],
        group_id=group,
        name="g",
        bootstrap_servers=servers,
        handler=lambda batch: None,
        assign_all=True,
    )
    thread = threading.Thread(
        target=runtime.run,
        kwargs={"until": lambda: runtime.stats.dead_lettered >= expected, "install_signal_handlers": False},
    )
    thread.start()
    thread.join(60)
    runtime.stop()
    thread.join(30)
    assert runtime.stats.dead_lettered == expected


def _wrong_topic_event() -> bytes:
    """A valid event, but of a type whose topic is not ``steps.labeled``."""
    payload = QuestionRegistered(question_id="q-dlq", dataset="t", problem="1+1?", gold_answer="2")
    return encode_event(make_event(payload, producer="test/0"))


def test_counts_are_exact_and_the_newest_error_type_is_named(tmp_path: Path) -> None:
    with EmbeddedBroker() as broker:
        servers = broker.bootstrap_servers
        ensure_topics(servers)
        empty = dead_letter_summary(servers)
        assert set(empty) == {dlq_topic(t) for t in EVENT_TOPICS}
        assert all(entry == {"count": 0} for entry in empty.values())

        _send(servers, LABELED, [b"{not json", b"[1, 2", b"\xff\xfe"])
        _send(servers, JUDGED, [b"{}"])
        group = f"g-{uuid.uuid4().hex[:8]}"
        _dead_letter_all(servers, group, 4)
        _send(servers, LABELED, [_wrong_topic_event()])  # the newest: its type must be the one named
        _dead_letter_all(servers, group, 1)

        summary = dead_letter_summary(servers)
        labeled, judged = summary.pop(dlq_topic(LABELED)), summary.pop(dlq_topic(JUDGED))
        assert (labeled["count"], labeled["newest_error_type"], labeled["newest_consumer"]) == (4, "WrongTopic", "g")
        assert (judged["count"], judged["newest_error_type"]) == (1, "DecodeError")
        assert all(entry == {"count": 0} for entry in summary.values())
        db = DuckEventStore(tmp_path / "prmloop.duckdb").path

        result = CliRunner().invoke(
            app,
            ["status", "--db", str(db)],
            env={"KAFKA_BOOTSTRAP_SERVERS": servers, "PRMLOOP_HOME": str(tmp_path)},
        )
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)["dead_letters"]
    assert shown[dlq_topic(LABELED)]["count"] == 4
    assert shown[dlq_topic(LABELED)]["newest_error_type"] == "WrongTopic"
    assert shown[dlq_topic(JUDGED)]["count"] == 1
