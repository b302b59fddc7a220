"""The annotator's searches started ahead: the next batch's, begun while this one ends (issue 55).

:meth:`prmloop.consumers.annotator.Annotator.look_ahead` starts them when the consumer runtime shows it
the records it fetched ahead; the next batch claims each by its record's position, and one the next
batch does not bring (its partition moved to another member) is dropped then.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Generic, TypeVar

from prmloop.store.kafka.runtime import ConsumedEvent

__all__ = ["SearchesAhead", "position"]

T = TypeVar("T")


def position(consumed: ConsumedEvent) -> tuple[str, int, int]:
    """Where a record is: its topic, partition and offset (one search a record)."""
    return consumed.topic, consumed.partition, consumed.offset


class SearchesAhead(Generic[T]):
    """Futures of searches started before their batch, by record position (safe from any thread)."""

    def __init__(self) -> None:
        self._futures: dict[tuple[str, int, int], Future[T]] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._futures)

    def start(self, records: Iterable[ConsumedEvent], submit: Callable[[ConsumedEvent], Future[T]]) -> None:
        """``submit`` each record not started yet."""
        with self._lock:
            for consumed in records:
                key = position(consumed)
                if key not in self._futures:
                    self._futures[key] = submit(consumed)

    def claim(self, consumed: ConsumedEvent) -> Future[T] | None:
        """The search started for ``consumed``, taken (a retried batch searches again), or ``None``."""
        with self._lock:
            return self._futures.pop(position(consumed), None)

    def drop_all_but(self, batch: Iterable[ConsumedEvent]) -> None:
        """Cancel the searches of records ``batch`` does not bring (a running one finishes unused)."""
        keep = {position(c) for c in batch}
        with self._lock:
            for key in [k for k in self._futures if k not in keep]:
                self._futures.pop(key).cancel()
