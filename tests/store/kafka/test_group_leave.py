"""Leaving a consumer group by silence (store.kafka.producer.without_leave_group), against the real Tansu broker.

The scene of the chaos test's hang after PostgreSQL's restart, made deterministic: a group's leader
holds every partition; a second member joins, so the group re-forms and waits for its leader's new
assignment; the leader closes before it joins again. With kafka-python's LeaveGroup, Tansu can keep the
departed member as the group's leader, and the second member never gets a partition. Closed silently,
the leader expires after the session timeout and the second member takes every partition.

The test checks only the silent close. An earlier version also checked that the stock LeaveGroup still
hangs. Whether it does depends on where the LeaveGroup lands in the re-forming (CI once saw the stock
member take all four partitions), so that check asserted a race in the broker, not anything prmloop does.
"""

from __future__ import annotations

import time
import uuid

from kafka import KafkaConsumer

from prmloop.store.events.topics import TopicSpec
from prmloop.store.kafka.producer import consumer_config, ensure_topics, without_leave_group
from prmloop.store.settings import KafkaSettings

PARTITIONS = 4
SESSION_MS = 6_000


def _member(servers: str, group: str, topic: str) -> KafkaConsumer:
    config = consumer_config(KafkaSettings(), servers, group_id=group, session_timeout_ms=SESSION_MS)
    consumer = KafkaConsumer(**config)
    consumer.subscribe([topic])
    return consumer


def _leader_leaves_while_the_group_reforms(servers: str, topic: str, *, silently: bool) -> KafkaConsumer:
    """The group's second member, after its leader closed in the middle of the group's re-forming."""
    group = f"g-{uuid.uuid4().hex[:8]}"
    leader = _member(servers, group, topic)
    if silently:
        without_leave_group(leader)
    deadline = time.monotonic() + 60
    while len(leader.assignment()) < PARTITIONS and time.monotonic() < deadline:
        leader.poll(timeout_ms=200)
    assert len(leader.assignment()) == PARTITIONS, "the first member never got the topic's partitions"
    second = _member(servers, group, topic)
    deadline = time.monotonic() + 20
    while "rebalanc" not in str(second._coordinator.state).lower() and time.monotonic() < deadline:
        second.poll(timeout_ms=200)  # it joins, and waits for the leader's assignment
    assert "rebalanc" in str(second._coordinator.state).lower(), "the second member never joined the group"
    leader.close(autocommit=False)
    return second


def test_a_leader_that_closes_silently_while_its_group_reforms_leaves_the_group_to_the_others(
    kafka_bootstrap: str,
) -> None:
    topic = f"leave-{uuid.uuid4().hex[:8]}"
    ensure_topics(kafka_bootstrap, [TopicSpec(topic, PARTITIONS)])
    silent = _leader_leaves_while_the_group_reforms(kafka_bootstrap, topic, silently=True)
    started = time.monotonic()
    try:
        # The member left polls for four session timeouts: the silent leader's expires after one.
        while time.monotonic() - started < 4 * SESSION_MS / 1000 and len(silent.assignment()) < PARTITIONS:
            silent.poll(timeout_ms=100)
        assert len(silent.assignment()) == PARTITIONS, (
            "the silent leader's group never gave its partitions to the member left"
        )
    finally:
        without_leave_group(silent).close(autocommit=False)
