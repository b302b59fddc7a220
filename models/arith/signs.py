"""Which operations on the question's quantities any correct solution may write, for the checker.

A question that only adds and subtracts (levels 1-3: ``Ben has 13 pencils. He buys 14 more. He gives
5 to Max.``) has one answer, ``13 + 14 - 5``, and many correct ways to reach it: any order, any
grouping (``14 - 5 = 9`` first, or the amounts given away summed first). Every quantity such a solution
computes is a *signed part* of the answer: a sum of some of the question's numbers each with its own
sign (``13 + 14``, ``14 - 5``), or the negative of one (``5 + 2`` for everything given away). So an
equation can be read exactly, by values, without the words:

- *valid* when some reading of its operands (each a question number, a constant, or a quantity
  derived before, with the part it stands for) makes its result a signed part: the step computes
  something a correct solution may compute, on the reference chain or not;
- *invalid* when no reading does: a product or a quotient of quantities (``2 * 3`` for "has 2, finds 3
  more"), a number added that the question takes away (``20 + 16`` for "gives 16 to Max"), one
  quantity used twice (``27 + 27``), or 1 added or taken that is no number of the question (``2 + 1``);
- *undecided* when an operand is a quantity whose part is not known (derived by a step the checker
  could not read), or there are too many readings to try (a bound keeps the work linear).

Questions with products or shares (levels 4-5) are not read this way; for them only an operation on a
reference step's own operands is judged (:func:`wrong_operation`): ``4 + 3`` where the question's
step is ``4 * 3`` is wrong when nothing else can be meant.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from itertools import pairwise, product
from typing import Literal

from prmloop.models.arith.curriculum import ArithChain, ChainStep
from prmloop.models.arith.equations import Equation, has_operator, show

__all__ = ["Parts", "wrong_operation"]

#: Readings of one expression tried at most (operands with several possible meanings multiply them).
MAX_READINGS = 64
#: Parts one value may stand for, at most; past it the value's part is unknown (a bound on the work).
MAX_PARTS = 8

Vector = tuple[int, ...]
_CONSTANT: Literal["constant"] = "constant"
Candidate = Vector | Literal["constant"] | None  # None: a quantity whose part is unknown
Verdict = Literal["valid", "invalid", "undecided"]


@dataclass
class Parts:
    """The signed parts of a question that only adds and subtracts, and what each known value may be.

    ``signs``: one per question number, in the question's order: ``+1`` (the start, an amount
    added), ``-1`` (an amount taken away), ``0`` (a distractor). ``known``: each value a solution may
    use, with every part it may stand for (``None``: unknown).
    """

    signs: tuple[int, ...]
    values: tuple[Fraction, ...]
    constants: frozenset[Fraction]
    start: int = 0
    totals: frozenset[Vector] = frozenset()
    known: dict[Fraction, list[Candidate]] = field(default_factory=dict)

    @classmethod
    def of(cls, chain: ArithChain, constants: Iterable[Fraction]) -> Parts | None:
        """``None`` unless the chain is a running total changed by additions and subtractions of
        question numbers (what levels 1-3 generate)."""
        steps = chain.steps
        if any(s.op not in ("+", "-") for s in steps):
            return None
        if any(later.left != earlier.result for earlier, later in pairwise(steps)):
            return None
        wanted = [(steps[0].left, 1)] + [(s.right, 1 if s.op == "+" else -1) for s in steps]
        signs = []
        for number in chain.numbers:
            match = next((i for i, (value, _) in enumerate(wanted) if value == number), None)
            if match is None:
                signs.append(0)  # a distractor
            else:
                signs.append(wanted.pop(match)[1])
        if wanted:
            return None  # the chain uses a number the question does not state
        values = tuple(Fraction(n) for n in chain.numbers)
        start = chain.numbers.index(steps[0].left)
        parts = cls(tuple(signs), values, frozenset(Fraction(c) for c in constants) - set(values), start)
        parts.totals = frozenset(parts.result_parts(chain).values())
        for i, value in enumerate(values):
            parts.known.setdefault(value, []).append(tuple(int(i == j) for j in range(len(values))))
        for constant in parts.constants:
            parts.known.setdefault(constant, []).append(_CONSTANT)
        return parts

    def result_parts(self, chain: ArithChain) -> dict[Fraction, Vector]:
        """The part each result of the reference chain stands for (the running total after each step)."""
        running = [0] * len(self.values)
        used = set()
        found: dict[Fraction, Vector] = {}
        operands = [chain.steps[0].left] + [s.right for s in chain.steps]
        for k, number in enumerate(operands):
            i = next(j for j, v in enumerate(self.values) if v == number and j not in used and self.signs[j] != 0)
            used.add(i)
            running[i] = self.signs[i]
            if k:
                found.setdefault(Fraction(chain.steps[k - 1].result), tuple(running))
        return found

    def vouches(self, vector: Vector) -> bool:
        """Whether a signed part is vouched for as a step: a count the story reaches (a result of the
        reference chain), or amounts taken together without the start ("3 + 4 bought", "16 + 1 given
        away", "7 - 5 more than before"). A part with the start that is no such count (``2 + 9`` when
        16 came between) is correct arithmetic that left an event out or reordered the story, not told
        apart; one number alone got back by a computation (``5 - 1 = 4`` when 4 is the start) undoes a
        step: neither is vouched for."""
        if vector in self.totals:
            return True
        return vector[self.start] == 0 and sum(c != 0 for c in vector) >= 2

    def learn(self, value: Fraction, candidates: Sequence[Candidate]) -> None:
        """A value derived or stated, with the parts it may stand for."""
        have = self.known.setdefault(value, [])
        for candidate in candidates:
            if candidate in have:
                continue
            if len(have) >= MAX_PARTS:
                if None not in have:
                    have.append(None)
                return
            have.append(candidate)

    def judge(self, equation: Equation) -> tuple[Verdict, list[Vector], str]:
        """Whether the equation computes a signed part (see the module docstring), the parts its result
        may stand for, and why (for an invalid one)."""
        computing = [side for side in equation.sides if has_operator(side)]
        if len(computing) != 1:
            return "undecided", [], ""
        side = list(computing[0])
        if len(side) > 1 and side[0] == "-" and isinstance(side[1], Fraction):
            side = [-side[1], *side[2:]]  # "-2 + 7": a negative quantity derived before
        terms, ops = side[0::2], side[1::2]
        if any(not isinstance(t, Fraction) for t in terms) or any(o not in ("+", "-", "*", "/") for o in ops):
            return "undecided", [], ""  # parentheses, signs: not read here
        if len(ops) > 1 and any(o in ("*", "/") for o in ops):
            return "undecided", [], ""
        choices = [self.known.get(t, [None]) for t in terms]
        readings = 1
        for c in choices:
            readings *= len(c)
            if readings > MAX_READINGS:
                return "undecided", [], ""
        valid: list[Vector] = []
        undecided = False
        reasons: list[tuple[int, str]] = []
        for reading in product(*choices):
            outcome, detail = self._combine(reading, ops, terms)
            if outcome is None:
                undecided = True
            elif isinstance(outcome, tuple):
                valid.append(outcome)
            else:
                reasons.append((sum(c == _CONSTANT for c in reading), detail))
        if valid:
            return "valid", valid, ""
        # The reason of the reading that takes the fewest numbers for constants (1 is also a result).
        return ("undecided", [], "") if undecided else ("invalid", [], min(reasons)[1])

    def _combine(
        self, reading: Sequence[Candidate], ops: Sequence[str], terms: Sequence[Fraction]
    ) -> tuple[Vector | bool | None, str]:
        """One reading's part (a vector), ``False`` with the reason when it is no signed part, ``None``
        when it cannot be told."""
        if any(c is None for c in reading):
            return None, ""
        if len(ops) == 1 and ops[0] in ("*", "/"):
            a, b = reading
            if b == _CONSTANT and terms[1] == 1 and a != _CONSTANT:
                return self._checked(a), ""  # x * 1, x / 1: the same quantity
            if a == _CONSTANT and terms[0] == 1 and ops[0] == "*" and b != _CONSTANT:
                return self._checked(b), ""
            word = "multiplies" if ops[0] == "*" else "divides"
            return False, f"{word} quantities of a question that only adds and subtracts"
        total = [0] * len(self.values)
        for k, candidate in enumerate(reading):
            sign = 1 if k == 0 or ops[k - 1] == "+" else -1
            if candidate == _CONSTANT:
                if terms[k] != 0:
                    return False, f"adds or takes {show(terms[k])}, which is no number of the question"
                continue
            assert isinstance(candidate, tuple)
            for i, c in enumerate(candidate):
                total[i] += sign * c
        vector = tuple(total)
        if all(c == 0 for c in vector) and all(c == _CONSTANT for c in reading):
            return None, ""
        return self._checked(vector), self._why(vector)

    def _checked(self, vector: Candidate) -> Vector | bool:
        if not isinstance(vector, tuple):
            return False
        nonzero = [(c, s) for c, s in zip(vector, self.signs, strict=True) if c]
        if not nonzero or any(abs(c) != 1 or s == 0 for c, s in nonzero):
            return False
        return vector if len({c * s for c, s in nonzero}) == 1 else False

    def _why(self, vector: Vector) -> str:
        if any(abs(c) > 1 for c in vector):
            twice = next(self.values[i] for i, c in enumerate(vector) if abs(c) > 1)
            return f"uses the question's {show(twice)} more than once"
        if any(c and s == 0 for c, s in zip(vector, self.signs, strict=True)):
            return "uses a number the question does not need"
        if not any(vector):
            return "takes a quantity from itself"
        added = [show(v) for v, s in zip(self.values, self.signs, strict=True) if s > 0]
        taken = [show(v) for v, s in zip(self.values, self.signs, strict=True) if s < 0]
        return f"combines the question's numbers with the wrong signs (it adds {', '.join(added)}" + (
            f" and takes away {', '.join(taken)})" if taken else " and takes nothing away)"
        )


def wrong_operation(
    equation: Equation, chain: ArithChain, counts: dict[Fraction, int], on_chain: set[Fraction]
) -> str | None:
    """Why an equation that applies another operation to a reference step's own operands is wrong
    (``4 + 3 = 7`` where the question's step is ``4 * 3``), or ``None``.

    Claimed only where the operands can mean nothing else: each value is written once among the
    question's numbers and the quantities derived so far (``counts``), and the result is no value of
    the chain (``2 * 2`` and ``2 + 2`` agree)."""
    operands = equation.operands()
    computing = [side for side in equation.sides if has_operator(side)]
    if len(operands) != 2 or len(computing) != 1:
        return None
    ops = [t for t in computing[0] if t in ("+", "-", "*", "/")]
    if len(ops) != 1 or any(t in ("(", ")") for t in computing[0]):
        return None
    op = str(ops[0])
    a, b = operands
    results = equation.results()
    if not results or results[0] in on_chain:
        return None
    need = {a: 2} if a == b else {a: 1, b: 1}
    if any(counts.get(value, 0) != n for value, n in need.items()):
        return None
    for step in chain.steps:
        if sorted((a, b)) != sorted((Fraction(step.left), Fraction(step.right))) or op == step.op:
            continue
        return f"{equation.text} applies {op} to the question's {_shown(step)}, which it combines by {step.op}"
    return None


def _shown(step: ChainStep) -> str:
    return f"{step.left} and {step.right}"
