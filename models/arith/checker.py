"""The exact step checker: the first provably wrong step of a solution, or "unknown" with the reason."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any, Literal

from prmloop.models.answers import extract_answer
from prmloop.models.arith.curriculum import DEFAULT_CONSTANTS, ArithChain, ChainStep
from prmloop.models.arith.equations import (
    Equation,
    bare_expression_values,
    evaluate,
    find_equations,
    has_operator,
    number_words,
    result_claims,
    runs,
    show,
    stated_numbers,
)
from prmloop.models.arith.limits import BeyondLimits, ReadingBudget

# --------------------------------------------------------------------------------------------------
# The checker
# --------------------------------------------------------------------------------------------------

StepVerdict = Literal["verified", "wrong", "unverified"]


@dataclass(frozen=True, slots=True)
class StepCheck:
    """The checker's verdict on one solution.

    Attributes:
        status: ``"exact"``: ``first_error_step`` is the first wrong step (every step before it is
            verified), or ``None`` and every step is verified and the stated answer is the gold one;
            ``"unknown"``: the checker cannot decide (see ``reason``).
        first_error_step: 0-based index of the first wrong step; ``None`` when there is none or the
            status is unknown.
        reason: how the verdict was reached, in words.
        verdicts: one per step checked: ``verified``, ``wrong`` or ``unverified``. Checking stops at
            the first wrong step, so this may be shorter than the solution.
        wrong_step: the first step found wrong even when an unverified step before it makes the
            location unknown (a hint, not a label).
        equations: how many equations were read.
        beyond_limits: the checker stopped reading at a limit of :mod:`prmloop.models.arith.limits`
            (``status`` is ``"unknown"``, ``reason`` names the limit).
        chars_read: characters of the solution scanned (its work is linear in them).
        pairs_tried: pairs of numbers tried for a single operation that gives a stated number (the
            only part of the work that is not linear; bounded by the limits).
    """

    status: Literal["exact", "unknown"]
    first_error_step: int | None
    reason: str
    verdicts: tuple[StepVerdict, ...] = field(default=())
    wrong_step: int | None = None
    equations: int = 0
    beyond_limits: bool = False
    chars_read: int = 0
    pairs_tried: int = 0

    @property
    def exact(self) -> bool:
        return self.status == "exact"


def _as_chain(chain: ArithChain | Mapping[str, Any]) -> ArithChain:
    return chain if isinstance(chain, ArithChain) else ArithChain.from_json(chain)


def _single_operation(equation: Equation) -> tuple[str, Fraction, Fraction] | None:
    """``(op, a, b)`` when the equation computes one operation ``a op b`` (``2(5)`` is ``*``)."""
    operands = equation.operands()
    if len(operands) != 2:
        return None
    side = next(side for side in equation.sides if has_operator(side))
    ops = [t for t in side[1:] if t in ("+", "-", "*", "/")]
    return (str(ops[0]) if ops else "*", operands[0], operands[1])


def _same_operation(single: tuple[str, Fraction, Fraction], step: ChainStep) -> bool:
    """Whether ``a op b`` is the chain step (either order for ``+`` and ``*``)."""
    op, a, b = single
    left, right = Fraction(step.left), Fraction(step.right)
    if op != step.op:
        return False
    return (a, b) == (left, right) or (op in ("+", "*") and (b, a) == (left, right))


def _one_operation_gives(target: Fraction, counts: Counter[Fraction], budget: ReadingBudget) -> bool:
    """Whether ``a op b == target`` for two known numbers at different positions (``counts``: how
    often each number is known; so ``4 * 4`` only when 4 is known twice). Constants are left out by
    the caller: ``x + 1`` would make every off-by-one slip look derivable.

    One pass over the distinct numbers, solving each operation for ``b`` (linear, where listing every
    ``a op b`` is quadratic in the numbers known). When every number is whole, so is any ``b`` that
    can be known, and plain integers stand in for fractions (about three times faster).
    """
    total = sum(counts.values())
    nonzero = total - counts.get(Fraction(0), 0)
    whole = target.denominator == 1 and all(k.denominator == 1 for k in counts)
    values: dict[Fraction | int, int] = {(k.numerator if whole else k): n for k, n in counts.items()}
    goal: Fraction | int = target.numerator if whole else target
    for a, times in values.items():
        budget.pairs_tried += 1
        candidates: list[Fraction | int | None] = [goal - a, a - goal]  # a + b, a - b
        if a != 0:
            candidates.append(_quotient(goal, a, whole))  # a * b
        elif goal == 0 and total >= 2:
            return True  # 0 * b
        if goal != 0:
            if a != 0:
                candidates.append(_quotient(a, goal, whole))  # a / b, b != 0
        elif a == 0 and nonzero >= 1:
            return True  # 0 / b with b != 0
        if any(b is not None and b in values and (b != a or times >= 2) for b in candidates):
            return True
    return False


def _quotient(x: Fraction | int, y: Fraction | int, whole: bool) -> Fraction | int | None:
    """``x / y``; for integers only when exact (``None`` otherwise: no whole number is that quotient)."""
    if not whole:
        return Fraction(x) / y
    assert isinstance(x, int) and isinstance(y, int)
    return x // y if x % y == 0 else None


def _fmt(value: Fraction) -> str:
    return show(value)


def _final_answer(text: str) -> Fraction | Literal["unparsed"] | None:
    """The final answer a step states as a number, ``None`` if it states none, ``"unparsed"`` if not a number."""
    if not re.search(r"answer|\\boxed|\\fbox|####", text, flags=re.IGNORECASE):
        return None
    answer = extract_answer(text)
    if answer is None:
        return None
    numbers = [t for tokens in runs(answer) for t in tokens if isinstance(t, Fraction)]
    value = evaluate([t for tokens in runs(answer) for t in tokens]) if numbers else None
    if value is None and len(numbers) == 1:
        value = numbers[0]
    return "unparsed" if value is None else value


def check_steps(
    question_chain: ArithChain | Mapping[str, Any],
    steps: Sequence[str],
    *,
    constants: Iterable[int] = DEFAULT_CONSTANTS,
    strictness: Literal["equations", "numbers", "lenient"] = "equations",
) -> StepCheck:
    """Find the first wrong step of a solution to an arithmetic question, exactly, or say "unknown".

    ``question_chain`` is the question's :class:`ArithChain` (or its JSON form, as stored in a
    question's metadata under ``chain``); ``steps`` are the solution's steps as free text, with or
    without ``Step k:`` labels.

    Each step, in order, is:

    - *wrong* if it has a false equation (``3 * 4 = 13``; all sides are evaluated exactly with
      fractions), or an equation that uses a number that is not *known* (known = the question's
      numbers, the results of earlier equations and numbers earlier steps stated, and ``constants``),
      or it states, outside any equation, a number that is not known and that no single operation on
      two known numbers gives (an invented number), or it states a final answer other than the gold
      one (``The final answer is: 8``, ``\\boxed{8}``);
    - *verified* if it is not wrong, every equation with one operation is a step of the reference
      chain (same operation, same operands, either order for ``+`` and ``*``) whose operands are at
      hand, every longer expression reaches a value of the chain, and
      every number it
      states without one is a number of the question, an earlier result, or the result of a
      reference step whose operands are already known (a value stated before it can be had, such as
      the final answer in the first step, or a bare constant such as "0 cookies", is not vouched for);
    - *unverified* otherwise (correct arithmetic that leaves the reference chain: a valid regrouping
      or a wrong operation, which arithmetic alone cannot tell apart; an expression written without
      a result, such as ``3 + 1 books``, counts as deriving its value; so does a number presented as
      an outcome, "the total is 5", "I'll have 2 left", "she now has 4", when it is a question number
      rather than a result).

    Verdict: the first wrong step is the first error, ``status="exact"``, when every step before it is
    verified; if an unverified step comes first, ``status="unknown"`` (``wrong_step`` still says where
    the first provable error is). With no wrong step: ``first_error_step=None`` and ``"exact"`` when
    every step is verified, the gold answer is stated and at least one equation was read;
    ``"unknown"`` otherwise (no equation at all, no answer stated, or an unverified step).

    What the checker does not see, and ``strictness``. It checks quantities, not words, so a sentence
    can be false with every number in it right ("Ella has 30 cards" when Anna has them, "she is 3
    years old" when she is 9). Which steps without an equation it vouches for is therefore a choice:

    - ``"equations"`` (default): only a step with an equation (all of its equations true, operands
      at hand, results on the chain) or one that states the gold answer is verified; restatements
      and prose are unverified. An error is located exactly only after steps that each showed
      correct work, or in the first step.
    - ``"numbers"``: also a step whose stated numbers are all question numbers or results that can
      be had by now; a step with no number at all is unverified.
    - ``"lenient"``: also a step with no number at all ("the first arithmetic error").

    Measured on SmolLM2-135M's step_k solutions to levels 1-5 (240 solutions, 231 not correct; the
    located errors checked by hand, see ``flows/evals/arith.py``): ``"equations"`` located 22, of
    which 21 were the true first error (20 of the 22 are in step 0, where any located error is the
    first); ``"numbers"`` located 46, of which about two in three were right in a hand check (the
    misses: an earlier sentence that misuses question numbers, "Ella has 30 cards" when Anna has
    them); ``"lenient"`` located 91, fewer of them right. Number words (``two``, ``twelve``) are not
    read as numbers; a step with one that is not on the chain is unverified.

    Numbers are read with ``1,000`` -> 1000, ``$5`` -> 5, ``5.0`` -> 5; ``x``, ``×``, ``*``,
    ``\\times``, ``\\cdot`` multiply; ``÷``, ``/`` and ``\\div`` divide; ``Step 3:`` labels and
    ordinals (``2nd``) are not numbers.

    Limits (:mod:`prmloop.models.arith.limits`): a solution longer than the checker reads (steps,
    characters, written numbers, digits of a number, terms of an expression, nesting, digits of a
    computed value) is ``"unknown"`` from the step that passes the limit on (``beyond_limits``; the
    reason names the limit); a wrong step before it is still found. The work is linear in the
    characters read, and a step is measured before it is read.
    """
    budget = ReadingBudget()
    check = _check(_as_chain(question_chain), steps, constants, strictness, budget)
    return replace(check, chars_read=budget.chars_read, pairs_tried=budget.pairs_tried)


def _check(
    chain: ArithChain,
    steps: Sequence[str],
    constants: Iterable[int],
    strictness: Literal["equations", "numbers", "lenient"],
    budget: ReadingBudget,
) -> StepCheck:
    gold = Fraction(chain.answer)
    allowed = {Fraction(c) for c in constants}
    on_chain = {Fraction(n) for n in chain.numbers} | {Fraction(r) for r in chain.results} | allowed
    question_numbers = {Fraction(n) for n in chain.numbers}
    known = question_numbers | allowed
    verdicts: list[StepVerdict] = []
    first_unverified: int | None = None
    equation_count = 0
    answer_stated = False
    index = 0
    try:
        for index, step in enumerate(steps):
            budget.admit(step)
            equations = find_equations(step)
            equation_count += len(equations)
            wrong: str | None = None
            derived: list[Fraction] = []
            unreadable = False
            off_chain: list[Fraction] = []
            for equation in equations:
                if None in equation.values():
                    # A side that is not a well-formed expression ("10 2 * 39"): read wrongly, so no verdict.
                    unreadable = True
                    continue
                if not equation.holds:
                    values = ", ".join("?" if v is None else _fmt(v) for v in equation.values())
                    wrong = f"step {index}: false equation {equation.text} (sides evaluate to {values})"
                    break
                unknown = [n for n in equation.operands() if n not in known and n not in derived]
                if unknown:
                    wrong = (
                        f"step {index}: {equation.text} uses {_fmt(unknown[0])}, "
                        "which is neither in the question nor derived"
                    )
                    break
                # One operation must be a step of the reference chain whose operands are at hand
                # ("3 * 3 = 9" is not, when 9 is the answer of 3 * 4 - 3); a longer expression may
                # reach any value of the chain ("3 + 4 + 5 = 12").
                have = known | set(derived)
                at_hand = [c for c in chain.steps if {Fraction(c.left), Fraction(c.right)} <= have]
                single = _single_operation(equation)
                vouched = (
                    any(_same_operation(single, c) for c in at_hand)
                    if single is not None
                    else all(r in on_chain for r in equation.results())
                )
                if not vouched:
                    off_chain.extend(equation.results())
                derived.extend(equation.results())
            answer = _final_answer(step)
            stated = [] if answer is not None else stated_numbers(step)
            if wrong is None and answer is not None and answer != "unparsed":
                answer_stated = True
                if answer != gold:
                    wrong = f"step {index}: states the final answer {_fmt(answer)}, but the answer is {_fmt(gold)}"
            # A number stated without an equation is vouched for only if it could be had by now: a
            # question number, an earlier result, or the next result of the reference chain.
            so_far = known | set(derived)
            next_results = {Fraction(c.result) for c in chain.steps if {Fraction(c.left), Fraction(c.right)} <= so_far}
            if wrong is None:
                pool = [Fraction(n) for n in chain.numbers] + [k for k in so_far if k not in question_numbers | allowed]
                counts = Counter(pool)
                for number in stated:
                    if number in known or number in derived or number in next_results:
                        continue
                    if not _one_operation_gives(number, counts, budget):
                        wrong = f"step {index}: states {_fmt(number)}, which no operation on known numbers gives"
                        break
            if wrong is not None:
                verdicts.append("wrong")
                if first_unverified is None:
                    return StepCheck("exact", index, wrong, tuple(verdicts), index, equation_count)
                return StepCheck(
                    "unknown",
                    None,
                    f"{wrong}; but step {first_unverified} before it could not be verified",
                    tuple(verdicts),
                    index,
                    equation_count,
                )
            stateable = ((known - allowed) | question_numbers | set(derived) | next_results) - (
                allowed - question_numbers
            )
            fresh = off_chain + [n for n in bare_expression_values(step) if n not in on_chain]
            words = [n for n in number_words(step) if n not in allowed]  # "one of them" claims nothing
            fresh += [n for n in (*stated, *words) if n not in stateable]
            # "The total is 5", "I'll have 2 left", "she now has 4": a count claimed as a result must be a
            # result (of the chain or of this solution's equations), not a restated question number.
            results = {Fraction(r) for r in chain.results} | (known - question_numbers - allowed) | set(derived)
            fresh += [n for n in result_claims(step) if n not in results and answer is None]
            prose_only = not equations and not stated and answer is None
            unchecked = {
                "lenient": False,
                "numbers": prose_only,
                # Only an equation, or the gold answer, vouches for a step: restatements do not.
                "equations": not equations and answer is None,
            }[strictness]
            if fresh or unreadable or unchecked:
                verdicts.append("unverified")
                if first_unverified is None:
                    first_unverified = index
            else:
                verdicts.append("verified")
            known.update(derived)
            known.update(stated)
    except BeyondLimits as error:
        return StepCheck(
            "unknown", None, f"step {index}: cannot decide: {error}", tuple(verdicts), None, equation_count, True
        )

    if not steps:
        return StepCheck("unknown", None, "no steps to check", (), None, 0)
    if equation_count == 0:
        return StepCheck("unknown", None, "no equation in any step: nothing to verify", tuple(verdicts), None, 0)
    if first_unverified is not None:
        return StepCheck(
            "unknown",
            None,
            f"no provably wrong step, but step {first_unverified} leaves the reference chain",
            tuple(verdicts),
            None,
            equation_count,
        )
    if not answer_stated:
        return StepCheck(
            "unknown", None, "every step verified, but no final answer is stated", tuple(verdicts), None, equation_count
        )
    return StepCheck(
        "exact", None, "every step verified and the gold answer stated", tuple(verdicts), None, equation_count
    )
