"""The DuckDB store's guards: conflicting duplicates are recorded (deterministically, in the batch's
transaction), store_health counts them, query errors are one line, EXPLAIN only of reads."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from prmloop.consumers.sink import events_to_arrow
from prmloop.store.events import Envelope, QuestionRegistered, make_event
from prmloop.store.events.codec import encode_event
from prmloop.store.kafka.runtime import ConsumedEvent
from prmloop.store.tables.duck import (
    DuckEventStore,
    QueryError,
    ReadOnlyViolation,
    query,
    store_health,
)
from prmloop.store.tables.sql_guard import check_read_only


def question(qid: str, problem: str = "2+2?", event_id: uuid.UUID | None = None) -> Envelope:
    return make_event(
        QuestionRegistered(question_id=qid, dataset="d", problem=problem), producer="t", event_id=event_id
    )


def at(event: Envelope, topic: str, partition: int, offset: int) -> ConsumedEvent:
    return ConsumedEvent(event, topic, partition, offset, 0, encode_event(event))


@pytest.fixture
def store(tmp_path: Path) -> DuckEventStore:
    return DuckEventStore(tmp_path / "prmloop.duckdb")


def write(store: DuckEventStore, batch: list[ConsumedEvent]) -> tuple[int, int]:
    result = store.write_batch(events_to_arrow(batch), [(c.topic, c.partition, c.offset + 1) for c in batch])
    return result.inserted, result.conflicts


def test_a_conflicting_duplicate_is_recorded_and_the_stored_version_kept(store: DuckEventStore) -> None:
    eid = uuid.uuid4()
    first, other = question("q1", "first", eid), question("q1", "second", eid)
    assert write(store, [at(first, "questions.registered", 0, 5)]) == (1, 0)
    assert write(store, [at(first, "questions.registered", 0, 5)]) == (0, 0)  # a redelivery: harmless
    assert write(store, [at(other, "questions.registered", 1, 9)]) == (0, 1)
    assert write(store, [at(other, "questions.registered", 1, 9)]) == (0, 0)  # the same conflict, once
    rows = query(store.path, "SELECT event_id, kafka_partition, kafka_offset, body, stored_offset FROM conflicts").rows
    assert len(rows) == 1
    assert rows[0][0] == eid and rows[0][1:3] == (1, 9) and rows[0][4] == 5
    assert json.loads(rows[0][3])["payload"]["problem"] == "second"
    assert query(store.path, "SELECT problem FROM questions").rows == [("first",)]


def test_within_a_batch_the_first_by_topic_partition_offset_wins_whatever_the_arrival_order(
    tmp_path: Path,
) -> None:
    eid = uuid.uuid4()
    a, b = question("q2", "from partition 0", eid), question("q2", "from partition 3", eid)
    # Arrival order differs between the two stores; the outcome must not.
    for name, batch in (
        ("one", [at(b, "questions.registered", 3, 1), at(a, "questions.registered", 0, 7)]),
        ("two", [at(a, "questions.registered", 0, 7), at(b, "questions.registered", 3, 1)]),
    ):
        store = DuckEventStore(tmp_path / f"{name}.duckdb")
        assert write(store, batch) == (1, 1)
        assert query(store.path, "SELECT problem FROM questions").rows == [("from partition 0",)]
        assert query(store.path, "SELECT kafka_partition FROM conflicts").rows == [(3,)]


def test_equal_content_under_one_id_in_a_batch_is_no_conflict(store: DuckEventStore) -> None:
    e = question("q3")
    assert write(store, [at(e, "questions.registered", p, 1) for p in range(4)]) == (1, 0)


def test_store_health_counts_events_and_conflicts(store: DuckEventStore) -> None:
    eid = uuid.uuid4()
    write(
        store,
        [at(question("q4", "x", eid), "questions.registered", 0, 0), at(question("q5"), "questions.registered", 0, 1)],
    )
    write(store, [at(question("q4", "y", eid), "questions.registered", 0, 2)])
    health = store_health(store.path)
    assert health["events"] == 2
    assert health["events_per_topic"] == {"questions.registered": 2}
    assert health["events_per_type"] == {"QuestionRegistered": 2}
    assert health["conflicts"] == 1 and health["conflicting_events"] == 1
    assert health["last_ingested_at"] is not None


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("SELECT * FROM no_such_table", "no_such_table"),
        ("SELECT CAST('x' AS INTEGER)", "Conversion"),
        ("SELECT 1; SELECT nope FROM events", "statement 2"),
    ],
)
def test_a_failing_query_is_one_line_naming_the_problem(store: DuckEventStore, sql: str, expected: str) -> None:
    with pytest.raises(QueryError) as info:
        query(store.path, sql)
    message = str(info.value)
    assert "\n" not in message and expected in message and "^^^" not in message
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    "sql",
    [
        "EXPLAIN ANALYZE CREATE TEMP TABLE t AS SELECT 1",
        "explain analyze insert into events select * from events",
        "/* hidden */ EXPLAIN ANALYZE CREATE TEMP TABLE t AS SELECT 1",
        "EXPLAIN (FORMAT json) CREATE TEMP TABLE t (a INT)",
        "SELECT 1; EXPLAIN ANALYZE COPY (SELECT 1) TO '/tmp/x.csv'",
    ],
)
def test_explain_of_anything_but_a_read_is_refused(store: DuckEventStore, sql: str) -> None:
    with pytest.raises(ReadOnlyViolation, match="EXPLAIN"):
        check_read_only(sql)
    with pytest.raises(ReadOnlyViolation):
        query(store.path, sql)


@pytest.mark.parametrize(
    "sql", ["EXPLAIN SELECT 1", "EXPLAIN ANALYZE SELECT count(*) FROM events", "EXPLAIN FROM events"]
)
def test_explain_of_a_read_still_works(store: DuckEventStore, sql: str) -> None:
    assert query(store.path, sql).rows


def test_conflicts_is_queryable_like_any_table(store: DuckEventStore) -> None:
    assert query(store.path, "SELECT count(*) FROM conflicts").rows == [(0,)]
