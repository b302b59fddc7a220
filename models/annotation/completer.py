"""The seam between the annotation algorithms and whatever produces rollouts (a model, the simulator).

A *state* ``s_t = [q; a_1; ...; a_t]`` (EpicPRM Sec. 2) is the question plus the first ``t`` steps of a
solution. A completer continues a state ``n`` times in one call and reports, per rollout, what the
Monte-Carlo estimators need: the final answer, the log-probability mass of the generated tokens (for
``PPL``, EpicPRM Eq. 1), the token count (cost) and why generation stopped.
"""

from __future__ import annotations

import copy
import hashlib
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    from prmloop.models.backends.base import Generator, SamplingParams
    from prmloop.models.prompts import PromptFormat

__all__ = [
    "AnswerChecker",
    "Completer",
    "FinishReason",
    "GeneratorCompleter",
    "Rollout",
    "exact_match",
    "math_equivalent",
]

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


def math_equivalent(prediction: str, gold: str) -> bool:
    """math-verify equivalence (:func:`prmloop.models.grading.answers_equivalent`): the checker for real models."""
    from prmloop.models.grading import answers_equivalent

    return answers_equivalent(prediction, gold)


class GeneratorCompleter:
    """A :class:`Completer` over a model backend: ``n`` rollouts of a state in one ``Generator.rollouts`` call.

    The state ``[q; a_1..a_t]`` is rendered exactly as the solution was sampled
    (:func:`prmloop.models.prompts.solution_prompt` plus the steps in ``style``), so the model continues
    with step ``t + 1``. The final answer of a rollout is :func:`prmloop.models.answers.extract_answer`
    of the generated text (``None`` when it states none); a rollout cut by ``max_new_tokens`` reports
    ``finish_reason="length"``, which the estimator counts and grades as wrong.

    Seeds: every call gets a seed derived from ``(seed, question, t, draw)`` where ``draw`` counts the
    calls for that state, so a re-run of the same annotation samples the same rollouts on engines that
    honour seeds. One call at a time per completer (``lock``): local engines are not re-entrant; for a
    server-side engine (vLLM, an OpenAI-compatible endpoint) pass ``lock=False`` to keep several
    solutions' rollouts in flight.
    """

    def __init__(
        self,
        generator: Generator,
        *,
        style: PromptFormat = "step_k",
        params: SamplingParams | None = None,
        seed: int = 0,
        name: str | None = None,
        lock: bool = True,
    ) -> None:
        from prmloop.models.backends.base import SamplingParams

        self.generator = generator
        self.style = style
        self.params = params or SamplingParams(temperature=0.7, max_new_tokens=384, stop_at_answer=True)
        self.seed = seed
        self.name = name or generator.model_name
        self._lock: threading.Lock | None = threading.Lock() if lock else None
        self._draws: dict[tuple[str, int], int] = {}
        self._draw_lock = threading.Lock()

    def with_style(self, style: PromptFormat) -> GeneratorCompleter:
        """This completer continuing solutions sampled with prompt format ``style`` (same engine, lock,
        seeds and draw counters), for a service whose solutions come in several formats."""
        if style == self.style:
            return self
        view = copy.copy(self)
        view.style = style
        return view

    def prefix(self, question: str, steps: Sequence[str]) -> str:
        """The text a rollout from the state through ``steps`` continues."""
        from prmloop.models.prompts import format_steps, solution_prompt, step_format

        return solution_prompt(self.generator, question, self.style) + format_steps(steps, step_format(self.style))

    def complete(self, question: str, steps: Sequence[str], n: int) -> list[Rollout]:
        from prmloop.models.answers import extract_answer

        with self._draw_lock:
            draw = self._draws.get((question, len(steps)), 0)
            self._draws[(question, len(steps))] = draw + 1
        digest = hashlib.blake2b(f"{self.seed}|{question}|{len(steps)}|{draw}".encode(), digest_size=4).digest()
        from prmloop.models.prompts import stop_strings

        update: dict[str, object] = {"n": n, "seed": int.from_bytes(digest, "big") & 0x7FFFFFFF}
        if stop_strings(self.style):
            update["stop"] = tuple(dict.fromkeys((*self.params.stop, *stop_strings(self.style))))
        params = self.params.model_copy(update=update)
        prefix = self.prefix(question, steps)
        if self._lock is None:
            completions = self.generator.rollouts(prefix, n, params)
        else:
            with self._lock:
                completions = self.generator.rollouts(prefix, n, params)
        if len(completions) != n:
            raise RuntimeError(f"{self.name} returned {len(completions)} rollouts for {n} requested")
        return [Rollout.from_logprobs(extract_answer(c.text), c.logprobs, c.finish_reason) for c in completions]
