"""Publishing fails fast for an event that can never be delivered, and such an event never enters
the outbox; reconcile skips (and reports) undeliverable entries of an old outbox instead of failing."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from prmloop.store.events import Envelope, QuestionRegistered, make_event
from prmloop.store.events.codec import EventTooLarge, UndeliverableEvent
from prmloop.store.events.limits import event_limits
from prmloop.store.kafka.outbox import Outbox, scan_segment, segment_summary, segments
from prmloop.store.kafka.producer import EventProducer
from prmloop.store.kafka.reconcile import reconcile


def question(problem: str, qid: str | None = None) -> Envelope:
    return make_event(
        QuestionRegistered(question_id=qid or f"q-{uuid.uuid4().hex[:8]}", dataset="d", problem=problem),
        producer="t",
    )


def test_an_oversized_question_fails_at_once_and_leaves_no_trace(kafka_bootstrap: str, tmp_path: Path) -> None:
    big = question("x" * 10_000_000)
    fine = question("2+2?")
    outbox = Outbox(tmp_path / "outbox", "test")
    with EventProducer(kafka_bootstrap, outbox=outbox, timeout_s=60) as producer:
        t0 = time.monotonic()
        with pytest.raises(EventTooLarge) as info:
            producer.publish([fine, big])
        assert time.monotonic() - t0 < 5  # not retried as if the broker were down
        assert "Is the broker up" not in str(info.value)
        assert str(big.event_id) in str(info.value) and "limit" in str(info.value)
        assert segment_summary(tmp_path / "outbox")["events"] == 0  # the whole batch: nothing
        assert producer.publish([fine]) == 1
    assert [e.event_id for e in scan_segment(segments(tmp_path / "outbox")[0]).events] == [fine.event_id]


def test_reconcile_skips_and_reports_undeliverable_entries_of_an_old_outbox(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """An outbox written before the limits existed: a 10 MB question between two ordinary ones, a
    torn last line, and an event the broker refused (marked by the producer)."""
    outbox_dir = tmp_path / "outbox"
    outbox_dir.mkdir()
    ok_a, ok_b, refused = question("a"), question("b"), question("c")
    big_line = question("y").model_dump_json().replace('"y"', '"' + "y" * 10_000_000 + '"').encode()
    old = outbox_dir / "sample-1-1.closed.jsonl"
    old.write_bytes(
        ok_a.model_dump_json().encode() + b"\n" + big_line + b"\n" + ok_b.model_dump_json().encode() + b"\n"
    )
    marked = Outbox(outbox_dir, "annotator")
    marked.append([refused])
    marked.mark_undeliverable([refused.event_id], "the broker refused it: MessageSizeTooLargeError")
    marked.close()
    with open(old, "ab") as fh:
        fh.write(b'{"event_id": "torn')

    db = tmp_path / "none.duckdb"  # nothing stored yet
    t0 = time.monotonic()
    report = reconcile(kafka_bootstrap, db, outbox_dir)
    assert time.monotonic() - t0 < 30
    assert report["republished"] == 2
    assert report["undeliverable"] == 3  # the 10 MB line, the torn line, the refused event
    text = " ".join(report["undeliverable_examples"])
    assert "4,194,304" in text and str(refused.event_id) in text and "MessageSizeTooLargeError" in text
    assert report["segments_removed"] == 1  # the annotator's: its only event is undeliverable

    again = reconcile(kafka_bootstrap, db, outbox_dir)
    assert again["republished"] == 2  # the sink is not running: still missing, published again
    assert again["undeliverable"] == 2


def test_an_undeliverable_event_is_a_value_error_for_the_command_line() -> None:
    assert issubclass(UndeliverableEvent, ValueError)


@pytest.fixture
def raised_event_limit(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """An event limit above what the producer may send, so the refusal comes from Kafka's side."""
    monkeypatch.setenv("PRMLOOP_MAX_EVENT_BYTES", str(64 * 1024 * 1024))
    event_limits.cache_clear()
    yield
    monkeypatch.delenv("PRMLOOP_MAX_EVENT_BYTES")
    event_limits.cache_clear()


@pytest.mark.usefixtures("raised_event_limit")
def test_an_event_kafka_refuses_is_not_retried_and_reconcile_skips_it(kafka_bootstrap: str, tmp_path: Path) -> None:
    big = question("z" * 10_000_000)
    outbox = Outbox(tmp_path / "outbox", "test")
    with EventProducer(kafka_bootstrap, outbox=outbox, timeout_s=60) as producer:
        t0 = time.monotonic()
        with pytest.raises(EventTooLarge, match="refused") as info:
            producer.publish([big])
        assert time.monotonic() - t0 < 10
        assert info.value.event_ids == (big.event_id,)
    scan = scan_segment(segments(tmp_path / "outbox")[0])
    assert scan.events == [] and scan.undeliverable_ids == {big.event_id}
    report = reconcile(kafka_bootstrap, tmp_path / "none.duckdb", tmp_path / "outbox")
    assert report["republished"] == 0 and report["undeliverable"] == 1 and report["segments_removed"] == 1
