"""The envelope of every event: which payload it carries, when and from whom, and its idempotency key.

Every fact prmloop learns is an immutable :class:`Envelope`; its ``payload`` is a discriminated union on
``event_type`` (:mod:`prmloop.store.events.payloads`). An event written by an older producer is
upgraded before validation by the codec (:mod:`prmloop.store.events.codec`), so consumers only ever see
the current shape.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Annotated, Any, Self, TypeAlias

from pydantic import Field, TypeAdapter, model_validator

from prmloop.store.events.bounds import EventTime, Int32
from prmloop.store.events.payloads import (
    EVENT_NAMESPACE,
    CalibrationFitted,
    LabelsAccepted,
    LabelsRejected,
    ModelRegistered,
    Payload,
    QuestionPrioritized,
    QuestionRegistered,
    Record,
    SolutionSampled,
    SolutionSelected,
    StepsJudged,
    StepsLabeled,
    StepsScored,
    UnknownFieldError,
    unknown_fields,
)

__all__ = [
    "ENVELOPE_ADAPTER",
    "PAYLOAD_ADAPTERS",
    "PAYLOAD_TYPES",
    "AnyPayload",
    "Envelope",
    "deterministic_event_id",
    "make_event",
]

AnyPayload: TypeAlias = Annotated[
    QuestionRegistered
    | QuestionPrioritized
    | SolutionSampled
    | StepsScored
    | SolutionSelected
    | StepsLabeled
    | StepsJudged
    | LabelsAccepted
    | LabelsRejected
    | ModelRegistered
    | CalibrationFitted,
    Field(discriminator="event_type"),
]

PAYLOAD_TYPES: dict[str, type[Payload]] = {
    cls.model_fields["event_type"].default: cls
    for cls in (
        QuestionRegistered,
        QuestionPrioritized,
        SolutionSampled,
        StepsScored,
        SolutionSelected,
        StepsLabeled,
        StepsJudged,
        LabelsAccepted,
        LabelsRejected,
        ModelRegistered,
        CalibrationFitted,
    )
}


class Envelope(Record):
    """The frozen envelope of every event. ``event_id`` is the idempotency key everywhere."""

    event_id: uuid.UUID
    event_type: str
    schema_version: Annotated[Int32, Field(ge=1)]
    occurred_at: EventTime
    producer: str = Field(description="service name and version, e.g. prmloop-sample/0.1.0")
    causation_id: uuid.UUID | None = Field(default=None, description="the event this one reacts to")
    correlation_id: str = Field(description="the question or solution this concerns; the Kafka key")
    payload: AnyPayload

    @model_validator(mode="after")
    def _type_matches_payload(self) -> Self:
        if self.event_type != self.payload.event_type:
            raise ValueError(
                f"envelope event_type {self.event_type!r} differs from payload {self.payload.event_type!r}"
            )
        expected = type(self.payload).SCHEMA_VERSION
        if self.schema_version != expected:
            raise ValueError(f"{self.event_type} must carry schema_version {expected}, got {self.schema_version}")
        return self

    @property
    def topic(self) -> str:
        return type(self.payload).TOPIC


#: One TypeAdapter per type (built once; building them per call is slow).
ENVELOPE_ADAPTER: TypeAdapter[Envelope] = TypeAdapter(Envelope)
PAYLOAD_ADAPTERS: dict[str, TypeAdapter[Any]] = {name: TypeAdapter(cls) for name, cls in PAYLOAD_TYPES.items()}


def deterministic_event_id(event_type: str, *key_parts: object) -> uuid.UUID:
    """A UUIDv5 of the event type and the parts that identify one logical fact.

    Examples: a sampled solution is (question id, generator, seed, sample index); a label is
    (solution id, method, parameters). Publishing the same fact twice yields the same id, and the
    sink keeps it once.
    """
    key = "\x1f".join([event_type, *(json.dumps(p, sort_keys=True, default=str) for p in key_parts)])
    return uuid.uuid5(EVENT_NAMESPACE, key)


def make_event(
    payload: Payload,
    *,
    producer: str,
    event_id: uuid.UUID | None = None,
    causation_id: uuid.UUID | None = None,
    occurred_at: datetime | None = None,
) -> Envelope:
    """Wrap a payload in an envelope. Without an explicit ``event_id`` a random UUID4 is used;
    prefer :func:`deterministic_event_id` for anything that may be re-run.

    Raises :class:`UnknownFieldError` if the payload carries a field its schema does not declare.
    """
    extra = unknown_fields(payload)
    if extra:
        raise UnknownFieldError(
            f"{type(payload).__name__} has no field(s) {extra}; a producer may only set declared fields"
        )
    return Envelope(
        event_id=event_id or uuid.uuid4(),
        event_type=payload.event_type,
        schema_version=type(payload).SCHEMA_VERSION,
        occurred_at=occurred_at or datetime.now(UTC),
        producer=producer,
        causation_id=causation_id,
        correlation_id=payload.correlation_id(),
        payload=payload,
    )
