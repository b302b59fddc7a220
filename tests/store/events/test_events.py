"""The event envelope, payload schemas, upcasting and the wire codec."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import ValidationError

from prmloop.flows.lab.bench.synthetic import synthetic_events
from prmloop.store.events import (
    QuestionRegistered,
    StepsLabeled,
    UnknownFieldError,
    codec,
    deterministic_event_id,
    make_event,
)
from prmloop.store.events.codec import (
    DecodeError,
    UnknownSchemaVersion,
    decode_event,
    decode_stored_form,
    encode_event,
    upcaster,
)
from prmloop.store.events.topics import EVENT_TOPICS, TOPIC_OF


def _question(**extra: Any) -> QuestionRegistered:
    return QuestionRegistered(question_id="q1", dataset="gsm8k", problem="1+1?", gold_answer="2", **extra)


def test_every_event_type_round_trips_through_json() -> None:
    stream = synthetic_events(60, k=2)
    assert {e.event_type for e in stream} >= {"QuestionRegistered", "SolutionSampled", "StepsLabeled"}
    for event in stream:
        assert decode_event(encode_event(event)) == event


def test_every_event_type_has_its_own_topic() -> None:
    assert len(TOPIC_OF) == 11
    assert len(set(TOPIC_OF.values())) == len(EVENT_TOPICS) == 11
    assert TOPIC_OF["SolutionSelected"] == "steps.selected"


def test_envelope_is_frozen() -> None:
    event = make_event(_question(), producer="t/1")
    with pytest.raises(ValidationError):
        event.producer = "other"  # type: ignore[misc]


def test_producer_may_not_set_an_unknown_field() -> None:
    with pytest.raises(UnknownFieldError, match="difficulty"):
        make_event(_question(difficulty=3), producer="t/1")


def test_producer_may_not_set_an_unknown_nested_field() -> None:
    labeled = StepsLabeled(
        solution_id="s",
        question_id="q",
        method="sequential",
        labels=(True, False),
        first_error_step=1,
        cost={"rollouts": 3, "gpu_hours": 1.0},  # type: ignore[arg-type]
    )
    with pytest.raises(UnknownFieldError, match=r"cost\.gpu_hours"):
        make_event(labeled, producer="t/1")


def test_consumer_ignores_unknown_fields() -> None:
    event = make_event(_question(), producer="t/1")
    wire = json.loads(encode_event(event))
    wire["payload"]["difficulty"] = 3
    wire["trace_id"] = "abc"
    decoded = decode_event(json.dumps(wire).encode())
    declared = type(event.payload).model_fields
    assert {f: getattr(decoded.payload, f) for f in declared} == {f: getattr(event.payload, f) for f in declared}
    assert decoded.event_id == event.event_id


def test_envelope_type_must_match_payload() -> None:
    wire = json.loads(encode_event(make_event(_question(), producer="t/1")))
    wire["event_type"] = "StepsLabeled"
    with pytest.raises(DecodeError):
        decode_event(json.dumps(wire))


def test_first_error_step_must_be_a_labelled_step() -> None:
    with pytest.raises(ValidationError, match="first_error_step 5"):
        StepsLabeled(solution_id="s", question_id="q", method="binary", labels=(True, False), first_error_step=5)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"\x00\xffnot json", "not JSON"),
        (b"[1, 2]", "not an object"),
        (b'{"event_type": "Nope", "schema_version": 1, "payload": {}}', "unknown event_type 'Nope'"),
        (b'{"event_type": "QuestionRegistered", "payload": {}}', "integer schema_version"),
    ],
)
def test_undecodable_records_raise_decode_error_with_a_reason(raw: bytes, message: str) -> None:
    with pytest.raises(DecodeError, match=message):
        decode_event(raw)


def test_a_newer_schema_version_is_refused_with_advice() -> None:
    wire = json.loads(encode_event(make_event(_question(), producer="t/1")))
    wire["schema_version"] = 7
    with pytest.raises(UnknownSchemaVersion, match="upgrade this consumer"):
        decode_event(json.dumps(wire))


@pytest.fixture
def question_v2() -> Iterator[None]:
    """Pretend QuestionRegistered moved to v2, where v1's ``answer`` became ``gold_answer``."""
    original = QuestionRegistered.SCHEMA_VERSION
    QuestionRegistered.SCHEMA_VERSION = 2

    @upcaster("QuestionRegistered", 1)
    def upcast_v1_v2(payload: dict[str, Any]) -> dict[str, Any]:
        payload["gold_answer"] = payload.pop("answer", None)
        return payload

    yield
    QuestionRegistered.SCHEMA_VERSION = original
    del codec._UPCASTERS[("QuestionRegistered", 1)]


@pytest.mark.usefixtures("question_v2")
def test_old_versions_are_upcast_before_validation() -> None:
    v1 = {
        "event_id": str(uuid.uuid4()),
        "event_type": "QuestionRegistered",
        "schema_version": 1,
        "occurred_at": "2026-01-01T00:00:00Z",
        "producer": "old/0.0.1",
        "correlation_id": "q1",
        "payload": {
            "event_type": "QuestionRegistered",
            "question_id": "q1",
            "dataset": "d",
            "problem": "p",
            "answer": "4",
        },
    }
    event, stored = decode_stored_form(json.dumps(v1).encode())
    assert event.schema_version == 2
    assert event.payload.gold_answer == "4"  # type: ignore[union-attr]
    assert json.loads(stored)["schema_version"] == 2  # the store keeps the upgraded form


@pytest.mark.usefixtures("question_v2")
def test_a_version_without_upcaster_names_the_fix() -> None:
    QuestionRegistered.SCHEMA_VERSION = 3
    wire = {
        "event_id": str(uuid.uuid4()),
        "event_type": "QuestionRegistered",
        "schema_version": 2,
        "occurred_at": "2026-01-01T00:00:00Z",
        "producer": "p",
        "correlation_id": "q1",
        "payload": {"question_id": "q1", "dataset": "d", "problem": "p"},
    }
    with pytest.raises(UnknownSchemaVersion, match=r"@upcaster\('QuestionRegistered', 2\)"):
        decode_event(json.dumps(wire))


def test_deterministic_ids_are_stable_and_distinct() -> None:
    a = deterministic_event_id("SolutionSampled", "q1", 0)
    assert a == deterministic_event_id("SolutionSampled", "q1", 0)
    assert a != deterministic_event_id("SolutionSampled", "q1", 1)
    assert a != deterministic_event_id("StepsScored", "q1", 0)
    assert deterministic_event_id("x", {"a": 1, "b": 2}) == deterministic_event_id("x", {"b": 2, "a": 1})


def test_occurred_at_must_be_timezone_aware() -> None:
    wire = json.loads(encode_event(make_event(_question(), producer="t/1")))
    wire["occurred_at"] = "2026-01-01T00:00:00"
    with pytest.raises(DecodeError, match="occurred_at"):
        decode_event(json.dumps(wire))
