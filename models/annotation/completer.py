"""The seam between the annotation algorithms and whatever produces rollouts (a model, the simulator).

A *state* ``s_t = [q; a_1; ...; a_t]`` (EpicPRM Sec. 2) is the question plus the first ``t`` steps of a
solution. A completer continues a state ``n`` times in one call and reports, per rollout, what the
Monte-Carlo estimators need: the final answer, the log-probability mass of the generated tokens (for
``PPL``, EpicPRM Eq. 1), the token count (cost) and why generation stopped.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

__all__ = ["AnswerChecker", "Completer", "FinishReason", "Rollout", "exact_match"]

FinishReason = Literal["stop", "length"]

#: ``checker(prediction, gold) -> bool``: does a rollout's final answer match the gold answer?
AnswerChecker = Callable[[str, str], bool]


@dataclass(frozen=True, slots=True)
class Rollout:
    """One continuation of a state.

    Attributes:
        answer: the final answer extracted from the rollout, ``None`` when none could be parsed (or the
            rollout ran out of tokens before answering).
        tokens: number of generated tokens (the cost unit of EpicPRM Table 2 / UnPRM Table 2).
        sum_logprob: ``sum_i log p(x_i | x_<i)`` over the generated tokens.
        finish_reason: ``"stop"`` or ``"length"`` (the ``max_tokens`` budget was hit).
        token_logprobs: the per-token log-probabilities when the completer has them; a simulator may
            report only their sum (``sum_logprob``), which is all Eq. 1 needs.
    """

    answer: str | None
    tokens: int
    sum_logprob: float
    finish_reason: FinishReason = "stop"
    token_logprobs: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.tokens < 0:
            raise ValueError(f"a rollout cannot have {self.tokens} tokens")
        if self.token_logprobs is not None and len(self.token_logprobs) != self.tokens:
            raise ValueError(
                f"a rollout with {self.tokens} tokens needs as many log-probabilities, got {len(self.token_logprobs)}"
            )

    @classmethod
    def from_logprobs(
        cls, answer: str | None, token_logprobs: Sequence[float], finish_reason: FinishReason = "stop"
    ) -> Rollout:
        logprobs = tuple(float(x) for x in token_logprobs)
        return cls(answer, len(logprobs), math.fsum(logprobs), finish_reason, logprobs)

    @property
    def mean_logprob(self) -> float:
        """``(1/L) sum_i log p(x_i | x_<i)``; ``0.0`` for an empty rollout (it has probability 1)."""
        return self.sum_logprob / self.tokens if self.tokens else 0.0

    @property
    def log_ppl(self) -> float:
        """``log PPL = -(1/L) sum_i log p(x_i | x_<i)`` (EpicPRM Eq. 1, before the ``exp``)."""
        return -self.mean_logprob


@runtime_checkable
class Completer(Protocol):
    """Continues a state ``n`` times: all rollouts of one state in one call (one batched engine request)."""

    name: str

    def complete(self, question: str, steps: Sequence[str], n: int) -> list[Rollout]:
        """``n`` rollouts from the state ``[question; steps[0]; ...; steps[-1]]``.

        May raise on an engine failure; the estimator counts it as ``completer_error`` and retries.
        """
        ...


def exact_match(prediction: str, gold: str) -> bool:
    """Whitespace-insensitive string equality: enough for the simulator and for integer answers."""
    return prediction.strip() == gold.strip()
