"""The judges: step-wise CoT verification with CoT Entropy, and the whole-solution critic.

:class:`StepwiseJudge` (CoT Entropy paper, Sec. 4.2): for each step it samples one judgment at a low
temperature (0.1), whose decision is the prediction (Eq. 4), and ``samples`` judgments at
temperature 1.0 for the uncertainty estimates (:mod:`prmloop.models.judge.uncertainty`). Eq. 5 needs
the probabilities of *both* decision words after a rationale; backends report the log-probability of
the sampled token only, so each parsed judgment's two options are scored by teacher forcing after
its own rationale (one batched ``score`` call per step): this works alike on transformers, vLLM and an
OpenAI-compatible server. By default the judge stops at the first step it finds wrong (consensus
needs the first error only); ``all_steps`` judges every step.

:class:`Critic` (Qwen "Lessons", appendix; the ProcessBench critic protocol): the whole solution in
one prompt; greedy (``samples=1``, temperature 0) or the majority over ``samples`` judgments.
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from prmloop.models.backends.base import Generator, SamplingParams, Scorer
from prmloop.models.judge.prompts import JSON_PREFIX, critic_messages, parse_critic, parse_judgment, step_messages
from prmloop.models.judge.uncertainty import (
    DecisionSample,
    cot_entropy,
    decision_probability,
    discrete_cot_entropy,
    naive_entropy,
    uncertainty_split,
)
from prmloop.models.prompts import render_for

__all__ = ["Critic", "CriticVerdict", "JudgeEngine", "SolutionJudgment", "StepVerdict", "StepwiseJudge"]


class JudgeEngine(Generator, Scorer, Protocol):
    """What a judge needs of a backend: sampling and teacher-forced scoring (every backend has both)."""


@dataclass(frozen=True, slots=True)
class StepVerdict:
    """One step's verdict: the prediction and the uncertainty estimates (``None`` where undefined)."""

    step_index: int
    has_error: bool | None
    p_error: float | None
    cot_entropy: float | None
    cot_entropy_discrete: float | None
    naive_entropy: float | None
    epistemic: float | None
    aleatoric: float | None
    samples: int
    unparsed: int
    rationale_digest: str | None


@dataclass
class SolutionJudgment:
    """Every judged step of one solution and what judging cost."""

    verdicts: list[StepVerdict]
    n_steps: int
    generated_tokens: int = 0
    wall_time_s: float = 0.0
    unparsed: int = 0
    failures: Counter[str] = field(default_factory=Counter)

    @property
    def first_error_step(self) -> int | None:
        return next((v.step_index for v in self.verdicts if v.has_error), None)

    def step_labels(self) -> tuple[bool | None, ...]:
        """Per step, as labels are: True = no error found, False = error, None = not judged or unparsed."""
        by_step = {v.step_index: v for v in self.verdicts}
        return tuple(
            None if (v := by_step.get(t)) is None or v.has_error is None else not v.has_error
            for t in range(self.n_steps)
        )


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class StepwiseJudge:
    """Step-wise CoT verification of solutions with a judge-LM (see the module docstring)."""

    engine: JudgeEngine
    samples: int = 10
    temperature: float = 1.0
    prediction_temperature: float = 0.1
    max_new_tokens: int = 256
    all_steps: bool = False
    seed: int = 0

    def parameters(self) -> dict[str, Any]:
        """Everything that changes a verdict (part of the judged event's id)."""
        return {
            "samples": self.samples,
            "temperature": self.temperature,
            "prediction_temperature": self.prediction_temperature,
            "max_new_tokens": self.max_new_tokens,
            "all_steps": self.all_steps,
            "seed": self.seed,
        }

    def _params(self, temperature: float, n: int, key: str) -> SamplingParams:
        seed = int.from_bytes(hashlib.sha256(f"{self.seed}\x1f{key}".encode()).digest()[:4], "big")
        return SamplingParams(n=n, temperature=temperature, max_new_tokens=self.max_new_tokens, seed=seed)

    def judge_step(self, problem: str, steps: Sequence[str], index: int) -> tuple[StepVerdict, int]:
        """The verdict on step ``index`` and the tokens generated for it."""
        prompt = render_for(self.engine, step_messages(problem, steps, index)) + JSON_PREFIX
        key = f"{problem}\x1f{index}\x1f{steps[index]}"
        [[prediction]] = self.engine.generate([prompt], self._params(self.prediction_temperature, 1, key + "\x1fp"))
        [drawn] = (
            self.engine.generate([prompt], self._params(self.temperature, self.samples, key + "\x1fs"))
            if self.samples
            else [[]]
        )
        completions = [prediction, *drawn]
        parsed = [parse_judgment(c.text) for c in completions]
        pairs: list[tuple[str, str]] = []
        for completion, judgment in zip(completions, parsed, strict=True):
            if judgment is not None:
                context = prompt + completion.text[: judgment.decision_at]
                pairs.extend((context, option) for option in judgment.options)
        scored = self.engine.score(pairs) if pairs else []
        decisions: list[DecisionSample | None] = []
        position = 0
        for completion, judgment in zip(completions, parsed, strict=True):
            if judgment is None:
                decisions.append(None)
                continue
            error_lp, fine_lp = scored[position].sum_logprob, scored[position + 1].sum_logprob
            position += 2
            decisions.append(
                DecisionSample(judgment.has_error, decision_probability(error_lp, fine_lp), completion.logprobs)
            )
        head, rest = decisions[0], [d for d in decisions[1:] if d is not None]
        split = uncertainty_split(rest)
        verdict = StepVerdict(
            step_index=index,
            has_error=head.has_error if head is not None else None,
            p_error=head.p_error if head is not None else None,
            cot_entropy=cot_entropy(rest),
            cot_entropy_discrete=discrete_cot_entropy(rest),
            naive_entropy=naive_entropy(rest),
            epistemic=split.epistemic if split else None,
            aleatoric=split.aleatoric if split else None,
            samples=len(drawn),
            unparsed=sum(d is None for d in decisions[1:]),
            rationale_digest=_digest(parsed[0].reasoning) if parsed[0] is not None else None,
        )
        return verdict, sum(c.completion_tokens for c in completions)

    def judge(self, problem: str, steps: Sequence[str]) -> SolutionJudgment:
        """Judge the steps in order; stop after the first predicted error unless ``all_steps``."""
        started = time.perf_counter()
        result = SolutionJudgment(verdicts=[], n_steps=len(steps))
        for index in range(len(steps)):
            verdict, tokens = self.judge_step(problem, steps, index)
            result.verdicts.append(verdict)
            result.generated_tokens += tokens
            result.unparsed += verdict.unparsed + (verdict.has_error is None)
            if verdict.has_error and not self.all_steps:
                break
        if result.unparsed:
            result.failures["unparsed"] = result.unparsed
        result.wall_time_s = time.perf_counter() - started
        return result


@dataclass(frozen=True, slots=True)
class CriticVerdict:
    """The critic's first wrong step (``None``: correct; ``"unparsed"``: no majority of valid answers)."""

    first_error_step: int | str | None
    votes: dict[str, int]
    generated_tokens: int
    wall_time_s: float
    unparsed: int


@dataclass
class Critic:
    """The ProcessBench critic: greedy with ``samples=1``, else the majority of ``samples`` judgments."""

    engine: Generator
    samples: int = 1
    temperature: float = 0.7
    max_new_tokens: int = 1024
    seed: int = 0

    def parameters(self) -> dict[str, Any]:
        return {
            "samples": self.samples,
            "temperature": 0.0 if self.samples == 1 else self.temperature,
            "max_new_tokens": self.max_new_tokens,
            "seed": self.seed,
        }

    def judge(self, problem: str, steps: Sequence[str]) -> CriticVerdict:
        started = time.perf_counter()
        prompt = render_for(self.engine, critic_messages(problem, steps))
        greedy = self.samples == 1
        params = SamplingParams(
            n=self.samples,
            temperature=0.0 if greedy else self.temperature,
            max_new_tokens=self.max_new_tokens,
            seed=self.seed,
        )
        [completions] = self.engine.generate([prompt], params)
        answers = [parse_critic(c.text, len(steps)) for c in completions]
        votes = Counter("correct" if a is None else str(a) for a in answers if a != "unparsed")
        unparsed = sum(a == "unparsed" for a in answers)
        outcome: int | str | None = "unparsed"
        if votes:
            # Majority; a tie goes to the earliest error (a judge that saw an error anywhere wins over "correct").
            best = max(votes.values())
            tied = [k for k, v in votes.items() if v == best]
            numbers = sorted(int(k) for k in tied if k != "correct")
            outcome = numbers[0] if numbers else None
        return CriticVerdict(
            first_error_step=outcome,
            votes=dict(votes),
            generated_tokens=sum(c.completion_tokens for c in completions),
            wall_time_s=time.perf_counter() - started,
            unparsed=unparsed,
        )
