"""The exact checker as a judge: on the arithmetic curriculum the first error needs no LLM.

``prmloop judge --method exact`` uses :class:`ExactVerifier` in place of an LLM judge. It rebuilds a
question's reference chain from its id (``arith/L<level>/<seed>/<index>``: the generator is a function
of these three values, see :func:`~prmloop.models.arith.curriculum.generate_question`) and runs
:func:`~prmloop.models.arith.checker.check_steps` on the solution's steps. Its verdict is the first
wrong step (``None`` for a correct solution), or undecided when the checker cannot tell or the question is
not from the curriculum; the judge service publishes it like any judge's, so consensus accepts MC labels
only where they agree with the exact first error.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from prmloop.models.arith.checker import StepCheck, Strictness, check_steps
from prmloop.models.arith.curriculum import ARITH_ID, ArithChain, ArithQuestion, generate_question

__all__ = ["CHECKER_RULES", "ExactVerdict", "ExactVerifier", "chain_of", "question_of"]

#: The checker's rules, as a number in the judge's parameters (and so in its verdicts' event ids): a
#: solution judged again under other rules is a new verdict, not a conflicting copy of the old one.
#: 2: operations no correct solution writes, and prose numbers held to the question's words.
CHECKER_RULES = 2


@lru_cache(maxsize=4096)
def question_of(question_id: str) -> ArithQuestion | None:
    """The curriculum question an id names, rebuilt from it; ``None`` for other ids."""
    match = ARITH_ID.match(question_id)
    if match is None:
        return None
    return generate_question(int(match["level"]), int(match["seed"]), int(match["index"]))


def chain_of(question_id: str) -> ArithChain | None:
    """The reference chain of a curriculum question, rebuilt from its id; ``None`` for other ids."""
    question = question_of(question_id)
    return None if question is None else question.chain


@dataclass(frozen=True)
class ExactVerdict:
    """``first_error_step`` (``None``: no wrong step) is meaningful only when ``decided``;
    ``beyond_limits``: undecided because the solution is larger than the checker reads (``reason``
    names the limit, see :mod:`prmloop.models.arith.limits`). ``verdicts``: one per step, as a
    judge's labels are: ``True`` (no error), ``False`` (the first error and the steps after it),
    ``None`` (no verdict); an undecided solution keeps ``True`` for the verified steps before the
    first one the checker could not verify. ``step_reasons``: the checker's reason per step read."""

    decided: bool
    first_error_step: int | None
    reason: str
    wall_time_s: float
    beyond_limits: bool = False
    verdicts: tuple[bool | None, ...] = ()
    step_reasons: tuple[str, ...] = ()


def step_labels(check: StepCheck, n: int) -> tuple[bool | None, ...]:
    """The checker's verdict as one label per step (see :class:`ExactVerdict`)."""
    if check.exact:
        first = check.first_error_step
        return tuple(first is None or t < first for t in range(n))
    prefix = next((t for t, v in enumerate(check.verdicts) if v != "verified"), len(check.verdicts))
    if check.beyond_limits or prefix == len(check.verdicts):
        prefix = 0  # undecided as a whole (no answer, no equation, too large): no step vouched for
    return tuple(True if t < prefix else None for t in range(n))


@dataclass(frozen=True)
class ExactVerifier:
    """A judge that is never wrong where it answers: the curriculum's exact step checker.

    ``strictness`` (see :func:`~prmloop.models.arith.checker.check_steps`): ``quantities`` by default,
    so that a step restating the question ("Emma has 5 shells.") is vouched for as the question's
    words say, and consensus can weigh MC labels of solutions that restate before they compute.
    """

    strictness: Strictness = "quantities"

    def parameters(self) -> dict[str, Any]:
        return {"strictness": self.strictness, "rules": CHECKER_RULES}

    def judge_question(self, question_id: str, steps: Sequence[str]) -> ExactVerdict:
        started = time.perf_counter()
        question = question_of(question_id)
        if question is None:
            return ExactVerdict(
                False, None, "not a curriculum question", time.perf_counter() - started, verdicts=(None,) * len(steps)
            )
        check = check_steps(question.chain, steps, strictness=self.strictness, problem=question.problem)
        decided = check.status == "exact"
        first = check.first_error_step if decided else None
        return ExactVerdict(
            decided,
            first,
            check.reason,
            time.perf_counter() - started,
            check.beyond_limits,
            step_labels(check, len(steps)),
            check.step_reasons,
        )
