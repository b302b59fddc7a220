"""Solutions with a known first error, made from the curriculum's reference solutions (no model).

A held-out set for a PRM must have true first-error labels. The curriculum's reference solution of a
question is right at every step (:func:`~prmloop.models.arith.reference_solution`); changing the
result of one of its equations (``4 + 5 = 9`` -> ``4 + 5 = 11``) makes that step the first error, and
the exact checker confirms it (a corruption it would not locate is dropped). The pair, right and
corrupted, costs nothing to make: the demo's held-out set, where sampling the model's own solutions
would spend minutes of a 15-minute budget.
"""

from __future__ import annotations

import random
import re

from prmloop.models.arith.checker import check_steps
from prmloop.models.arith.curriculum import ArithQuestion

__all__ = ["corrupted_solution"]

_RESULT = re.compile(r"=\s*(\d+)")


def corrupted_solution(question: ArithQuestion, rng: random.Random) -> tuple[list[str], int] | None:
    """The reference solution with one equation's result changed, and that step's index (the first
    error), or ``None`` when no step can be corrupted so that the checker locates it exactly."""
    steps = list(question.reference_steps)
    candidates = [i for i, step in enumerate(steps) if _RESULT.search(step)]
    rng.shuffle(candidates)
    for index in candidates:
        match = _RESULT.search(steps[index])
        assert match is not None
        value = int(match.group(1))
        wrong = value + rng.choice([d for d in (-3, -2, -1, 1, 2, 3) if value + d >= 0])
        changed = steps[index][: match.start(1)] + str(wrong) + steps[index][match.end(1) :]
        corrupted = [*steps[:index], changed, *steps[index + 1 :]]
        check = check_steps(question.chain, corrupted)
        if check.exact and check.first_error_step == index:
            return corrupted, index
    return None
