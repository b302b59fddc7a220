"""One way to run a consuming service: its handler on the consumer runtime until it is told to stop.

Every prmloop service (scorer, selector, annotator, judge, consensus, the sink) is its settings, its handler and
a call of :func:`run_service`, which runs the handler on :class:`~prmloop.store.kafka.runtime.ConsumerRuntime`
until SIGTERM/SIGINT, ``until()``, ``done()`` (the service's own limit, e.g. ``--max-solutions``) or
``idle_timeout_s`` seconds without input, then closes what the service opened (its producer last) and
returns one :class:`ServiceStats`: the handler's counters beside the runtime's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prmloop.store.kafka.runtime import BatchHandler, ConsumerRuntime
from prmloop.store.settings import KafkaSettings

log = logging.getLogger(__name__)

__all__ = ["ServiceStats", "run_service"]


@dataclass(frozen=True)
class ServiceStats:
    """What one run of a service did: its handler's ``counters`` and its runtime's figures."""

    name: str
    counters: Mapping[str, Any]
    batches: int
    events: int
    dead_lettered: int
    retries: int
    wall_s: float

    def as_dict(self) -> dict[str, Any]:
        """The counters, then ``batches``, ``events``, ``dead_lettered``, ``retries`` and ``wall_s``
        (what ``prmloop <service>`` prints as its last line)."""
        return {
            **self.counters,
            "batches": self.batches,
            "events": self.events,
            "dead_lettered": self.dead_lettered,
            "retries": self.retries,
            "wall_s": self.wall_s,
        }


def run_service(
    name: str,
    handler: BatchHandler,
    *,
    topics: Sequence[str],
    group_id: str,
    bootstrap_servers: str,
    counters: Callable[[], Mapping[str, Any]],
    kafka: KafkaSettings | None = None,
    max_batch: int = 1000,
    until: Callable[[], bool] | None = None,
    done: Callable[[], bool] | None = None,
    idle_timeout_s: float | None = None,
    install_signal_handlers: bool = True,
    close: Sequence[Callable[[], None]] = (),
    started: float | None = None,
    **runtime: Any,
) -> ServiceStats:
    """Run ``handler`` as the service ``name`` (the consumer group ``group_id`` on ``topics``) and
    return its figures. ``done``: the service's own stop condition, checked with ``until`` between
    batches; ``close``: what to close afterwards, in order, whatever happened (the producer last);
    ``started``: when the service began (``time.monotonic()``; default now), for ``wall_s``, so its
    model's loading counts; ``runtime``: further :class:`ConsumerRuntime` options."""
    started = time.monotonic() if started is None else started
    try:
        consumer = ConsumerRuntime(
            topics=topics,
            group_id=group_id,
            bootstrap_servers=bootstrap_servers,
            handler=handler,
            kafka=kafka,
            max_batch=max_batch,
            name=name,
            **runtime,
        )

        def stop() -> bool:
            return (done is not None and done()) or (until is not None and until())

        stats = consumer.run(until=stop, idle_timeout_s=idle_timeout_s, install_signal_handlers=install_signal_handlers)
    finally:
        for closing in close:
            closing()
    out = ServiceStats(
        name=name,
        counters=dict(counters()),
        batches=stats.batches,
        events=stats.events,
        dead_lettered=stats.dead_lettered,
        retries=stats.retries,
        wall_s=round(time.monotonic() - started, 3),
    )
    log.info("%s stopped: %s", name, out.as_dict())
    return out
