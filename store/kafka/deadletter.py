"""Dead-letter topics (``<topic>.dlq``): writing a poison record there with its error and origin in
headers, and reading back how many each topic holds and what failed last (``prmloop status``).

Header names (one owner, here): ``dlq.error_type``, ``dlq.error``, ``dlq.topic``, ``dlq.partition``,
``dlq.offset``, ``dlq.consumer``, ``dlq.failed_at``; a truncated copy adds ``dlq.truncated``,
``dlq.original_size`` and ``dlq.original_sha256`` (:func:`prmloop.store.kafka.poison.truncated_copy`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from kafka import KafkaConsumer, TopicPartition
from kafka.consumer.fetcher import ConsumerRecord
from kafka.errors import KafkaError, MessageSizeTooLargeError, RecordListTooLargeError

from prmloop.store.events.limits import DLQ_TRUNCATED_BYTES
from prmloop.store.events.topics import EVENT_TOPICS, dlq_topic
from prmloop.store.kafka.poison import truncated_copy
from prmloop.store.kafka.producer import EventProducer
from prmloop.store.settings import KafkaSettings

log = logging.getLogger(__name__)

__all__ = ["DeadLetters", "dead_letter_summary"]


class DeadLetters:
    """Sends a consumer's poison records to their dead-letter topics, retrying broker failures.

    The producer is made on first use (``producer`` given: that one, which the caller closes).
    """

    def __init__(
        self,
        name: str,
        bootstrap_servers: str,
        *,
        kafka: KafkaSettings,
        stop: threading.Event,
        producer: EventProducer | None = None,
        backoff_initial_s: float = 0.2,
        backoff_max_s: float = 30.0,
    ) -> None:
        self.name = name
        self.bootstrap_servers = bootstrap_servers
        self.kafka = kafka
        self.stop = stop
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.retries = 0
        self._producer = producer
        self._owned = producer is None

    def reconnect(self, bootstrap_servers: str) -> None:
        """Send to another broker from now on (the one the consumer moved to)."""
        self.bootstrap_servers = bootstrap_servers
        if self._owned and self._producer is not None:
            self._producer.close(timeout_s=1)
            self._producer = None

    def close(self) -> None:
        if self._owned and self._producer is not None:
            self._producer.close()
            self._producer = None

    def send(self, poison: Sequence[tuple[ConsumerRecord, str, str]]) -> bool:
        """Copy each ``(record, error_type, reason)`` to its dead-letter topic with the error and its
        origin in headers; False if ``stop`` was set before the broker took them all.

        The copies are sent together and then awaited (one round trip, not one per record). A record
        the broker (or the producer's size limit) refuses is replaced by a truncated copy: its first
        :data:`DLQ_TRUNCATED_BYTES` bytes, with ``dlq.original_sha256``, ``dlq.original_size`` and
        ``dlq.truncated`` headers besides the usual origin headers; if even that is refused, by the
        headers alone. Broker failures are retried.
        """
        if not poison:
            return True
        if self._producer is None:
            self._producer = EventProducer(self.bootstrap_servers, kafka=self.kafka)
        producer = self._producer
        failed_at = datetime.now(UTC).isoformat().encode()
        pending = [
            (
                rec,
                reason,
                [
                    ("dlq.error_type", kind.encode()[:200]),
                    ("dlq.error", reason[:4000].encode()),
                    ("dlq.topic", rec.topic.encode()),
                    ("dlq.partition", str(rec.partition).encode()),
                    ("dlq.offset", str(rec.offset).encode()),
                    ("dlq.consumer", self.name.encode()),
                    ("dlq.failed_at", failed_at),
                ],
                0,
            )
            for rec, kind, reason in poison
        ]
        delay = self.backoff_initial_s
        while True:
            futures = []
            for rec, reason, origin, level in pending:
                topic = dlq_topic(rec.topic)
                if level == 0:
                    key, value, headers = rec.key, rec.value, [*(rec.headers or []), *origin]
                else:  # 1: a truncated copy; 2: the headers alone (the broker refused even the truncated copy)
                    key, value, headers = truncated_copy(rec, origin, keep=DLQ_TRUNCATED_BYTES if level == 1 else 0)
                futures.append(((rec, reason, origin, level), producer.send_raw_async(topic, key, value, headers)))
            retry: list[tuple[ConsumerRecord, str, list[tuple[str, bytes]], int]] = []
            last_error: KafkaError | None = None
            for item, future in futures:
                rec, reason, origin, level = item
                try:
                    future.get(timeout=producer.timeout_s)
                except (MessageSizeTooLargeError, RecordListTooLargeError) as exc:
                    if level < 2:
                        retry.append((rec, reason, origin, level + 1))
                        continue
                    retry.append(item)  # even the headers alone: a broker problem, retried like one
                    last_error = exc
                except KafkaError as exc:
                    retry.append(item)
                    last_error = exc
                else:
                    log.error(
                        "%s: %s:%d@%d dead-lettered: %s", self.name, rec.topic, rec.partition, rec.offset, reason[:500]
                    )
            if not retry:
                return True
            pending = retry
            if last_error is None:
                continue  # only smaller copies to send: no need to wait
            self.retries += 1
            log.warning(
                "%s: dead-lettering %d records failed (%r); retrying in %.1fs", self.name, len(retry), last_error, delay
            )
            if self.stop.wait(delay):
                return False
            delay = min(delay * 2, self.backoff_max_s)


def dead_letter_summary(
    bootstrap_servers: str, *, topics: Sequence[str] = EVENT_TOPICS, kafka: KafkaSettings | None = None
) -> dict[str, dict[str, Any]]:
    """Per dead-letter topic: ``count`` (records it holds) and, when it holds any, the newest one's
    ``newest_error_type``, ``newest_failed_at`` and ``newest_consumer`` (from its ``dlq.*`` headers).

    Only each partition's last record batch is read: the broker's end offset is that batch's base
    offset plus one on the embedded Tansu broker (ARCHITECTURE.md), so the batch's own records give the
    exact end, and the newest record, without reading the whole topic.
    """
    kwargs = (kafka or KafkaSettings()).client_kwargs(bootstrap_servers)
    consumer = KafkaConsumer(
        **kwargs,
        enable_auto_commit=False,
        group_id=None,
        receive_message_max_bytes=128 * 1024 * 1024,
        max_partition_fetch_bytes=8 * 1024 * 1024,
        fetch_max_wait_ms=100,
    )
    summary: dict[str, dict[str, Any]] = {}
    try:
        names = [dlq_topic(t) for t in topics]
        parts = [TopicPartition(n, p) for n in names for p in sorted(consumer.partitions_for_topic(n) or ())]
        begins = consumer.beginning_offsets(parts) if parts else {}
        ends = consumer.end_offsets(parts) if parts else {}
        last: dict[TopicPartition, ConsumerRecord] = {}
        waiting = {tp for tp in parts if ends.get(tp, 0) > begins.get(tp, 0)}
        if waiting:
            consumer.assign(sorted(waiting, key=lambda tp: (tp.topic, tp.partition)))
            for tp in waiting:
                consumer.seek(tp, ends[tp] - 1)
            deadline = time.monotonic() + 10
            # Until every partition gave its last batch, and then until a poll brings nothing more
            # (a batch larger than one poll's records comes in several).
            while time.monotonic() < deadline:
                polled = consumer.poll(timeout_ms=1000 if waiting else 200)
                for tp, records in polled.items():
                    last[tp] = records[-1]
                    waiting.discard(tp)
                if not polled and not waiting:
                    break
        for name in names:
            mine = [tp for tp in parts if tp.topic == name]
            count = 0
            newest: ConsumerRecord | None = None
            for tp in mine:
                end = max(int(ends.get(tp, 0)), last[tp].offset + 1 if tp in last else 0)
                count += max(0, end - int(begins.get(tp, 0)))
                rec = last.get(tp)
                if rec is not None and (newest is None or _failed_at(rec) > _failed_at(newest)):
                    newest = rec
            entry: dict[str, Any] = {"count": count}
            if newest is not None:
                headers = dict(newest.headers or [])
                entry["newest_error_type"] = headers.get("dlq.error_type", b"").decode(errors="replace") or None
                entry["newest_failed_at"] = _failed_at(newest) or None
                entry["newest_consumer"] = headers.get("dlq.consumer", b"").decode(errors="replace") or None
            summary[name] = entry
    finally:
        consumer.close()
    return summary


def _failed_at(rec: ConsumerRecord) -> str:
    value = dict(rec.headers or []).get("dlq.failed_at")
    if value:
        return value.decode(errors="replace")
    return datetime.fromtimestamp(rec.timestamp / 1000, UTC).isoformat() if rec.timestamp else ""
