"""Noticing a consumer that stopped fetching while its partitions have records waiting.

Seen in the chaos test (tests/flows/test_cluster_chaos.py) after the cluster's PostgreSQL, the brokers'
storage, was killed and restarted: both members of the consensus group stayed in it, heartbeating and
polling, and fetched nothing for minutes while 179 records waited past the group's committed offsets;
a rebalance (one member stopped) freed them at once. The runtime checks for that state between polls
and then rejoins the group (:meth:`prmloop.store.consumer.ConsumerRuntime.run`).
"""

from __future__ import annotations

import logging
import time

from kafka import KafkaConsumer
from kafka.errors import KafkaError

__all__ = ["StallWatch"]

log = logging.getLogger(__name__)


class StallWatch:
    """``stalled(consumer)``: the records waiting past the committed offsets of the consumer's
    partitions, once nothing came for ``after_s``; 0 otherwise. It asks the broker at most once per
    ``after_s``; a failed check counts as no stall (a broker that is down is followed elsewhere)."""

    def __init__(self, after_s: float | None) -> None:
        self.after_s = after_s
        self.last_record_at = self.checked_at = time.monotonic()

    def saw_records(self) -> None:
        self.last_record_at = time.monotonic()

    def idle_s(self) -> float:
        return time.monotonic() - self.last_record_at

    def stalled(self, consumer: KafkaConsumer) -> int:
        now = time.monotonic()
        if self.after_s is None or min(now - self.last_record_at, now - self.checked_at) < self.after_s:
            return 0
        self.checked_at = now
        assigned = sorted(consumer.assignment())
        if not assigned:
            return 0
        try:
            ends = consumer.end_offsets(assigned)
            return sum(max(0, int(ends[tp]) - int(consumer.committed(tp) or 0)) for tp in assigned)
        except (KafkaError, KeyError) as exc:
            log.debug("the stall check failed: %r", exc)
            return 0
