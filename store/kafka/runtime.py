"""The consumer runtime every prmloop service runs on.

Delivery rules (ARCHITECTURE.md): at-least-once delivery, effectively-once effects.

* Records are decoded and validated (with upcasting); a record that can never be valid goes to
  ``<topic>.dlq`` with the error and its origin in headers, and the stream continues.
* The handler receives a batch and must make its effect durable (and idempotent by ``event_id``)
  before returning. Only then are the offsets committed.
* A record that fails for a reason that will never change goes to ``<topic>.dlq`` and the stream
  moves on, whatever the exception: any decode failure (a RecursionError of a record nested 100,000
  levels, a serialisation error, a MemoryError), an event of one type on another type's topic, a
  record the handler rejects. A record too big for the dead-letter topic is replaced there by a
  truncated copy with its sha256 digest, size and origin in headers.
* Only transient handler errors (:func:`is_transient`: broker, network, disk, database I/O, a model
  server's connection errors) are retried with exponential backoff (at most 5 s: a database that
  returns is written again within seconds), polling meanwhile (a wait past the poll interval cost the
  group membership), and nothing is committed until the batch succeeds. Any other exception is a
  poison record in the batch: the batch is split in halves, recursively, the good halves processed
  and the failing single records dead-lettered, so no input can make a service exit or retry forever.
* The handler runs in a worker thread while the consumer's partitions are paused and the main thread
  keeps polling, so minutes of work (MC rollouts) do not cost the group membership.
* A handler with a ``look_ahead(events)`` method is shown the next batch's decoded events as they are
  fetched ahead, while it works on this one, so it may start on them early (the annotator's searches).
  A hint only: the events still come in the next batch, are committed after it, and a failing
  ``look_ahead`` is logged and changes nothing.
* SIGTERM/SIGINT finish the batch in hand, commit, and leave the group.
* A broker that does not answer yet is waited for (:mod:`prmloop.store.kafka.connect`); one from
  ``broker.json`` is followed when replaced (:mod:`prmloop.store.kafka.follow`).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from kafka import KafkaConsumer, TopicPartition
from kafka.consumer.fetcher import ConsumerRecord
from kafka.errors import CommitFailedError, KafkaError
from kafka.structs import OffsetAndMetadata

from prmloop.store.events.topics import TOPIC_OF
from prmloop.store.kafka.connect import once_answering
from prmloop.store.kafka.deadletter import DeadLetters
from prmloop.store.kafka.follow import BrokerLink, BrokerWatch
from prmloop.store.kafka.poison import TransientError, is_transient, one_line
from prmloop.store.kafka.producer import EventProducer, assign_all_partitions, consumer_config, without_leave_group
from prmloop.store.kafka.reconnect import Reconnecting
from prmloop.store.kafka.records import ConsumedEvent, Decoded, decode_record, paused_gc
from prmloop.store.kafka.stall import JoinListener, StallWatch
from prmloop.store.settings import KafkaSettings

log = logging.getLogger(__name__)

__all__ = ["BatchHandler", "ConsumedEvent", "ConsumerRuntime", "RuntimeStats", "TransientError", "is_transient"]


@dataclass
class RuntimeStats:
    batches: int = 0
    events: int = 0
    dead_lettered: int = 0
    retries: int = 0
    commits: int = 0
    started_at: float = field(default_factory=time.monotonic)


#: A batch handler returns the events it could never process, with the reason (they are dead-lettered).
BatchHandler = Callable[[list[ConsumedEvent]], Iterable[tuple[ConsumedEvent, str]] | None]


class ConsumerRuntime(Reconnecting):
    """Poll, decode, hand a batch to ``handler``, dead-letter poison, commit after the effect.

    ``assign_all=True`` reads every partition of ``topics`` without joining a consumer group (the
    DuckDB sink is the single writer, so it must not share partitions; it also restarts instantly
    after a crash). Offsets are still committed under ``group_id``.
    """

    def __init__(
        self,
        *,
        topics: Sequence[str],
        group_id: str,
        bootstrap_servers: str,
        handler: BatchHandler,
        kafka: KafkaSettings | None = None,
        assign_all: bool = False,
        max_batch: int = 1000,
        max_wait_s: float = 0.2,
        backoff_initial_s: float = 0.2,
        backoff_max_s: float = 5.0,
        max_poll_interval_ms: int = 10_000,
        session_timeout_ms: int = 10_000,
        pause_after_s: float = 1.0,
        dlq_producer: EventProducer | None = None,
        name: str | None = None,
        transient_errors: tuple[type[BaseException], ...] = (),
        check_topic: bool = True,
        follow_broker: bool = True,
        stall_after_s: float | None = 30.0,
    ) -> None:
        self.topics = list(topics)
        self.group_id = group_id
        self.handler = handler
        self._kafka = kafka or KafkaSettings()
        self.assign_all = assign_all or self._kafka.assign_all
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.pause_after_s = pause_after_s
        #: Seconds without a record after which a member whose partitions lag rejoins (store/kafka/stall.py).
        self._stall = StallWatch(None if self.assign_all else stall_after_s)
        self.name = name or group_id
        #: Handler exceptions retried besides :data:`prmloop.store.kafka.poison.TRANSIENT_ERRORS`.
        self.transient_errors = transient_errors
        #: Dead-letter an event read from a known event topic other than its type's topic.
        self.check_topic = check_topic
        self.stats = RuntimeStats()
        self._stop = threading.Event()
        #: Set when the broker came from broker.json: a replaced embedded broker is followed.
        self._watch = BrokerWatch.for_servers(bootstrap_servers, self._kafka) if follow_broker else None
        if self._watch is not None:
            bootstrap_servers = self._watch.resolve(self.name)
        self._bootstrap = bootstrap_servers
        self._session_timeout_ms = session_timeout_ms
        self._consumer_options = {
            "group_id": group_id,
            "max_poll_records": max_batch,
            "max_poll_interval_ms": max_poll_interval_ms,
            "session_timeout_ms": session_timeout_ms,
        }
        self._consumer = self._connect(bootstrap_servers, wait_s=self._kafka.connect_wait_s)
        self._dead_letters = DeadLetters(
            self.name,
            bootstrap_servers,
            kafka=self._kafka,
            stop=self._stop,
            producer=dlq_producer,
            backoff_initial_s=backoff_initial_s,
            backoff_max_s=backoff_max_s,
        )
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{self.name}-work")
        self._prefetched: list[ConsumerRecord] = []
        #: Prefetched records already decoded while the handler worked (by ``id``; the record is kept
        #: beside its result, so an id is never confused with a later record's).
        self._ahead: dict[int, tuple[ConsumerRecord, Decoded]] = {}
        self._cluster_id: str | None = None
        #: Counts the moves to another broker (offsets of records read before a move are not committed).
        self._generation = 0
        self._link = BrokerLink(self._watch.state, self.name) if self._watch is not None else None
        if self._link is not None and self._watch is not None:
            self._link.write(self._watch.current, reachable=True)

    # ------------------------------------------------------------------------------------------ control

    def stop(self) -> None:
        """Ask the loop to finish the batch in hand, commit and return."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def run(
        self,
        *,
        until: Callable[[], bool] | None = None,
        idle_timeout_s: float | None = None,
        install_signal_handlers: bool = True,
    ) -> RuntimeStats:
        """Run until :meth:`stop`, SIGTERM/SIGINT, ``until()`` returns True between batches, or (with
        ``idle_timeout_s``) no record arrived for that many seconds (drain a backlog and exit)."""
        previous: dict[signal.Signals, Any] = {}
        if install_signal_handlers and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, self._on_signal)
        last_record = time.monotonic()
        try:
            while not self._stop.is_set():
                if until is not None and until():
                    break
                if idle_timeout_s is not None and not self._consumer.assignment():
                    last_record = time.monotonic()  # still joining the group: not idle yet
                elif idle_timeout_s is not None and time.monotonic() - last_record > idle_timeout_s:
                    log.info("%s: idle for %.0fs; stopping", self.name, idle_timeout_s)
                    break
                batch = self._collect()
                if batch:
                    self._process(batch)
                    last_record = time.monotonic()
                    self._stall.saw_records(batch)
                elif waiting := self._stall.stalled(self._consumer):
                    self._rejoin(f"read nothing for {self._stall.idle_s():.0f} s while {waiting} records wait")
                elif joining := self._stall.join_hung():
                    self._rejoin(f"its join of the group has not finished after {joining:.0f} s")
                self._stall.read_again(self._consumer, self.name)
        finally:
            for signum, old_handler in previous.items():
                signal.signal(signum, old_handler)
            self.close()
        return self.stats

    def close(self) -> None:
        self._executor.shutdown(wait=True)
        try:  # no LeaveGroup (store.kafka.producer.without_leave_group): the broker expires the member
            self._consumer.close(autocommit=False, timeout_ms=5_000)
        except KafkaError as exc:  # leaving the group is best effort: the session times out anyway
            log.warning("closing the consumer failed: %r", exc)
        self._dead_letters.close()
        if self._link is not None:
            self._link.remove()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        log.info("%s: signal %d received, finishing the current batch", self.name, signum)
        self._stop.set()

    # ------------------------------------------------------------------------------------------ polling

    def _connect(self, bootstrap_servers: str, *, wait_s: float = 0.0) -> KafkaConsumer:
        config = consumer_config(self._kafka, bootstrap_servers, **self._consumer_options)
        made = once_answering(lambda: KafkaConsumer(**config), bootstrap_servers, self.name, wait_s=wait_s)
        consumer = without_leave_group(made)
        try:
            if self.assign_all:
                assign_all_partitions(consumer, self.topics)
            else:
                consumer.subscribe(self.topics, listener=JoinListener(self._stall))
        except BaseException:
            consumer.close(autocommit=False, timeout_ms=1_000)
            raise
        return consumer

    def _collect(self) -> list[ConsumerRecord]:
        """Up to ``max_batch`` records, waiting at most ``max_wait_s`` after the first one arrives."""
        if self._prefetched and not self.assign_all:
            # A rebalance may have moved partitions away while they were fetched ahead: their new owner
            # reads them from the committed offset, so working on them here would only repeat its work.
            owned = self._consumer.assignment()
            self._prefetched = [r for r in self._prefetched if TopicPartition(r.topic, r.partition) in owned]
            self._ahead = {id(r): self._ahead[id(r)] for r in self._prefetched if id(r) in self._ahead}
        records, self._prefetched = self._prefetched[: self.max_batch], self._prefetched[self.max_batch :]
        deadline: float | None = time.monotonic() + self.max_wait_s if records else None
        while len(records) < self.max_batch and not self._stop.is_set():
            timeout = self.max_wait_s if deadline is None else max(0.0, deadline - time.monotonic())
            polled = self._consumer.poll(timeout_ms=int(timeout * 1000), max_records=self.max_batch - len(records))
            if self._broker_moved() or self._broker_replaced():
                return []
            for recs in polled.values():
                records.extend(recs)
            if records and deadline is None:
                deadline = time.monotonic() + self.max_wait_s
            if deadline is None or time.monotonic() >= deadline:
                break
        return records

    # --------------------------------------------------------------------------------------- processing

    def _process(self, records: list[ConsumerRecord]) -> None:
        """Decode, dead-letter what can never be valid, run the handler on the rest, commit.

        Dead letters are sent before the handler's effect (and the commit), so a crash in between
        repeats a dead letter at worst, never loses one.
        """
        generation = self._generation
        good: list[ConsumedEvent] = []
        poison: list[tuple[ConsumerRecord, str, str]] = []
        known_topics = set(TOPIC_OF.values())
        with paused_gc():
            self._decode(records, good, poison, known_topics)
        if not self._dead_letter(poison):
            return  # stopped while the broker was unreachable: commit nothing, redeliver later
        by_position = {(r.topic, r.partition, r.offset): r for r in records}
        rejected = self._run_handler(good)
        if rejected is None:  # stopped while the effect kept failing: commit nothing, redeliver later
            return
        if not self._dead_letter(
            [(by_position[(c.topic, c.partition, c.offset)], kind, reason) for c, kind, reason in rejected]
        ):
            return
        if generation == self._generation:  # else the records are the old broker's: nothing to commit
            self._commit(records)
        self.stats.batches += 1
        self.stats.events += len(good) - len(rejected)
        self.stats.dead_lettered += len(poison) + len(rejected)

    def _decode(
        self,
        records: list[ConsumerRecord],
        good: list[ConsumedEvent],
        poison: list[tuple[ConsumerRecord, str, str]],
        known_topics: set[str],
    ) -> None:
        """Sort ``records`` into decoded events (``good``) and records to dead-letter (``poison``),
        using what :meth:`_decode_ahead` already decoded."""
        for rec in records:
            cached = self._ahead.pop(id(rec), None)
            kind, value = cached[1] if cached is not None and cached[0] is rec else self._decode_one(rec, known_topics)
            if kind == "good":
                good.append(value)
            elif kind == "poison":
                poison.append(value)

    def _decode_ahead(self, records: list[ConsumerRecord]) -> list[ConsumedEvent]:
        """Decode prefetched records while the handler works on the current batch (decoding depends
        only on the bytes, so doing it early changes nothing but when the CPU is spent: the sink's
        decoding then overlaps its DuckDB write, which runs without the GIL). Returns the events decoded."""
        good: list[ConsumedEvent] = []
        if not records:
            return good
        known_topics = set(TOPIC_OF.values())
        with paused_gc():
            for rec in records:
                decoded = self._ahead[id(rec)] = (rec, self._decode_one(rec, known_topics))
                if decoded[1][0] == "good":
                    good.append(decoded[1][1])
        return good

    def _show_ahead(self, events: list[ConsumedEvent]) -> None:
        """Hand the decoded events fetched ahead to the handler's ``look_ahead``, if it has one."""
        look_ahead = getattr(self.handler, "look_ahead", None)
        if look_ahead is None or not events:
            return
        try:
            look_ahead(events)
        except Exception as exc:  # noqa: BLE001 - a hint: the events come again in the next batch
            log.warning("%s: look_ahead failed (%r); the next batch starts them as usual", self.name, exc)

    def _decode_one(self, rec: ConsumerRecord, known_topics: set[str]) -> Decoded:
        return decode_record(rec, known_topics, check_topic=self.check_topic)

    def _run_handler(self, batch: list[ConsumedEvent]) -> list[tuple[ConsumedEvent, str, str]] | None:
        """The records to dead-letter (with kind and reason) once the batch's effect is durable, or
        ``None`` if the runtime stopped while a transient failure persisted.

        A transient failure retries the batch with backoff. Any other exception means a record in
        the batch can never be processed: the batch is split in halves (in order) and each half run
        the same way, down to single records, which are then dead-lettered with the exception. A
        handler's effect is idempotent, so running part of a batch again is harmless.
        """
        if not batch:
            return []
        delay = self.backoff_initial_s
        while True:
            future = self._executor.submit(self.handler, batch)
            self._wait_polling(future)
            try:
                return [(c, "Rejected", reason) for c, reason in (future.result() or [])]
            except Exception as exc:  # noqa: BLE001 - classified below
                if not is_transient(exc, self.transient_errors):
                    return self._isolate_poison(batch, exc)
                self.stats.retries += 1
                log.warning("%s: batch of %d failed (%r); retrying in %.1fs", self.name, len(batch), exc, delay)
                self._wait_polling(self._executor.submit(self._stop.wait, delay))  # the group keeps this member
                if self._stop.is_set():
                    return None
                delay = min(delay * 2, self.backoff_max_s)

    def _isolate_poison(
        self, batch: list[ConsumedEvent], exc: Exception
    ) -> list[tuple[ConsumedEvent, str, str]] | None:
        if len(batch) == 1:
            c = batch[0]
            log.error("%s: %s:%d@%d cannot be processed: %r", self.name, c.topic, c.partition, c.offset, exc)
            return [(c, type(exc).__name__, one_line(exc))]
        log.warning(
            "%s: batch of %d failed permanently (%r); splitting it to find the record", self.name, len(batch), exc
        )
        middle = len(batch) // 2
        out: list[tuple[ConsumedEvent, str, str]] = []
        for half in (batch[:middle], batch[middle:]):
            rejected = self._run_handler(half)
            if rejected is None:
                return None
            out.extend(rejected)
        return out

    def _wait_polling(self, future: Future[Any]) -> None:
        """Keep the group membership while the worker thread works.

        The main thread keeps polling: it prefetches up to one more batch, so quick handlers (the
        sink) overlap with fetching. Once the handler has run longer than ``pause_after_s`` (MC
        rollouts), every partition is paused and polling continues only to stay in the group, so a
        slow service holds at most one batch in memory whatever the backlog. Pausing only then
        matters: kafka-python drops the fetched-ahead records of a paused partition.
        """
        paused: set[TopicPartition] = set()
        started = time.monotonic()
        try:
            while not future.done():
                if self._broker_moved():
                    paused = set()  # the old consumer's pauses went with it
                    continue
                room = self.max_batch - len(self._prefetched)
                if room > 0:
                    polled = self._consumer.poll(timeout_ms=20, max_records=room)
                    for recs in polled.values():
                        self._prefetched.extend(recs)
                    self._show_ahead(self._decode_ahead([r for recs in polled.values() for r in recs]))
                    continue
                if time.monotonic() - started < self.pause_after_s:
                    wait([future], timeout=0.02)
                    continue
                polled = self._consumer.poll(timeout_ms=50)
                # Partitions assigned by a rebalance are not paused yet: give back what they returned.
                for tp, recs in polled.items():
                    self._consumer.seek(tp, recs[0].offset)
                unpaused = set(self._consumer.assignment()) - paused
                if unpaused:
                    self._consumer.pause(*unpaused)
                    paused |= unpaused
        finally:
            if paused:
                self._consumer.resume(*(paused & set(self._consumer.assignment())))

    def _dead_letter(self, poison: Sequence[tuple[ConsumerRecord, str, str]]) -> bool:
        """Dead-letter ``poison`` (see :class:`DeadLetters`); False if stopped before the broker took it."""
        before = self._dead_letters.retries
        try:
            return self._dead_letters.send(poison)
        finally:
            self.stats.retries += self._dead_letters.retries - before

    def _commit(self, records: list[ConsumerRecord]) -> None:
        offsets: dict[TopicPartition, OffsetAndMetadata] = {}
        for rec in records:
            tp = TopicPartition(rec.topic, rec.partition)
            if tp not in offsets or offsets[tp].offset <= rec.offset:
                offsets[tp] = OffsetAndMetadata(rec.offset + 1, "", -1)
        try:
            # Bounded: with the broker gone, an unbounded commit would wait for it forever.
            self._consumer.commit(offsets=offsets, timeout_ms=10_000)
            self.stats.commits += 1
        except (CommitFailedError, KafkaError) as exc:
            # The effect is durable and idempotent: whoever reads these records next repeats nothing.
            log.warning("%s: offset commit failed (%r); the records will be redelivered", self.name, exc)
            if isinstance(exc, CommitFailedError) and not self.assign_all:  # out of the group: store.kafka.reconnect
                self._drop_fetched_ahead()
