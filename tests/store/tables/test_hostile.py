"""Records that used to stop the pipeline, against a real broker, the real runtime and the real sink:
deep nesting, a record too big for the dead-letter topic, an event on another type's topic,
conflicting duplicates, and a handler that fails for one record of a batch."""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.consumer.fetcher import ConsumerRecord

from prmloop.consumers.sink import SinkSettings, run_sink
from prmloop.flows.ops.broker import EmbeddedBroker
from prmloop.store.events import (
    CostLedger,
    Envelope,
    ModelRef,
    QuestionRegistered,
    StepJudgment,
    StepsJudged,
    StepsLabeled,
    make_event,
)
from prmloop.store.events.codec import encode_event
from prmloop.store.events.limits import DLQ_TRUNCATED_BYTES
from prmloop.store.events.topics import TopicSpec, dlq_topic
from prmloop.store.kafka.producer import EventProducer, consumer_config, ensure_topics
from prmloop.store.kafka.runtime import ConsumedEvent, ConsumerRuntime
from prmloop.store.kafka.service import ServiceStats
from prmloop.store.settings import KafkaSettings
from prmloop.store.tables.duck import query, store_exists, store_health
from prmloop.store.tables.export import export_views
from prmloop.store.tables.lake import LakeStore
from prmloop.store.tables.metrics import loop_metrics


@pytest.fixture(scope="module")
def servers() -> Iterator[str]:
    """A broker of this module's own: its event topics and dead-letter topics hold only what these
    tests put there, so they can be counted exactly."""
    with EmbeddedBroker() as broker:
        ensure_topics(broker.bootstrap_servers, [])
        ensure_topics(broker.bootstrap_servers)
        yield broker.bootstrap_servers


def raw_producer(servers: str) -> KafkaProducer:
    """A plain producer without prmloop's limits: what a foreign or broken producer can send."""
    return KafkaProducer(bootstrap_servers=servers, acks="all", max_request_size=64 * 1024 * 1024, linger_ms=5)


def question(i: int | str) -> Envelope:
    return make_event(QuestionRegistered(question_id=f"q{i}", dataset="d", problem=f"p{i}"), producer="t")


def deep_record(depth: int) -> bytes:
    body = json.loads(encode_event(question("deep")))
    body["payload"]["extra"] = "@"
    return json.dumps(body).replace('"@"', "[" * depth + "]" * depth).encode()


def read_topic(servers: str, topic: str, expected: int, timeout_s: float = 30) -> list[ConsumerRecord]:
    consumer = KafkaConsumer(**consumer_config(KafkaSettings(), servers, group_id=None))
    parts = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or [0])]
    consumer.assign(parts)
    consumer.seek_to_beginning()
    out: list[ConsumerRecord] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < expected and time.monotonic() < deadline:
        for recs in consumer.poll(timeout_ms=200).values():
            out.extend(recs)
    # A little longer: more than expected would be a bug too.
    for recs in consumer.poll(timeout_ms=500).values():
        out.extend(recs)
    consumer.close()
    return out


class SinkThread:
    """The real sink in a thread, against a temporary DuckDB file."""

    def __init__(self, servers: str, db: Path | LakeStore) -> None:
        self.db = db
        self.stop = threading.Event()
        self.result: list[ServiceStats] = []
        self.error: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, args=(servers,), daemon=True)
        self.thread.start()

    def _run(self, servers: str) -> None:
        try:
            self.result.append(
                run_sink(
                    SinkSettings(group=f"sink-{uuid.uuid4().hex[:8]}"),
                    bootstrap_servers=servers,
                    db_path=self.db,
                    until=self.stop.is_set,
                    install_signal_handlers=False,
                )
            )
        except BaseException as exc:
            self.error.append(exc)
            raise

    @property
    def alive(self) -> bool:
        return self.thread.is_alive()

    def close(self) -> ServiceStats:
        self.stop.set()
        self.thread.join(60)
        assert not self.error, self.error
        return self.result[0]


def stored(db: Path | LakeStore, events: list[Envelope]) -> int:
    if not store_exists(db):
        return 0
    ids = ",".join(f"'{e.event_id}'" for e in events)
    return int(query(db, f"SELECT count(*) FROM events WHERE event_id IN ({ids})").rows[0][0])


@pytest.fixture
def own_servers() -> Iterator[str]:
    """A broker of this test's own (the store-parametrized tests count dead letters exactly)."""
    with EmbeddedBroker() as broker:
        ensure_topics(broker.bootstrap_servers)
        yield broker.bootstrap_servers


@pytest.fixture(params=["duckdb", "ducklake"])
def store_at(request: pytest.FixtureRequest, tmp_path: Path) -> Path | LakeStore:
    """Where the sink writes: a DuckDB file, or a DuckLake with a real PostgreSQL catalog."""
    if request.param == "duckdb":
        return tmp_path / "store.duckdb"
    lake: LakeStore = request.getfixturevalue("lake_store")
    return lake


def test_hostile_records_among_valid_ones_go_to_the_dlq_and_the_valid_ones_are_stored(
    own_servers: str, store_at: Path | LakeStore, wait_until: Callable[..., None]
) -> None:
    good = [question(f"h{i}") for i in range(6)]
    huge = b"\x00not json" + b"x" * 12_000_000
    hostile = [deep_record(100_000), deep_record(300), huge, b"\xff\xfe", b"[]"]
    topic = good[0].topic
    producer = raw_producer(own_servers)
    for i, e in enumerate(good):
        producer.send(topic, key=e.correlation_id.encode(), value=encode_event(e))
        if i < len(hostile):
            producer.send(topic, key=b"bad", value=hostile[i])
    producer.flush(30)
    producer.close()

    sink = SinkThread(own_servers, store_at)
    wait_until(lambda: stored(sink.db, good) == len(good), 60, "the valid events")
    assert sink.alive
    stats = sink.close()
    assert stats.dead_lettered == len(hostile)
    assert stats.counters["inserted"] == len(good)

    dead = read_topic(own_servers, dlq_topic(topic), len(hostile))
    assert len(dead) == len(hostile)
    by_error = {dict(r.headers)["dlq.error_type"] for r in dead}
    assert b"RecordTooDeep" in by_error and b"RecordTooLarge" in by_error
    truncated = [r for r in dead if dict(r.headers).get("dlq.truncated") == b"true"]
    assert len(truncated) == 1  # only the 12 MB one did not fit
    h = dict(truncated[0].headers)
    assert truncated[0].value == huge[:DLQ_TRUNCATED_BYTES]
    assert h["dlq.original_size"] == str(len(huge)).encode()
    assert h["dlq.original_sha256"] == hashlib.sha256(huge).hexdigest().encode()
    assert h["dlq.topic"] == topic.encode() and int(h["dlq.offset"]) >= 0
    small = [r for r in dead if r not in truncated]
    assert sorted(r.value for r in small) == sorted(v for v in hostile if v is not huge)  # intact copies


def test_an_event_on_another_types_topic_and_conflicting_duplicates_are_never_silent(
    own_servers: str, store_at: Path | LakeStore, wait_until: Callable[..., None]
) -> None:
    original = question("c1")
    same_again = encode_event(original)
    changed = json.loads(encode_event(original))
    changed["payload"]["problem"] = "a different problem under the same event_id"
    changed_raw = json.dumps(changed).encode()
    stray = question("stray")  # a QuestionRegistered on steps.labeled
    producer = raw_producer(own_servers)
    producer.send(original.topic, key=b"c1", value=encode_event(original))
    producer.send(original.topic, key=b"c1", value=same_again)  # a harmless redelivery
    producer.send(original.topic, key=b"c1", value=changed_raw)
    producer.send(original.topic, key=b"c1", value=changed_raw)  # the same conflict twice: one row
    producer.send("steps.labeled", key=b"stray", value=encode_event(stray))
    producer.flush(30)
    producer.close()

    db = store_at
    sink = SinkThread(own_servers, db)
    wait_until(lambda: stored(db, [original]) == 1, 60, "the original")
    wait_until(lambda: int(query(db, "SELECT count(*) FROM conflicts").rows[0][0]) >= 1, 30, "the conflict")
    wrong = read_topic(own_servers, dlq_topic("steps.labeled"), 1)
    sink.close()

    rows = query(
        db, "SELECT event_id, topic, body, body_sha256, stored_sha256, kafka_offset, stored_offset FROM conflicts"
    ).rows
    assert len(rows) == 1
    event_id, topic, body, body_digest, stored_digest, offset, stored_offset = rows[0]
    assert event_id == original.event_id and topic == original.topic
    assert json.loads(body)["payload"]["problem"].startswith("a different problem")
    assert body_digest != stored_digest
    assert offset > stored_offset
    payload = query(db, f"SELECT payload->>'problem' FROM events WHERE event_id = '{original.event_id}'").rows
    assert payload == [("pc1",)]  # the first version stays
    assert stored(db, [stray]) == 0
    assert len(wrong) == 1
    assert dict(wrong[0].headers)["dlq.error_type"] == b"WrongTopic"
    assert b"questions" in dict(wrong[0].headers)["dlq.error"]

    health = store_health(db)
    assert health["conflicts"] == 1 and health["conflicting_events"] == 1
    assert health["events_per_topic"].get("steps.labeled", 0) == 0
    assert health["events"] >= 1


def test_numbers_the_store_cannot_hold_are_dead_lettered_and_every_view_still_reads(
    own_servers: str, store_at: Path | LakeStore, wait_until: Callable[..., None], tmp_path: Path
) -> None:
    """Issue 25.3: `generated_tokens = 2**70` used to be stored and then break `cost_ledger`,
    `prmloop status` and `prmloop export`; `step_index = 2**40` broke `step_judgments`."""
    labeled = make_event(
        StepsLabeled(solution_id="s", question_id="q", method="m", labels=(True,), cost=CostLedger(rollouts=3)),
        producer="t",
    )
    judged = make_event(
        StepsJudged(
            solution_id="s",
            question_id="q",
            judge=ModelRef(backend="b", name="n"),
            verdicts=(True,),
            judgments=(StepJudgment(step_index=0, has_error=False),),
        ),
        producer="t",
    )
    huge_tokens = json.loads(encode_event(labeled))
    huge_tokens["event_id"] = str(uuid.uuid4())
    huge_tokens["payload"]["cost"]["generated_tokens"] = 2**70
    huge_index = json.loads(encode_event(judged))
    huge_index["event_id"] = str(uuid.uuid4())
    huge_index["payload"]["judgments"][0]["step_index"] = 2**40
    producer = raw_producer(own_servers)
    for event, hostile in ((labeled, huge_tokens), (judged, huge_index)):
        producer.send(event.topic, key=b"s", value=json.dumps(hostile).encode())
        producer.send(event.topic, key=b"s", value=encode_event(event))
    producer.flush(30)
    producer.close()

    sink = SinkThread(own_servers, store_at)
    wait_until(lambda: stored(sink.db, [labeled, judged]) == 2, 60, "the valid events")
    stats = sink.close()
    assert stats.dead_lettered == 2
    assert query(store_at, "SELECT count(*) FROM events").rows == [(2,)]
    ledger = query(store_at, "SELECT source, rollouts, generated_tokens FROM cost_ledger ORDER BY 1").rows
    assert ledger == [("StepsJudged", 0, 0), ("StepsLabeled", 3, 0)]
    assert query(store_at, "SELECT step_index FROM step_judgments").rows == [(0,)]
    assert store_health(store_at)["events"] == 2 and loop_metrics(store_at)["label_tokens"] == 0
    exported = export_views(store_at, ["cost_ledger", "step_judgments"], tmp_path / "out")
    assert [r["rows"] for r in exported] == [2, 1]
    for topic in (labeled.topic, judged.topic):
        [dead] = read_topic(own_servers, dlq_topic(topic), 1)
        assert b"less than or equal" in dict(dead.headers)["dlq.error"]


def _own_topic(servers: str) -> str:
    name = f"hostile-{uuid.uuid4().hex[:10]}"
    ensure_topics(servers, [TopicSpec(name, 1), TopicSpec(dlq_topic(name), 1)])
    return name


def test_a_handler_failing_for_one_record_dead_letters_that_record_only(servers: str) -> None:
    topic = _own_topic(servers)
    events = [question(f"b{i}") for i in range(20)]
    with EventProducer(servers) as producer:
        for e in events:
            producer.send_raw(topic, b"k", encode_event(e), [])
    done: list[str] = []
    calls: list[int] = []

    def handler(batch: list[ConsumedEvent]) -> None:
        calls.append(len(batch))
        if any(c.event.correlation_id == "qb13" for c in batch):
            raise KeyError("qb13 breaks this handler")  # not transient: a poison record
        done.extend(c.event.correlation_id for c in batch)

    runtime = ConsumerRuntime(
        topics=[topic], group_id=f"g-{topic}", bootstrap_servers=servers, handler=handler, assign_all=True
    )
    deadline = time.monotonic() + 60
    runtime.run(until=lambda: len(done) >= 19 or time.monotonic() > deadline, install_signal_handlers=False)
    assert sorted(done) == sorted(f"qb{i}" for i in range(20) if i != 13)  # each once
    assert runtime.stats.dead_lettered == 1 and runtime.stats.retries == 0
    assert len(calls) < 20  # found by splitting, not one by one
    dead = read_topic(servers, dlq_topic(topic), 1)
    assert len(dead) == 1
    headers: dict[str, Any] = dict(dead[0].headers)
    assert headers["dlq.error_type"] == b"KeyError"
    assert b"qb13 breaks" in headers["dlq.error"]
    assert json.loads(dead[0].value)["correlation_id"] == "qb13"


def test_a_dead_letter_topic_with_a_small_limit_gets_a_truncated_copy_or_the_headers_alone(servers: str) -> None:
    """A DLQ producer limited to 32 KiB stands in for a broker with a small ``message.max.bytes``."""
    topic = _own_topic(servers)
    medium, large = b"m" * 40_000, b"\x00" + b"L" * 200_000
    with EventProducer(servers) as producer:
        for value in (b"x" * 1000, medium, large):
            producer.send_raw(topic, b"k", value, [])
    small_dlq = EventProducer(servers, max_request_size=32 * 1024)
    runtime = ConsumerRuntime(
        topics=[topic],
        group_id=f"g-{topic}",
        bootstrap_servers=servers,
        handler=lambda batch: None,
        assign_all=True,
        dlq_producer=small_dlq,
    )
    deadline = time.monotonic() + 60
    runtime.run(
        until=lambda: runtime.stats.dead_lettered >= 3 or time.monotonic() > deadline, install_signal_handlers=False
    )
    small_dlq.close()
    dead = sorted(read_topic(servers, dlq_topic(topic), 3), key=lambda r: int(dict(r.headers)["dlq.offset"]))
    assert [len(r.value or b"") for r in dead] == [1000, 0, 0]
    for record, original in zip(dead[1:], (medium, large), strict=True):
        h = dict(record.headers)
        assert h["dlq.truncated"] == b"true"
        assert h["dlq.original_size"] == str(len(original)).encode()
        assert h["dlq.original_sha256"] == hashlib.sha256(original).hexdigest().encode()
