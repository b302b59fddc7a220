"""The exact step checker: the first provably wrong step of a solution, or "unknown" with the reason."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any, Literal

from prmloop.models.answers import extract_answer
from prmloop.models.arith.curriculum import DEFAULT_CONSTANTS, ArithChain
from prmloop.models.arith.equations import (
    bare_expression_values,
    evaluate,
    find_equations,
    number_words,
    result_claims,
    runs,
    show,
    stated_numbers,
)
from prmloop.models.arith.limits import BeyondLimits, ReadingBudget
from prmloop.models.arith.reading import StepReading, read_equation, read_mentions
from prmloop.models.arith.roles import QuestionRoles
from prmloop.models.arith.signs import Parts

# --------------------------------------------------------------------------------------------------
# The checker
# --------------------------------------------------------------------------------------------------

StepVerdict = Literal["verified", "wrong", "unverified"]
#: Which steps without an equation the checker vouches for (see :func:`check_steps`).
Strictness = Literal["equations", "quantities", "numbers", "lenient"]


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
        step_reasons: one per entry of ``verdicts``: ``"verified"``, why the step could not be
            verified, or why it is wrong.
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
    step_reasons: tuple[str, ...] = field(default=())

    @property
    def exact(self) -> bool:
        return self.status == "exact"


def _as_chain(chain: ArithChain | Mapping[str, Any]) -> ArithChain:
    return chain if isinstance(chain, ArithChain) else ArithChain.from_json(chain)


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
    equations = find_equations(answer)
    if value is None and len(equations) == 1 and equations[0].holds:
        value = equations[0].results()[0]  # "The final answer is: 9 + 10 = 19 apples"
    return "unparsed" if value is None else value


def check_steps(
    question_chain: ArithChain | Mapping[str, Any],
    steps: Sequence[str],
    *,
    constants: Iterable[int] = DEFAULT_CONSTANTS,
    strictness: Strictness = "equations",
    problem: str | None = None,
) -> StepCheck:
    """Find the first wrong step of a solution to an arithmetic question, exactly, or say "unknown".

    ``question_chain`` is the question's :class:`ArithChain` (or its JSON form, as stored in a
    question's metadata under ``chain``); ``steps`` are the solution's steps as free text, with or
    without ``Step k:`` labels; ``problem``, the question's text, lets the checker hold numbers
    written in prose to the question's own words (:mod:`prmloop.models.arith.roles`).

    Each step, in order, is:

    - *wrong* if it has a false equation (``3 * 4 = 13``; all sides are evaluated exactly with
      fractions), or an equation that uses a number that is not *known* (known = the question's
      numbers, the results of earlier equations and numbers earlier steps stated, and ``constants``),
      or an operation no correct solution writes (where the question only adds and subtracts: a
      product of its quantities, a number added that it takes away, a quantity used twice, 1 added
      from nowhere, see :mod:`prmloop.models.arith.signs`; otherwise another operation on a reference
      step's own operands, ``4 + 3`` for ``4 * 3``), or it states, outside any equation, a number that
      is not known and that no single operation on two known numbers gives (an invented number), or
      it gives a question number a role the question gives other numbers ("Ben finds 2 more" when he
      has 2 and finds 3; needs ``problem``), or it states a final answer other than the gold one
      (``The final answer is: 8``, ``\\boxed{8}``);
    - *verified* if it is not wrong, every equation with one operation is a step of the reference
      chain whose operands are at hand (or, where the question only adds and subtracts, any signed
      part of the answer: ``15 + 7`` before taking 5 away), every longer expression reaches a value
      of the chain, and every number it states without one is a number of the question, an earlier
      result, or the next result of the chain (a value stated before it can be had, or a bare
      constant such as "0 cookies", is not vouched for), and ``strictness`` vouches for it (below);
    - *unverified* otherwise, with the reason (``step_reasons``): correct arithmetic that leaves the
      reference chain where the question multiplies or shares (a regrouping or a slip, not told
      apart), an expression without a result off the chain (``3 + 1 books``), a question number
      presented as an outcome ("the total is 5", "she now has 4"), a number in words, a restatement
      the strictness does not vouch for.

    Verdict: the first wrong step is the first error, ``status="exact"``, when every step before it is
    verified; if an unverified step comes first, ``status="unknown"`` (``wrong_step`` still says where
    the first provable error is). With no wrong step: ``first_error_step=None`` and ``"exact"`` when
    every step is verified and the gold answer is stated (and, but at ``"quantities"``, at least one
    equation was read); ``"unknown"`` otherwise.

    What the checker does not see, and ``strictness``. It checks quantities, not meaning, so a
    sentence can be false with every number in it right ("Ella has 30 cards" when Anna has them).
    Which steps without an equation it vouches for is therefore a choice:

    - ``"equations"`` (default): only a step with an equation or one that states the gold answer;
    - ``"quantities"`` (the exact judge's): also a step whose every prose number says what the
      question says of it (same verb family, next word, person: "Emma has 5 shells.", "She finds 3
      more.") or is a result that can be had by now ("He has 8 apples now."); needs ``problem``;
    - ``"numbers"``: also a step whose stated numbers are all question numbers or results that can
      be had by now, in any words; a step with no number at all is unverified;
    - ``"lenient"``: also a step with no number at all ("the first arithmetic error").

    Measured on SmolLM2-135M's step_k solutions to levels 1-5 (240 solutions, 231 not correct; the
    located errors checked by hand, see ``flows/pools/levels.py``), before the operation and role
    rules: ``"equations"`` located 22, of which 21 were the true first error; ``"numbers"`` 46, about
    two in three right (the misses: an earlier sentence that misuses question numbers); ``"lenient"``
    91, fewer of them right. docs/judge-and-consensus.md's exact-judge section has the figures.

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
    check = _check(
        _as_chain(question_chain), steps, constants=constants, strictness=strictness, budget=budget, problem=problem
    )
    return replace(check, chars_read=budget.chars_read, pairs_tried=budget.pairs_tried)


def _check(
    chain: ArithChain,
    steps: Sequence[str],
    *,
    constants: Iterable[int],
    strictness: Strictness,
    budget: ReadingBudget,
    problem: str | None,
) -> StepCheck:
    gold = Fraction(chain.answer)
    allowed = {Fraction(c) for c in constants}
    on_chain = {Fraction(n) for n in chain.numbers} | {Fraction(r) for r in chain.results} | allowed
    question_numbers = {Fraction(n) for n in chain.numbers}
    known = question_numbers | allowed
    parts = Parts.of(chain, allowed)
    result_parts = parts.result_parts(chain) if parts is not None else {}
    totals = {Fraction(chain.steps[0].left)} | {Fraction(r) for r in chain.results}
    roles = QuestionRoles.from_problem(problem, linear=parts is not None, totals=totals) if problem else None
    counts: Counter[Fraction] = Counter(Fraction(n) for n in chain.numbers)
    verdicts: list[StepVerdict] = []
    reasons: list[str] = []
    first_unverified: int | None = None
    equation_count = 0
    answer_stated = False
    index = 0
    try:
        for index, text in enumerate(steps):
            budget.admit(text)
            step = StepReading(index)
            equations = find_equations(text)
            equation_count += len(equations)
            derived: list[Fraction] = []
            for equation in equations:
                derived.extend(
                    read_equation(
                        step,
                        equation,
                        chain=chain,
                        known=known,
                        derived=derived,
                        parts=parts,
                        counts=counts,
                        on_chain=on_chain,
                    )
                )
                if step.wrong:
                    break
            answer = _final_answer(text)
            stated = [] if answer is not None else stated_numbers(text)
            if step.wrong is None and answer is not None and answer != "unparsed":
                answer_stated = True
                if answer != gold:
                    step.wrong = f"step {index}: states the final answer {_fmt(answer)}, but the answer is {_fmt(gold)}"
            # A number stated without an equation is vouched for only if it could be had by now: a
            # question number, an earlier result, or the next result of the reference chain.
            so_far = known | set(derived)
            next_results = {Fraction(c.result) for c in chain.steps if {Fraction(c.left), Fraction(c.right)} <= so_far}
            if step.wrong is None:
                pool = [Fraction(n) for n in chain.numbers] + [k for k in so_far if k not in question_numbers | allowed]
                pool_counts = Counter(pool)
                for number in stated:
                    if number in known or number in derived or number in next_results:
                        continue
                    if not _one_operation_gives(number, pool_counts, budget):
                        step.wrong = f"step {index}: states {_fmt(number)}, which no operation on known numbers gives"
                        break
            results = {Fraction(r) for r in chain.results} | (known - question_numbers - allowed) | set(derived)
            restated = False
            if step.wrong is None and roles is not None:
                nearby = steps[max(0, index - 1) : index + 1]
                doubt = strictness in ("equations", "quantities")
                restated = read_mentions(step, text, roles, nearby, results | next_results, doubt=doubt)
            if step.wrong is not None:
                verdicts.append("wrong")
                reasons.append(step.wrong)
                if first_unverified is None:
                    return _done(
                        "exact", index, step.wrong, verdicts, reasons, wrong_step=index, equations=equation_count
                    )
                return _done(
                    "unknown",
                    None,
                    f"{step.wrong}; but step {first_unverified} before it could not be verified "
                    f"({reasons[first_unverified]})",
                    verdicts,
                    reasons,
                    wrong_step=index,
                    equations=equation_count,
                )
            stateable = ((known - allowed) | question_numbers | set(derived) | next_results) - (
                allowed - question_numbers
            )
            for value in bare_expression_values(text):
                if value not in on_chain:
                    step.doubt(f"writes an expression worth {_fmt(value)} without a result, off the reference chain")
            for value in [n for n in stated if n not in stateable]:
                step.doubt(f"states {_fmt(value)} before it can be had")
            for value in [n for n in number_words(text) if n not in allowed and n not in stateable]:
                step.doubt(f"writes a number in words ({_fmt(value)}), which the checker does not read")
            # "The total is 5", "I'll have 2 left", "she now has 4": a count claimed as a result must be a
            # result (of the chain or of this solution's equations), not a restated question number.
            for value in result_claims(text):
                if value not in results and (answer is None or answer != value):
                    step.doubt(f"presents {_fmt(value)} as a result, but it is no result")
            prose_only = not equations and not stated and answer is None
            if prose_only and strictness != "lenient":
                step.doubt("states no number: nothing to check")
            elif not equations and answer is None and strictness == "equations":
                step.doubt("a restatement (at strictness 'equations' only an equation or the answer vouch for a step)")
            elif not equations and answer is None and strictness == "quantities" and not restated:
                step.doubt("restates numbers in words the checker cannot match to the question's")
            if step.doubts:
                verdicts.append("unverified")
                reasons.append("; ".join(step.doubts))
                if first_unverified is None:
                    first_unverified = index
            else:
                verdicts.append("verified")
                reasons.append("verified")
            known.update(derived)
            known.update(stated)
            counts.update(derived)
            counts.update(n for n in stated if n not in question_numbers)
            if parts is not None:
                for value in stated:
                    if value in result_parts:
                        parts.learn(value, [result_parts[value]])
                    elif value not in question_numbers or not restated:
                        parts.learn(value, [None])
    except BeyondLimits as error:
        reason = f"step {index}: cannot decide: {error}"
        return _done("unknown", None, reason, verdicts, reasons, equations=equation_count, beyond_limits=True)

    if not steps:
        return StepCheck("unknown", None, "no steps to check", (), None, 0)
    if equation_count == 0 and strictness != "quantities":
        return _done("unknown", None, "no equation in any step: nothing to verify", verdicts, reasons, equations=0)
    if first_unverified is not None:
        return _done(
            "unknown",
            None,
            f"no provably wrong step, but step {first_unverified} could not be verified ({reasons[first_unverified]})",
            verdicts,
            reasons,
            equations=equation_count,
        )
    if not answer_stated:
        reason = "every step verified, but no final answer is stated"
        return _done("unknown", None, reason, verdicts, reasons, equations=equation_count)
    return _done(
        "exact", None, "every step verified and the gold answer stated", verdicts, reasons, equations=equation_count
    )


def _done(
    status: Literal["exact", "unknown"],
    first: int | None,
    reason: str,
    verdicts: list[StepVerdict],
    reasons: list[str],
    *,
    wrong_step: int | None = None,
    equations: int,
    beyond_limits: bool = False,
) -> StepCheck:
    return StepCheck(
        status, first, reason, tuple(verdicts), wrong_step, equations, beyond_limits, step_reasons=tuple(reasons)
    )
