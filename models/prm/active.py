"""Which solutions are worth their labels: ActPRM's confidence rule, and the orders active learning uses.

ActPRM (Duan et al., 2025, Sec. 3.2, Algorithm 1) asks, per step ``t`` with ensemble mean ``μ_t`` and
standard deviation ``σ_t`` (:class:`~prmloop.models.prm.ensemble.StepStats`):

- *epistemic* confidence: the heads agree, ``σ_t < σ_max``;
- *aleatoric* confidence: the mean is extreme, ``μ_t ≥ δ`` or ``μ_t ≤ 1 - δ``.

A step is confident when both hold. The steps checked are those up to and including the first
*predicted* error (the first step with ``μ_t < τ``, τ = 0.5 by default): what comes after an error is
not labelled anyway (PRM800K convention). A solution is **confident** when every checked step is, and
a confident solution is not sent to the labeller; the others are, most uncertain first.

How uncertain, for the order: each checked step's uncertainty relative to its threshold,
``e_t = σ_t / σ_max`` (epistemic) and ``a_t = min(μ_t, 1 - μ_t) / (1 - δ)`` (aleatoric), so that a value
of 1 sits on the boundary; the solution's score is the largest over its checked steps of ``max(e_t,
a_t)`` (rule ``actprm``), of ``e_t`` (``epistemic``) or of ``a_t`` (``aleatoric``). The single-criterion
rules also decide confidence by their own criterion alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from prmloop.models.prm.ensemble import StepStats

__all__ = ["RULES", "Decision", "Rule", "Thresholds", "checked_steps", "decide", "rank_uncertain", "step_confident"]

Rule = Literal["actprm", "epistemic", "aleatoric"]
RULES: tuple[Rule, ...] = ("actprm", "epistemic", "aleatoric")


@dataclass(frozen=True)
class Thresholds:
    """``delta``: a mean at least this far toward 0 or 1 is aleatorically confident; ``std_max``: heads
    whose standard deviation is below it agree; ``tau``: a mean below it predicts an error."""

    delta: float = 0.95
    std_max: float = 0.05
    tau: float = 0.5
    rule: Rule = "actprm"

    def __post_init__(self) -> None:
        if not 0.5 < self.delta < 1.0:
            raise ValueError(f"delta must lie in (0.5, 1), got {self.delta}")
        if self.std_max <= 0:
            raise ValueError(f"std_max must be positive, got {self.std_max}")
        if not 0.0 < self.tau < 1.0:
            raise ValueError(f"tau must lie in (0, 1), got {self.tau}")
        if self.rule not in RULES:
            raise ValueError(f"unknown rule {self.rule!r}; choose one of {', '.join(RULES)}")


@dataclass(frozen=True)
class Decision:
    """The rule's verdict on one solution.

    ``label``: send it to the labeller; ``score``: how uncertain (the order among those labelled);
    ``checked``: steps checked (through the first predicted error); ``step``: the most uncertain checked
    step; ``reason``: the verdict in words, for SQL and logs.
    """

    label: bool
    score: float
    checked: int
    step: int | None
    reason: str


def checked_steps(mean: Sequence[float], tau: float = 0.5) -> int:
    """How many steps the rule checks: through the first with ``μ < τ``, or all of them."""
    for index, value in enumerate(mean):
        if value < tau:
            return index + 1
    return len(mean)


def _parts(mean: float, std: float, th: Thresholds) -> tuple[float, float]:
    return std / th.std_max, min(mean, 1.0 - mean) / (1.0 - th.delta)


def step_confident(mean: float, std: float, th: Thresholds) -> bool:
    """ActPRM's test for one step under ``th.rule`` (see the module docstring)."""
    epistemic = std < th.std_max
    aleatoric = mean >= th.delta or mean <= 1.0 - th.delta
    if th.rule == "epistemic":
        return epistemic
    if th.rule == "aleatoric":
        return aleatoric
    return epistemic and aleatoric


def decide(stats: StepStats, th: Thresholds | None = None) -> Decision:
    """Label or skip one solution (a solution with no scored step is always labelled)."""
    th = th or Thresholds()
    n = checked_steps(stats.mean, th.tau)
    if n == 0:
        return Decision(True, float("inf"), 0, None, "no step has a score: label it")
    best, best_step = -1.0, 0
    unconfident: list[int] = []
    for t in range(n):
        e, a = _parts(stats.mean[t], stats.std[t], th)
        value = {"actprm": max(e, a), "epistemic": e, "aleatoric": a}[th.rule]
        if value > best:
            best, best_step = value, t
        if not step_confident(stats.mean[t], stats.std[t], th):
            unconfident.append(t)
    m, s = stats.mean[best_step], stats.std[best_step]
    where = f"step {best_step}: mean {m:.3f}, std {s:.3f}"
    if unconfident:
        return Decision(True, best, n, best_step, f"{len(unconfident)} of {n} checked steps uncertain ({where})")
    return Decision(False, best, n, best_step, f"all {n} checked steps confident (least: {where})")


def rank_uncertain(decisions: Sequence[Decision]) -> list[int]:
    """Indices of ``decisions`` in labelling order: every solution to label, most uncertain first, then
    the confident ones, least confident first (what a budget larger than the uncertain set takes next)."""
    return sorted(range(len(decisions)), key=lambda i: (not decisions[i].label, -decisions[i].score))
