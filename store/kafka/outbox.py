"""The producers' outbox: every published event is also appended to a local JSONL segment.

Why: the embedded broker keeps topics in memory, so a broker restart loses records that the sink
had not stored yet, even though the broker acknowledged them. :func:`reconcile` compares the outbox
with the events in DuckDB and re-publishes exactly the missing ones; the sink is idempotent by
``event_id``, so re-publishing too much is harmless. Segments whose events are all stored are deleted.
A real Kafka cluster (replicated, on disk) does not need this; it stays on as a cheap safety net.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from prmloop.store.events import Envelope
from prmloop.store.events.codec import DecodeError, decode_event, encode_event

#: The key of an outbox line that marks events the broker refused: reconcile never re-sends them.
UNDELIVERABLE_KEY = "prmloop_undeliverable"


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
        self.append_encoded([encode_event(e) for e in events])

    def append_encoded(self, encoded: Iterable[bytes]) -> None:
        """Append events already encoded (and so checked against the limits) by the producer."""
        self._write(b"".join(raw + b"\n" for raw in encoded))

    def mark_undeliverable(self, event_ids: Iterable[uuid.UUID], reason: str) -> None:
        """Record that the broker refused these events, so reconcile skips them instead of failing."""
        ids = [str(i) for i in event_ids]
        self._write(json.dumps({UNDELIVERABLE_KEY: ids, "reason": reason}).encode() + b"\n")

    def _write(self, data: bytes) -> None:
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
    """Events of one segment; a torn last line (a process killed mid-write) is skipped, and so is
    every line that cannot be an event or was marked undeliverable (see :func:`scan_segment`)."""
    yield from scan_segment(path).events


@dataclass
class SegmentScan:
    """One segment read for reconcile: its events, and what can never be delivered, with why."""

    events: list[Envelope] = field(default_factory=list)
    #: (event id if known else the line number, reason) of every line that will never be published.
    undeliverable: list[tuple[str, str]] = field(default_factory=list)
    undeliverable_ids: set[uuid.UUID] = field(default_factory=set)


def scan_segment(path: Path) -> SegmentScan:
    """Read a segment, separating deliverable events from lines no retry can deliver.

    Those are lines that do not decode (an old outbox may hold events above today's limits, such as
    a 10 MB question written before limits existed; or a torn last line) and events the broker
    refused (marked by :meth:`Outbox.mark_undeliverable`).
    """
    scan = SegmentScan()
    marked: dict[uuid.UUID, str] = {}
    with open(path, "rb") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            if line.startswith(b'{"' + UNDELIVERABLE_KEY.encode()):
                try:
                    mark = json.loads(line)
                    for i in mark[UNDELIVERABLE_KEY]:
                        marked[uuid.UUID(i)] = str(mark.get("reason", "refused by the broker"))
                except (ValueError, KeyError, TypeError):
                    scan.undeliverable.append((f"{path.name}:{lineno}", "unreadable undeliverable mark"))
                continue
            try:
                scan.events.append(decode_event(line))
            except DecodeError as exc:
                scan.undeliverable.append((f"{path.name}:{lineno}", " ".join(str(exc).split())[:300]))
    if marked:
        scan.undeliverable.extend((str(e.event_id), marked[e.event_id]) for e in scan.events if e.event_id in marked)
        scan.undeliverable_ids = set(marked)
        scan.events = [e for e in scan.events if e.event_id not in marked]
    return scan


def segment_summary(directory: Path) -> dict[str, int]:
    count = 0
    for seg in segments(directory):
        with open(seg, "rb") as fh:
            count += sum(1 for line in fh if line.strip())
    return {"segments": len(segments(directory)), "events": count}
