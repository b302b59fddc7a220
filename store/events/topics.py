"""Topic names and their layout. Every event type has exactly one topic; ``<topic>.dlq`` holds the
records of that topic that could never be processed."""

from __future__ import annotations

from dataclasses import dataclass

from prmloop.store.events import PAYLOAD_TYPES

DLQ_SUFFIX = ".dlq"


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int = 4
    replication_factor: int = 1


#: event_type -> topic, derived from the payload classes so the two can never disagree.
TOPIC_OF: dict[str, str] = {name: cls.TOPIC for name, cls in PAYLOAD_TYPES.items()}

#: Every event topic, in pipeline order.
EVENT_TOPICS: tuple[str, ...] = tuple(dict.fromkeys(TOPIC_OF.values()))


def dlq_topic(topic: str) -> str:
    return topic + DLQ_SUFFIX


def all_topic_specs(partitions: int = 4, replication_factor: int = 1) -> list[TopicSpec]:
    """The event topics and their dead-letter topics."""
    names = [*EVENT_TOPICS, *(dlq_topic(t) for t in EVENT_TOPICS)]
    return [TopicSpec(n, partitions, replication_factor) for n in names]
