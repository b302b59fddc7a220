"""Specification of answer extraction, equivalence, grading and grouping (prmloop.models.grading)."""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from prmloop.models.answers import extract_answer, normalize_answer
from prmloop.models.grading import GradeOutcome, answers_equivalent, grade, group_equivalent_answers

# An exponent tower math-verify cannot evaluate in any reasonable time.
SLOW_ANSWER = "2^{2^{2^{30}}}"


def _in_thread(fn: Callable[[], Any]) -> Any:
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(fn()))
    thread.start()
    thread.join(timeout=120)
    assert result, "the call in a worker thread did not finish"
    return result[0]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so $x = \boxed{\frac{1}{2}}$.", r"\frac{1}{2}"),
        (r"\boxed{\frac{\sqrt{3}}{2}} is nested", r"\frac{\sqrt{3}}{2}"),
        (r"first \boxed{1}, then \boxed{2}", "2"),
        (r"\fbox{7}", "7"),
        ("Step 3: 9 * 2 = 18. The final answer is 18.", "18"),
        ("The answer is $\\frac{3}{4}$.", r"\frac{3}{4}"),
        ("Answer: x = 7", "x = 7"),
        ("She makes 9 * 2 = $18.\n#### 18", "18"),
        ("#### 1,000", "1,000"),
        (r"\boxed{3} and the answer is 4", "3"),
    ],
)
def test_extract_answer_reads_boxed_then_answer_is_then_hashes(text: str, expected: str) -> None:
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    "text",
    ["I give up", "", r"so the answer is \boxed{\frac{1}{", "#### "],
)
def test_extract_answer_returns_none_without_a_complete_answer(text: str) -> None:
    assert extract_answer(text) is None


GRADING_TABLE = [
    # (prediction, gold, outcome)
    (r"\boxed{\dfrac{1}{2}}", "0.5", GradeOutcome.CORRECT),
    ("The answer is 1/2.", r"\frac{1}{2}", GradeOutcome.CORRECT),
    ("0.5", r"\frac12", GradeOutcome.CORRECT),
    ("#### 1,000", "1000", GradeOutcome.CORRECT),
    (r"\boxed{10\text{ cm}}", "10", GradeOutcome.CORRECT),
    ("5 inches", "5", GradeOutcome.CORRECT),
    (r"\boxed{90^\circ}", "90", GradeOutcome.CORRECT),
    (r"\boxed{\left( 3, \frac{\pi}{2} \right)}", r"(3,\frac{\pi}{2})", GradeOutcome.CORRECT),
    (r"\boxed{x^2+2x+1}", "(x+1)^2", GradeOutcome.CORRECT),
    (r"\boxed{\text{Evelyn}}", r"\text{Evelyn}", GradeOutcome.CORRECT),
    (r"so \boxed{\frac{\sqrt{3}}{2}}", r"\frac{\sqrt3}{2}", GradeOutcome.CORRECT),
    ("The final answer is 17.", "#### 18", GradeOutcome.INCORRECT),
    (r"\boxed{\frac{1}{3}}", "0.5", GradeOutcome.INCORRECT),
    ("4.33", r"\frac{13}{3}", GradeOutcome.INCORRECT),
    (r"\boxed{(3, \frac{\pi}{4})}", r"(3,\frac{\pi}{2})", GradeOutcome.INCORRECT),
    (r"\boxed{\text{Monday}}", r"\text{Evelyn}", GradeOutcome.INCORRECT),
    ("I don't know", "5", GradeOutcome.UNPARSEABLE),
    ("asdf qwerty", "5", GradeOutcome.UNPARSEABLE),
    ("", "5", GradeOutcome.UNPARSEABLE),
    ("The answer is ???", "5", GradeOutcome.UNPARSEABLE),
    (r"\boxed{}", "5", GradeOutcome.UNPARSEABLE),
    (r"cut off: the answer is \boxed{\frac{1}{", "0.5", GradeOutcome.UNPARSEABLE),
]


@pytest.mark.parametrize(("prediction", "gold", "outcome"), GRADING_TABLE)
def test_grade_matches_the_hand_made_table(prediction: str, gold: str, outcome: GradeOutcome) -> None:
    assert grade(prediction, gold).outcome is outcome


def test_grade_reports_the_extracted_answers_and_how_it_decided() -> None:
    result = grade("Step 2: 16 - 3 - 4 = 9.\nThe final answer is $18$.", "#### 18")
    assert (result.predicted_answer, result.gold_answer, result.reason) == ("18", "18", "string-match")
    assert result.is_correct


def test_grade_rejects_an_empty_gold_answer() -> None:
    with pytest.raises(ValueError, match="gold_answer"):
        grade("18", "  ")


def test_answers_equivalent_is_symmetric() -> None:
    assert answers_equivalent("0.5", r"\dfrac{1}{2}")
    assert answers_equivalent(r"\dfrac{1}{2}", "0.5")
    assert not answers_equivalent("17", "18")


def test_normalize_answer_drops_only_presentation() -> None:
    assert normalize_answer(r"$\left( 3, \dfrac{\pi}{2} \right)$.") == r"(3,\frac{\pi}{2})"
    assert normalize_answer("1/2") != normalize_answer("2/1")


def test_group_equivalent_answers_numbers_clusters_in_first_seen_order() -> None:
    answers = ["3.0", "0.5", r"\frac{1}{2}", "3", r"\dfrac12", "x", "", ""]
    assert group_equivalent_answers(answers) == [0, 1, 1, 0, 1, 2, 3, 3]
    assert group_equivalent_answers([]) == []


def test_timeout_in_the_main_thread_is_a_negative_answer_not_a_hang() -> None:
    assert not answers_equivalent(SLOW_ANSWER, "5", timeout_s=0.5)
    result = grade(rf"\boxed{{{SLOW_ANSWER}}}", "5", timeout_s=0.5)
    assert (result.outcome, result.reason) == (GradeOutcome.UNPARSEABLE, "timeout")


def test_timeout_keeps_an_outer_alarm_armed() -> None:
    fired: list[int] = []
    previous = signal.signal(signal.SIGALRM, lambda signum, frame: fired.append(signum))
    signal.setitimer(signal.ITIMER_REAL, 60.0)
    try:
        answers_equivalent(SLOW_ANSWER, "5", timeout_s=0.2)
        remaining, _ = signal.getitimer(signal.ITIMER_REAL)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert 50.0 < remaining < 60.0
    assert not fired


def test_grading_works_outside_the_main_thread() -> None:
    results = _in_thread(
        lambda: (
            answers_equivalent("0.5", r"\frac{1}{2}"),
            grade(r"\boxed{\frac{1}{3}}", "0.5").outcome,
            group_equivalent_answers(["1", "1.0", "2"]),
        )
    )
    assert results == (True, GradeOutcome.INCORRECT, [0, 0, 1])


def test_timeout_outside_the_main_thread_is_a_negative_answer_not_a_hang() -> None:
    result = _in_thread(lambda: grade(rf"\boxed{{{SLOW_ANSWER}}}", "5", timeout_s=0.5))
    assert (result.outcome, result.reason) == (GradeOutcome.UNPARSEABLE, "timeout")
    # The helper process recovers for the next call.
    assert _in_thread(lambda: answers_equivalent("2", "2.0"))


@pytest.fixture(scope="module")
def math500_rows(shared_data_dir: Path) -> list[dict[str, Any]]:
    with (shared_data_dir / "math" / "math500_test.jsonl").open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def test_every_math500_gold_answer_is_equivalent_to_itself_through_math_verify(
    math500_rows: list[dict[str, Any]],
) -> None:
    rows = math500_rows
    assert len(rows) == 500
    failures = [
        row["answer"] for row in rows if not answers_equivalent(row["answer"], row["answer"], string_fast_path=False)
    ]
    assert failures == []


def test_every_math500_reference_solution_grades_correct_against_its_answer(
    math500_rows: list[dict[str, Any]],
) -> None:
    rows = math500_rows
    failures = [
        (row["unique_id"], r.predicted_answer)
        for row in rows
        if not (r := grade(row["solution"], row["answer"])).is_correct
    ]
    assert failures == []
