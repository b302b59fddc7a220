"""Loop metrics (store/tables/metrics.py) and consumer lag (store/kafka/lag.py) on a real DuckDB file and broker."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.structs import OffsetAndMetadata

from prmloop.consumers.sink import events_to_arrow
from prmloop.flows.lab.bench.synthetic import synthetic_events
from prmloop.store.auth.signing import sign
from prmloop.store.events import (
    LabelsAccepted,
    LabelsRejected,
    ModelRef,
    ModelRegistered,
    StepsJudged,
    StepsLabeled,
    make_event,
)
from prmloop.store.kafka.lag import consumer_lag
from prmloop.store.kafka.runtime import ConsumedEvent
from prmloop.store.tables.duck import DuckEventStore, query
from prmloop.store.tables.metrics import label_quality, loop_metrics


@pytest.fixture
def db(tmp_path: Path) -> Path:
    store = DuckEventStore(tmp_path / "prmloop.duckdb")
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
    events.append(make_event(sign(prm), producer="test"))
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


def _labeled(sid: str, first: int | None, n: int = 3) -> StepsLabeled:
    labels = tuple(first is None or t < first for t in range(n))
    return StepsLabeled(solution_id=sid, question_id="q", method="mc", labels=labels, first_error_step=first)


def _judged(sid: str, verdicts: tuple[bool | None, ...], first: int | None, method: str = "exact") -> StepsJudged:
    return StepsJudged(
        solution_id=sid,
        question_id="q",
        judge=ModelRef(backend="exact", name="checker"),
        method=method,
        verdicts=verdicts,
        first_error_step=first,
        reason=None if None not in verdicts[: first if first is not None else len(verdicts)] else "cannot tell",
    )


def _decision(sid: str, reason: str | None) -> LabelsAccepted | LabelsRejected:
    if reason is None:
        return LabelsAccepted(solution_id=sid, question_id="q", labels=(True,), source_event_ids=(), rule="r")
    return LabelsRejected(
        solution_id=sid, question_id="q", labels=(True,), source_event_ids=(), rule="r", reason=reason
    )


def test_agreement_and_acceptance_on_hand_made_labels(tmp_path: Path) -> None:
    payloads = [
        # s1: both say step 1 -> decided, agree, accepted.
        _labeled("s1", 1),
        _judged("s1", (True, False, False), 1),
        _decision("s1", None),
        # s2: both say no error -> decided, agree.
        _labeled("s2", None),
        _judged("s2", (True, True, True), None),
        _decision("s2", None),
        # s3: MC step 0, judge step 2 -> decided, disagree, rejected.
        _labeled("s3", 0),
        _judged("s3", (True, True, False), 2),
        _decision("s3", "first errors disagree: MC 0, judge 2"),
        # s4: the judge stops at step 1 -> undecided (not counted in the rate), rejected.
        _labeled("s4", 2),
        _judged("s4", (True, None, None), None),
        _decision("s4", "judge gave no verdict on step 1 (cannot tell)"),
        # s5: a critic's verdict is a method of its own; s6: a verdict without an MC label is left out.
        _labeled("s5", 1),
        _judged("s5", (True, False, False), 1, method="critic"),
        _judged("s6", (True, True, True), None),
        _decision("s6", "judge gave no verdict on step 0"),
    ]
    events = [make_event(p, producer="test") for p in payloads]
    store = DuckEventStore(tmp_path / "prmloop.duckdb")
    store.write_batch(events_to_arrow([ConsumedEvent(e, "t", 0, i, 0) for i, e in enumerate(events)]), [("t", 0, 99)])
    quality = label_quality(store.path)
    assert quality["agreement"]["exact"] == {"solutions": 4, "decided": 3, "agree": 2, "rate": pytest.approx(2 / 3)}
    assert quality["agreement"]["critic"] == {"solutions": 1, "decided": 1, "agree": 1, "rate": 1.0}
    assert quality["mc_exact_agreement"] == pytest.approx(2 / 3)
    assert (quality["accepted"], quality["rejected"]) == (2, 3)
    assert quality["acceptance_rate"] == pytest.approx(2 / 5)
    assert quality["rejections"] == {"judge gave no verdict on step k": 2, "first errors disagree: MC k, judge k": 1}
    rows = query(store.path, "SELECT solution_id, agree, decision FROM label_agreement ORDER BY 1").rows
    assert rows == [
        ("s1", True, "accepted"),
        ("s2", True, "accepted"),
        ("s3", False, "rejected"),
        ("s4", None, "rejected"),
        ("s5", True, None),
    ]
    metrics = loop_metrics(store.path)
    assert metrics["mc_exact_agreement"] == quality["mc_exact_agreement"]
    assert metrics["acceptance_rate"] == quality["acceptance_rate"]
