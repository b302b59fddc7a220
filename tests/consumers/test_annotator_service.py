"""The annotator as a running service (`prmloop annotate`) on a real broker, under faults:
killed in the middle of a solution and restarted; two processes sharing one consumer group."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import pytest
from kafka import KafkaConsumer, TopicPartition
from pydantic import ValidationError

from prmloop.consumers.annotator import Annotator
from prmloop.consumers.annotator_settings import AnnotatorSettings
from prmloop.flows.lab.bench.annotator import scored_simulated_events
from prmloop.models.annotation.completer import Rollout
from prmloop.models.annotation.strategies import AdaptiveBinarySearch
from prmloop.models.simulator import SimulatedCompleter, SimulatedSolution, simulate_solutions
from prmloop.producers.simulated import SIMULATOR_REF, simulated_solution_id
from prmloop.store.events import Envelope, StepsLabeled, StepsScored
from prmloop.store.events.codec import decode_stored_form, encode_event
from prmloop.store.events.topics import TopicSpec, dlq_topic
from prmloop.store.kafka.producer import EventProducer, ensure_topics
from prmloop.store.kafka.runtime import ConsumedEvent


def publish_world(servers: str, n: int, seed: int, partitions: int = 4) -> tuple[str, list[SimulatedSolution]]:
    """The simulated solutions, scored as the step scorer scores them, on a private topic."""
    topic = f"test-annotate-{uuid.uuid4().hex[:8]}"
    ensure_topics(servers)
    ensure_topics(servers, [TopicSpec(topic, partitions), TopicSpec(dlq_topic(topic), 1)])
    solutions = simulate_solutions(n, seed=seed)
    _, scored = scored_simulated_events(solutions, seed)
    with EventProducer(servers) as producer:
        for e in scored:
            producer.send_raw(topic, e.correlation_id.encode(), encode_event(e), [])
    return topic, solutions


def annotator(
    servers: str, topic: str, group: str, world: tuple[int, int], home: Path, *extra: str
) -> subprocess.Popen[str]:
    """`prmloop annotate` on the simulated world ``(n, seed)`` reading ``topic``."""
    n, seed = world
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": servers, "PRMLOOP_HOME": str(home)}
    command = [sys.executable, "-m", "prmloop.flows.cli", "annotate", "--completer", "simulator"]
    command += ["--sim-n", str(n), "--sim-seed", str(seed), "--topic", topic, "--group", group, *extra]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def labels_of(servers: str, solution_ids: set[str]) -> dict[str, list[Envelope]]:
    """Every StepsLabeled event on `steps.labeled` for ``solution_ids``, in log order per partition."""
    consumer = KafkaConsumer(bootstrap_servers=servers, enable_auto_commit=False)
    try:
        partitions = [TopicPartition(StepsLabeled.TOPIC, p) for p in consumer.partitions_for_topic(StepsLabeled.TOPIC)]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        end = consumer.end_offsets(partitions)
        out: dict[str, list[Envelope]] = defaultdict(list)
        while any(consumer.position(tp) < end[tp] for tp in partitions):
            for records in consumer.poll(timeout_ms=500).values():
                for record in records:
                    event, _ = decode_stored_form(record.value)
                    if isinstance(event.payload, StepsLabeled) and event.payload.solution_id in solution_ids:
                        out[event.payload.solution_id].append(event)
        return out
    finally:
        consumer.close()


def wait_for_labels(servers: str, ids: set[str], at_least: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while len(labels_of(servers, ids)) < at_least:
        assert time.monotonic() < deadline, f"fewer than {at_least} solutions labelled after {timeout_s}s"
        time.sleep(0.5)


def summary_of(proc: subprocess.Popen[str], timeout_s: float) -> dict[str, object]:
    out, errors = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 0, errors
    return json.loads(out.strip().splitlines()[-1])


def test_a_killed_annotator_labels_each_solution_once_after_restart(kafka_bootstrap: str, tmp_path: Path) -> None:
    n, seed = 12, 9001
    topic, solutions = publish_world(kafka_bootstrap, n, seed)
    ids = {simulated_solution_id(seed, i) for i in range(n)}
    group = f"annotator-{topic}"
    first = annotator(kafka_bootstrap, topic, group, (n, seed), tmp_path, "--sim-latency", "0.08")
    try:
        wait_for_labels(kafka_bootstrap, ids, at_least=3, timeout_s=120)
    finally:
        first.send_signal(signal.SIGKILL)
        _, errors = first.communicate(timeout=30)
        print(errors)  # shown when the test fails
    partial = labels_of(kafka_bootstrap, ids)
    assert 3 <= len(partial) < n, "the kill should land in the middle of the stream"

    second = annotator(kafka_bootstrap, topic, group, (n, seed), tmp_path, "--until-idle", "4")
    summary = summary_of(second, timeout_s=180)
    labels = labels_of(kafka_bootstrap, ids)
    assert set(labels) == ids, f"unlabelled: {sorted(ids - set(labels))}"
    for solution_id, events in labels.items():
        assert len({e.event_id for e in events}) == 1, f"{solution_id} got different labels: {events}"
    # The restart did not redo what was committed: at most the batch in hand when killed is repeated.
    assert int(summary["published"]) <= n - len(partial) + 1  # type: ignore[call-overload]
    truth = {simulated_solution_id(seed, i): s.first_error_step for i, s in enumerate(solutions)}
    hits = sum(labels[k][0].payload.first_error_step == v for k, v in truth.items())  # type: ignore[union-attr]
    assert hits >= n - 2  # adaptive binary search is ~97% accurate on the default simulator


def test_two_annotators_in_one_group_share_the_work(kafka_bootstrap: str, tmp_path: Path) -> None:
    n, seed = 24, 9002
    topic, _ = publish_world(kafka_bootstrap, n, seed)
    ids = {simulated_solution_id(seed, i) for i in range(n)}
    group = f"annotator-{topic}"
    extra = ("--sim-latency", "0.1", "--until-idle", "5")
    procs = [annotator(kafka_bootstrap, topic, group, (n, seed), tmp_path, *extra) for _ in range(2)]
    summaries = [summary_of(p, timeout_s=240) for p in procs]
    labels = labels_of(kafka_bootstrap, ids)
    assert set(labels) == ids
    for solution_id, events in labels.items():
        assert len({e.event_id for e in events}) == 1, f"{solution_id} got different labels"
    published = [int(s["published"]) for s in summaries]  # type: ignore[call-overload]
    assert all(p > 0 for p in published), f"one process did no work: {summaries}"
    assert sum(published) >= n


def test_solutions_in_flight_get_the_labels_they_get_one_at_a_time() -> None:
    solutions = simulate_solutions(8, seed=77)
    _, events = scored_simulated_events(solutions, 77)
    assert all(isinstance(e.payload, StepsScored) for e in events)
    batch = [ConsumedEvent(e, StepsScored.TOPIC, 0, i, 0) for i, e in enumerate(events)]
    results = []
    for in_flight in (1, 4):
        published: list[list[Envelope]] = []
        handler = Annotator(
            AdaptiveBinarySearch(),
            [SimulatedCompleter(solutions, seed=77)],
            [SIMULATOR_REF],
            published.append,
            max_in_flight=in_flight,
        )
        assert list(handler(batch)) == []
        handler.close()
        # one publish of the batch one at a time; in flight, one per solution as its search ends
        assert [len(events) for events in published] == ([8] if in_flight == 1 else [1] * 8)
        out = [e for events in published for e in events]
        labels = {e.payload.solution_id: e.payload.model_dump() for e in out}  # type: ignore[union-attr]
        for label in labels.values():
            label["cost"].pop("wall_time_s")  # the only field allowed to differ
        results.append(labels)
    assert results[0] == results[1]
    assert len(results[0]) == 8


def test_searches_started_ahead_give_the_same_labels_for_the_same_rollouts() -> None:
    """``look_ahead`` starts the next batch's searches early; that batch then publishes exactly the labels
    it publishes without, asking the completer no rollout more. A look-ahead of records the next batch
    does not bring is dropped, and those solutions are searched anew (and labelled) when they come."""
    solutions = simulate_solutions(8, seed=78)
    _, events = scored_simulated_events(solutions, 78)
    batch = [ConsumedEvent(e, StepsScored.TOPIC, 0, i, 0) for i, e in enumerate(events)]
    costly = sum(not e.payload.correct for e in events)  # type: ignore[union-attr]
    assert costly > 0

    class Counting(SimulatedCompleter):
        calls = 0

        def complete(self, question: str, steps: Sequence[str], n: int) -> list[Rollout]:
            with lock:
                Counting.calls += 1
            return super().complete(question, steps, n)

    lock = threading.Lock()
    results = []
    for ahead in (False, True, "dropped"):
        Counting.calls = 0
        published: list[list[Envelope]] = []
        handler = Annotator(
            AdaptiveBinarySearch(), [Counting(solutions, seed=78)], [SIMULATOR_REF], published.append, max_in_flight=3
        )
        if ahead:
            handler.look_ahead(batch[:4] if ahead == "dropped" else batch)
        assert list(handler(batch[4:] if ahead == "dropped" else batch)) == []
        if ahead == "dropped":
            assert list(handler(batch[:4])) == []  # its look-ahead was dropped: searched anew
        handler.close()
        started_ahead = handler.stats.counts["started_ahead"]
        assert started_ahead == (costly if ahead is True else 0), handler.stats.counts
        labels = {e.payload.solution_id: e.payload.model_dump() for events in published for e in events}  # type: ignore[union-attr]
        for label in labels.values():
            label["cost"].pop("wall_time_s")
        results.append((labels, Counting.calls))
    assert results[0][0] == results[1][0] and len(results[0][0]) == 8
    # the simulator draws each prefix's rollouts in turn, so a dropped search that ran leaves other draws
    assert set(results[2][0]) == set(results[0][0])
    assert results[0][1] == results[1][1] > 0  # not one rollout repeated or added


def test_a_batch_larger_than_the_searches_in_flight_is_taken_at_once_and_labelled_once(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """``--batch`` hands the annotator more solutions than it searches at once, so a search that ends
    makes room for the next (issue 55: the loop's engine saw three requests in flight); without it a
    batch is ``--in-flight`` solutions. Either way each solution is labelled once."""
    n = 12
    for seed, batch, largest in ((9003, ("--batch", "6"), 6), (9004, (), 2)):
        topic, _ = publish_world(kafka_bootstrap, n, seed, partitions=1)  # all waiting before it starts
        ids = {simulated_solution_id(seed, i) for i in range(n)}
        extra = ("--in-flight", "2", *batch, "--until-idle", "4")
        summary = summary_of(annotator(kafka_bootstrap, topic, f"annotator-{topic}", (n, seed), tmp_path, *extra), 180)
        assert summary["largest_batch"] == largest, summary
        labels = labels_of(kafka_bootstrap, ids)
        assert set(labels) == ids
        assert all(len({e.event_id for e in events}) == 1 for events in labels.values())
    with pytest.raises(ValidationError, match=r"batch \(1\) must be at least in_flight \(2\)"):
        AnnotatorSettings(in_flight=2, batch=1)
