"""How a consumer runtime changes the consumer it reads with, and why (part of :class:`ConsumerRuntime`).

Three reasons: its member of the group stalled or its join hung (:mod:`prmloop.store.kafka.stall`: it
joins again as a new member); the broker it read from was replaced in ``broker.json``
(:mod:`prmloop.store.kafka.follow`: it moves to the new one); an in-memory broker restarted with a new
cluster id (it reads again from the start). A fourth drops only what was fetched ahead: an offset
commit refused because the member is no longer in its group. kafka-python then joins the group again
before it fetches, and every partition it is given starts from its committed offset, so those records
come again to whoever owns them next; working on them here would only repeat that owner's work (after
PostgreSQL's restart in the chaos test, batch after batch for 30 s per member). Not so for a reader
that assigns itself its partitions (``assign_all``): it joins nothing, so its position stands.
In every case nothing is lost: what was not committed is read again, and every effect is idempotent.
"""

from __future__ import annotations

import logging

from kafka import KafkaConsumer
from kafka.consumer.fetcher import ConsumerRecord
from kafka.errors import KafkaError

from prmloop.store.kafka.deadletter import DeadLetters
from prmloop.store.kafka.follow import BrokerLink, BrokerWatch
from prmloop.store.kafka.records import Decoded
from prmloop.store.kafka.stall import StallWatch

log = logging.getLogger("prmloop.store.kafka.runtime")

__all__ = ["Reconnecting"]


class Reconnecting:
    """The consumer-changing half of :class:`prmloop.store.kafka.runtime.ConsumerRuntime`."""

    name: str
    _consumer: KafkaConsumer
    _bootstrap: str
    _session_timeout_ms: int
    _stall: StallWatch
    _prefetched: list[ConsumerRecord]
    _ahead: dict[int, tuple[ConsumerRecord, Decoded]]
    #: Counts the changes of consumer (offsets of records read before one are not committed).
    _generation: int
    _cluster_id: str | None
    _watch: BrokerWatch | None
    _link: BrokerLink | None
    _dead_letters: DeadLetters

    def _connect(self, bootstrap_servers: str, *, wait_s: float = 0.0) -> KafkaConsumer:
        raise NotImplementedError

    def _drop_fetched_ahead(self) -> None:
        """Forget what was fetched ahead of the batch in hand: it is read again from the committed offset."""
        self._prefetched.clear()
        self._ahead.clear()

    def _rejoin(self, why: str) -> None:
        """Join the group again as a new member (see :mod:`prmloop.store.kafka.stall`); the old one expires after
        the session timeout. The new consumer reads from the committed offsets; effects are idempotent. A
        broker that cannot be reached now leaves the old consumer in place: the watch asks again later."""
        log.warning("%s: %s: rejoining the group as a new member", self.name, why)
        try:
            consumer = self._connect(self._bootstrap)
        except (KafkaError, RuntimeError) as exc:
            log.warning("%s: rejoining failed (%r); trying again later", self.name, exc)
            self._stall.wait_again(3 * self._session_timeout_ms / 1000)
            return
        self._replace_consumer(consumer)

    def _replace_consumer(self, consumer: KafkaConsumer) -> None:
        """Read with ``consumer`` from now on; the old one is closed without a LeaveGroup (the broker
        expires it). What it fetched is dropped, and the offsets of a batch in hand from it are not
        committed."""
        old, self._consumer = self._consumer, consumer
        try:
            old.close(autocommit=False, timeout_ms=2_000)
        except KafkaError as exc:
            log.debug("closing the old consumer failed: %r", exc)
        self._drop_fetched_ahead()
        self._generation += 1
        self._stall.joined_anew(3 * self._session_timeout_ms / 1000)

    def _broker_moved(self) -> bool:
        """True when this runtime moved to the broker that replaced its own in ``broker.json`` (see
        :mod:`prmloop.store.kafka.follow`); a broker that is gone or answers again is logged.

        The new consumer starts from the new broker's committed offsets, or from the beginning (a new
        embedded broker has none). What was fetched from the old broker is dropped, and a batch the
        handler is working on is finished but its offsets (the old broker's) are not committed.
        """
        change = self._watch.check() if self._watch is not None else None
        if change is None or self._watch is None or self._link is None:
            return False
        log.warning("%s: %s", self.name, change.message() + ("; reconnecting" if change.kind == "moved" else ""))
        if change.kind != "moved":
            self._link.write(change.broker, reachable=change.kind == "back")
            return False
        try:
            consumer = self._connect(change.broker.bootstrap_servers)
        except (KafkaError, RuntimeError) as exc:
            log.warning("%s: connecting to %s failed (%r); trying again", self.name, change.broker.describe(), exc)
            return False
        self._replace_consumer(consumer)
        self._bootstrap = change.broker.bootstrap_servers
        self._dead_letters.reconnect(self._bootstrap)
        self._cluster_id = None
        self._watch.follow(change.broker)
        self._link.write(change.broker, reachable=True)
        log.warning("%s: now reading from %s", self.name, change.broker.describe())
        return True

    def _broker_replaced(self) -> bool:
        """True (once) when the cluster id changed: an in-memory broker restarted with empty topics.

        Its logs start again at offset 0 and it has no committed offsets, so every assigned partition
        is read again from the beginning; effects are idempotent, and what the restart lost is
        re-published from the outbox by ``prmloop reconcile``. A real Kafka cluster keeps its id.
        """
        current = self._consumer._client.cluster.cluster_id  # kafka-python keeps it from metadata
        previous, self._cluster_id = self._cluster_id, current or self._cluster_id
        if previous is None or current is None or current == previous:
            return False
        log.warning(
            "%s: the broker was replaced (cluster %s -> %s); rereading from the start", self.name, previous, current
        )
        self._drop_fetched_ahead()
        self._consumer.seek_to_beginning(*self._consumer.assignment())
        return True
