"""Uncertainty-guided probabilistic bisection: binary search's accuracy at a fraction of its rollouts.

Neither paper's search uses everything it knows. Adaptive binary search (EpicPRM Alg. 1) ignores the
step uncertainty; UnPRM's Δu search (Alg. 1) trusts it completely and labels whichever uncertain step
fails first, so its accuracy follows the uncertainty-error correlation. This search keeps a
*posterior* over the position ``e`` of the first error and lets every piece of evidence move it:

1. **Prior.** ``π(e = t) = (1 - floor) softmax(Δu / temperature)_t + floor / n``: the uncertainty
   deltas point at likely errors, the uniform floor bounds what a wrong prior can cost. With
   ``difficulty_tilt`` the prior also leans early for a hard question and late for an easy one, by
   ``exp(tilt (MC(s_0) - 0.5) (2t / (n - 1) - 1))`` (EpicPRM Eq. 4-5 make the same move, by
   shifting the first midpoint). Without Δu the prior is uniform.
2. **Probe.** The state through step ``m`` where the posterior's cumulative mass crosses one half,
   the split that halves the remaining uncertainty (the classic probabilistic bisection choice);
   the last state of an incorrect solution is known bad and never probed.
3. **Observation.** The state is *bad* when its MC (or MC-PPL) is at or below ``alpha MC(s_0)``
   (EpicPRM's contribution rule), settled by :class:`SequentialStopping` from a few rollouts at a
   time. A rollout estimate is evidence, not truth: the answer is taken to be wrong with probability
   ``flip``, so ``bad`` multiplies ``π(e <= m)`` by ``1 - flip`` and ``π(e > m)`` by ``flip``.
4. **Stop** when one position holds ``confidence`` of the mass, or after ``max_probes`` probes, or
   when the best split was already probed and no other split puts at least ``min_split`` of the mass
   on its smaller side; the answer is the posterior's mode. (On short solutions the probes run out
   first: after a good state and the bad one after it, no split is left.)
5. **Check the boundary.** The answer ``e`` rests on two verdicts: the state through ``e - 1`` good,
   the state through ``e`` bad. One wrong verdict early in a long search otherwise decides the answer
   (the search converges on the wrong boundary and never asks again), so both states are settled again
   at ``check``'s higher confidence, their rollouts counting. A verdict that flips replaces the old
   one in the posterior and the search goes on from there.

Rollouts are never wasted: ``MC(s_0)`` and every settled state stay in the estimator, and a state the
search already decided is not probed again (its verdict would count the same rollouts twice).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prmloop.models.annotation.estimate import MCEstimator, Sampling, SequentialStopping, Weighting

if TYPE_CHECKING:
    from prmloop.models.annotation.strategies import SolutionToLabel

__all__ = [
    "BISECTION_S0_SAMPLING",
    "BISECTION_STOPPING",
    "BOUNDARY_CHECK",
    "PROBE_STOPPING",
    "ProbabilisticBisection",
    "first_error_prior",
    "split_point",
    "update_posterior",
]

#: Sequential stopping the bench gives the papers' searches (``+stop``): batches of 4, settled at 98 %,
#: at most 32 rollouts.
BISECTION_STOPPING = SequentialStopping(batch=4, n_max=32, confidence=0.98)

#: The bisection's own probes settle sooner (90 %) because the two states its answer rests on are then
#: settled again at 99.5 % (at most 64 rollouts): :data:`BOUNDARY_CHECK`. On the simulator (2,000
#: solutions) the check lifts first-error accuracy from 96.9-98.0 % to 98.0-98.4 % (adaptive binary
#: search: 98.2 %) for 0.49-0.57x adaptive's tokens instead of 0.39-0.49x.
PROBE_STOPPING = SequentialStopping(batch=4, n_max=32, confidence=0.9)
BOUNDARY_CHECK = SequentialStopping(batch=4, n_max=64, confidence=0.995)

#: How the bisection estimates MC(s_0): 8 rollouts, more (8 at a time) until 5 correct or 48. Cheaper
#: than the papers' 16/10/72; on the simulator it costs about one point of accuracy for a third fewer
#: tokens (``prmloop bench annotate`` prints both; ``sampling=ADAPTIVE_SAMPLING`` restores the papers').
BISECTION_S0_SAMPLING = Sampling(n0=8, n_min_correct=5, n_max=48, grow_by=8)


def first_error_prior(
    deltas: Sequence[float] | None,
    n_steps: int,
    *,
    temperature: float = 1.0,
    floor: float = 0.3,
    mc_s0: float | None = None,
    difficulty_tilt: float = 0.0,
) -> list[float]:
    """``π(e = t)`` for ``t`` in ``0..n_steps-1`` (see the module docstring, item 1); sums to 1."""
    if n_steps < 1:
        raise ValueError("a first-error prior needs at least one step")
    if deltas is not None and len(deltas) == n_steps:
        top = max(deltas)
        weights = [math.exp((d - top) / temperature) for d in deltas]
        total = math.fsum(weights)
        prior = [(1.0 - floor) * w / total + floor / n_steps for w in weights]
    else:
        prior = [1.0 / n_steps] * n_steps
    if difficulty_tilt and mc_s0 is not None and n_steps > 1:
        prior = [
            p * math.exp(difficulty_tilt * (mc_s0 - 0.5) * (2.0 * t / (n_steps - 1) - 1.0)) for t, p in enumerate(prior)
        ]
    total = math.fsum(prior)
    return [p / total for p in prior]


def update_posterior(posterior: Sequence[float], probed: int, bad: bool, flip: float) -> list[float]:
    """Bayes' rule for one noisy observation of the state through step ``probed``.

    ``bad`` says ``e <= probed``; it is right with probability ``1 - flip``.
    """
    updated = [p * ((1.0 - flip) if (t <= probed) == bad else flip) for t, p in enumerate(posterior)]
    total = math.fsum(updated)
    if total <= 0.0:
        raise ValueError("the observation has zero probability under the posterior (flip = 0 and a contradiction)")
    return [p / total for p in updated]


def split_point(posterior: Sequence[float], exclude: set[int]) -> tuple[int, float] | None:
    """The probe ``m`` (not in ``exclude``, never the last step) whose ``P(e <= m)`` is nearest one half,
    with that mass; ``None`` when no step can be probed."""
    best: tuple[int, float] | None = None
    mass = 0.0
    for t in range(len(posterior) - 1):
        mass += posterior[t]
        if t in exclude:
            continue
        if best is None or abs(mass - 0.5) < abs(best[1] - 0.5):
            best = (t, mass)
    return best


@dataclass(frozen=True, slots=True)
class ProbabilisticBisection:
    """Uncertainty-guided probabilistic bisection with sequential stopping (module docstring)."""

    alpha: float = 0.5
    sampling: Sampling = BISECTION_S0_SAMPLING
    stopping: SequentialStopping = PROBE_STOPPING
    temperature: float = 1.0
    floor: float = 0.3
    difficulty_tilt: float = 1.0
    flip: float = 0.05
    confidence: float = 0.9
    max_probes: int = 12
    min_split: float = 0.1
    check: SequentialStopping | None = BOUNDARY_CHECK
    weighting: Weighting = "inv_ppl"
    name: str = "bisection"

    def __post_init__(self) -> None:
        if not 0.0 < self.flip < 0.5 or not 0.0 <= self.floor <= 1.0 or self.temperature <= 0:
            raise ValueError(f"bisection needs 0 < flip < 0.5, 0 <= floor <= 1 and temperature > 0; got {self}")

    def parameters(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.pop("name", None)
        return out

    def search(self, solution: SolutionToLabel, estimator: MCEstimator) -> int | None:
        n = estimator.n_steps
        s0 = estimator.estimate(-1, self.sampling)
        if s0.correct_rollouts == 0:
            return None  # the completers never solve the question (as adaptive binary search)
        if n == 1:
            return 0  # an incorrect one-step solution: its only step is the error
        threshold = self.alpha * s0.value
        prior = first_error_prior(
            solution.uncertainty_delta,
            n,
            temperature=self.temperature,
            floor=self.floor,
            mc_s0=s0.value,
            difficulty_tilt=self.difficulty_tilt,
        )
        posterior = prior
        verdicts: dict[int, bool] = {}
        checked: set[int] = set()
        while True:
            posterior = self._probe(posterior, verdicts, estimator, threshold)
            mode = max(range(n), key=lambda t: (posterior[t], -t))
            if self.check is None:
                return mode
            # The boundary the answer rests on: the state before the error must be good, the error's own
            # state bad. One wrong early verdict otherwise decides the answer, so both are settled again
            # at the check's confidence (their rollouts count; more are drawn only while unsettled).
            changed = False
            for m in (mode - 1, mode):
                if m < 0 or m in checked or m >= n - 1:
                    continue
                checked.add(m)
                bad = estimator.decide(m, threshold, self.check)
                if verdicts.get(m) != bad:
                    verdicts[m] = bad
                    changed = True
            if not changed:
                return mode
            posterior = self._posterior(prior, verdicts)

    def _posterior(self, prior: Sequence[float], verdicts: dict[int, bool]) -> list[float]:
        posterior = list(prior)
        for m, bad in verdicts.items():
            posterior = update_posterior(posterior, m, bad, self.flip)
        return posterior

    def _probe(
        self, posterior: list[float], verdicts: dict[int, bool], estimator: MCEstimator, threshold: float
    ) -> list[float]:
        """Probe split points until the posterior is confident or no split is left; records verdicts."""
        for _ in range(self.max_probes):
            if max(posterior) >= self.confidence:
                break
            choice = split_point(posterior, exclude=set())
            if choice is None:
                break
            m, _mass = choice
            if m in verdicts:
                # The best split was probed already and its verdict is settled (asking again would count
                # the same rollouts twice): take the best split not yet probed, if it still splits.
                other = split_point(posterior, exclude=set(verdicts))
                if other is None or min(other[1], 1.0 - other[1]) < self.min_split:
                    break
                m = other[0]
            bad = estimator.decide(m, threshold, self.stopping)
            verdicts[m] = bad
            posterior = update_posterior(posterior, m, bad, self.flip)
        return posterior
