"""Noticing a consumer that stopped fetching while its partitions have records waiting.

Seen in the chaos test (tests/flows/ops/test_cluster_chaos.py) after the cluster's PostgreSQL, the brokers'
storage, was killed and restarted: both members of the consensus group stayed in it, heartbeating and
polling, and fetched nothing for minutes while 179 records waited past the group's committed offsets;
a rebalance (one member stopped) freed them at once. In the next run both scorers' commits failed
with ``UnknownMemberIdError`` (the group had expelled them during the outage) and they sat with no
partitions while 15 records waited. The runtime checks for either state between polls and then rejoins
the group (:meth:`prmloop.store.kafka.runtime.ConsumerRuntime.run`).

A third state, in the chaos test (a CI run failed on it; reproduced here): after the restart both
consensus members read nothing for ten minutes while 80 solutions waited for their decision, the group
listed a third member, gone, and a stack dump caught a member inside kafka-python's join; a new consumer
of the group joined, and the group formed at once with it and both members.
A member whose join has not finished after ``after_s`` joins again as a new member
(:meth:`StallWatch.join_hung`, told of joins by :class:`JoinListener`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from kafka import ConsumerRebalanceListener, KafkaConsumer, TopicPartition
from kafka.consumer.fetcher import ConsumerRecord
from kafka.errors import KafkaError

__all__ = ["JoinListener", "StallWatch", "record_timestamp"]

log = logging.getLogger(__name__)


class StallWatch:
    """``stalled(consumer)``: once nothing came for ``after_s``, the records waiting past the group's
    committed offsets on the consumer's partitions; where none wait there, those on the other partitions
    of its topics (another member's, or nobody's), but only when the group's committed offsets there
    stood still since the previous check (a member idle beside busy ones is not stalled); 0 otherwise.
    It asks the broker at most once per ``after_s``; a failed check counts as no stall (a broker that is
    down is followed elsewhere)."""

    def __init__(self, after_s: float | None) -> None:
        self.after_s = after_s
        self.last_record_at = self.checked_at = self.rewind_checked_at = time.monotonic()
        self._group_committed: dict[TopicPartition, int] | None = None
        #: Per partition, the newest timestamp (ms) of a record this reader was handed.
        self.last_timestamp: dict[TopicPartition, int] = {}
        self._behind: dict[TopicPartition, tuple[int, int]] = {}
        #: Until when (monotonic) a new member is left to join: see :meth:`joined_anew`.
        self.quiet_until = 0.0
        #: Since when (monotonic) the consumer has been joining its group; None once it has partitions.
        self.joining_since: float | None = None

    def join_began(self) -> None:
        if self.joining_since is None:
            self.joining_since = time.monotonic()

    def join_ended(self) -> None:
        self.joining_since = None

    def join_hung(self) -> float:
        """Seconds this member has been joining its group, once that is ``after_s`` or more (0 before,
        and while a new member is left to join). A join takes a session timeout at most here (the broker
        waits for the members it knows); one still going after ``after_s`` waits for a member that is
        gone, and a new member's join lets the group form (see the module's docstring)."""
        now = time.monotonic()
        if self.after_s is None or self.joining_since is None or now < self.quiet_until:
            return 0.0
        joining = now - self.joining_since
        return joining if joining >= self.after_s else 0.0

    def joined_anew(self, grace_s: float) -> None:
        """A new consumer replaced the old one, which left the group silently: its partitions move once
        the broker expires it (a session timeout, then a join: about 18 s with 10 s sessions on Tansu).
        No stall counts for ``grace_s``, or the watch would replace the new member before it got them."""
        self.wait_again(grace_s)
        self.joining_since = None

    def wait_again(self, grace_s: float) -> None:
        """Neither a stall nor a hung join counts for ``grace_s`` (a rejoin that could not reach the broker
        is tried again after it); the stall's clock starts again."""
        self.saw_records()
        self.quiet_until = time.monotonic() + grace_s

    def saw_records(self, records: Iterable[ConsumerRecord] = ()) -> None:
        self.last_record_at = time.monotonic()
        self._group_committed = None
        for record in records:
            tp = TopicPartition(record.topic, record.partition)
            self.last_timestamp[tp] = max(self.last_timestamp.get(tp, record.timestamp), record.timestamp)

    def rewound(self, consumer: KafkaConsumer) -> dict[TopicPartition, tuple[int, int, int]]:
        """Partitions whose log now ends before this reader's position: the broker lost its newest
        records and appends new ones at their offsets, which the reader would skip. Seen in the chaos test
        after the cluster's PostgreSQL was killed and restarted: both brokers came back with watermarks
        and committed offsets from a few seconds earlier, and the selectors waited at offsets past the end
        while 48 new solutions were written below them. Returns, per such partition, (position, end,
        where to read again): the first record stamped at or after the newest one this reader was
        handed (every record written since is new to it; one seen again is harmless, effects are
        idempotent), else the end. A partition counts once two checks in a row (``after_s`` apart) saw
        the same position past the same end, and the record at the reported end is not one this reader
        was handed already: the embedded Tansu broker reports a partition's end as its last record
        batch's first offset plus one, so a reader of a batch of several records stands past that end
        while nothing was lost (reading again there handed the loop's selector every such batch twice a
        few minutes later); a failed check finds nothing."""
        now = time.monotonic()
        if self.after_s is None or now - self.rewind_checked_at < self.after_s:
            return {}
        self.rewind_checked_at = now
        try:
            assigned = sorted(consumer.assignment())
            if not assigned:
                return {}
            ends = consumer.end_offsets(assigned)
            now_behind = {tp: (int(consumer.position(tp)), int(ends[tp])) for tp in assigned}
            now_behind = {tp: pe for tp, pe in now_behind.items() if pe[0] > pe[1]}
            # Two brokers on one storage can each report an end a record or two behind the other's for a
            # while: only a position past an end that stood still since the last check is acted on.
            before, self._behind = self._behind, now_behind
            behind = {tp: pe for tp, pe in now_behind.items() if before.get(tp) == pe}
            behind = {tp: pe for tp, pe in behind.items() if not self._still_there(consumer, tp, pe[1])}
            if not behind:
                return {}
            self._behind = {tp: pe for tp, pe in now_behind.items() if tp not in behind}
            stamps = {tp: self.last_timestamp[tp] for tp in behind if tp in self.last_timestamp}
            found = consumer.offsets_for_times(stamps) if stamps else {}
            moves = {}
            for tp, (position, end) in behind.items():
                at = found.get(tp)
                moves[tp] = (position, end, min(end, int(at.offset)) if at is not None else end)
            return moves
        except (KafkaError, KeyError, ValueError) as exc:
            log.debug("the rewind check failed: %r", exc)
            return {}

    def _still_there(self, consumer: KafkaConsumer, tp: TopicPartition, end: int) -> bool:
        """Whether the record at offset ``end`` is one this reader was handed (stamped no later than the
        newest it saw): the log did not go back, the broker undercounted its end."""
        newest = self.last_timestamp.get(tp)
        if newest is None:
            return False
        stamp = record_timestamp(consumer, tp, end)
        return stamp is not None and stamp <= newest

    def idle_s(self) -> float:
        return time.monotonic() - self.last_record_at

    def stalled(self, consumer: KafkaConsumer) -> int:
        now = time.monotonic()
        if self.after_s is None or min(now - self.last_record_at, now - self.checked_at) < self.after_s:
            return 0
        if now < self.quiet_until:
            return 0
        self.checked_at = now
        try:
            assigned = sorted(consumer.assignment())
            if assigned:
                ends = consumer.end_offsets(assigned)
                waiting = sum(max(0, int(ends[tp]) - int(consumer.committed(tp) or 0)) for tp in assigned)
                if waiting:
                    return waiting
            # The partitions owned by others, or by nobody: after the brokers' storage went back, two
            # members each held the same half of a topic and the other half waited, unowned.
            parts = [
                TopicPartition(topic, p)
                for topic in sorted(consumer.subscription() or ())
                for p in sorted(consumer.partitions_for_topic(topic) or ())
                if TopicPartition(topic, p) not in assigned
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

    def read_again(self, consumer: KafkaConsumer, name: str) -> None:
        """Seek the partitions :meth:`rewound` finds, saying so."""
        for tp, (position, end, offset) in self.rewound(consumer).items():
            log.warning(
                "%s: %s[%d] ends at %d, before this reader's position %d: the broker lost its newest records "
                "(its storage went back); reading again from %d",
                name, tp.topic, tp.partition, end, position, offset,
            )  # fmt: skip
            consumer.seek(tp, offset)


#: The settings a probe consumer copies from the consumer it checks for (how to reach and log in to the broker).
_CONNECTION_KEYS = ("bootstrap_servers", "client_id", "security_protocol", "api_version", "request_timeout_ms")


def record_timestamp(consumer: KafkaConsumer, tp: TopicPartition, offset: int, timeout_s: float = 5.0) -> int | None:
    """The timestamp (ms) of the record at ``offset`` of ``tp``, read by a consumer of its own (no group)
    with ``consumer``'s connection settings; None where there is none there (or it cannot be read)."""
    settings = {k: v for k, v in consumer.config.items() if k in _CONNECTION_KEYS or k.startswith(("sasl_", "ssl_"))}
    probe = KafkaConsumer(**settings, enable_auto_commit=False)
    try:
        probe.assign([tp])
        probe.seek(tp, offset)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for records in probe.poll(timeout_ms=200, max_records=1).values():
                for record in records:
                    return int(record.timestamp) if record.offset == offset else None
        return None
    finally:
        probe.close()


class JoinListener(ConsumerRebalanceListener):
    """Tells a :class:`StallWatch` when its consumer starts joining the group (kafka-python revokes the
    partitions first, on every join, the first included) and when the join ends (partitions assigned)."""

    def __init__(self, watch: StallWatch) -> None:
        self.watch = watch

    def on_partitions_revoked(self, revoked: object) -> None:
        self.watch.join_began()

    def on_partitions_assigned(self, assigned: object) -> None:
        self.watch.join_ended()
