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

from prmloop.store.events import Envelope
from prmloop.store.events.codec import UndeliverableEvent, encode_event
from prmloop.store.kafka.outbox import scan_segment, segments
from prmloop.store.kafka.producer import EventProducer, ensure_topics
from prmloop.store.procs import pid_running
from prmloop.store.settings import KafkaSettings
from prmloop.store.tables.duck import StoreLocation, open_reader, store_exists

#: How many undeliverable entries the report names (all are counted).
REPORT_EXAMPLES = 20


def stored_event_ids(db_path: StoreLocation, candidates: list[uuid.UUID]) -> set[uuid.UUID]:
    """Which of ``candidates`` are already in the store."""
    if not candidates or not store_exists(db_path):
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
    return pid_running(pid)


def reconcile(
    bootstrap_servers: str, db_path: StoreLocation, outbox_dir: Path, *, kafka: KafkaSettings | None = None
) -> dict[str, Any]:
    """Re-publish outbox events missing from ``db_path``; returns counts of what it did.

    Entries that can never be delivered (undecodable or above the event limits, or refused by the
    broker) are skipped and reported under ``undeliverable`` (count) and ``undeliverable_examples``
    (id or ``segment:line``, reason), never retried: one of them must not block every later run.
    A segment holding nothing but stored or undeliverable events is removed like a stored one.
    """
    ensure_topics(bootstrap_servers, kafka=kafka)
    scans = {seg: scan_segment(seg) for seg in segments(outbox_dir)}
    undeliverable: list[tuple[str, str]] = [u for scan in scans.values() for u in scan.undeliverable]
    refused: set[uuid.UUID] = {i for scan in scans.values() for i in scan.undeliverable_ids}
    all_ids = list({e.event_id for scan in scans.values() for e in scan.events} | refused)
    stored = stored_event_ids(db_path, all_ids)
    missing: dict[uuid.UUID, Envelope] = {}
    for scan in scans.values():
        for e in scan.events:
            if e.event_id not in stored and e.event_id not in missing:
                try:
                    encode_event(e)  # today's limits: an old outbox may hold events above them
                except UndeliverableEvent as exc:
                    refused.add(e.event_id)
                    undeliverable.append((str(e.event_id), str(exc)))
                    continue
                missing[e.event_id] = e
    republished = 0
    if missing:
        with EventProducer(bootstrap_servers, kafka=kafka) as producer:
            try:
                republished = producer.publish(missing.values())
            except UndeliverableEvent as exc:  # refused by the broker; the others were acknowledged
                refused.update(exc.event_ids)
                undeliverable.extend((str(i), str(exc)) for i in exc.event_ids)
                republished = len(missing) - len(exc.event_ids)
    removable = [
        seg
        for seg, scan in scans.items()
        if not _still_written(seg) and all(e.event_id in stored or e.event_id in refused for e in scan.events)
    ]
    for seg in removable:
        seg.unlink(missing_ok=True)
    return {
        "outbox_events": len(all_ids),
        "already_stored": len(stored),
        "republished": republished,
        "undeliverable": len(undeliverable),
        "undeliverable_examples": [f"{what}: {why}" for what, why in undeliverable[:REPORT_EXAMPLES]],
        "segments_removed": len(removable),
    }
