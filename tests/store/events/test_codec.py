"""The codec's limits: size and nesting are checked before any parser sees a record, and an event
above them never leaves its producer. Every decode failure is a DecodeError, whatever raised it."""

from __future__ import annotations

import json
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prmloop.store.events import CalibrationFitted, QuestionRegistered, make_event
from prmloop.store.events.codec import (
    DecodeError,
    EventTooDeep,
    EventTooLarge,
    PublishError,
    RecordTooDeep,
    RecordTooLarge,
    UndeliverableEvent,
    decode_event,
    decode_stored_form,
    encode_event,
)
from prmloop.store.events.limits import (
    DEFAULT_MAX_EVENT_BYTES,
    DEFAULT_MAX_JSON_DEPTH,
    event_limits,
    json_depth_exceeds,
)


def _question(problem: str = "2+2?") -> bytes:
    return encode_event(make_event(QuestionRegistered(question_id="q1", dataset="d", problem=problem), producer="t"))


def _nest(payload_value: str, depth: int) -> bytes:
    """A QuestionRegistered whose payload carries an extra field nested ``depth`` arrays deep."""
    event = json.loads(_question())
    text = json.dumps(event)
    return text.replace('"payload": {', f'"payload": {{"deep": {"[" * depth}1{"]" * depth}, ', 1).encode()


def test_the_defaults_are_the_documented_ones() -> None:
    assert DEFAULT_MAX_EVENT_BYTES == 4 * 1024 * 1024
    assert DEFAULT_MAX_JSON_DEPTH == 64
    assert event_limits().max_event_bytes == DEFAULT_MAX_EVENT_BYTES


@pytest.mark.parametrize("depth", [100, 300, 1_000, 100_000])
def test_deep_nesting_is_refused_before_parsing(depth: int) -> None:
    raw = _nest("x", depth)
    for decode in (decode_event, decode_stored_form):
        with pytest.raises(RecordTooDeep, match=f"limit of {DEFAULT_MAX_JSON_DEPTH}"):
            decode(raw)


def test_nesting_within_the_limit_still_decodes() -> None:
    event, body = decode_stored_form(_nest("x", 20))
    assert event.event_type == "QuestionRegistered"
    assert body.startswith(b"{")


def test_an_unclosed_deep_record_is_refused_too() -> None:
    with pytest.raises(RecordTooDeep):
        decode_event(b"[" * 100_000)
    with pytest.raises(RecordTooDeep):
        decode_event(b'{"a":' * 50_000)


def test_brackets_inside_strings_do_not_count() -> None:
    problem = "\\left[" * 500 + '\\" {{{{{{ [[[[[ ' + "}" * 300
    event = decode_event(_question(problem))
    assert event.payload.problem == problem


def _real_depth(v: object) -> int:
    if isinstance(v, dict):
        return 1 + max((_real_depth(x) for x in v.values()), default=0)
    if isinstance(v, list):
        return 1 + max((_real_depth(x) for x in v), default=0)
    return 0


@pytest.mark.parametrize(
    "text",
    ["[]", "{}", "1", '"[[["', '{"a":[{"b":[[]]}]}', '[[1,[2,[3]]],{"x":{"y":{}}}]', '["\\\\", "\\"[", {"k]": []}]'],
)
def test_the_depth_scan_matches_the_real_depth(text: str) -> None:
    real = _real_depth(json.loads(text))
    assert json_depth_exceeds(text.encode(), real) is None
    if real:
        assert json_depth_exceeds(text.encode(), real - 1) == real


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=False) | st.text(alphabet='[]{}"\\ab'),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(alphabet='[]{}"\\k'), inner, max_size=4),
    max_leaves=40,
)


@given(_JSON_VALUES, st.integers(min_value=0, max_value=12))
def test_the_depth_check_agrees_with_the_parsed_depth_on_either_path(value: object, limit: int) -> None:
    """Small limits take the bracket scan, large ones the bracket-count shortcut: both must agree
    with the depth of the parsed value (brackets inside strings never count)."""
    raw = json.dumps(value).encode()
    real = _real_depth(value)
    found = json_depth_exceeds(raw, limit)
    if real <= limit:
        assert found is None
    else:
        assert found is not None and found > limit


def test_an_oversized_record_is_refused_by_size_first() -> None:
    raw = b"[" * (DEFAULT_MAX_EVENT_BYTES + 1)  # also too deep: the size check names the real problem
    with pytest.raises(RecordTooLarge, match="4,194,304"):
        decode_stored_form(raw)


def test_an_oversized_event_cannot_be_encoded_and_the_error_names_it() -> None:
    event = make_event(QuestionRegistered(question_id="big", dataset="d", problem="x" * 5_000_000), producer="t")
    with pytest.raises(EventTooLarge) as info:
        encode_event(event)
    message = str(info.value)
    assert "\n" not in message
    assert "QuestionRegistered" in message and str(event.event_id) in message and "4,194,304" in message
    assert info.value.event_ids == (event.event_id,)
    assert isinstance(info.value, PublishError) and isinstance(info.value, ValueError)


@pytest.mark.parametrize("depth", [100, 1_000])
def test_a_too_deep_event_cannot_be_encoded(depth: int) -> None:
    deep: object = 1
    for _ in range(depth):
        deep = [deep]
    payload = CalibrationFitted(
        calibration_id="c",
        generator="g",
        prm="p",
        score_rule="min",
        method="platt",
        fit={"params": deep},
        calibration_split="test",
    )
    event = make_event(payload, producer="t")
    with pytest.raises(UndeliverableEvent, match=r"nested|serialis") as info:
        encode_event(event)
    if depth == 100:
        assert isinstance(info.value, EventTooDeep)
        assert "limit of 64" in str(info.value)
    assert not isinstance(info.value, DecodeError)  # a producer's error, not a poison record


@pytest.mark.parametrize(
    "raw",
    [
        b"\xff\xfe\x00garbage",
        b"",
        b"null",
        b"[1, 2]",
        b'{"event_type": "QuestionRegistered", "schema_version": 1, "payload": []}',
        b'{"event_type": 5}',
        json.dumps({"event_type": "Nope", "schema_version": 1, "payload": {}}).encode(),
        b'{"a": 1e999999}',
        b'{"a": "\\ud800"}',
    ],
)
def test_every_bad_record_is_a_decode_error(raw: bytes) -> None:
    with pytest.raises(DecodeError):
        decode_stored_form(raw)


def test_a_mapping_that_breaks_validation_is_a_decode_error() -> None:
    with pytest.raises(DecodeError):
        decode_event({"event_type": "QuestionRegistered", "schema_version": 1, "payload": {"x": object()}})
    with pytest.raises(DecodeError):
        decode_event({"event_id": str(uuid.uuid4()), "event_type": 1})
