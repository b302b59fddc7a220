"""The wire codec: events as JSON bytes, upcasting of old versions, and the errors of undecodable records.

:mod:`prmloop.store.events` owns the schemas; this module owns how an event crosses the wire. An
event written by an older producer is upgraded by the chain of ``upcast_vN_vN+1`` functions
registered with :func:`upcaster` *before* validation, so consumers only ever see the current shape.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import ValidationError
from pydantic_core import PydanticSerializationError

from prmloop.store.events import ENVELOPE_ADAPTER, PAYLOAD_TYPES, Envelope
from prmloop.store.events.limits import event_limits, json_depth_exceeds

__all__ = [
    "DecodeError",
    "EventNotEncodable",
    "EventTooDeep",
    "EventTooLarge",
    "PublishError",
    "RecordTooDeep",
    "RecordTooLarge",
    "UndeliverableEvent",
    "UnknownEventType",
    "UnknownSchemaVersion",
    "decode_event",
    "decode_stored_form",
    "encode_event",
    "upcast",
    "upcaster",
]

# ---------------------------------------------------------------------------------------------- upcasting

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]
_UPCASTERS: dict[tuple[str, int], Upcaster] = {}


def upcaster(event_type: str, from_version: int) -> Callable[[Upcaster], Upcaster]:
    """Register ``fn`` as the upgrade of ``event_type`` payloads from ``from_version`` to the next.

    Name the function ``upcast_v{N}_v{N+1}``; it receives and returns the payload as a plain dict.
    """

    def register(fn: Upcaster) -> Upcaster:
        key = (event_type, from_version)
        if key in _UPCASTERS:
            raise ValueError(f"an upcaster for {event_type} v{from_version} is already registered")
        _UPCASTERS[key] = fn
        return fn

    return register


def upcast(event_type: str, version: int, payload: dict[str, Any]) -> dict[str, Any]:
    """Apply the registered upcasters from ``version`` up to the current version of ``event_type``."""
    cls = PAYLOAD_TYPES.get(event_type)
    if cls is None:
        raise UnknownEventType(event_type)
    current = cls.SCHEMA_VERSION
    if version > current:
        raise UnknownSchemaVersion(event_type, version, current)
    while version < current:
        fn = _UPCASTERS.get((event_type, version))
        if fn is None:
            raise UnknownSchemaVersion(event_type, version, current)
        payload = fn(dict(payload))
        version += 1
    return payload


# ------------------------------------------------------------------------------------------------ errors


class DecodeError(ValueError):
    """A record that can never become a valid event: it belongs in the dead-letter topic."""


class RecordTooLarge(DecodeError):
    """A record above the event size limit: refused before parsing."""


class RecordTooDeep(DecodeError):
    """A record nested deeper than the limit: refused before any recursive parser sees it."""


class UnknownEventType(DecodeError):
    def __init__(self, event_type: object) -> None:
        super().__init__(
            f"unknown event_type {event_type!r}; known types: {', '.join(sorted(PAYLOAD_TYPES))}. "
            "Upgrade this consumer if a newer producer introduced it."
        )


class UnknownSchemaVersion(DecodeError):
    def __init__(self, event_type: str, version: int, current: int) -> None:
        hint = (
            "a newer producer wrote it: upgrade this consumer"
            if version > current
            else f"register an upcaster with @upcaster({event_type!r}, {version})"
        )
        super().__init__(f"{event_type} schema_version {version} cannot be read (current is {current}): {hint}")


class PublishError(RuntimeError):
    """Events were not published."""

    def __init__(self, message: str, event_ids: tuple[uuid.UUID, ...] = ()) -> None:
        super().__init__(message)
        #: The events concerned (where known), so a caller such as reconcile can set them aside.
        self.event_ids = event_ids


class UndeliverableEvent(PublishError, ValueError):
    """An event that no retry can ever deliver: refused at once, never written to the outbox."""


class EventTooLarge(UndeliverableEvent):
    pass


class EventTooDeep(UndeliverableEvent):
    pass


class EventNotEncodable(UndeliverableEvent):
    pass


# ------------------------------------------------------------------------------------------------- codec


def encode_event(event: Envelope) -> bytes:
    """The wire format: the envelope as compact JSON (UTF-8), within the event limits.

    Raises a subclass of :class:`UndeliverableEvent` (one line naming the event and the limit) for an
    event that cannot be serialised, is larger than ``max_event_bytes`` or nested deeper than
    ``max_json_depth``: every reader would refuse it, so it must never leave the producer.
    """
    limits = event_limits()
    name = f"{event.event_type} {event.event_id} ({event.correlation_id[:80]!r})"
    try:
        raw = event.model_dump_json().encode()
    except (PydanticSerializationError, RecursionError, ValueError, TypeError) as exc:
        reason = " ".join(str(exc).split())[:300]
        raise EventNotEncodable(
            f"{name} cannot be serialised ({type(exc).__name__}: {reason}); fix the producer's data",
            (event.event_id,),
        ) from exc
    if len(raw) > limits.max_event_bytes:
        raise EventTooLarge(
            f"{name} is {len(raw):,} bytes, above the limit of {limits.max_event_bytes:,} "
            "(PRMLOOP_MAX_EVENT_BYTES); split or shorten its content",
            (event.event_id,),
        )
    depth = json_depth_exceeds(raw, limits.max_json_depth)
    if depth is not None:
        raise EventTooDeep(
            f"{name} is nested {depth} levels deep, above the limit of {limits.max_json_depth} "
            "(PRMLOOP_MAX_JSON_DEPTH); flatten its content",
            (event.event_id,),
        )
    return raw


def check_record_limits(raw: bytes) -> None:
    """Refuse ``raw`` before parsing if it breaks the size limit (checked first) or the depth limit."""
    limits = event_limits()
    if len(raw) > limits.max_event_bytes:
        raise RecordTooLarge(
            f"record is {len(raw):,} bytes, above the event limit of {limits.max_event_bytes:,} "
            "(PRMLOOP_MAX_EVENT_BYTES)"
        )
    depth = json_depth_exceeds(raw, limits.max_json_depth)
    if depth is not None:
        raise RecordTooDeep(
            f"record is nested at least {depth} levels deep, above the limit of {limits.max_json_depth} "
            "(PRMLOOP_MAX_JSON_DEPTH)"
        )


def decode_stored_form(raw: bytes) -> tuple[Envelope, bytes]:
    """Decode ``raw`` and return it with the JSON to store: ``raw`` itself when it already is a
    current-version event, else the upcast event re-encoded.

    Every failure is a :class:`DecodeError`, whatever raised it (a recursion or memory error of a
    hostile record, a serialisation error, a buggy upcaster): decoding depends on nothing but the
    bytes, so a record that fails once fails forever and belongs in the dead-letter topic.
    """
    try:
        check_record_limits(raw)
        try:
            return ENVELOPE_ADAPTER.validate_json(raw), raw
        except ValidationError:
            event = decode_event(raw, checked=True)
            return event, encode_event(event)
    except DecodeError:
        raise
    except Exception as exc:
        raise DecodeError(f"record cannot be decoded ({type(exc).__name__}: {_one_line(exc)})") from exc


def _one_line(exc: BaseException, limit: int = 300) -> str:
    return " ".join(str(exc).split())[:limit]


def decode_event(raw: bytes | str | Mapping[str, Any], *, checked: bool = False) -> Envelope:
    """Parse, upcast and validate one event, ignoring fields this version does not know.

    Raises :class:`DecodeError` (with a message naming what is wrong) for anything that can never
    be valid: above the size or depth limits, not JSON, not an object, unknown type or version,
    failed validation. ``checked=True`` skips the limit check the caller already made.
    """
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogatepass")
    if isinstance(raw, bytes) and not checked:
        check_record_limits(raw)
    try:
        return _decode(raw)
    except DecodeError:
        raise
    except Exception as exc:
        raise DecodeError(f"record cannot be decoded ({type(exc).__name__}: {_one_line(exc)})") from exc


def _decode(raw: bytes | Mapping[str, Any]) -> Envelope:
    if isinstance(raw, bytes):
        # Fast path: a current-version event validates straight from JSON in pydantic's Rust core.
        try:
            return ENVELOPE_ADAPTER.validate_json(raw)
        except ValidationError:
            pass  # older version, or invalid: the slow path below upcasts or explains
    if isinstance(raw, Mapping):
        data: Any = dict(raw)
    else:
        try:
            data = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            preview = raw[:80].decode("utf-8", "replace")
            raise DecodeError(f"record is not JSON ({exc}); starts with {preview!r}") from exc
    if not isinstance(data, dict):
        raise DecodeError(f"record is JSON but not an object: {type(data).__name__}")
    event_type = data.get("event_type")
    version = data.get("schema_version")
    payload = data.get("payload")
    if not isinstance(event_type, str) or not isinstance(version, int) or not isinstance(payload, dict):
        raise DecodeError("record lacks a string event_type, an integer schema_version or an object payload")
    payload = upcast(event_type, version, payload)
    payload.setdefault("event_type", event_type)
    data = {**data, "payload": payload, "schema_version": PAYLOAD_TYPES[event_type].SCHEMA_VERSION}
    try:
        return ENVELOPE_ADAPTER.validate_python(data)
    except ValidationError as exc:
        raise DecodeError(f"{event_type} v{version} failed validation: {_one_line(exc, 2000)}") from exc
