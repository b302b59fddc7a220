"""Which question to label next: a priority from a cheap probe of a few samples per question.

The loop spends compute where a question teaches the PRM most. A probe draws a few solutions of a
question (``n`` samples) and the priority combines the signals the papers give, each scaled to [0, 1]:

- **reliability information** ``r = 4 q (1 - q)``, where ``q`` estimates the generator's probability
  of answering the question correctly, the ``q_M`` of Kuang et al. (Theorem 3.2, the "LLM signal
  term"). ``r`` is 1 at ``q = 0.5``, where a question yields both correct and incorrect solutions and
  its first errors are the most informative, and 0 at ``q`` = 0 or 1. With a gold answer, ``q`` is
  the posterior mean of a Beta(1, 1) prior after ``c`` correct of ``n`` probes, ``(c + 1) / (n + 2)``;
  without one but with a calibrated PRM, ``q_M ≈ mean_i g(p_i)`` over the probes' PRM scores (Kuang et
  al. section 4.1, ``g`` the binned calibrator); without either, the share of the majority answer.
- **answer dispersion** ``d = H(answers) / log n`` (UnPRM section 3: the entropy of the final-answer
  distribution across samples; unparseable answers count as one more answer).
- **token uncertainty** ``t = 1 - exp(-mean NLL)``: one minus the geometric-mean probability of the
  sampled tokens, averaged over the probes. UnPRM's sequence entropy ``u`` is not used here: it is
  bounded by ``log(tokens)`` and grows with length, so it would rank long answers, not uncertain ones.
- **PRM spread** ``s = 2 · std(PRM solution scores)`` (scores in [0, 1], so ``s`` ≤ 1), once a PRM exists.

``priority = f · (Σ_j w_j x_j) / (Σ_j w_j)`` over the signals that are available, where ``f`` =
``extreme_factor`` for a question whose probes were all wrong (hopeless for now: EpicPRM drops
questions with too few correct rollouts, and an annotator cannot find a first error when no rollout
reaches the answer, MC(s_0) = 0) or all right (trivial: no incorrect solution to label), else 1.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

__all__ = [
    "DEFAULT_WEIGHTS",
    "PriorityWeights",
    "Probe",
    "answer_dispersion_normalized",
    "estimate_reliability",
    "priority",
    "priority_signals",
    "token_uncertainty",
]


@dataclass(frozen=True)
class PriorityWeights:
    """Relative weights of the signals and the factor for hopeless / trivial questions."""

    reliability: float = 0.5
    dispersion: float = 0.2
    token: float = 0.1
    prm_spread: float = 0.2
    extreme_factor: float = 0.1

    def __post_init__(self) -> None:
        weights = (self.reliability, self.dispersion, self.token, self.prm_spread)
        if any(w < 0 for w in weights) or sum(weights) <= 0:
            raise ValueError("priority weights must be >= 0 and not all zero")
        if not 0.0 <= self.extreme_factor <= 1.0:
            raise ValueError("extreme_factor must be in [0, 1]")


DEFAULT_WEIGHTS = PriorityWeights()


@dataclass(frozen=True)
class Probe:
    """What a few samples of one question showed.

    Attributes:
        answers: the final answer of each sample (``None``: none stated).
        correct: graded against the gold answer (``None``: not gradable); empty when there is no gold.
        mean_nll: mean token negative log-likelihood of each sample (empty when the backend gives none).
        prm_scores: a PRM's solution score of each sample, in [0, 1] (``None``: no PRM yet).
        tokens: generated tokens the probe cost.
    """

    answers: tuple[str | None, ...]
    correct: tuple[bool | None, ...] = ()
    mean_nll: tuple[float, ...] = ()
    prm_scores: tuple[float, ...] | None = None
    tokens: int = 0
    notes: dict[str, str] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.answers)

    @property
    def graded(self) -> bool:
        return bool(self.correct) and any(c is not None for c in self.correct)

    @property
    def n_correct(self) -> int:
        return sum(c is True for c in self.correct)


def estimate_reliability(probe: Probe, calibrator: Callable[[float], float] | None = None) -> tuple[float, str]:
    """``(q, how)``: the generator's estimated accuracy on the question and which estimate was used.

    ``gold``: Beta(1, 1) posterior mean ``(c + 1) / (n + 2)`` over the graded probes; ``prm``: the mean
    calibrated PRM probability ``mean_i g(p_i)``; ``majority``: the share of the most common answer.
    """
    if probe.graded:
        graded = [c for c in probe.correct if c is not None]
        return (sum(graded) + 1.0) / (len(graded) + 2.0), "gold"
    if probe.prm_scores and calibrator is not None:
        return statistics.fmean(calibrator(p) for p in probe.prm_scores), "prm"
    answered = [a for a in probe.answers if a is not None]
    if not answered:
        return 0.0, "majority"
    return Counter(answered).most_common(1)[0][1] / probe.n, "majority"


def answer_dispersion_normalized(answers: Sequence[str | None]) -> float:
    """``H(answers) / log n`` in [0, 1]; unparseable answers (``None``) form one group of their own."""
    n = len(answers)
    if n < 2:
        return 0.0
    counts = Counter("\x00none" if a is None else a for a in answers).values()
    entropy = -sum(c / n * math.log(c / n) for c in counts)
    return max(0.0, entropy / math.log(n))


def token_uncertainty(mean_nll: Sequence[float]) -> float | None:
    """``1 - exp(-NLL)`` averaged over samples: 0 for certain tokens, toward 1 for surprising ones."""
    values = [1.0 - math.exp(-max(0.0, x)) for x in mean_nll if math.isfinite(x)]
    return statistics.fmean(values) if values else None


def priority_signals(probe: Probe, calibrator: Callable[[float], float] | None = None) -> dict[str, float]:
    """The signals behind a priority, each in [0, 1] (plus ``q`` and the probe's counts, for the record)."""
    if probe.n == 0:
        raise ValueError("a probe needs at least one sample")
    q, how = estimate_reliability(probe, calibrator)
    signals = {
        "q": q,
        "reliability": 4.0 * q * (1.0 - q),
        "dispersion": answer_dispersion_normalized(probe.answers),
        "samples": float(probe.n),
        "tokens": float(probe.tokens),
        "q_from_gold": 1.0 if how == "gold" else 0.0,
    }
    token = token_uncertainty(probe.mean_nll)
    if token is not None:
        signals["token"] = token
    if probe.prm_scores:
        spread = statistics.pstdev(probe.prm_scores) if len(probe.prm_scores) > 1 else 0.0
        signals["prm_spread"] = min(1.0, 2.0 * spread)
    if probe.graded:
        signals["correct"] = float(probe.n_correct)
        signals["graded"] = float(sum(c is not None for c in probe.correct))
    return signals


def priority(signals: dict[str, float], weights: PriorityWeights = DEFAULT_WEIGHTS) -> float:
    """``f · Σ w_j x_j / Σ w_j`` over the available signals (see the module docstring)."""
    terms = {
        "reliability": weights.reliability,
        "dispersion": weights.dispersion,
        "token": weights.token,
        "prm_spread": weights.prm_spread,
    }
    used = {k: w for k, w in terms.items() if k in signals and w > 0}
    if not used:
        raise ValueError("no signal with a positive weight is available")
    value = sum(w * signals[k] for k, w in used.items()) / sum(used.values())
    if signals.get("q_from_gold") and "correct" in signals:
        c, n = signals["correct"], signals["graded"]
        if c in (0, n):
            value *= weights.extreme_factor
    return value
