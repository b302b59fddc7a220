"""Search strategies that find the first wrong step of an incorrect solution, behind one interface.

Every strategy decides *which* states to estimate; the shared :class:`MCEstimator` decides *how*. Step
indices are 0-based: the state "through step ``i``" is ``[q; a_0..a_i]``, ``-1`` is ``s_0`` (the
question alone). Labels follow PRM800K / Math-Shepherd: steps before the first error True, from it on
False (EpicPRM Sec. 2). Correct solutions are labelled all True without sampling (UnPRM Alg. 1 l. 4-6).

========================  =======================================================  ====================
name                      decision                                                  paper
========================  =======================================================  ====================
``sequential``            first state with no correct rollout (hard MC, N=48)       Math-Shepherd
``binary``                binary search on "any rollout correct" (hard MC, N=48)    OmegaPRM
``adaptive_binary``       C(a_t) = MC_PPL(s_t)/MC_PPL(s_0) <= alpha, Eq. 4-5 start  EpicPRM Alg. 1
``uncertainty_driven``    descending Δu, first MC_PPL(s_i) < tau = MC_PPL(s_0)      UnPRM Alg. 1
``bisection``             posterior over the first error, Δu prior, noisy probes    this project
========================  =======================================================  ====================

Every strategy can take sequential stopping of its MC sampling (:class:`SequentialStopping`); the
hard-MC baselines take a :class:`StateTest` so they can be run under adaptive binary search's rule.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from prmloop.models.annotation.bisection import ProbabilisticBisection
from prmloop.models.annotation.completer import AnswerChecker, Completer, Rollout, exact_match
from prmloop.models.annotation.estimate import (
    ADAPTIVE_SAMPLING,
    AnnotationAborted,
    CostTally,
    MCEstimator,
    Sampling,
    SequentialStopping,
    SharedStarts,
    StateEstimate,
    Weighting,
)

__all__ = [
    "STRATEGIES",
    "AdaptiveBinarySearch",
    "Annotation",
    "AnnotationStrategy",
    "BinarySearch",
    "ProbabilisticBisection",
    "SequentialSearch",
    "SolutionToLabel",
    "StateTest",
    "UncertaintyDrivenSearch",
    "annotate",
    "difficulty_level",
    "first_midpoint",
    "labels_from_first_error",
    "make_strategy",
]

Status = Literal["labelled", "all_correct", "unresolved", "aborted"]


@dataclass(frozen=True, slots=True)
class SolutionToLabel:
    """What a strategy needs to know about one sampled solution.

    ``uncertainty_delta[t]`` is Δu of step ``t`` (UnPRM Alg. 1 l. 9, ``u(s_t) - u(s_{t-1})``); only the
    uncertainty-driven search reads it.
    """

    question: str
    steps: tuple[str, ...]
    gold_answer: str
    correct: bool
    uncertainty_delta: tuple[float, ...] | None = None


@dataclass(frozen=True, slots=True)
class Annotation:
    """A strategy's verdict on one solution and everything it cost.

    ``status``: ``labelled``; ``all_correct`` (a correct solution, no sampling); ``unresolved`` (the
    uncertainty-driven search tried every step and none fell below tau, UnPRM drops such solutions);
    ``aborted`` (the completer kept failing). The last two carry no labels.
    ``soft_labels[t]`` is the MC value of the state through step ``t`` where it was estimated.
    """

    method: str
    parameters: dict[str, Any]
    status: Status
    labels: tuple[bool, ...]
    first_error_step: int | None
    soft_labels: tuple[float | None, ...]
    estimates: tuple[StateEstimate, ...]
    cost: CostTally
    error: str | None = None


class AnnotationStrategy(Protocol):
    """One search strategy: which states to estimate, and where the first error is."""

    @property
    def name(self) -> str: ...

    @property
    def weighting(self) -> Weighting: ...

    def parameters(self) -> dict[str, Any]:
        """Everything that changes the labels (part of the label's deterministic event id)."""
        ...

    def search(self, solution: SolutionToLabel, estimator: MCEstimator) -> int | None:
        """The 0-based first error step of an incorrect solution, ``None`` when not found."""
        ...


def _params(strategy: Any) -> dict[str, Any]:
    """The strategy's parameters for events and reports; options left unset (``None``) are omitted, so
    adding an option does not change the ids of labels made without it."""
    out = dataclasses.asdict(strategy)
    out.pop("name", None)
    return {key: value for key, value in out.items() if value is not None}


Rule = Literal["hard", "relative"]


@dataclass(frozen=True, slots=True)
class StateTest:
    """How a search decides that the state through a step is *bad* (its last step is wrong).

    ``hard`` (Math-Shepherd, OmegaPRM): bad when none of ``n`` rollouts reaches the answer. ``relative``
    (EpicPRM Eq. 3, Alg. 1 l. 11): ``MC(s_0)`` first, with the adaptive ``sampling``; then bad when
    ``MC(s_t) <= alpha * MC(s_0)``, each state getting the number of rollouts ``s_0`` took. With
    ``stopping`` every state draws rollouts in small batches until its verdict is settled
    (:class:`SequentialStopping`) instead of a fixed count. Every strategy takes one, so a comparison
    can give them all the same rule and let only the search differ.
    """

    rule: Rule = "hard"
    n: int = 48
    alpha: float = 0.5
    sampling: Sampling = ADAPTIVE_SAMPLING
    stopping: SequentialStopping | None = None

    def prepare(self, estimator: MCEstimator) -> tuple[float, Sampling] | None:
        """The threshold and per-state sampling for this solution; ``None`` when ``MC(s_0) = 0`` under the
        relative rule (the completers never solve the question: nothing can be located)."""
        if self.rule == "hard":
            return 0.0, Sampling.fixed(self.n)
        s0 = estimator.estimate(-1, self.sampling)
        if s0.correct_rollouts == 0:
            return None
        return self.alpha * s0.value, Sampling.fixed(max(1, s0.rollouts // len(estimator.completers)))

    def bad(self, estimator: MCEstimator, step: int, threshold: float, per_state: Sampling) -> bool:
        if self.stopping is not None:
            return estimator.decide(step, threshold, self.stopping)
        return estimator.estimate(step, per_state).value <= threshold

    def describe(self) -> str:
        """One line for reports: which labelling rule a strategy used."""
        base = f"hard MC, N={self.n}" if self.rule == "hard" else f"MC <= {self.alpha} MC(s_0), N as s_0"
        if self.stopping is not None:
            stop = self.stopping
            base += f", sequential stop (batch {stop.batch}, confidence {stop.confidence}, at most {stop.n_max})"
        return base


@dataclass(frozen=True, slots=True)
class SequentialSearch:
    """Estimate the states through steps 0, 1, ... and stop at the first bad one (by default
    Math-Shepherd's hard label: "a step is correct if any of 48 rollouts reaches the gold answer")."""

    n: int = 48
    weighting: Weighting = "count"
    test: StateTest | None = None
    name: str = "sequential"

    def parameters(self) -> dict[str, Any]:
        return _params(self)

    def search(self, solution: SolutionToLabel, estimator: MCEstimator) -> int | None:
        test = self.test or StateTest("hard", n=self.n)
        prepared = test.prepare(estimator)
        if prepared is None:
            return None
        threshold, per_state = prepared
        for step in range(estimator.n_steps):
            if test.bad(estimator, step, threshold, per_state):
                return step
        return None


@dataclass(frozen=True, slots=True)
class BinarySearch:
    """OmegaPRM's binary search (by default on the hard label: the state through ``mid`` is good when
    any of 48 rollouts reaches the gold answer); the first bad state's last step is the first error."""

    n: int = 48
    weighting: Weighting = "count"
    test: StateTest | None = None
    name: str = "binary"

    def parameters(self) -> dict[str, Any]:
        return _params(self)

    def search(self, solution: SolutionToLabel, estimator: MCEstimator) -> int | None:
        test = self.test or StateTest("hard", n=self.n)
        prepared = test.prepare(estimator)
        if prepared is None:
            return None
        threshold, per_state = prepared
        left, right = 0, estimator.n_steps - 1
        while left <= right:
            mid = (left + right) // 2
            if test.bad(estimator, mid, threshold, per_state):
                right = mid - 1
            else:
                left = mid + 1
        return left if left < estimator.n_steps else None


def difficulty_level(mc_s0: float) -> int:
    """EpicPRM Eq. 4: ``d(q_i, θ_1:K) = round(10 * MC_PPL(s_0, θ_1:K))``, 11 levels 0..10 (half rounds up)."""
    return math.floor(10.0 * mc_s0 + 0.5)


def first_midpoint(left: int, right: int, n_steps: int, mc_s0: float) -> int:
    """EpicPRM Eq. 5, the difficulty-dependent first midpoint, kept inside ``[left, right]``::

    mid = ⌊(l+r)/2⌋ - ⌊Len/4⌋   if d < 2        (hard question: errors come early)
          ⌊(l+r)/2⌋             if 2 <= d < 6
          ⌊(l+r)/2⌋ + ⌊Len/4⌋   if d >= 6       (easy question: errors come late)
    """
    d = difficulty_level(mc_s0)
    mid = (left + right) // 2
    if d < 2:
        mid -= n_steps // 4
    elif d >= 6:
        mid += n_steps // 4
    return min(max(mid, left), right)


@dataclass(frozen=True, slots=True)
class AdaptiveBinarySearch:
    """EpicPRM Algorithm 1 (adaptive binary search) with MC-PPL contributions.

    - l. 2: ``V = MC_PPL(s_0)`` with adaptive sampling (16 rollouts, more until 10 correct or 72); the
      number it took is the question's dynamic sample count for every later state (Sec. 3.2.2).
    - Eq. 3: ``C(a_t) = MC_PPL(s_t) / MC_PPL(s_0)``; step ``a_t`` is wrong when ``C(a_t) <= alpha``,
      i.e. ``MC_PPL(s_mid) <= H = alpha * V`` (l. 11).
    - l. 4-5: the first midpoint follows Eq. 5 when the solution has at least 4 steps.
    - ``MC_PPL(s_0) = 0`` (no rollout from the question reaches the answer, even after N_max): the
      search is undefined and the solution stays unlabelled (``unresolved``) rather than blaming step 0.
    - ``state_n_max`` (not in the paper, off by default): a state that would be called bad with none of
      its rollouts correct gets more first, up to ``state_n_max`` per completer, until one is correct
      (:meth:`MCEstimator.confirm_zero`): with a handful of rollouts a state, a false zero moves the first
      error early.
    """

    alpha: float = 0.5
    sampling: Sampling = ADAPTIVE_SAMPLING
    weighting: Weighting = "inv_ppl"
    dynamic_start: bool = True
    stopping: SequentialStopping | None = None
    state_n_max: int | None = None
    name: str = "adaptive_binary"

    def __post_init__(self) -> None:
        if self.state_n_max is not None and self.state_n_max < 1:
            raise ValueError(f"state_n_max must be at least 1 (or None: as many as s_0 took); got {self.state_n_max}")

    def parameters(self) -> dict[str, Any]:
        return _params(self)

    def search(self, solution: SolutionToLabel, estimator: MCEstimator) -> int | None:
        s0 = estimator.estimate(-1, self.sampling)
        if s0.correct_rollouts == 0:
            # The completers never solve the question: C(a_t) = MC_PPL(s_t) / 0 is undefined and every
            # state would fall at or below H = 0, labelling step 0 wrong whatever the solution says.
            # No label (status "unresolved"); a stronger completer or an easier question is needed.
            return None
        per_state = Sampling.fixed(max(1, s0.rollouts // len(estimator.completers)))
        threshold = self.alpha * s0.value
        n_steps = estimator.n_steps
        left, right, first = 0, n_steps - 1, True
        while left <= right:
            if first and self.dynamic_start and n_steps >= 4:
                mid = first_midpoint(left, right, n_steps, s0.value)
            else:
                mid = (left + right) // 2
            first = False
            bad = StateTest("relative", stopping=self.stopping).bad(estimator, mid, threshold, per_state)
            if bad and self.state_n_max is not None and self.stopping is None:
                bad = estimator.confirm_zero(mid, self.state_n_max).value <= threshold
            if bad:
                right = mid - 1
            else:
                left = mid + 1
        return left if left < n_steps else None


@dataclass(frozen=True, slots=True)
class UncertaintyDrivenSearch:
    """UnPRM Algorithm 1: try steps by descending Δu (l. 8-12); estimate each with adaptive sampling
    (l. 14-19); the first whose ``MC_PPL(s_i) < tau`` is the error (l. 20-21), ``tau = tau_scale *
    MC_PPL(s_0)`` (the paper's tau is ``MC_PPL(s_0)``, ``tau_scale = 1``).

    Unlike a first-error search it finds "the most uncertain erroneous step": when a later wrong step
    is tried before the first one, the later one is labelled. The paper ranks steps ``t > 1``; here
    every step with a Δu is ranked (the scorer defines Δu of step 0), so an error in step 0 is found.
    """

    tau_scale: float = 1.0
    sampling: Sampling = ADAPTIVE_SAMPLING
    weighting: Weighting = "inv_ppl"
    stopping: SequentialStopping | None = None
    name: str = "uncertainty_driven"

    def parameters(self) -> dict[str, Any]:
        return _params(self)

    def search(self, solution: SolutionToLabel, estimator: MCEstimator) -> int | None:
        deltas = solution.uncertainty_delta
        if deltas is None or len(deltas) != estimator.n_steps:
            raise ValueError(
                f"uncertainty_driven needs one Δu per step ({estimator.n_steps}), got "
                f"{'none' if deltas is None else len(deltas)}; run the step-uncertainty consumer first "
                "(StepsScored) or choose adaptive_binary"
            )
        tau = self.tau_scale * estimator.estimate(-1, self.sampling).value
        order = sorted(range(len(deltas)), key=lambda t: -deltas[t])
        for step in order:
            if self.stopping is not None:
                # "< tau" as "<= tau" minus nothing: a settled posterior below tau is the same decision.
                if estimator.decide(step, tau, self.stopping):
                    return step
            elif estimator.estimate(step, self.sampling).value < tau:
                return step
        return None


#: name -> strategy factory (keyword parameters are the dataclass fields).
STRATEGIES: dict[str, Callable[..., AnnotationStrategy]] = {
    "sequential": SequentialSearch,
    "binary": BinarySearch,
    "adaptive_binary": AdaptiveBinarySearch,
    "uncertainty_driven": UncertaintyDrivenSearch,
    "bisection": ProbabilisticBisection,
}


def make_strategy(name: str, **parameters: Any) -> AnnotationStrategy:
    """The registered strategy ``name`` with ``parameters`` (e.g. ``alpha=0.5``)."""
    try:
        factory = STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown annotation strategy {name!r}; choose one of {', '.join(STRATEGIES)}") from None
    return factory(**parameters)


def labels_from_first_error(n_steps: int, first_error_step: int | None) -> tuple[bool, ...]:
    """Steps before the first error True, from it on False (PRM800K convention; EpicPRM Sec. 2)."""
    if first_error_step is None:
        return (True,) * n_steps
    return tuple(t < first_error_step for t in range(n_steps))


def annotate(
    solution: SolutionToLabel,
    strategy: AnnotationStrategy,
    completers: Sequence[Completer],
    *,
    checker: AnswerChecker = exact_match,
    max_attempts: int = 3,
    starts: SharedStarts | None = None,
    starts_scope: Hashable = None,
    first_rollouts: Sequence[Sequence[tuple[Rollout, bool]]] | None = None,
) -> Annotation:
    """Label one solution with ``strategy``; never raises for completer failures (status ``aborted``).
    ``starts``: ``MC(s_0)`` shared between the solutions of a question (:class:`SharedStarts`);
    ``first_rollouts``: per completer, graded rollouts from ``s_0`` drawn already (:class:`MCEstimator`)."""
    started = time.perf_counter()
    n_steps = len(solution.steps)
    params = strategy.parameters()
    if solution.correct:
        return Annotation(
            strategy.name, params, "all_correct", (True,) * n_steps, None, (None,) * n_steps, (), CostTally()
        )
    if n_steps == 0:
        raise ValueError(f"an incorrect solution needs at least one step to label; question {solution.question!r}")
    estimator = MCEstimator(
        completers,
        solution.question,
        solution.steps,
        solution.gold_answer,
        weighting=strategy.weighting,
        checker=checker,
        max_attempts=max_attempts,
        starts=starts,
        starts_scope=starts_scope,
        first_rollouts=first_rollouts,
    )
    status: Status = "labelled"
    error: str | None = None
    first_error: int | None = None
    try:
        first_error = strategy.search(solution, estimator)
        if first_error is None:
            status = "unresolved"
    except AnnotationAborted as aborted:
        status, error = "aborted", str(aborted)
    estimator.ledger.wall_time_s = time.perf_counter() - started
    soft: list[float | None] = [None] * n_steps
    for estimate in estimator.estimates:
        if estimate.step_index >= 0:
            soft[estimate.step_index] = estimate.value
    labels = labels_from_first_error(n_steps, first_error) if status == "labelled" else ()
    return Annotation(
        method=strategy.name,
        parameters=params,
        status=status,
        labels=labels,
        first_error_step=first_error if status == "labelled" else None,
        soft_labels=tuple(soft),
        estimates=tuple(estimator.estimates),
        cost=estimator.ledger,
        error=error,
    )
