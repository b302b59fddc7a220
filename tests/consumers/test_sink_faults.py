"""The sink under faults, against a real broker: SIGKILL, SIGTERM, a restarted broker, duplicates and
out-of-order delivery. The store must end equal to what was published: nothing lost, nothing twice."""

from __future__ import annotations

import random
import signal
import threading
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from prmloop.consumers.sink import SinkSettings, run_sink
from prmloop.flows.ops.broker import EmbeddedBroker
from prmloop.store.events import StepsLabeled, make_event
from prmloop.store.kafka.outbox import Outbox, segment_summary
from prmloop.store.kafka.producer import EventProducer, ensure_topics
from prmloop.store.kafka.reconcile import reconcile
from prmloop.store.kafka.service import ServiceStats
from prmloop.store.tables.duck import StoreLocked, query

if TYPE_CHECKING:  # the fixture's type, from this folder's conftest.py (tests is not a package)
    from conftest import SinkTools


def stored_ids(db: Path, ids: list[uuid.UUID]) -> set[uuid.UUID]:
    if not db.exists():
        return set()
    wanted = ",".join(f"'{i}'" for i in ids)
    try:
        rows = query(db, f"SELECT event_id FROM events WHERE event_id IN ({wanted})", timeout_s=10).rows
    except StoreLocked:
        return set()
    return {r[0] for r in rows}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kills", "n"),
    # make test kills four times; make test-soak twelve, under three times the events.
    [pytest.param(4, 800, id="4 kills"), pytest.param(12, 2400, id="12 kills", marks=pytest.mark.soak)],
)
def test_a_sink_killed_again_and_again_while_events_flow_loses_and_duplicates_nothing(
    kafka_bootstrap: str, tmp_path: Path, sink_tools: SinkTools, kills: int, n: int
) -> None:
    events = sink_tools.fresh_events(n, seed=101)
    db = tmp_path / "store.duckdb"
    group = f"sink-{uuid.uuid4().hex[:8]}"
    rng = random.Random(5)

    publisher = sink_tools.publish_slowly(kafka_bootstrap, events, pause_s=0.5)
    for _ in range(kills):
        proc = sink_tools.start(kafka_bootstrap, str(db), group, tmp_path, max_batch=500)
        time.sleep(rng.uniform(0.05, 1.5))
        proc.kill()
        proc.wait(timeout=30)
    publisher.join()

    proc = sink_tools.start(kafka_bootstrap, str(db), group, tmp_path, max_batch=500)
    ids = [e.event_id for e in events]
    sink_tools.wait_for(lambda: len(stored_ids(db, ids)) == len(ids), 120, "the restarted sink to catch up")
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out.decode()
    assert b"sink stopped" in out
    sink_tools.assert_store_equals(db, events)
    counts = query(db, "SELECT count(*), count(DISTINCT event_id) FROM events").rows[0]
    assert counts[0] == counts[1]


def test_duplicates_and_out_of_order_events_end_in_one_consistent_store(
    kafka_bootstrap: str, tmp_path: Path, sink_tools: SinkTools
) -> None:
    events = sink_tools.fresh_events(200, seed=102)
    solutions = [e for e in events if e.event_type == "SolutionSampled"]
    labels = [e for e in events if e.event_type == "StepsLabeled"]
    accepted = {e.correlation_id for e in events if e.event_type == "LabelsAccepted"}
    old_label = next(e for e in labels if e.correlation_id not in accepted)  # no consensus overrides it
    sid = old_label.correlation_id
    new_label = make_event(
        StepsLabeled(**{**old_label.payload.model_dump(), "method": "uncertainty_driven"}),
        producer="test",
        occurred_at=old_label.occurred_at.replace(year=2027),
    )
    with EventProducer(kafka_bootstrap) as producer:
        producer.publish(labels)  # labels before the solutions they label (another topic)
        producer.publish([new_label])  # the newer label before the older one's duplicate
        producer.publish(solutions)
        producer.publish(events)  # everything again
        producer.publish([old_label])
    db = tmp_path / "store.duckdb"
    expected = [*events, new_label]
    ids = [e.event_id for e in expected]
    done = threading.Event()
    t = threading.Thread(
        target=run_sink,
        kwargs={
            "bootstrap_servers": kafka_bootstrap,
            "db_path": db,
            "settings": SinkSettings(group=f"s-{uuid.uuid4().hex[:8]}"),
            "until": done.is_set,
            "install_signal_handlers": False,
        },
    )
    t.start()
    try:
        sink_tools.wait_for(lambda: len(stored_ids(db, ids)) == len(ids), 60, "the sink")
    finally:
        done.set()
        t.join(30)
    sink_tools.assert_store_equals(db, expected)
    current = query(db, f"SELECT DISTINCT method FROM current_labels WHERE solution_id = '{sid}'").rows
    assert current == [("uncertainty_driven",)]
    n_steps = query(db, f"SELECT n_steps FROM solutions WHERE solution_id = '{sid}'").rows
    assert n_steps == [(len(old_label.payload.labels),)]  # type: ignore[union-attr]


def _sink_thread(servers: str, db: Path, group: str) -> tuple[threading.Thread, threading.Event, list[ServiceStats]]:
    stop = threading.Event()
    result: list[ServiceStats] = []

    def target() -> None:
        stats = run_sink(
            SinkSettings(group=group),
            bootstrap_servers=servers,
            db_path=db,
            until=stop.is_set,
            install_signal_handlers=False,
        )
        result.append(stats)

    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t, stop, result


@pytest.mark.slow
def test_a_restarted_in_memory_broker_loses_nothing_acknowledged(tmp_path: Path, sink_tools: SinkTools) -> None:
    """Producers and the sink reconnect by themselves; what the restart lost, the outbox restores."""
    db = tmp_path / "store.duckdb"
    batch_a, batch_b, batch_c, batch_d = (sink_tools.fresh_events(150, seed=s) for s in (201, 202, 203, 204))
    with EmbeddedBroker() as broker:
        servers = broker.bootstrap_servers
        ensure_topics(servers)
        producer = EventProducer(servers, outbox=Outbox(tmp_path / "outbox", "test"))

        sink, stop, _ = _sink_thread(servers, db, "sink")
        producer.publish(batch_a)
        sink_tools.wait_for(lambda: len(stored_ids(db, [e.event_id for e in batch_a])) == 150, 60, "batch A")
        stop.set()
        sink.join(30)

        producer.publish(batch_b)  # acknowledged, then lost: the sink is down when the broker restarts
        broker.restart()
        ensure_topics(servers)  # what `prmloop broker` does when it starts

        sink, stop, _ = _sink_thread(servers, db, "sink")
        producer.publish(batch_c)  # the same producer object: it reconnected by itself
        sink_tools.wait_for(lambda: len(stored_ids(db, [e.event_id for e in batch_c])) == 150, 60, "batch C")
        assert stored_ids(db, [e.event_id for e in batch_b]) == set(), "batch B should have been lost"

        broker.restart()  # now with the sink running: it must reconnect without help
        ensure_topics(servers)
        producer.publish(batch_d)
        sink_tools.wait_for(lambda: len(stored_ids(db, [e.event_id for e in batch_d])) == 150, 90, "batch D")

        report = reconcile(servers, db, tmp_path / "outbox")
        assert report["republished"] == 150
        sink_tools.wait_for(
            lambda: len(stored_ids(db, [e.event_id for e in batch_b])) == 150, 60, "batch B re-published"
        )
        stop.set()
        sink.join(30)
        producer.close()

        again = reconcile(servers, db, tmp_path / "outbox")
    assert again["republished"] == 0
    assert again["segments_removed"] == 1  # the producer closed, everything stored: compacted
    assert segment_summary(tmp_path / "outbox")["events"] == 0
    sink_tools.assert_store_equals(db, [*batch_a, *batch_b, *batch_c, *batch_d])
