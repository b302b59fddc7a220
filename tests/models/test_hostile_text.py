"""Stored text parsed in linear time: answers, grading and step splitting on hostile inputs (issue 25)."""

from __future__ import annotations

import time

from hypothesis import given
from hypothesis import strategies as st

from prmloop.models.answers import _boxed_spans, extract_answer, last_boxed
from prmloop.models.grading import MAX_ANSWER_CHARS, GradeOutcome, answers_equivalent, grade
from prmloop.models.steps import split_steps

MIB = 1024 * 1024
#: CPU seconds allowed for one pass over a hostile megabyte. A linear pass takes well under one here; a
#: quadratic one takes minutes. The bound is not a speed target (those are benchmarks): it only tells
#: the two apart, with room for a loaded CI machine (a pass took 1.06 s in one CI run).
LINEAR_S = 10.0


def _cpu(fn: object, *args: object) -> tuple[object, float]:
    started = time.process_time()
    result = fn(*args)  # type: ignore[operator]
    return result, time.process_time() - started


def _spans_by_scanning(text: str) -> list[tuple[int, int]]:
    """The definition: from each box, count braces until the box closes (``\\{``, ``\\}`` are text)."""
    import re

    spans = []
    for match in re.finditer(r"\\(?:boxed|fbox)\s*\{", text):
        depth, i = 1, match.end()
        while i < len(text) and depth:
            if text[i] == "\\" and i + 1 < len(text) and text[i + 1] in "{}":
                i += 2
                continue
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            spans.append((match.end(), i))
    return spans


@given(st.lists(st.sampled_from(["\\boxed{", "\\fbox {", "{", "}", "\\", "\\{", "\\}", "1", " ", "x"]), max_size=30))
def test_boxes_are_paired_in_one_pass_exactly_as_by_scanning(pieces: list[str]) -> None:
    text = "".join(pieces)
    assert _boxed_spans(text) == _spans_by_scanning(text)


def test_a_megabyte_of_unclosed_boxes_is_read_in_linear_time() -> None:
    # 140 kB of "\boxed{" took 228 s when each box was scanned to the end of the text.
    text = "\\boxed{" * (MIB // 7)
    answer, cpu = _cpu(extract_answer, text)
    assert answer is None and cpu < LINEAR_S
    closed, cpu = _cpu(last_boxed, text + "}" + " and \\boxed{42}")
    assert closed == "42" and cpu < LINEAR_S


def test_an_answer_too_long_to_parse_is_not_given_to_math_verify() -> None:
    long_answer = "1+" * MIB + "1"
    result, cpu = _cpu(grade, f"The answer is {long_answer}", "2")
    assert result.outcome is GradeOutcome.UNPARSEABLE and result.reason == "too-long"  # type: ignore[attr-defined]
    assert cpu < LINEAR_S
    # A gold answer of that length is compared as a string: different, and at once.
    result, cpu = _cpu(grade, "The answer is 2", long_answer)
    assert result.outcome is GradeOutcome.INCORRECT and result.reason == "string-match"  # type: ignore[attr-defined]
    assert cpu < LINEAR_S
    equal, cpu = _cpu(answers_equivalent, "2", "2" + " " * MIB + "+0")
    assert equal is False and cpu < LINEAR_S
    # The same long text on both sides is still the same answer (the string fast path).
    assert answers_equivalent(long_answer, long_answer)
    # Answers of ordinary length still go to math-verify.
    assert len(r"\frac{1}{2}") < MAX_ANSWER_CHARS and answers_equivalent(r"\frac{1}{2}", "0.5")


def test_splitting_a_megabyte_of_markers_and_blank_lines_is_linear() -> None:
    steps, cpu = _cpu(split_steps, "Step 1: " + "Step " * (MIB // 5))
    assert len(steps) == 1 and cpu < LINEAR_S  # type: ignore[arg-type]
    steps, cpu = _cpu(split_steps, "a\n \n" * (MIB // 16))
    assert len(steps) == MIB // 16 and cpu < LINEAR_S  # type: ignore[arg-type]
