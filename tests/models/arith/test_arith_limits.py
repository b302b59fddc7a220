"""The exact checker's limits (models/arith/limits.py): bounded, linear work on any solution, however hostile."""

from __future__ import annotations

import time
from collections import Counter
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prmloop.models.arith import ArithChain, ChainStep, check_steps, generate_question
from prmloop.models.arith.checker import _one_operation_gives
from prmloop.models.arith.limits import (
    MAX_CHARS,
    MAX_DIGITS,
    MAX_EXPRESSION_TERMS,
    MAX_NESTING,
    MAX_NUMBERS,
    MAX_STEPS,
    ReadingBudget,
)
from prmloop.store.events.limits import DEFAULT_MAX_EVENT_BYTES

TOM = ArithChain(
    numbers=(3, 4, 2, 5),
    steps=(ChainStep("+", 3, 4, 7), ChainStep("*", 2, 5, 10), ChainStep("+", 7, 10, 17)),
)
LEVEL5 = generate_question(5, 0, 0)


def _timed(steps: list[str], chain: ArithChain = TOM) -> tuple[object, float]:
    started = time.process_time()
    check = check_steps(chain, steps)
    return check, time.process_time() - started


def test_the_hostile_step_of_issue_25_is_undecided_at_once_not_a_crash() -> None:
    # 32k terms of "9999 * " = 1: a quadratic product of 128,000 digits, then a ValueError printing it.
    check, cpu = _timed(["9999 * " * 32_000 + "= 1"])
    assert check.status == "unknown" and check.beyond_limits
    assert check.reason.startswith("step 0: cannot decide:") and f"MAX_CHARS={MAX_CHARS}" in check.reason
    assert check.chars_read == 0 and check.pairs_tried == 0  # measured, never read
    assert cpu < 1.0


def test_a_step_at_the_event_size_limit_costs_nothing_to_refuse() -> None:
    # The worst a StepsScored can carry: one step of nearly 4 MiB of "9999 * ".
    step = "9999 * " * ((DEFAULT_MAX_EVENT_BYTES - 4096) // 7)
    check, cpu = _timed([step])
    assert check.status == "unknown" and check.beyond_limits and "MAX_CHARS" in check.reason
    assert check.chars_read == 0 and check.pairs_tried == 0
    assert cpu < 1.0


@pytest.mark.parametrize(
    ("steps", "limit"),
    [
        (["3 + 4 = 7"] * (MAX_STEPS + 1), "MAX_STEPS"),
        (["1 " * (MAX_NUMBERS + 1)], "MAX_NUMBERS"),
        ([f"3 + {'9' * (MAX_DIGITS + 1)} = 7"], "MAX_DIGITS"),
        (["(" * (MAX_NESTING + 1) + "3" + ")" * (MAX_NESTING + 1) + " + 4 = 7"], "MAX_NESTING"),
        (["- " * (MAX_NESTING + 1) + "3 + 4 = 7"], "MAX_NESTING"),
        ([" * ".join(["99999"] * 60) + " = 7"], "MAX_VALUE_DIGITS"),
        ([" + ".join(["1"] * (MAX_EXPRESSION_TERMS // 2 + 1)) + " = 7"], "MAX_EXPRESSION_TERMS"),
        (["Three and four make seven. " * 1000], "MAX_CHARS"),
    ],
)
def test_each_limit_makes_the_solution_undecided_and_is_named(steps: list[str], limit: str) -> None:
    check, cpu = _timed(steps)
    assert check.status == "unknown" and check.beyond_limits and check.first_error_step is None
    assert limit in check.reason and "cannot decide" in check.reason
    assert cpu < 1.0


def test_nesting_that_used_to_exhaust_the_stack_is_undecided() -> None:
    # 5000 levels were a RecursionError; the expression is now refused by its length, before evaluation.
    check, _ = _timed(["(" * 5000 + "3" + ")" * 5000 + " + 4 = 7"])
    assert check.status == "unknown" and check.beyond_limits and "MAX_EXPRESSION_TERMS" in check.reason


def test_a_wrong_step_before_the_limit_is_still_found_exactly() -> None:
    check, _ = _timed(["3 + 4 = 8", "9" * 10_000 + " = 9"])
    assert check.status == "exact" and check.first_error_step == 0 and not check.beyond_limits


def test_solutions_within_the_limits_are_checked_as_before() -> None:
    steps = list(LEVEL5.reference_steps)
    check, _ = _timed(steps, LEVEL5.chain)
    assert check.status == "exact" and check.first_error_step is None and not check.beyond_limits
    assert check.chars_read == sum(len(s) for s in steps)


def test_the_costliest_solution_within_the_limits_stays_bounded() -> None:
    # Every step states numbers that one operation on the known numbers gives, so each is searched
    # for, and each step's numbers join the known ones (the pool the next step searches grows).
    pool = list(LEVEL5.chain.numbers)
    steps: list[str] = []
    while len(pool) - len(LEVEL5.chain.numbers) + 30 <= MAX_NUMBERS:
        top = max(pool)
        new = sorted({top + x for x in pool if x != top})[-30:]
        steps.append("So " + " and ".join(str(n) for n in new) + " follow.")
        pool += new
    check, cpu = _timed(steps, LEVEL5.chain)
    assert not check.beyond_limits and check.reason == "no equation in any step: nothing to verify"
    assert check.pairs_tried > 10_000  # the search really ran ...
    assert check.pairs_tried <= MAX_NUMBERS * (MAX_NUMBERS + len(LEVEL5.chain.numbers))  # ... within its bound
    assert check.chars_read <= MAX_CHARS
    assert cpu < 1.0


def _brute_force(target: Fraction, pool: list[Fraction]) -> bool:
    """The definition: some ``a op b`` with a and b at different positions of ``pool``."""
    for i, a in enumerate(pool):
        for j, b in enumerate(pool):
            if i != j and (target in (a + b, a - b, a * b) or (b != 0 and a / b == target)):
                return True
    return False


_values = st.one_of(
    st.integers(-12, 12).map(Fraction),
    st.builds(Fraction, st.integers(-12, 12), st.integers(1, 4)),
)


@given(pool=st.lists(_values, max_size=8), target=_values)
def test_the_linear_search_for_one_operation_agrees_with_the_definition(pool: list[Fraction], target: Fraction) -> None:
    budget = ReadingBudget()
    assert _one_operation_gives(target, Counter(pool), budget) == _brute_force(target, pool)
    assert budget.pairs_tried <= len(set(pool))


LEVEL3 = generate_question(3, 0, 0)


def test_the_wording_and_operation_rules_stay_bounded_on_the_costliest_prose_and_arithmetic() -> None:
    # Every written number a prose mention (its sentence read back a bounded number of words), and
    # as many true equations on the question's numbers as the limits allow (each result gets its
    # parts, at most MAX_PARTS per value, MAX_READINGS readings per equation).
    first = LEVEL3.chain.steps[0]
    a, b, r = first.left, first.right, first.result
    back = "-" if first.op == "+" else "+"
    prose = ["Ben has " + " and ".join([str(a)] * 140) + " apples."]
    arithmetic = [f"{a} {first.op} {b} = {r}, {r} {back} {b} = {a}"] * 26  # true, and parts of the answer
    for steps in (prose, arithmetic, prose + arithmetic):
        started = time.process_time()
        check = check_steps(LEVEL3.chain, steps, problem=LEVEL3.problem, strictness="quantities")
        cpu = time.process_time() - started
        assert not check.beyond_limits and check.wrong_step is None, check.reason
        assert cpu < 1.0, (len(steps), cpu)
