"""Property-based fuzzing of the running sink with hostile records, on a real broker and DuckDB file.

Hypothesis generates batches mixing valid events (from every topic, with arbitrary Unicode text)
and hostile records: random bytes, JSON nested 10^2..10^5 levels deep (bare or inside an otherwise
valid event), wrong field types, valid events on another type's topic, conflicting and identical
duplicates of valid events, and (rarely) multi-megabyte records; a fixed set of huge records (up to
12 MB) goes first. After every batch the sink must still run and have stored every valid event;
at the end every valid event is stored exactly once, and every invalid record is in a dead-letter
topic or the conflicts table, counted exactly.
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from prmloop.consumers.sink import SinkSettings, run_sink
from prmloop.flows.lab.bench.synthetic import synthetic_events
from prmloop.flows.ops.broker import EmbeddedBroker
from prmloop.store.events import Envelope, QuestionRegistered, make_event
from prmloop.store.events.codec import encode_event
from prmloop.store.events.topics import EVENT_TOPICS, dlq_topic
from prmloop.store.kafka.producer import consumer_config, ensure_topics
from prmloop.store.settings import KafkaSettings
from prmloop.store.tables.duck import query

EXAMPLES = 100

#: (kind of record, topic, what was drawn for it: an index, a text, bytes or a size)
Plan = tuple[str, str, int | str | bytes]


@dataclass
class Ledger:
    """What was sent, and what the store must therefore show."""

    valid: dict[uuid.UUID, Envelope] = field(default_factory=dict)
    dead: int = 0  # records that must end in a dead-letter topic
    conflicts: set[tuple[uuid.UUID, str]] = field(default_factory=set)  # (event_id, changed problem)
    hostile: int = 0  # every record sent that is not a fresh valid event
    batches: int = 0
    kinds: dict[str, int] = field(default_factory=dict)

    def note(self, kind: str) -> None:
        self.hostile += 1
        self.kinds[kind] = self.kinds.get(kind, 0) + 1


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, threading.Thread, list[object]]]:
    """Its own broker (so dead-letter topics can be counted exactly) and the real sink in a thread."""
    db = tmp_path_factory.mktemp("fuzz") / "store.duckdb"
    with EmbeddedBroker() as broker:
        servers = broker.bootstrap_servers
        ensure_topics(servers)
        stop = threading.Event()
        outcome: list[object] = []

        def target() -> None:
            try:
                outcome.append(
                    run_sink(
                        SinkSettings(group="fuzz-sink", max_batch=500),
                        bootstrap_servers=servers,
                        db_path=db,
                        until=stop.is_set,
                        install_signal_handlers=False,
                    )
                )
            except BaseException as exc:
                outcome.append(exc)
                raise

        sink = threading.Thread(target=target, daemon=True)
        sink.start()
        yield servers, db, sink, outcome
        stop.set()
        sink.join(60)


def _valid_pool() -> list[Envelope]:
    return synthetic_events(400, k=2, seed=31)


POOL = _valid_pool()

texts = st.text(max_size=200)  # any Unicode: control characters, markup, RTL overrides
depths = st.floats(2, 5).map(lambda x: int(10**x))


@st.composite
def batches(draw: st.DrawFn) -> list[Plan]:
    """A list of (kind, topic, detail) to turn into records; the details are drawn here so that
    Hypothesis can shrink them."""
    out: list[Plan] = []
    for _ in range(draw(st.integers(1, 8))):
        kind = draw(
            st.sampled_from(
                [
                    *("valid", "valid", "question", "bytes", "bytes", "deep", "deep", "deep_event", "deep_event"),
                    *("types", "wrong_topic", "dup", "conflict"),
                ]
            )
        )
        if draw(st.integers(0, 24)) == 17:  # multi-megabyte records: a few only (they cost seconds)
            kind = "big"
        topic = draw(st.sampled_from(EVENT_TOPICS))
        if kind == "bytes":
            detail: int | str | bytes = draw(st.binary(max_size=3000))
        elif kind in ("deep", "deep_event"):
            detail = draw(depths)
        elif kind == "big":
            detail = draw(st.integers(4 * 1024 * 1024 + 1, 6 * 1024 * 1024))
        elif kind == "types":
            detail = draw(st.sampled_from(["event_id", "payload", "occurred_at", "problem", "question_id"]))
        elif kind in ("question", "conflict"):
            detail = draw(texts)
        else:
            detail = draw(st.integers(0, len(POOL) - 1))
        out.append((kind, topic, detail))
    return out


def _key() -> bytes:
    """A key for every record: without one the producer picks partitions with the random module."""
    return uuid.uuid4().hex.encode()


def _fresh(e: Envelope) -> Envelope:
    return e.model_copy(update={"event_id": uuid.uuid4()})


def _question(text: str) -> Envelope:
    return make_event(
        QuestionRegistered(question_id=f"fz-{uuid.uuid4().hex[:8]}", dataset="fz", problem=text), producer="fuzz"
    )


def _wrong_types(field_name: str) -> bytes:
    body = json.loads(encode_event(_question("t")))
    if field_name == "event_id":
        body["event_id"] = "not-a-uuid"
    elif field_name == "payload":
        body["payload"] = [body["payload"]]
    elif field_name == "occurred_at":
        body["occurred_at"] = "yesterday-ish"
    elif field_name == "problem":
        body["payload"]["problem"] = {"nested": ["not", "text"]}
    else:
        body["payload"]["question_id"] = None
    return json.dumps(body).encode()


def _deep(depth: int, inside_event: bool) -> bytes:
    nest = "[" * depth + "]" * depth
    if not inside_event:
        return nest.encode()
    body = json.loads(encode_event(_question("deep")))
    body["payload"]["extra"] = "@"
    return json.dumps(body).replace('"@"', nest).encode()


def _send(producer: KafkaProducer, ledger: Ledger, plan: list[Plan], recent: list[Envelope]) -> list[Envelope]:
    """Send one planned batch; returns the fresh valid events it contained."""
    fresh: list[Envelope] = []
    for kind, topic, detail in plan:
        number = detail if isinstance(detail, int) else 0
        if kind in ("valid", "question"):
            e = _fresh(POOL[number]) if kind == "valid" else _question(str(detail))
            producer.send(e.topic, key=e.correlation_id.encode(), value=encode_event(e))
            ledger.valid[e.event_id] = e
            fresh.append(e)
            recent.append(e)
            continue
        ledger.note(kind)
        if kind == "bytes":
            producer.send(topic, key=_key(), value=detail if isinstance(detail, bytes) else b"")
            ledger.dead += 1
        elif kind in ("deep", "deep_event"):
            producer.send(topic, key=_key(), value=_deep(number, kind == "deep_event"))
            ledger.dead += 1
        elif kind == "big":
            producer.send(topic, key=_key(), value=b'{"event_type": "' + b"B" * number + b'"}')
            ledger.dead += 1
        elif kind == "types":
            producer.send(EVENT_TOPICS[0], key=_key(), value=_wrong_types(str(detail)))
            ledger.dead += 1
        elif kind == "wrong_topic":
            e = _fresh(POOL[number])
            wrong = next(t for t in EVENT_TOPICS if t != e.topic)
            producer.send(wrong if topic == e.topic else topic, key=_key(), value=encode_event(e))
            ledger.dead += 1
        elif kind == "dup":  # an identical redelivery: harmless, stored once
            original = recent[number % len(recent)] if recent else _question("dup")
            if not recent:
                ledger.valid[original.event_id] = original
                fresh.append(original)
                producer.send(original.topic, key=_key(), value=encode_event(original))
            producer.send(original.topic, key=_key(), value=encode_event(original))
        elif kind == "conflict":  # the same event_id with another problem text
            # Same key, so same partition: the original comes first by offset and must be kept.
            original = _question(f"original {uuid.uuid4().hex}")
            key = original.correlation_id.encode()
            producer.send(original.topic, key=key, value=encode_event(original))
            ledger.valid[original.event_id] = original
            fresh.append(original)
            body = json.loads(encode_event(original))
            body["payload"]["problem"] = f"changed: {detail!s}"
            producer.send(original.topic, key=key, value=json.dumps(body).encode())
            ledger.conflicts.add((original.event_id, str(detail)))
    producer.flush(60)
    return fresh


def _stored(db: Path, ids: list[uuid.UUID]) -> int:
    if not ids or not db.exists():
        return 0
    wanted = ",".join(f"'{i}'" for i in ids)
    return int(
        query(db, f"SELECT count(DISTINCT event_id) FROM events WHERE event_id IN ({wanted})", timeout_s=30).rows[0][0]
    )


def _count_dead(servers: str) -> int:
    consumer = KafkaConsumer(**consumer_config(KafkaSettings(), servers, group_id=None))
    parts = [
        TopicPartition(dlq_topic(t), p)
        for t in EVENT_TOPICS
        for p in sorted(consumer.partitions_for_topic(dlq_topic(t)) or [])
    ]
    consumer.assign(parts)
    consumer.seek_to_beginning()
    n = 0
    idle_since = time.monotonic()
    while time.monotonic() - idle_since < 2:
        polled = consumer.poll(timeout_ms=200)
        if polled:
            idle_since = time.monotonic()
        n += sum(len(r) for r in polled.values())
    consumer.close()
    return n


def test_the_sink_survives_generated_hostile_records(
    rig: tuple[str, Path, threading.Thread, list[object]],
    capsys: pytest.CaptureFixture[str],
    wait_until: Callable[..., None],
) -> None:
    servers, db, sink, outcome = rig
    ledger = Ledger()
    producer = KafkaProducer(bootstrap_servers=servers, acks="all", max_request_size=64 * 1024 * 1024, linger_ms=5)
    recent: list[Envelope] = []
    rng = random.Random(3)

    # A few huge records first (generation would rarely reach them): 12 MB of bytes, a 12 MB and a
    # 5 MB JSON string, a 4.5 MB record nested 100,000 levels inside its first bytes.
    huge = [
        bytes(rng.getrandbits(8) for _ in range(1024)) * (12 * 1024),
        b'"' + b"x" * (12 * 1024 * 1024) + b'"',
        json.dumps({**json.loads(encode_event(_question("h"))), "pad": "y" * (5 * 1024 * 1024)}).encode(),
        b"[" * 100_000 + b" " * (4 * 1024 * 1024 + 512 * 1024),
    ]
    for value in huge:
        producer.send(rng.choice(EVENT_TOPICS), key=_key(), value=value)
        ledger.note("huge")
        ledger.dead += 1
    producer.flush(60)

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
    )
    @given(plan=batches())
    def one_batch(plan: list[Plan]) -> None:
        ledger.batches += 1
        fresh = _send(producer, ledger, plan, recent)
        ids = [e.event_id for e in fresh]
        wait_until(lambda: _stored(db, ids) == len(ids) or not sink.is_alive(), 60, "the batch's valid events")
        assert sink.is_alive(), f"the sink stopped: {outcome}"
        assert _stored(db, ids) == len(ids)

    one_batch()
    producer.close()

    valid_ids = list(ledger.valid)
    wait_until(lambda: _stored(db, valid_ids) == len(valid_ids), 60, "every valid event")
    wait_until(
        lambda: int(query(db, "SELECT count(*) FROM conflicts").rows[0][0]) >= len(ledger.conflicts),
        30,
        "the conflicts",
    )
    assert sink.is_alive()
    dead = _count_dead(servers)
    assert dead == ledger.dead, f"{dead} dead letters for {ledger.dead} invalid records"
    counts = query(db, "SELECT count(*), count(DISTINCT event_id) FROM events").rows[0]
    assert counts[0] == counts[1] == len(valid_ids)  # every valid event exactly once, nothing else
    conflict_ids = {r[0] for r in query(db, "SELECT event_id FROM conflicts").rows}
    assert conflict_ids == {eid for eid, _ in ledger.conflicts}
    assert int(query(db, "SELECT count(*) FROM conflicts").rows[0][0]) == len(ledger.conflicts)
    for eid, _ in ledger.conflicts:  # the first version stays
        problem = query(db, f"SELECT payload->>'problem' FROM events WHERE event_id = '{eid}'").rows[0][0]
        assert problem.startswith("original ")
    with capsys.disabled():
        print(
            f"\nfuzz: {ledger.hostile} hostile records ({json.dumps(ledger.kinds, sort_keys=True)}) among "
            f"{len(valid_ids)} valid events in {ledger.batches} generated batches; {dead} dead-lettered, "
            f"{len(ledger.conflicts)} conflicts recorded"
        )
    assert not outcome  # still running: no result, no exception yet
