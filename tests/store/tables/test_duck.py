"""The DuckDB store: idempotent batches, projections over label history, read-only SQL."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import pytest

from prmloop.consumers.sink import events_to_arrow
from prmloop.flows.lab.bench.synthetic import synthetic_events
from prmloop.store.events import (
    Envelope,
    LabelsAccepted,
    ModelRef,
    QuestionRegistered,
    SamplingSpec,
    SolutionSampled,
    StepsJudged,
    StepsLabeled,
    deterministic_event_id,
    make_event,
)
from prmloop.store.events.codec import encode_event
from prmloop.store.kafka.runtime import ConsumedEvent
from prmloop.store.tables.duck import (
    DuckEventStore,
    QueryError,
    ReadOnlyViolation,
    StoreLocked,
    open_reader,
    open_writer,
    query,
    store_health,
)
from prmloop.store.tables.lake import LakeEventStore, open_lake
from prmloop.store.tables.published import snapshot_files
from prmloop.store.tables.sql_guard import check_read_only
from prmloop.store.tables.writer import EventStore

T0 = datetime(2026, 5, 1, tzinfo=UTC)


def consumed(events: list[Envelope], topic: str = "t", partition: int = 0) -> list[ConsumedEvent]:
    return [ConsumedEvent(e, topic, partition, i, 0) for i, e in enumerate(events)]


def write(store: EventStore, events: list[Envelope]) -> int:
    return store.write_batch(events_to_arrow(consumed(events)), [("t", 0, len(events))]).inserted


@pytest.fixture(params=["duckdb", "ducklake"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[EventStore]:
    """The same tests on both stores: the DuckDB file and a DuckLake with a PostgreSQL catalog."""
    if request.param == "duckdb":
        yield DuckEventStore(tmp_path / "prmloop.duckdb")
        return
    writer = open_writer(request.getfixturevalue("lake_store"))
    assert isinstance(writer, LakeEventStore)
    yield writer
    writer.close()


@pytest.fixture
def duck_store(tmp_path: Path) -> DuckEventStore:
    """The DuckDB file only: its single-writer lock is what these tests are about."""
    return DuckEventStore(tmp_path / "prmloop.duckdb")


def test_a_batch_written_twice_is_stored_once(store: EventStore) -> None:
    events = synthetic_events(200, k=2)
    assert write(store, events) == 200
    assert write(store, events) == 0
    assert write(store, events[:50] + events[:50]) == 0
    rows = query(store.location, "SELECT count(*), count(DISTINCT event_id) FROM events").rows
    assert rows == [(200, 200)]


def test_duplicates_inside_one_batch_are_stored_once(store: EventStore) -> None:
    events = synthetic_events(10, k=1)
    assert write(store, events + events) == 10


def test_consumed_offsets_are_recorded_with_the_batch(store: EventStore) -> None:
    events = synthetic_events(5, k=1)
    store.write_batch(events_to_arrow(consumed(events, "solutions.sampled", 2)), [("solutions.sampled", 2, 42)])
    store.write_batch(events_to_arrow(consumed(events, "solutions.sampled", 2)), [("solutions.sampled", 2, 47)])
    rows = query(store.location, "SELECT topic, kafka_partition, next_offset FROM sink_offsets").rows
    assert rows == [("solutions.sampled", 2, 47)]


def test_the_same_fact_from_another_producer_is_a_redelivery_not_a_conflict(
    store: EventStore,
) -> None:
    """What `make demo` does: `sample` and `prioritize` both register a question under its
    deterministic id; only the envelope's producer, time and cause differ."""
    fact = QuestionRegistered(question_id="q7", dataset="d", problem="2+2?")
    eid = deterministic_event_id("QuestionRegistered", "d", "q7")
    by_sample = make_event(fact, producer="prmloop-sample/0.1.0", event_id=eid, occurred_at=T0)
    by_prioritize = make_event(
        fact,
        producer="prmloop-prioritize/0.1.0",
        event_id=eid,
        occurred_at=T0 + timedelta(minutes=3),
        causation_id=uuid.uuid4(),
    )
    changed = make_event(fact.model_copy(update={"problem": "2+3?"}), producer="x", event_id=eid, occurred_at=T0)
    assert write(store, [by_sample]) == 1
    again = store.write_batch(events_to_arrow(consumed([by_prioritize])), [("t", 0, 1)])
    within = store.write_batch(events_to_arrow(consumed([by_prioritize, by_sample, by_prioritize])), [("t", 0, 3)])
    assert (again.inserted, again.conflicts, within.inserted, within.conflicts) == (0, 0, 0, 0)
    assert query(store.location, "SELECT count(*) FROM conflicts").rows == [(0,)]
    assert store_health(store.location)["conflicts"] == 0
    other = store.write_batch(events_to_arrow(consumed([changed])), [("t", 0, 4)])
    assert (other.inserted, other.conflicts) == (0, 1)  # another fact under the same id still is one
    assert query(store.location, "SELECT producer, payload->>'problem' FROM events").rows == [
        ("prmloop-sample/0.1.0", "2+2?")
    ]


def test_conflict_rows_an_older_sink_kept_for_a_mere_redelivery_are_dropped_at_start(
    store: EventStore,
) -> None:
    """Stores written before a redelivery stopped counting as a conflict hold such rows: the next
    writer to open the store removes them (and only them)."""
    fact = QuestionRegistered(question_id="q8", dataset="d", problem="1+1?")
    eid = deterministic_event_id("QuestionRegistered", "d", "q8")
    first = make_event(fact, producer="prmloop-sample/0.1.0", event_id=eid, occurred_at=T0)
    redelivered = make_event(fact, producer="prmloop-prioritize/0.1.0", event_id=eid, occurred_at=T0 + timedelta(1))
    changed = make_event(fact.model_copy(update={"problem": "1+2?"}), producer="x", event_id=eid, occurred_at=T0)
    assert write(store, [first]) == 1
    rows = [
        (eid, "QuestionRegistered", "questions.registered", 0, i + 1, encode_event(e).decode(), f"old-{i}", "s", T0)
        for i, e in enumerate([redelivered, changed])
    ]
    insert = (
        "INSERT INTO conflicts (event_id, event_type, topic, kafka_partition, kafka_offset, body, body_sha256, "
        "stored_sha256, detected_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
    )
    if isinstance(store, DuckEventStore):
        with duckdb.connect(str(store.path)) as con:
            con.executemany(insert, rows)
        reopened: EventStore = DuckEventStore(store.path)
    else:
        with open_lake(store.location, read_only=False) as con:
            con.executemany(insert, rows)
        reopened = open_writer(store.location)
    reopened.close()
    left = query(store.location, "SELECT body_sha256, body->'payload'->>'problem' FROM conflicts").rows
    assert left == [("old-1", "1+2?")]


def _solution(sid: str, n_steps: int = 3) -> Envelope:
    payload = SolutionSampled(
        solution_id=sid,
        question_id="q",
        generator=ModelRef(backend="transformers", name="tiny"),
        sampling=SamplingSpec(),
        prompt_format="step_k",
        text="...",
        steps=tuple(f"Step {i + 1}" for i in range(n_steps)),
        final_answer="3",
        correct=False,
    )
    return make_event(payload, producer="t", occurred_at=T0)


def _labeled(sid: str, labels: tuple[bool, ...], method: str, minutes: int) -> Envelope:
    first = labels.index(False) if False in labels else None
    payload = StepsLabeled(solution_id=sid, question_id="q", method=method, labels=labels, first_error_step=first)
    return make_event(payload, producer="t", occurred_at=T0 + timedelta(minutes=minutes))


def test_steps_view_unnests_solution_steps_in_order(store: EventStore) -> None:
    write(store, [_solution("s1", 3)])
    rows = query(store.location, "SELECT step_index, text FROM steps WHERE solution_id = 's1' ORDER BY step_index").rows
    assert rows == [(0, "Step 1"), (1, "Step 2"), (2, "Step 3")]


def test_a_newer_label_supersedes_an_older_one_whatever_the_arrival_order(store: EventStore) -> None:
    newer = _labeled("s1", (True, True, False), "adaptive_binary", minutes=10)
    older = _labeled("s1", (True, False, False), "sequential", minutes=1)
    write(store, [_solution("s1"), newer])
    write(store, [older])  # arrives last, happened first
    current = query(
        store.location, "SELECT step_index, label, method, n_versions FROM current_labels ORDER BY step_index"
    ).rows
    assert current == [
        (0, True, "adaptive_binary", 2),
        (1, True, "adaptive_binary", 2),
        (2, False, "adaptive_binary", 2),
    ]
    history = query(store.location, "SELECT count(*) FROM label_history WHERE solution_id = 's1'").rows
    assert history == [(6,)]


def test_consensus_beats_annotation_and_annotation_beats_the_judge(store: EventStore) -> None:
    labeled = _labeled("s1", (True, False), "sequential", minutes=1)
    judged = make_event(
        StepsJudged(
            solution_id="s1", question_id="q", judge=ModelRef(backend="openai", name="judge"), verdicts=(False, None)
        ),
        producer="t",
        occurred_at=T0 + timedelta(minutes=5),
    )
    write(store, [labeled, judged])
    assert query(store.location, "SELECT source FROM current_labels WHERE step_index = 0").rows == [("StepsLabeled",)]
    accepted = make_event(
        LabelsAccepted(
            solution_id="s1", question_id="q", labels=(True, True), source_event_ids=(labeled.event_id,), rule="agree"
        ),
        producer="t",
        occurred_at=T0 + timedelta(minutes=2),
    )
    write(store, [accepted])
    rows = query(store.location, "SELECT step_index, label, source FROM current_labels ORDER BY step_index").rows
    assert rows == [(0, True, "LabelsAccepted"), (1, True, "LabelsAccepted")]


def test_cost_ledger_sums_what_labels_cost(store: EventStore) -> None:
    write(store, synthetic_events(300, k=4))
    total = query(store.location, "SELECT sum(rollouts) FROM cost_ledger").rows[0][0]
    expected = query(
        store.location,
        "SELECT sum(CAST(payload->'cost'->>'rollouts' AS BIGINT)) FROM events WHERE event_type = 'StepsLabeled'",
    ).rows[0][0]
    assert total == expected > 0


@pytest.mark.parametrize(
    "sql",
    [
        "INSERT INTO events SELECT * FROM events",
        "DELETE FROM events",
        "UPDATE events SET producer = 'x'",
        "CREATE TABLE x AS SELECT 1",
        "DROP VIEW steps",
        "COPY events TO '/tmp/out.csv'",
        "ATTACH '/tmp/other.duckdb' AS other",
        "SET enable_external_access = true",
        "PRAGMA enable_profiling",
        "CALL checkpoint()",
        "INSTALL httpfs",
        "LOAD httpfs",
        "EXPORT DATABASE '/tmp/dump'",
        "SELECT 1; DELETE FROM events",
        "",
    ],
)
def test_statements_that_write_attach_or_copy_are_refused(sql: str) -> None:
    with pytest.raises(ReadOnlyViolation):
        check_read_only(sql)


def test_reading_files_from_a_select_is_blocked(store: EventStore, tmp_path: Path) -> None:
    secret = tmp_path / "secret.csv"
    secret.write_text("a\n1\n")
    with pytest.raises(QueryError, match=r"(?i)external access|permission"):
        query(store.location, f"SELECT * FROM read_csv('{secret}')")


def test_a_reader_reads_while_the_writer_holds_the_file(duck_store: DuckEventStore) -> None:
    """Readers read the writer's published snapshot, never its file: a writer holding the file (a batch
    being written) holds no reader up, and no reader holds the writer up (issue 54)."""
    held = threading.Event()
    release = threading.Event()

    def hold() -> None:
        con = duckdb.connect(str(duck_store.path))
        held.set()
        release.wait(30)
        con.close()

    t = threading.Thread(target=hold)
    t.start()
    held.wait(5)
    try:
        result = query(duck_store.path, "SELECT count(*) FROM events", timeout_s=20)
        assert not release.is_set()  # answered while the file was still held
    finally:
        release.set()
        t.join()
    assert result.rows == [(0,)]


def test_a_reader_gives_up_with_a_clear_error_when_the_lock_persists(duck_store: DuckEventStore) -> None:
    """With no snapshot to read (removed here), the reader must copy the file, and waits for the lock."""
    for copy in snapshot_files(duck_store.path):
        copy.unlink()
    duck_store.path.with_name(duck_store.path.name + ".snapshot.json").unlink()
    con = duckdb.connect(str(duck_store.path))
    try:
        started = time.monotonic()
        with pytest.raises(StoreLocked, match=r"stayed locked|no read snapshot"):
            query(duck_store.path, "SELECT 1", timeout_s=1.5)
        assert time.monotonic() - started < 10
    finally:
        con.close()


def test_a_second_reader_in_the_process_reads_while_the_first_holds_the_locked_configuration(
    duck_store: DuckEventStore,
) -> None:
    """Connections of one process to one file share the database's settings: once the first reader
    locked them, the second can no longer switch its progress bar off (CI saw that error from
    test_event_bounds). It must still open, read, and stay locked."""
    duck_store.close()
    with open_reader(duck_store.path) as (first, _), open_reader(duck_store.path) as (second, _):
        assert second.execute("SELECT count(*) FROM events").fetchall() == [(0,)]
        assert first.execute("SELECT count(*) FROM events").fetchall() == [(0,)]
        with pytest.raises(duckdb.InvalidInputException, match="locked"):
            second.execute("SET enable_external_access = true")


def test_querying_a_missing_store_says_how_to_create_it(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="prmloop sink"):
        query(tmp_path / "none.duckdb", "SELECT 1")
