"""How sure a judge is of one step's verdict: the CoT Entropy paper's estimates (Sec. 2.3-5).

A judge samples ``N`` rationales ``c_i`` at temperature 1 for a step, each ending in a decision
``e_i`` (1 = the step has an error). For each sample Eq. 5 normalises the probabilities of the two
decision tokens after the rationale into ``p_i(e) = p(τ(e) | x, c_i) / Σ_e' p(τ(e') | x, c_i)``.

- :func:`cot_entropy` (Eq. 7, computed as the paper's three steps): cluster the samples by their
  decision, sum each cluster's own-decision probabilities ``Σ_{i: e_i = e} p_i(e)``, normalise the two
  masses and take the entropy.
- :func:`discrete_cot_entropy`: the same with empirical decision frequencies (semantic entropy's
  discrete variant).
- :func:`naive_entropy`: the length-normalised negative log-probability of the generations, averaged.
- :func:`uncertainty_split` (Eq. 9): predictive entropy ``H[(1/N) Σ_i p_i]`` = epistemic (the mutual
  information between decision and rationale) + aleatoric ``(1/N) Σ_i H[p_i]``. Sampling ``c`` from the
  model stands in for the posterior ``q(c | D)``, so every sample weighs ``1/N``.

Entropies are in nats. A step whose samples are all unparsed has no estimate (``None``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "DecisionSample",
    "UncertaintySplit",
    "binary_entropy",
    "cot_entropy",
    "decision_probability",
    "discrete_cot_entropy",
    "naive_entropy",
    "uncertainty_split",
]


@dataclass(frozen=True, slots=True)
class DecisionSample:
    """One sampled judgment: its decision and Eq. 5's normalised probability that the step has an error."""

    has_error: bool
    p_error: float
    token_logprobs: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class UncertaintySplit:
    """Eq. 9: ``predictive = epistemic + aleatoric``."""

    predictive: float
    epistemic: float
    aleatoric: float


def binary_entropy(p: float) -> float:
    """``-p log p - (1-p) log (1-p)`` in nats; 0 at ``p`` in {0, 1}."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"a probability lies in [0, 1], got {p}")
    value = -math.fsum(q * math.log(q) for q in (p, 1.0 - p) if q > 0.0)
    return value if value > 0.0 else 0.0  # never -0.0


def decision_probability(logprob_yes: float, logprob_no: float) -> float:
    """Eq. 5: ``p(E = 1) = p(τ(yes)) / (p(τ(yes)) + p(τ(no)))``, from the two tokens' log-probabilities.

    Examples:
        >>> round(decision_probability(math.log(0.3), math.log(0.1)), 6)
        0.75
    """
    top = max(logprob_yes, logprob_no)
    if top == -math.inf:
        raise ValueError("both decision tokens have probability 0; Eq. 5 is undefined")
    yes, no = math.exp(logprob_yes - top), math.exp(logprob_no - top)
    return yes / (yes + no)


def cot_entropy(samples: Sequence[DecisionSample]) -> float | None:
    """CoT Entropy (Eq. 7): entropy of the decision clusters' summed own-decision probabilities."""
    if not samples:
        return None
    error_mass = math.fsum(s.p_error for s in samples if s.has_error)
    fine_mass = math.fsum(1.0 - s.p_error for s in samples if not s.has_error)
    total = error_mass + fine_mass
    if total <= 0.0:
        return None
    return binary_entropy(error_mass / total)


def discrete_cot_entropy(samples: Sequence[DecisionSample]) -> float | None:
    """The discrete variant: entropy of the empirical decision frequencies."""
    if not samples:
        return None
    return binary_entropy(sum(s.has_error for s in samples) / len(samples))


def naive_entropy(samples: Sequence[DecisionSample]) -> float | None:
    """Naive entropy: ``-(1/N) Σ_i (1/L_i) Σ_j log p(token_ij)`` over the generations' tokens."""
    scored = [s.token_logprobs for s in samples if s.token_logprobs]
    if not scored:
        return None
    return -math.fsum(math.fsum(lps) / len(lps) for lps in scored) / len(scored)


def uncertainty_split(samples: Sequence[DecisionSample]) -> UncertaintySplit | None:
    """Eq. 9 over the samples: predictive, epistemic (mutual information) and aleatoric entropy."""
    if not samples:
        return None
    mean_p = math.fsum(s.p_error for s in samples) / len(samples)
    predictive = binary_entropy(min(1.0, max(0.0, mean_p)))
    aleatoric = math.fsum(binary_entropy(s.p_error) for s in samples) / len(samples)
    # Jensen: H[mean] >= mean H; rounding can make the difference a hair negative.
    return UncertaintySplit(predictive, max(0.0, predictive - aleatoric), aleatoric)
