"""Reconciliation: re-publish what the outbox holds and DuckDB does not.

The embedded broker keeps topics in memory; after it restarts, events it had acknowledged but the
sink had not stored are gone from Kafka. They are still in the producers' outbox segments, so this
re-publishes exactly those (same ``event_id``: the sink keeps each once, however often it sees it),
and deletes segments that are fully stored and whose producing process has exited.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa

from prmloop.store.duck import open_reader
from prmloop.store.events import Envelope
from prmloop.store.kafka import EventProducer, ensure_topics
from prmloop.store.outbox import read_segment, segments
from prmloop.store.settings import KafkaSettings


def stored_event_ids(db_path: Path, candidates: list[uuid.UUID]) -> set[uuid.UUID]:
    """Which of ``candidates`` are already in the store."""
    if not candidates or not db_path.exists():
        return set()
    ids = pa.table({"event_id": pa.array([str(c) for c in candidates], pa.string())})
    with open_reader(db_path) as (con, _):
        con.register("candidates", ids)
        rows = con.execute(
            "SELECT e.event_id FROM events e SEMI JOIN candidates c ON e.event_id = CAST(c.event_id AS UUID)"
        ).fetchall()
    return {r[0] if isinstance(r[0], uuid.UUID) else uuid.UUID(str(r[0])) for r in rows}


def _still_written(segment: Path) -> bool:
    """An open segment of a live process may still grow; closed ones and a dead writer's may not."""
    if segment.name.endswith(".closed.jsonl"):
        return False
    parts = segment.stem.rsplit("-", 2)
    try:
        pid = int(parts[-2])
    except (IndexError, ValueError):
        return False
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reconcile(
    bootstrap_servers: str, db_path: Path, outbox_dir: Path, *, kafka: KafkaSettings | None = None
) -> dict[str, Any]:
    """Re-publish outbox events missing from ``db_path``; returns counts of what it did."""
    ensure_topics(bootstrap_servers, kafka=kafka)
    by_segment: dict[Path, list[Envelope]] = {seg: list(read_segment(seg)) for seg in segments(outbox_dir)}
    all_ids = list({e.event_id for events in by_segment.values() for e in events})
    stored = stored_event_ids(db_path, all_ids)
    missing: dict[uuid.UUID, Envelope] = {}
    removable: list[Path] = []
    for seg, events in by_segment.items():
        pending = [e for e in events if e.event_id not in stored]
        for e in pending:
            missing.setdefault(e.event_id, e)
        if not pending and not _still_written(seg):
            removable.append(seg)
    if missing:
        with EventProducer(bootstrap_servers, kafka=kafka) as producer:
            producer.publish(missing.values())
    for seg in removable:
        seg.unlink(missing_ok=True)
    return {
        "outbox_events": len(all_ids),
        "already_stored": len(stored),
        "republished": len(missing),
        "segments_removed": len(removable),
    }
