"""Noticing a consumer that stopped fetching while its partitions have records waiting.

Seen in the chaos test (tests/flows/test_cluster_chaos.py) after the cluster's PostgreSQL, the brokers'
storage, was killed and restarted: both members of the consensus group stayed in it, heartbeating and
polling, and fetched nothing for minutes while 179 records waited past the group's committed offsets;
a rebalance (one member stopped) freed them at once. In the next run both scorers' commits failed
with ``UnknownMemberIdError`` (the group had expelled them during the outage) and they sat with no
partitions while 15 records waited. The runtime checks for either state between polls and then rejoins
the group (:meth:`prmloop.store.consumer.ConsumerRuntime.run`).
"""

from __future__ import annotations

import logging
import time

from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaError

__all__ = ["StallWatch"]

log = logging.getLogger(__name__)


class StallWatch:
    """``stalled(consumer)``: once nothing came for ``after_s``, the records waiting past the group's
    committed offsets on the consumer's partitions; with no partitions, those on every partition of its
    topics, but only when the group's committed offsets stood still since the previous check (a member
    left without partitions beside busy ones is not stalled); 0 otherwise. It asks the broker at most
    once per ``after_s``; a failed check counts as no stall (a broker that is down is followed elsewhere)."""

    def __init__(self, after_s: float | None) -> None:
        self.after_s = after_s
        self.last_record_at = self.checked_at = time.monotonic()
        self._group_committed: dict[TopicPartition, int] | None = None

    def saw_records(self) -> None:
        self.last_record_at = time.monotonic()
        self._group_committed = None

    def idle_s(self) -> float:
        return time.monotonic() - self.last_record_at

    def stalled(self, consumer: KafkaConsumer) -> int:
        now = time.monotonic()
        if self.after_s is None or min(now - self.last_record_at, now - self.checked_at) < self.after_s:
            return 0
        self.checked_at = now
        try:
            assigned = sorted(consumer.assignment())
            if assigned:
                ends = consumer.end_offsets(assigned)
                return sum(max(0, int(ends[tp]) - int(consumer.committed(tp) or 0)) for tp in assigned)
            parts = [
                TopicPartition(topic, p)
                for topic in sorted(consumer.subscription() or ())
                for p in sorted(consumer.partitions_for_topic(topic) or ())
            ]
            committed = {tp: int(consumer.committed(tp) or 0) for tp in parts}
            before, self._group_committed = self._group_committed, committed
            if not parts or before != committed:
                return 0
            ends = consumer.end_offsets(parts)
            return sum(max(0, int(ends[tp]) - committed[tp]) for tp in parts)
        except (KafkaError, KeyError) as exc:
            log.debug("the stall check failed: %r", exc)
            return 0
