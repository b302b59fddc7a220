"""The numbers and times an event may carry: exactly what the store's columns and views can hold.

The sink stores an event's JSON as it arrived, and the views of ``projections.sql`` cast fields out
of it (``CAST(payload->>'round' AS INTEGER)``, ``... AS BIGINT``, ``... AS DOUBLE``). A value the
schema accepted but a cast cannot hold (``generated_tokens = 2**70``, ``step_index = 2**40``, a
JSON ``true`` where a number belongs) would be stored and then break every query of that view,
``prmloop status`` and ``prmloop export``. So every number of every payload has one of the types
below: an event outside them fails validation, which refuses it at publish (:func:`make_event`)
and dead-letters it at every consumer, the sink included.

Use them for every number of a new payload (and nested record):

- :data:`Int32` / :data:`Count32`: a view casts it to ``INTEGER`` (step indices, rounds, small
  counts). ``Count32`` is the non-negative one.
- :data:`Int64` / :data:`Count64`: anything else whole (token counts, seeds, offsets): ``BIGINT``.
- :data:`Real` / :data:`NonNegReal`: a ``DOUBLE``; finite (no NaN, no infinity: JSON has neither,
  and a NaN compares unequal to itself in every aggregate).
- :data:`EventTime`: an aware time whose UTC value lies in years 1 to 9999 (a time with an offset
  near either end would leave the range Python and the store share when converted to UTC).
- :data:`JsonData`: free-form JSON (``metadata``, ``parameters``, ``fit``): no view casts inside it,
  but its whole numbers still fit ``BIGINT`` and its floats are finite, so every reader of the
  exported JSON can parse it.

Numbers are strict: a JSON string or boolean is no number (``"3"`` or ``true`` for a count would
be stored as such and break the cast), and a whole-number field takes no float. Narrow a bound
inside the annotation: ``step_index: Annotated[Int32, Field(ge=-1)]``. (A ``Field(ge=-1)`` given as
the field's default is silently overridden by the alias's own bound; it can never widen it either.)
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Annotated, Any, TypeAlias

from pydantic import AfterValidator, AllowInfNan, AwareDatetime, Field, Strict

__all__ = [
    "INT32_MAX",
    "INT32_MIN",
    "INT64_MAX",
    "INT64_MIN",
    "TIME_MAX",
    "TIME_MIN",
    "Count32",
    "Count64",
    "EventTime",
    "Int32",
    "Int64",
    "JsonData",
    "NonNegReal",
    "Real",
]

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
#: One day inside Python's datetime range at both ends, so no offset moves a time out of it.
TIME_MIN = datetime(1, 1, 2, tzinfo=UTC)
TIME_MAX = datetime(9999, 12, 30, 23, 59, 59, 999999, tzinfo=UTC)

#: A whole number a view casts to ``INTEGER``.
Int32: TypeAlias = Annotated[int, Strict(), Field(ge=INT32_MIN, le=INT32_MAX)]
#: A non-negative whole number a view casts to ``INTEGER`` (an index or a small count).
Count32: TypeAlias = Annotated[int, Strict(), Field(ge=0, le=INT32_MAX)]
#: A whole number held as ``BIGINT``.
Int64: TypeAlias = Annotated[int, Strict(), Field(ge=INT64_MIN, le=INT64_MAX)]
#: A non-negative whole number held as ``BIGINT`` (a count of tokens, rollouts, examples).
Count64: TypeAlias = Annotated[int, Strict(), Field(ge=0, le=INT64_MAX)]
#: A finite ``DOUBLE`` (a whole number is taken as a float).
Real: TypeAlias = Annotated[float, Strict(), AllowInfNan(False)]
#: A finite, non-negative ``DOUBLE`` (seconds, costs).
NonNegReal: TypeAlias = Annotated[float, Strict(), AllowInfNan(False), Field(ge=0.0)]
#: When something happened: aware, and within years 1 to 9999 once converted to UTC.
EventTime: TypeAlias = Annotated[AwareDatetime, Field(ge=TIME_MIN, le=TIME_MAX)]


def _bounded_json(value: Any) -> Any:
    """``value`` unchanged if every number in it (at any depth) is a ``BIGINT`` or a finite float.

    Walked with a stack, not recursion: the nesting limit is the codec's to enforce (with its own
    message), not this check's to trip over."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, bool) or item is None or isinstance(item, str):
            continue
        if isinstance(item, int):
            if not INT64_MIN <= item <= INT64_MAX:
                raise ValueError(f"a whole number of {item.bit_length()} bits is outside BIGINT (64 bits)")
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise ValueError(f"{item} is no finite number (JSON has no NaN or infinity)")
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return value


#: Free-form JSON (any depth) whose whole numbers are ``BIGINT`` and whose floats are finite.
JsonData: TypeAlias = Annotated[Any, AfterValidator(_bounded_json)]
