"""What the consumer runtime needs to tell poison from bad luck, and to dead-letter any record.

A failure is *transient* when waiting may cure it (broker, network, disk, database I/O, a model
server's connection errors): the runtime retries those with backoff. Everything else is permanent
for the record at hand, which then goes to its dead-letter topic; a record too big to copy there is
replaced by a truncated copy that still identifies it.
"""

from __future__ import annotations

import hashlib

import duckdb
from kafka.consumer.fetcher import ConsumerRecord
from kafka.errors import KafkaError

from prmloop.store.events.limits import DLQ_TRUNCATED_BYTES

__all__ = [
    "TRANSIENT_ERRORS",
    "TRANSIENT_ERROR_NAMES",
    "TransientError",
    "is_transient",
    "one_line",
    "truncated_copy",
]


class TransientError(Exception):
    """Raise (or chain) this from a handler for a failure that may pass: the batch is retried."""


#: Exceptions that may pass by themselves: the batch is retried, never dead-lettered. ``OSError``
#: covers connection errors, timeouts, a full disk and ``StoreLocked``.
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    TransientError,
    KafkaError,
    OSError,
    duckdb.IOException,
    duckdb.ConnectionException,
    duckdb.TransactionException,
    duckdb.OutOfMemoryException,
)

#: Names of transient exception classes of HTTP clients a model backend may use (httpx, openai,
#: requests-like); matched by name so the store does not import them.
TRANSIENT_ERROR_NAMES = frozenset(
    {
        "APIConnectionError",
        "APITimeoutError",
        "RateLimitError",
        "InternalServerError",
        "ServiceUnavailableError",
        "TransportError",
        "ConnectError",
        "ReadTimeout",
        "WriteTimeout",
        "ConnectTimeout",
        "PoolTimeout",
        "RemoteProtocolError",
        "TimeoutException",
    }
)


def is_transient(exc: BaseException, extra: tuple[type[BaseException], ...] = ()) -> bool:
    """Whether ``exc`` (or an exception it was raised from) may pass by itself, so retrying helps."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, TRANSIENT_ERRORS + extra):
            return True
        if any(cls.__name__ in TRANSIENT_ERROR_NAMES for cls in type(current).__mro__):
            return True
        current = current.__cause__ or current.__context__
    return False


def one_line(exc: BaseException, limit: int = 500) -> str:
    return f"{type(exc).__name__}: " + " ".join(str(exc).split())[:limit]


def truncated_copy(
    rec: ConsumerRecord, origin: list[tuple[str, bytes]], keep: int = DLQ_TRUNCATED_BYTES
) -> tuple[bytes | None, bytes, list[tuple[str, bytes]]]:
    """Key, value and headers of the stand-in for a record too big to copy: its first ``keep``
    bytes, and how to recognise the original (its sha256 digest, size and position)."""
    value = rec.value or b""
    key = rec.key
    if key is not None and len(key) > 1024:
        key = hashlib.sha256(key).hexdigest().encode()
    headers = list(rec.headers or [])
    if sum(len(k) + len(v or b"") for k, v in headers) > 16 * 1024:
        headers = [("dlq.original_headers_dropped", str(len(headers)).encode())]
    return (
        key,
        value[:keep],
        [
            *headers,
            *origin,
            ("dlq.truncated", b"true"),
            ("dlq.original_size", str(len(value)).encode()),
            ("dlq.original_sha256", hashlib.sha256(value).hexdigest().encode()),
        ],
    )
