"""Read-side lookups over a topic: the latest event per key, kept current by a private consumer.

Services that need facts published elsewhere (the annotator needs a question's text from
``questions.registered`` and a solution's Δu from ``steps.scored``) read them from the log itself
rather than from DuckDB: the sink may lag, and the log is the source of truth. A :class:`TopicIndex`
assigns itself every partition of one topic without a consumer group (nothing is committed, every
process builds its own view from offset 0) and polls on demand, so a lookup for a key published a
moment ago waits for it instead of failing.

Memory: one payload per key. ``questions.registered`` with a million questions is a few hundred MB;
index only what a service needs (``project`` maps an event to the kept value).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

from kafka import KafkaConsumer, TopicPartition

from prmloop.store.codec import DecodeError, decode_stored_form
from prmloop.store.events import Envelope, QuestionRegistered, StepsScored
from prmloop.store.kafka import consumer_config
from prmloop.store.settings import KafkaSettings

__all__ = ["MissingKey", "TopicIndex", "question_index", "step_score_index"]

log = logging.getLogger(__name__)

V = TypeVar("V")


class MissingKey(LookupError):
    """A key that did not appear on the topic within the lookup's timeout."""


class TopicIndex(Generic[V]):
    """``key -> value`` of the newest event on ``topic`` for each key (newest by log position per partition).

    Args:
        topic: the topic to index (every partition, from the beginning).
        key: the key of an event (``None``: the event is not indexed).
        project: the value kept for an event (default: the payload).
    """

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        key: Callable[[Envelope], str | None],
        project: Callable[[Envelope], V],
        *,
        kafka: KafkaSettings | None = None,
        startup_timeout_s: float = 30.0,
    ) -> None:
        self.topic = topic
        self._key = key
        self._project = project
        self._values: dict[str, V] = {}
        self._lock = threading.Lock()
        self._consumer = KafkaConsumer(**consumer_config(kafka or KafkaSettings(), bootstrap_servers, group_id=None))
        deadline = time.monotonic() + startup_timeout_s
        partitions = self._consumer.partitions_for_topic(topic)
        while partitions is None and time.monotonic() < deadline:
            time.sleep(0.2)
            partitions = self._consumer.partitions_for_topic(topic)
        if partitions is None:
            self._consumer.close()
            raise RuntimeError(f"topic {topic!r} does not exist: create the topics first (`prmloop topics`)")
        assigned = [TopicPartition(topic, p) for p in sorted(partitions)]
        self._consumer.assign(assigned)
        self._consumer.seek_to_beginning(*assigned)
        self.skipped = 0

    def __len__(self) -> int:
        return len(self._values)

    def refresh(self, timeout_s: float = 0.2) -> int:
        """Read what arrived since the last call (waiting up to ``timeout_s`` for something); new keys seen."""
        with self._lock:
            return self._poll(timeout_s)

    def _poll(self, timeout_s: float) -> int:
        polled = self._consumer.poll(timeout_ms=int(timeout_s * 1000), max_records=10_000)
        added = 0
        for records in polled.values():
            for record in records:
                try:
                    event, _ = decode_stored_form(record.value or b"")
                except DecodeError as error:
                    self.skipped += 1
                    log.warning(
                        "%s: skipping %s:%d@%d: %s", self.topic, record.topic, record.partition, record.offset, error
                    )
                    continue
                key = self._key(event)
                if key is None:
                    continue
                added += key not in self._values
                self._values[key] = self._project(event)
        return added

    def get(self, key: str, timeout_s: float = 10.0) -> V:
        """The value for ``key``, reading the topic until it appears.

        Raises:
            MissingKey: ``key`` was not on the topic after ``timeout_s`` seconds.
        """
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while key not in self._values:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise MissingKey(f"no event for {key!r} on {self.topic!r} after {timeout_s:.0f}s")
                self._poll(min(left, 0.5))
            return self._values[key]

    def peek(self, key: str) -> V | None:
        """The value for ``key`` if it has been read already (no waiting)."""
        with self._lock:
            return self._values.get(key)

    def close(self) -> None:
        self._consumer.close()

    def __enter__(self) -> TopicIndex[V]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _question_key(event: Envelope) -> str | None:
    return event.payload.question_id if isinstance(event.payload, QuestionRegistered) else None


def _question(event: Envelope) -> QuestionRegistered:
    assert isinstance(event.payload, QuestionRegistered)
    return event.payload


def question_index(bootstrap_servers: str, *, kafka: KafkaSettings | None = None) -> TopicIndex[QuestionRegistered]:
    """Registered questions by ``question_id`` (``questions.registered``)."""
    return TopicIndex(bootstrap_servers, QuestionRegistered.TOPIC, _question_key, _question, kafka=kafka)


def _scores_key(event: Envelope) -> str | None:
    return event.payload.solution_id if isinstance(event.payload, StepsScored) else None


def _scores(event: Envelope) -> StepsScored:
    assert isinstance(event.payload, StepsScored)
    return event.payload


def step_score_index(bootstrap_servers: str, *, kafka: KafkaSettings | None = None) -> TopicIndex[StepsScored]:
    """The newest ``StepsScored`` of each solution by ``solution_id`` (``steps.scored``)."""
    return TopicIndex(bootstrap_servers, StepsScored.TOPIC, _scores_key, _scores, kafka=kafka)
