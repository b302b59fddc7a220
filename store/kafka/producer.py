"""Kafka plumbing shared by every service: topic admin and an acknowledged, retrying event producer."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import NewTopic
from kafka.errors import (
    InvalidTopicError,
    KafkaError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    TopicAlreadyExistsError,
)
from kafka.producer.future import FutureProduceResult, FutureRecordMetadata
from kafka.structs import TopicPartition

from prmloop.store.events import Envelope
from prmloop.store.events.codec import EventTooLarge, PublishError, UndeliverableEvent, encode_event
from prmloop.store.events.topics import TopicSpec, all_topic_specs
from prmloop.store.kafka.connect import once_answering
from prmloop.store.kafka.follow import BrokerWatch
from prmloop.store.kafka.outbox import Outbox
from prmloop.store.settings import KafkaSettings

log = logging.getLogger(__name__)


__all__ = [
    "EventProducer",
    "EventRejected",
    "PublishError",
    "assign_all_partitions",
    "consumer_config",
    "ensure_topics",
    "event_headers",
    "without_leave_group",
]

#: Broker answers that no retry can change: the record itself is refused.
PERMANENT_SEND_ERRORS: tuple[type[KafkaError], ...] = (
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    InvalidTopicError,
)


class EventRejected(UndeliverableEvent):
    """The broker refused the event itself (too large for it, invalid topic): retrying cannot help."""


def ensure_topics(
    bootstrap_servers: str, specs: Sequence[TopicSpec] | None = None, kafka: KafkaSettings | None = None
) -> list[str]:
    """Create the topics that do not exist yet; idempotent. Returns the names created now."""
    kafka = kafka or KafkaSettings()
    specs = list(specs) if specs is not None else all_topic_specs()
    admin = KafkaAdminClient(**kafka.client_kwargs(bootstrap_servers))
    created: list[str] = []
    try:
        for spec in specs:
            try:
                admin.create_topics([NewTopic(spec.name, spec.partitions, spec.replication_factor)])
                created.append(spec.name)
            except TopicAlreadyExistsError:
                pass
    finally:
        admin.close()
    return created


def consumer_config(
    kafka: KafkaSettings,
    bootstrap_servers: str,
    *,
    group_id: str | None,
    max_poll_records: int = 1000,
    max_poll_interval_ms: int = 10_000,
    session_timeout_ms: int = 10_000,
) -> dict[str, Any]:
    """kafka-python consumer settings used by every prmloop consumer (and the raw benchmark baseline)."""
    return {
        **kafka.client_kwargs(bootstrap_servers),
        "group_id": group_id,
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        # Tansu delays a group join by about half the rebalance timeout: keep it short and keep polling.
        "max_poll_interval_ms": max_poll_interval_ms,
        "session_timeout_ms": session_timeout_ms,
        "heartbeat_interval_ms": max(500, session_timeout_ms // 5),
        "max_poll_records": max_poll_records,
        # An idle consumer's fetch waits this long at the broker, which answers at once when a record
        # comes (Tansu does: 5-19 ms from send to poll at 100 and at 500). At 100, eight idle consumers
        # kept the broker and its gate at 0.10-0.15 of a core, at 500 at 0.04: a core the engine needs
        # on a laptop (docs/loop.md, "Idle consumers' fetches").
        "fetch_max_wait_ms": 500,
        "fetch_max_bytes": 32 * 1024 * 1024,
        "max_partition_fetch_bytes": 8 * 1024 * 1024,
        # Tansu may answer a fetch with more than fetch_max_bytes; kafka-python's 1 MB frame cap drops it.
        "receive_message_max_bytes": 128 * 1024 * 1024,
        "reconnect_backoff_max_ms": 2_000,
        "request_timeout_ms": max(30_000, session_timeout_ms + 5_000),
    }


def without_leave_group(consumer: KafkaConsumer) -> KafkaConsumer:
    """Make ``consumer`` leave its group by silence: it forgets its member id instead of sending
    LeaveGroup, and the broker expires the member after ``session_timeout_ms``.

    Tansu 0.6 keeps a group's leader when that leader sends LeaveGroup while the group re-forms (a member
    joined or left since the last assignment): every later member then waits for an assignment from a
    leader that is gone, for ever. kafka-python sends LeaveGroup on ``close()``, on ``unsubscribe()``
    and from its heartbeat thread when ``poll()`` was not called for ``max_poll_interval_ms``. Seen in
    the chaos test after PostgreSQL's restart: both scorers sat joining the group, with records waiting,
    and new consumers of theirs could not join either. The cost: a stopped member's partitions move
    after the session timeout (10 s) instead of at once. tests/store/kafka/test_group_leave.py shows both.
    """
    coordinator = getattr(consumer, "_coordinator", None)
    if coordinator is not None:
        coordinator.maybe_leave_group = lambda timeout_ms=None: coordinator.reset_generation()
    return consumer


def event_headers(event: Envelope) -> list[tuple[str, bytes]]:
    """``event_type`` and ``schema_version`` travel in headers too, so routers need not parse JSON."""
    return [
        ("event_type", event.event_type.encode()),
        ("schema_version", str(event.schema_version).encode()),
        ("event_id", str(event.event_id).encode()),
        ("content-type", b"application/json"),
    ]


def _all_but(batch: list[Envelope], rejected: list[tuple[Envelope, KafkaError]]) -> list[Envelope]:
    """What to send again after the broker was replaced: the whole batch, since what the old broker
    acknowledged went with it (a repeat is harmless: every effect is idempotent by ``event_id``)."""
    refused = {e.event_id for e, _ in rejected}
    return [e for e in batch if e.event_id not in refused]


class EventProducer:
    """Publishes events and returns only when the broker acknowledged all of them (``acks='all'``).

    Failures are retried with exponential backoff until ``timeout_s``; the broker being restarted
    is such a failure. A producer whose broker came from ``broker.json`` follows a replaced embedded
    broker (:mod:`prmloop.store.kafka.follow`): a batch in flight then goes to the new one whole. Every
    event is first written to the outbox (when one is given), so events acknowledged by an in-memory
    broker that then restarts can be re-published by ``reconcile``.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        kafka: KafkaSettings | None = None,
        outbox: Outbox | None = None,
        linger_ms: int = 5,
        timeout_s: float = 60.0,
        max_request_size: int = 8 * 1024 * 1024,
        follow_broker: bool = True,
    ) -> None:
        self.kafka = kafka or KafkaSettings()
        self.outbox = outbox
        self.timeout_s = timeout_s
        self._options: dict[str, Any] = {
            "acks": "all",
            "linger_ms": linger_ms,
            "retries": 5,
            "retry_backoff_ms": 200,
            "request_timeout_ms": 10_000,
            "max_block_ms": 10_000,
            "reconnect_backoff_max_ms": 2_000,
            # One in-flight request keeps a key's events in order when a send is retried.
            "max_in_flight_requests_per_connection": 1,
            "batch_size": 256 * 1024,
            "max_request_size": max_request_size,
        }
        #: Set when the broker came from broker.json: a replaced embedded broker is followed.
        self._watch = BrokerWatch.for_servers(bootstrap_servers, self.kafka) if follow_broker else None
        self.bootstrap_servers = self._watch.resolve("producer") if self._watch is not None else bootstrap_servers
        self._producer = once_answering(
            lambda: KafkaProducer(**self.kafka.client_kwargs(self.bootstrap_servers), **self._options),
            self.bootstrap_servers,
            "producer",
            wait_s=self.kafka.connect_wait_s,
        )

    def _follow(self) -> bool:
        """Reconnect to the broker that replaced ours (see :mod:`prmloop.store.kafka.follow`); True if it did."""
        change = self._watch.check() if self._watch is not None else None
        if change is None or self._watch is None:
            return False
        log.warning("producer: %s", change.message())
        if change.kind != "moved":
            return False
        try:
            producer = KafkaProducer(**self.kafka.client_kwargs(change.broker.bootstrap_servers), **self._options)
        except KafkaError as exc:
            log.warning("producer: connecting to %s failed (%r); trying again", change.broker.describe(), exc)
            return False
        old, self._producer = self._producer, producer
        self.bootstrap_servers = change.broker.bootstrap_servers
        self._watch.follow(change.broker)
        try:
            old.close(timeout=0)
        except KafkaError as exc:  # batches for the dead broker never complete: they go to the new one
            log.debug("producer: closing the client of %s: %r", change.previous.describe(), exc)
        return True

    def publish(self, events: Iterable[Envelope]) -> int:
        """Send ``events`` (each to its type's topic, keyed by ``correlation_id``); wait for acks.

        Every event is encoded (and checked against the event limits) before anything is written to
        the outbox or sent, so an event that can never be delivered fails the call at once with an
        :class:`UndeliverableEvent` naming it and the limit, and the batch leaves no trace. Only
        broker unavailability is retried (until ``timeout_s``). A refusal by the broker itself
        (:class:`EventRejected`, e.g. above a real Kafka's ``message.max.bytes``) is raised without
        retrying, after the outbox has been told, so ``reconcile`` never tries those events again.
        """
        batch = list(events)
        if not batch:
            return 0
        encoded = {e.event_id: encode_event(e) for e in batch}  # raises UndeliverableEvent: fail fast
        if self.outbox is not None:
            self.outbox.append_encoded([encoded[e.event_id] for e in batch])
        deadline = time.monotonic() + self.timeout_s
        pending = batch
        rejected: list[tuple[Envelope, KafkaError]] = []
        delay = 0.2
        self._follow()
        while True:
            futures = []
            for e in pending:
                try:
                    fut = self._producer.send(
                        e.topic, key=e.correlation_id.encode(), value=encoded[e.event_id], headers=event_headers(e)
                    )
                except PERMANENT_SEND_ERRORS as exc:  # checked by the client before sending
                    rejected.append((e, exc))
                    continue
                futures.append((e, fut))
            if not self._flushed(deadline):
                pending = _all_but(batch, rejected)
                continue
            failed: list[Envelope] = []
            last_error: BaseException | None = None
            for e, fut in futures:
                try:
                    fut.get(timeout=max(0.1, deadline - time.monotonic()))
                except PERMANENT_SEND_ERRORS as exc:
                    rejected.append((e, exc))
                except KafkaError as exc:
                    failed.append(e)
                    last_error = exc
            if not failed:
                break
            if time.monotonic() + delay > deadline:
                raise PublishError(
                    f"{len(failed)} of {len(batch)} events were not acknowledged within {self.timeout_s}s: "
                    f"{last_error!r}. Is the broker up? They are kept in the outbox; `prmloop reconcile` "
                    "re-publishes them.",
                    tuple(e.event_id for e in failed),
                )
            log.warning("retrying %d unacknowledged events after %r", len(failed), last_error)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)
            pending = _all_but(batch, rejected) if self._follow() else failed
        if rejected:
            self._reject(rejected)
        return len(batch)

    def _flushed(self, deadline: float) -> bool:
        """Wait until every record sent is acknowledged or failed (or ``deadline`` passed); False if the
        followed broker was replaced meanwhile (what it did not acknowledge must go to the new one)."""
        while True:
            try:
                self._producer.flush(timeout=max(0.1, min(1.0, deadline - time.monotonic())))
                return True
            except KafkaTimeoutError:
                if self._follow():
                    return False
                if time.monotonic() >= deadline:
                    return True  # the futures report the failure

    def _reject(self, rejected: list[tuple[Envelope, KafkaError]]) -> None:
        first, exc = rejected[0]
        reason = f"the broker refused it: {type(exc).__name__}"
        if self.outbox is not None:
            self.outbox.mark_undeliverable([e.event_id for e, _ in rejected], reason)
        cls = EventTooLarge if isinstance(exc, MessageSizeTooLargeError | RecordListTooLargeError) else EventRejected
        more = f" (and {len(rejected) - 1} more)" if len(rejected) > 1 else ""
        raise cls(
            f"{first.event_type} {first.event_id}{more} cannot be published to {first.topic}: {reason} "
            f"({exc}); it is not retried, and reconcile skips it",
            tuple(e.event_id for e, _ in rejected),
        )

    def send_raw(self, topic: str, key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]]) -> None:
        """Send one record as it is (dead-letter copies) and wait for its acknowledgement."""
        self.send_raw_async(topic, key, value, headers).get(timeout=self.timeout_s)

    def send_raw_async(
        self, topic: str, key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]]
    ) -> FutureRecordMetadata:
        """Send one record as it is; the returned future raises the broker's error, if any (a record
        the client refuses before sending, e.g. above ``max_request_size``, fails the future too)."""
        self._follow()
        try:
            return self._producer.send(topic, key=key, value=value, headers=headers)
        except KafkaError as exc:
            failed = FutureRecordMetadata(FutureProduceResult(TopicPartition(topic, -1)), -1, -1, -1, -1, -1, -1)
            failed.failure(exc)
            return failed

    def close(self, timeout_s: float = 10) -> None:
        self._producer.close(timeout=timeout_s)
        if self.outbox is not None:
            self.outbox.close()

    def __enter__(self) -> EventProducer:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def assign_all_partitions(consumer: KafkaConsumer, topics: Sequence[str]) -> None:
    """Assign ``consumer`` every partition of ``topics`` (no group), waiting up to 30 s for each topic's
    metadata."""
    partitions: list[TopicPartition] = []
    for topic in topics:
        ids = None
        deadline = time.monotonic() + 30
        while ids is None and time.monotonic() < deadline:
            ids = consumer.partitions_for_topic(topic)
            if ids is None:
                time.sleep(0.2)
        if ids is None:
            raise RuntimeError(f"topic {topic!r} does not exist: create the topics first (`prmloop topics`)")
        partitions.extend(TopicPartition(topic, p) for p in sorted(ids))
    consumer.assign(partitions)
