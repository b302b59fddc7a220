"""The producers' outbox: every published event is also appended to a local JSONL segment.

Why: the embedded broker keeps topics in memory, so a broker restart loses records that the sink
had not stored yet, even though the broker acknowledged them. :func:`reconcile` compares the outbox
with the events in DuckDB and re-publishes exactly the missing ones; the sink is idempotent by
``event_id``, so re-publishing too much is harmless. Segments whose events are all stored are deleted.
A real Kafka cluster (replicated, on disk) does not need this; it stays on as a cheap safety net.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from prmloop.store.codec import DecodeError, decode_event, encode_event
from prmloop.store.events import Envelope


class Outbox:
    """Append-only JSONL segments, one per producing process, in ``directory``."""

    def __init__(self, directory: Path, name: str = "producer") -> None:
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True)
        safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in name)
        self.path = directory / f"{safe}-{os.getpid()}-{time.time_ns()}.jsonl"
        self._lock = threading.Lock()
        self._fh = open(self.path, "ab")  # noqa: SIM115 - kept open for the producer's lifetime

    def append(self, events: Iterable[Envelope]) -> None:
        data = b"".join(encode_event(e) + b"\n" for e in events)
        if not data:
            return
        with self._lock:
            self._fh.write(data)
            self._fh.flush()
            os.fsync(self._fh.fileno())

    def close(self) -> None:
        """Close the segment and mark it closed, so reconcile may delete it once all of it is stored."""
        with self._lock:
            if self._fh.closed:
                return
            self._fh.close()
            closed = self.path.with_suffix(".closed.jsonl")
            self.path.rename(closed)
            self.path = closed


def segments(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.jsonl")) if directory.exists() else []


def read_segment(path: Path) -> Iterator[Envelope]:
    """Events of one segment; a torn last line (a process killed mid-write) is skipped."""
    with open(path, "rb") as fh:
        for line in fh:
            if not line.strip():
                continue
            with contextlib.suppress(DecodeError):
                yield decode_event(line)


def segment_summary(directory: Path) -> dict[str, int]:
    count = 0
    for seg in segments(directory):
        with open(seg, "rb") as fh:
            count += sum(1 for line in fh if line.strip())
    return {"segments": len(segments(directory)), "events": count}
