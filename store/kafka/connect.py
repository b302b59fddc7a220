"""Connecting to a broker that does not answer yet: wait for it, say so, and go on when it answers.

kafka-python's clients ask a broker for its API versions while they are built, and raise
``NoBrokersAvailable`` when none answered within ``api_version_auto_timeout_ms`` (2 s). A broker that
is still starting, or one on a loaded machine, can take longer: in the cluster's chaos test on two
cores (nineteen processes starting at once, the brokers' storage on PostgreSQL) both consensus
processes died that way at start, and no solution was ever decided. A service waits instead, for
``KAFKA_CONNECT_WAIT_S`` seconds (``KafkaSettings.connect_wait_s``), saying every 30 s what it waits
for and what to do; then it fails with the client's error, as before.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from kafka.errors import KafkaConnectionError, KafkaTimeoutError, NoBrokersAvailable

log = logging.getLogger(__name__)

T = TypeVar("T")

#: What a broker that is down, starting or too slow to answer makes a client's construction raise.
NOT_ANSWERING: tuple[type[Exception], ...] = (NoBrokersAvailable, KafkaConnectionError, KafkaTimeoutError)


def once_answering(
    connect: Callable[[], T],
    servers: str,
    who: str,
    *,
    wait_s: float,
    stop: threading.Event | None = None,
    say_every_s: float = 30.0,
) -> T:
    """``connect()``, tried again while the broker at ``servers`` does not answer, for at most
    ``wait_s`` seconds (or until ``stop`` is set); then the last error is raised. ``who`` names the
    client in the log."""
    started = time.monotonic()
    said: float | None = None
    pause = 0.5
    while True:
        try:
            made = connect()
        except NOT_ANSWERING as exc:
            waited = time.monotonic() - started
            if waited >= wait_s or (stop is not None and stop.is_set()):
                raise
            if said is None or time.monotonic() - said >= say_every_s:
                log.warning(
                    "%s: no Kafka broker answers at %s yet (%s, %.0f s): waiting up to %.0f s "
                    "(start one with `prmloop up`, or point KAFKA_BOOTSTRAP_SERVERS at yours)",
                    who,
                    servers,
                    type(exc).__name__,
                    waited,
                    wait_s,
                )
                said = time.monotonic()
            time.sleep(max(0.0, min(pause, wait_s - waited)))
            pause = min(2 * pause, 5.0)
            continue
        if said is not None:
            log.warning("%s: the broker at %s answers, after %.0f s", who, servers, time.monotonic() - started)
        return made
