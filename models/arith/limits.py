"""How much the exact checker reads, so that one hostile solution costs bounded time, linear in its size.

Why. The checker evaluates every expression exactly, with fractions. Unbounded, a 0.9 MB step of
``9999 * 9999 * ...`` built a 512,000-digit product one multiplication at a time (quadratic: 134 s for
128k terms) and then failed to print it (Python refuses to convert integers of more than 4,300
digits); a 4 MiB event would have held the judge for half an hour. A solution that exceeds any of
these limits is not an error in the data: the checker says it cannot decide (status ``"unknown"``,
the reason names the limit), which is what it says of any solution it cannot read.

The limits are far above what a solution of the arithmetic curriculum needs (a level-5 reference
solution has 7 steps, about 600 characters, 30 numbers of at most 4 digits, no parentheses), so they
change no verdict on real solutions. They are constants, not parameters: a judge's parameters are part
of its verdicts' event ids.

Cost with these limits: every step is measured (length, then its numbers) before anything parses it,
so reading stops after at most :data:`MAX_CHARS` characters whatever the input's size; after that each
expression is evaluated once per use on values of at most :data:`MAX_VALUE_DIGITS` digits, and the
search for a single operation that gives a stated number tries at most :data:`MAX_NUMBERS` pairs per
stated number.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction

__all__ = [
    "MAX_CHARS",
    "MAX_DIGITS",
    "MAX_EXPRESSION_TERMS",
    "MAX_NESTING",
    "MAX_NUMBERS",
    "MAX_STEPS",
    "MAX_VALUE_DIGITS",
    "BeyondLimits",
    "ReadingBudget",
    "check_value",
]

#: Steps of one solution.
MAX_STEPS = 100
#: Characters of one solution, all steps together.
MAX_CHARS = 20_000
#: Written numbers of one solution, all steps together (each is a term of some expression).
MAX_NUMBERS = 300
#: Digits of one written number.
MAX_DIGITS = 30
#: Tokens (numbers, operators, parentheses, ``=``) of one run of arithmetic.
MAX_EXPRESSION_TERMS = 200
#: Parentheses and signs nested in one expression.
MAX_NESTING = 30
#: Digits of any value the checker computes (numerator and denominator each).
MAX_VALUE_DIGITS = 100

_MAX_VALUE_BITS = math.ceil(MAX_VALUE_DIGITS * math.log2(10))
# The same reading of a written number as the tokenizer's (``1,000`` is one number of 4 digits).
_NUMBER_RE = re.compile(r"(?<![\w.])\d{1,3}(?:,\d{3})+(?:\.\d+)?(?!\d)|\d+(?:\.\d+)?")


class BeyondLimits(Exception):
    """A solution the checker does not read to the end; the message says which limit it passed."""


def check_value(value: Fraction) -> Fraction:
    """``value``, or :class:`BeyondLimits` when its numerator or denominator is too long to compute with."""
    if value.numerator.bit_length() > _MAX_VALUE_BITS or value.denominator.bit_length() > _MAX_VALUE_BITS:
        raise BeyondLimits(
            f"a value of more than {MAX_VALUE_DIGITS} digits (limit MAX_VALUE_DIGITS={MAX_VALUE_DIGITS})"
        )
    return value


@dataclass
class ReadingBudget:
    """What one solution has used so far; :meth:`admit` measures a step before anything parses it.

    ``chars_read`` and ``pairs_tried`` count the checker's work (characters scanned, pairs of numbers
    tried for a single operation), so a test can check that it is bounded.
    """

    steps: int = 0
    chars_read: int = 0
    numbers: int = 0
    pairs_tried: int = 0

    def admit(self, step: str) -> None:
        """Count ``step`` against the limits; raises :class:`BeyondLimits` (with the limit) if it passes one.

        The length is checked before any character is scanned, so a step of megabytes costs nothing.
        """
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise BeyondLimits(f"the solution has more than {MAX_STEPS} steps (limit MAX_STEPS={MAX_STEPS})")
        if self.chars_read + len(step) > MAX_CHARS:
            raise BeyondLimits(
                f"the solution is longer than {MAX_CHARS} characters (this step has {len(step)}; "
                f"limit MAX_CHARS={MAX_CHARS})"
            )
        self.chars_read += len(step)
        for match in _NUMBER_RE.finditer(step):
            self.numbers += 1
            if self.numbers > MAX_NUMBERS:
                raise BeyondLimits(
                    f"the solution writes more than {MAX_NUMBERS} numbers (limit MAX_NUMBERS={MAX_NUMBERS})"
                )
            written = match.group()
            digits = len(written) - written.count(",") - written.count(".")
            if digits > MAX_DIGITS:
                raise BeyondLimits(f"a number of {digits} digits ({written[:12]}...; limit MAX_DIGITS={MAX_DIGITS})")
