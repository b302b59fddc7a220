"""Consumer lag per group and topic: how many records each service has still to process.

Lag = end offset - committed offset, summed over a topic's partitions (a partition the group never
committed on counts from its start). Offsets are read with a consumer of the group that never joins it
(``committed()``); the admin client's group-offsets call fails to decode Tansu's response. On the
embedded Tansu broker the end offset is the base offset of a partition's last record batch plus one, so
it undercounts by up to a batch (ARCHITECTURE.md): the figures are marked ``approximate`` there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kafka import KafkaConsumer, TopicPartition

from prmloop.store.events.topics import EVENT_TOPICS
from prmloop.store.settings import KafkaSettings

__all__ = ["consumer_lag"]


def consumer_lag(
    bootstrap_servers: str,
    groups: Sequence[str],
    *,
    topics: Sequence[str] = EVENT_TOPICS,
    kafka: KafkaSettings | None = None,
    approximate: bool = False,
) -> dict[str, Any]:
    """``{"lag": {group: {topic: lag}}, "approximate": ...}`` over the ``topics`` a group has committed on."""
    kwargs = (kafka or KafkaSettings()).client_kwargs(bootstrap_servers)
    lag: dict[str, dict[str, int]] = {}
    probe = KafkaConsumer(**kwargs, enable_auto_commit=False)
    try:
        parts = [TopicPartition(t, p) for t in topics for p in sorted(probe.partitions_for_topic(t) or ())]
        ends = probe.end_offsets(parts) if parts else {}
    finally:
        probe.close()
    for group in groups:
        consumer = KafkaConsumer(**kwargs, group_id=group, enable_auto_commit=False)
        try:
            per_topic: dict[str, int] = {}
            seen: set[str] = set()
            committed = {tp: consumer.committed(tp) for tp in parts}
            for tp, offset in committed.items():
                if offset is not None:
                    seen.add(tp.topic)
            for tp, offset in committed.items():
                if tp.topic in seen:
                    per_topic[tp.topic] = per_topic.get(tp.topic, 0) + max(0, int(ends.get(tp, 0)) - int(offset or 0))
            lag[group] = dict(sorted(per_topic.items()))
        finally:
            consumer.close()
    return {"lag": lag, "approximate": approximate}
