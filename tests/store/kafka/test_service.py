"""One service runner for every consuming service: its stop conditions, its clean-up and its figures."""

from __future__ import annotations

import time
import uuid

from prmloop.store.events import QuestionRegistered, make_event
from prmloop.store.events.codec import encode_event
from prmloop.store.events.topics import TopicSpec, dlq_topic
from prmloop.store.kafka.producer import EventProducer, ensure_topics
from prmloop.store.kafka.runtime import ConsumedEvent
from prmloop.store.kafka.service import run_service


def _topic_with(servers: str, count: int) -> str:
    topic = f"test-{uuid.uuid4().hex[:10]}"
    ensure_topics(servers, [TopicSpec(topic, 1), TopicSpec(dlq_topic(topic), 1)])
    with EventProducer(servers) as producer:
        for i in range(count):
            event = make_event(QuestionRegistered(question_id=f"q{i}", dataset="d", problem=f"p{i}"), producer="t")
            producer.send_raw(topic, b"k", encode_event(event), [])
    return topic


def test_a_service_stops_at_its_own_limit_closes_in_order_and_reports_one_stats(kafka_bootstrap: str) -> None:
    topic = _topic_with(kafka_bootstrap, 5)
    seen: list[str] = []
    closed: list[str] = []

    def handler(batch: list[ConsumedEvent]) -> None:
        seen.extend(e.event.payload.question_id for e in batch)  # type: ignore[union-attr]

    started = time.monotonic() - 2.0  # the service's model took 2 s to load before it ran
    stats = run_service(
        "counting",
        handler,
        topics=[topic],
        group_id=f"g-{uuid.uuid4().hex[:8]}",
        bootstrap_servers=kafka_bootstrap,
        counters=lambda: {"seen": len(seen)},
        max_batch=2,
        done=lambda: len(seen) >= 3,  # the service's own limit, like --max-solutions
        until=lambda: time.monotonic() - started > 60,
        install_signal_handlers=False,
        close=[lambda: closed.append("handler"), lambda: closed.append("producer")],
        started=started,
    )
    # batches of at most 2, the limit checked between them: 3 or 4 of the 5 read, in order, not 5
    assert seen in (["q0", "q1", "q2"], ["q0", "q1", "q2", "q3"])
    assert closed == ["handler", "producer"]
    assert (stats.name, stats.counters, stats.dead_lettered) == ("counting", {"seen": len(seen)}, 0)
    assert stats.events == len(seen)
    assert 2 <= stats.batches <= len(seen)
    assert stats.wall_s >= 2.0
    assert list(stats.as_dict()) == ["seen", "batches", "events", "dead_lettered", "retries", "wall_s"]


def test_a_service_whose_runtime_cannot_start_still_closes_what_it_opened(kafka_bootstrap: str) -> None:
    closed: list[str] = []
    try:
        run_service(
            "broken",
            lambda batch: None,
            topics=[f"missing-{uuid.uuid4().hex[:8]}"],
            group_id="g",
            bootstrap_servers=kafka_bootstrap,
            counters=dict,
            install_signal_handlers=False,
            close=[lambda: closed.append("producer")],
            no_such_option=1,
        )
    except TypeError as exc:
        assert "no_such_option" in str(exc)
    else:
        raise AssertionError("an unknown runtime option must fail")
    assert closed == ["producer"]
