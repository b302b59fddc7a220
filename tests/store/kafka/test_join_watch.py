"""A member whose join of its group does not finish joins again as a new member (store/kafka/stall.py).

Seen in the chaos test (a CI run, then here): after the cluster's PostgreSQL came back, both consensus
members read nothing for ten minutes while 80 solutions waited, one caught inside kafka-python's join,
and a new member's join let the group form at once. The watch's clock is checked by hand here; against
the real broker, a member that never comes back to the group's re-forming holds the runtime's join up,
and the runtime must notice and rejoin.
"""

from __future__ import annotations

import logging
import time
import uuid

import pytest
from kafka import KafkaConsumer, TopicPartition

from prmloop.store.events import QuestionRegistered, make_event
from prmloop.store.events.codec import encode_event
from prmloop.store.events.topics import TopicSpec, dlq_topic
from prmloop.store.kafka.producer import EventProducer, consumer_config, ensure_topics, without_leave_group
from prmloop.store.kafka.runtime import ConsumedEvent, ConsumerRuntime
from prmloop.store.kafka.stall import JoinListener, StallWatch
from prmloop.store.settings import KafkaSettings


def test_a_join_counts_as_hung_only_after_the_watch_s_seconds_and_not_once_partitions_came() -> None:
    watch = StallWatch(after_s=0.3)
    listener = JoinListener(watch)
    assert watch.join_hung() == 0.0, "no join began"
    listener.on_partitions_revoked(set())
    time.sleep(0.1)
    assert watch.join_hung() == 0.0, "0.1 s of joining is not a hung join"
    listener.on_partitions_revoked(set())  # a retried join keeps its start
    time.sleep(0.25)
    hung = watch.join_hung()
    assert 0.3 <= hung < 1.0, hung
    listener.on_partitions_assigned({TopicPartition("t", 0)})
    assert watch.join_hung() == 0.0, "the join ended with the assignment"
    listener.on_partitions_revoked(set())
    watch.joined_anew(grace_s=0.5)  # a new member: its own join starts when it polls
    assert watch.joining_since is None and watch.join_hung() == 0.0
    listener.on_partitions_revoked(set())
    time.sleep(0.35)
    assert watch.join_hung() == 0.0, "a new member is left to join for its grace"
    time.sleep(0.2)
    assert watch.join_hung() >= 0.3
    watch.wait_again(grace_s=0.5)  # a rejoin that could not reach the broker keeps the join's start
    assert watch.join_hung() == 0.0
    time.sleep(0.55)
    assert watch.join_hung() >= 0.3
    assert StallWatch(after_s=None).join_hung() == 0.0, "no watch (assigned partitions) never rejoins"


@pytest.mark.integration
def test_a_runtime_whose_join_is_held_up_rejoins_as_a_new_member_and_reads_everything(
    kafka_bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A member that holds every partition stops polling (its heartbeats go on, so the broker keeps it
    and waits for its join): the runtime's join is held up. It must say so after ``stall_after_s`` and
    join again as a new member; once the holder is gone the new member reads every record."""
    topic = f"test-{uuid.uuid4().hex[:10]}"
    ensure_topics(kafka_bootstrap, [TopicSpec(topic, 2), TopicSpec(dlq_topic(topic), 1)])
    group = f"g-{topic}"
    holder = without_leave_group(
        KafkaConsumer(
            **consumer_config(
                KafkaSettings(), kafka_bootstrap, group_id=group, session_timeout_ms=4_000, max_poll_interval_ms=120_000
            )
        )
    )
    holder.subscribe([topic])
    deadline = time.monotonic() + 60
    while len(holder.assignment()) < 2 and time.monotonic() < deadline:
        holder.poll(timeout_ms=200)
    assert len(holder.assignment()) == 2, "the holder never got the topic's partitions"
    with EventProducer(kafka_bootstrap) as producer:
        for i in range(6):
            event = make_event(QuestionRegistered(question_id=f"q{i}", dataset="d", problem=f"p{i}"), producer="t")
            producer.send_raw(topic, str(i).encode(), encode_event(event), [])
    seen: list[str] = []

    def handler(batch: list[ConsumedEvent]) -> None:
        seen.extend(str(c.event.correlation_id) for c in batch)

    runtime = ConsumerRuntime(
        topics=[topic],
        group_id=group,
        bootstrap_servers=kafka_bootstrap,
        handler=handler,
        stall_after_s=3,
        session_timeout_ms=4_000,
        follow_broker=False,
    )
    first = runtime._consumer
    began = time.monotonic()

    def until() -> bool:
        if runtime._consumer is not first and holder is not None and not holder._closed:
            holder.close(autocommit=False)  # silently: the broker expires it after its session
        return len(set(seen)) >= 6 or time.monotonic() - began > 90

    with caplog.at_level(logging.WARNING, logger="prmloop.store.kafka.runtime"):
        runtime.run(until=until, install_signal_handlers=False)
    hung = [r.getMessage() for r in caplog.records if "join of the group has not finished" in r.getMessage()]
    assert hung, f"the held-up join was never noticed: {[r.getMessage() for r in caplog.records]}"
    assert runtime._consumer is not first, "the runtime never joined again as a new member"
    assert len(set(seen)) == 6, seen
