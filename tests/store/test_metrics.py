"""Loop metrics (store/metrics.py) and consumer lag (store/lag.py) on a real DuckDB file and broker."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.structs import OffsetAndMetadata

from prmloop.consumers.sink import events_to_arrow
from prmloop.flows.bench.synthetic import synthetic_events
from prmloop.store.consumer import ConsumedEvent
from prmloop.store.duck import EventStore, query
from prmloop.store.events import ModelRef, ModelRegistered, make_event
from prmloop.store.lag import consumer_lag
from prmloop.store.metrics import loop_metrics


@pytest.fixture
def db(tmp_path: Path) -> Path:
    store = EventStore(tmp_path / "prmloop.duckdb")
    events = synthetic_events(400, k=4, seed=3)
    prm = ModelRegistered(
        model_id="prm-1",
        kind="prm",
        base_model=ModelRef(backend="transformers", name="smollm2"),
        artifact_uri="/tmp/prm-1",
        dataset_snapshot="abc",
        train_examples=10,
        parameters={"promoted": True},
        metrics={"f1": 0.5},
    )
    events.append(make_event(prm, producer="test"))
    rows = events_to_arrow([ConsumedEvent(e, "t", 0, i, 0) for i, e in enumerate(events)])
    store.write_batch(rows, [("t", 0, len(events))])
    return store.path


def test_metrics_agree_with_the_projections(db: Path) -> None:
    m = loop_metrics(db)
    accepted = query(db, "SELECT count(*) FROM consensus WHERE decision = 'accepted'").rows[0][0]
    rejected = query(db, "SELECT count(*) FROM consensus WHERE decision = 'rejected'").rows[0][0]
    tokens = query(db, "SELECT sum(generated_tokens) FROM cost_ledger").rows[0][0]
    assert accepted > 0 and (m["accepted"], m["rejected"]) == (accepted, rejected)
    assert m["acceptance_rate"] == pytest.approx(accepted / (accepted + rejected))
    assert m["tokens_per_accepted_label"] == pytest.approx(tokens / accepted)
    recent = (
        "SELECT count(*) FROM events WHERE event_type = 'SolutionSampled' "
        "AND occurred_at >= (SELECT max(occurred_at) FROM events) - INTERVAL 24 HOUR"
    )
    assert sum(row["solutions"] for row in m["per_hour"]) == query(db, recent).rows[0][0]
    assert m["current_prm"]["model_id"] == "prm-1" and m["current_prm"]["metrics"] == {"f1": 0.5}
    assert m["calibration"] is None


def test_lag_counts_what_a_group_has_not_committed(kafka_bootstrap: str) -> None:
    topic, group = f"lag-{time.time_ns()}", f"g-{time.time_ns()}"
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    for _i in range(10):
        producer.send(topic, b"x", partition=0).get(timeout=30)  # one record per batch: exact end offsets
    producer.close()
    consumer = KafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id=group, enable_auto_commit=False)
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.commit({tp: OffsetAndMetadata(4, "", -1)})
    consumer.close()
    result = consumer_lag(kafka_bootstrap, [group], topics=[topic])
    assert result["lag"][group] == {topic: 6}
