"""Reading one step for the exact checker: its equations and the numbers it writes in prose."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction

from prmloop.models.arith.curriculum import ArithChain, ChainStep
from prmloop.models.arith.equations import Equation, has_operator, mentions, show
from prmloop.models.arith.roles import QuestionRoles
from prmloop.models.arith.signs import Parts, wrong_operation

__all__ = ["StepReading", "read_equation", "read_mentions"]

_fmt = show


@dataclass
class StepReading:
    """What one step was found to be: ``wrong`` (the reason), or else unverified (``doubts``) or verified."""

    index: int
    wrong: str | None = None
    doubts: list[str] = field(default_factory=list)

    def doubt(self, why: str) -> None:
        if why not in self.doubts:
            self.doubts.append(why)


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


def read_equation(
    step: StepReading,
    equation: Equation,
    *,
    chain: ArithChain,
    known: set[Fraction],
    derived: list[Fraction],
    parts: Parts | None,
    counts: Counter[Fraction],
    on_chain: set[Fraction],
) -> list[Fraction]:
    """Check one equation of a step: set ``step.wrong`` or add doubts; returns the values it derives."""
    index = step.index
    if None in equation.values():
        # A side that is not a well-formed expression ("10 2 * 39"): read wrongly, so no verdict.
        step.doubt(f"{equation.text} has a side that is not an expression")
        return []
    if not equation.holds:
        values = ", ".join("?" if v is None else _fmt(v) for v in equation.values())
        step.wrong = f"step {index}: false equation {equation.text} (sides evaluate to {values})"
        return []
    unknown = [n for n in equation.operands() if n not in known and n not in derived]
    if unknown:
        neither = "which is neither in the question nor derived"
        step.wrong = f"step {index}: {equation.text} uses {_fmt(unknown[0])}, {neither}"
        return []
    # One operation must be a step of the reference chain whose operands are at hand ("3 * 3 = 9" is
    # not, when 9 is the answer of 3 * 4 - 3); a longer expression may reach any value of the chain
    # ("3 + 4 + 5 = 12"). Where the question only adds and subtracts, any signed part of the answer
    # is vouched for, and an operation no reading allows is wrong (models/arith/signs.py).
    have = known | set(derived)
    at_hand = [c for c in chain.steps if {Fraction(c.left), Fraction(c.right)} <= have]
    single = _single_operation(equation)
    vouched = (
        any(_same_operation(single, c) for c in at_hand)
        if single is not None
        else all(r in on_chain for r in equation.results())
    )
    results = equation.results()
    if parts is not None:
        verdict, vectors, why = parts.judge(equation)
        if verdict == "invalid" and not vouched:
            step.wrong = f"step {index}: {equation.text} {why}"
            return []
        for value in results:
            parts.learn(value, vectors if verdict == "valid" else [None])
        if verdict == "valid" and not vouched:
            vouched = any(parts.vouches(v) for v in vectors)
            if not vouched:
                step.doubt(
                    f"{equation.text} is a correct part of the answer but no count the story reaches "
                    "(an event left out, or the story reordered: not told apart)"
                )
                return results
    elif not vouched:
        mistaken = wrong_operation(equation, chain, counts, on_chain)
        if mistaken is not None:
            step.wrong = f"step {index}: {mistaken}"
            return []
    if not vouched:
        step.doubt(f"{equation.text} leaves the reference chain (a regrouping or a slip: not told apart)")
    return results


def read_mentions(
    step: StepReading, text: str, roles: QuestionRoles, nearby: Sequence[str], results: set[Fraction], *, doubt: bool
) -> bool:
    """Hold the step's prose numbers to the question's (:mod:`prmloop.models.arith.roles`): set
    ``step.wrong`` on a contradiction, doubt (with ``doubt``) a number said with a verb of the story
    that the question does not say of it; ``True`` when every one is a restatement or a result."""
    found = mentions(text)
    others_nearby = roles.others_named(nearby)
    clear = bool(found)
    for mention in found:
        reading = roles.read(mention)
        value = mention.value
        if value in roles.uses and roles.matches(value, reading):
            continue
        if value in results and reading.verb not in _ACTIONS and reading.after != "more":
            continue  # a count the story reaches ("he has 8 now")
        if value in roles.uses:
            contradiction = roles.contradiction(value, reading, results=results, others_nearby=others_nearby)
            if contradiction is not None:
                step.wrong = f"step {step.index}: {contradiction}"
                return False
        clear = False
        if doubt and (reading.verb in (*_ACTIONS, "have") or reading.after == "more"):
            said = " ".join([*mention.before[-2:], _fmt(value), *([mention.after] if mention.after else [])])
            step.doubt(f"says '{said}', not what the question says of {_fmt(value)}")
    return clear


_ACTIONS = ("acquire", "remove", "share")
