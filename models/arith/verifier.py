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
from typing import Any, Literal

from prmloop.models.arith.checker import check_steps
from prmloop.models.arith.curriculum import ARITH_ID, ArithChain, generate_question

__all__ = ["ExactVerdict", "ExactVerifier", "chain_of"]


@lru_cache(maxsize=4096)
def chain_of(question_id: str) -> ArithChain | None:
    """The reference chain of a curriculum question, rebuilt from its id; ``None`` for other ids."""
    match = ARITH_ID.match(question_id)
    if match is None:
        return None
    return generate_question(int(match["level"]), int(match["seed"]), int(match["index"])).chain


@dataclass(frozen=True)
class ExactVerdict:
    """``first_error_step`` (``None``: no wrong step) is meaningful only when ``decided``;
    ``beyond_limits``: undecided because the solution is larger than the checker reads (``reason``
    names the limit, see :mod:`prmloop.models.arith.limits`)."""

    decided: bool
    first_error_step: int | None
    reason: str
    wall_time_s: float
    beyond_limits: bool = False


@dataclass(frozen=True)
class ExactVerifier:
    """A judge that is never wrong where it answers: the curriculum's exact step checker."""

    strictness: Literal["equations", "numbers", "lenient"] = "equations"

    def parameters(self) -> dict[str, Any]:
        return {"strictness": self.strictness}

    def judge_question(self, question_id: str, steps: Sequence[str]) -> ExactVerdict:
        started = time.perf_counter()
        chain = chain_of(question_id)
        if chain is None:
            return ExactVerdict(False, None, "not a curriculum question", time.perf_counter() - started)
        check = check_steps(chain, steps, strictness=self.strictness)
        decided = check.status == "exact"
        first = check.first_error_step if decided else None
        return ExactVerdict(decided, first, check.reason, time.perf_counter() - started, check.beyond_limits)
