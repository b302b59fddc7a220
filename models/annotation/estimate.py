"""The one Monte-Carlo estimator every strategy shares: hard MC and MC-PPL with adaptive sampling.

Hard MC (Math-Shepherd, OmegaPRM; EpicPRM Sec. 2): ``MC(s_t) = M / N``, the fraction of ``N`` rollouts
from ``s_t`` that reach the gold answer.

MC-PPL (EpicPRM Sec. 3.1.1, Eq. 1-2; UnPRM Eq. 1)::

    PPL(j; s_t, θ_k) = exp{ -(1/L) Σ_i log p_θk(x_i | x_<i) }                                  (1)
    MC_PPL(s_t, θ_1:K) = (1/K) Σ_k  Σ_{m ∈ correct} log PPL(j; s_t, θ_k) / Σ_{n ∈ all} log PPL(j; s_t, θ_k)   (2)

Two rollout weights are implemented (``weighting``):

- ``"log_ppl"``: the equation as printed, ``w_j = log PPL_j`` (the mean negative log-likelihood). A
  *less* likely rollout weighs *more*, the opposite of the paper's own motivation ("a correct rollout
  with an exceptionally low generation probability ... a counting-based method would overestimate").
- ``"inv_ppl"``: the variant of the papers' public code, ``w_j = exp(mean_i log p(x_i | x_<i)) = 1 / PPL_j``
  (the geometric-mean token probability), so a more likely rollout weighs more, as the text argues.
- ``"count"``: ``w_j = 1``, which is hard MC ``M / N``.

Adaptive sampling (EpicPRM Sec. 3.2.2; UnPRM Algorithm 1 lines 14-18): start with ``N0`` rollouts and
add more "until N_correct >= N_min or reaching N_max" (the papers use 16, 10, 72), per completer.

``s_0`` is the question alone, the same state for every solution of it: EpicPRM grades a question's
difficulty by it (Eq. 4, ``d(q) = round(10 MC_PPL(s_0))``). :class:`SharedStarts` estimates it once per
question and hands the estimate to each of its solutions, so a question's second solution costs no
rollouts from ``s_0``, and a question no rollout solves (``MC(s_0) = 0``) leaves its other solutions
unresolved at no cost.
"""

from __future__ import annotations

import math
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from prmloop.models.annotation.completer import AnswerChecker, Completer, Rollout, exact_match

__all__ = [
    "ADAPTIVE_SAMPLING",
    "AnnotationAborted",
    "CostTally",
    "MCEstimator",
    "Sampling",
    "SequentialStopping",
    "StateEstimate",
    "Weighting",
    "mc_ppl",
    "rollout_weight",
]

Weighting = Literal["log_ppl", "inv_ppl", "count"]
_WEIGHTINGS: tuple[str, ...] = ("log_ppl", "inv_ppl", "count")


class AnnotationAborted(RuntimeError):
    """A state could not be estimated (the completer kept failing); the solution is left unlabelled."""


def rollout_weight(rollout: Rollout, weighting: Weighting) -> float:
    """The weight of one rollout in Eq. 2: ``log PPL`` (as printed), ``1/PPL`` (public code) or ``1``."""
    if weighting == "log_ppl":
        return rollout.log_ppl
    if weighting == "inv_ppl":
        return math.exp(rollout.mean_logprob)
    if weighting == "count":
        return 1.0
    raise ValueError(f"unknown MC weighting {weighting!r}; choose one of {', '.join(_WEIGHTINGS)}")


def mc_ppl(per_completer: Sequence[Sequence[tuple[Rollout, bool]]], weighting: Weighting = "inv_ppl") -> float:
    """EpicPRM Eq. 2: the mean over completers of (weight of correct rollouts) / (weight of all rollouts).

    ``per_completer[k]`` holds completer ``k``'s rollouts with whether each reached the gold answer.
    With ``weighting="count"`` this is hard MC ``M / N``. A completer whose rollouts all weigh zero
    (every token had probability 1 under ``"log_ppl"``) falls back to ``M / N``, the limit of Eq. 2.
    """
    if not per_completer or any(not rollouts for rollouts in per_completer):
        raise ValueError("MC_PPL needs at least one rollout from every completer")
    values = []
    for rollouts in per_completer:
        weights = [rollout_weight(r, weighting) for r, _ in rollouts]
        total = math.fsum(weights)
        if total > 0.0:
            values.append(math.fsum(w for w, (_, ok) in zip(weights, rollouts, strict=True) if ok) / total)
        else:
            values.append(sum(ok for _, ok in rollouts) / len(rollouts))
    return math.fsum(values) / len(values)


@dataclass(frozen=True, slots=True)
class Sampling:
    """How many rollouts one state gets: ``n0`` first, then ``grow_by`` more until ``n_min_correct``
    correct rollouts or ``n_max`` (EpicPRM Sec. 3.2.2). ``n_min_correct=0`` means a fixed ``n0``."""

    n0: int = 16
    n_min_correct: int = 10
    n_max: int = 72
    grow_by: int = 16

    def __post_init__(self) -> None:
        if not 1 <= self.n0 <= self.n_max or self.grow_by < 1 or self.n_min_correct < 0:
            raise ValueError(f"sampling needs 1 <= n0 <= n_max, grow_by >= 1 and n_min_correct >= 0; got {self}")

    @classmethod
    def fixed(cls, n: int) -> Sampling:
        return cls(n0=n, n_min_correct=0, n_max=n, grow_by=n)


#: The papers' adaptive sampling: N0 = 16, N_min = 10, N_max = 72 (EpicPRM Sec. 4.5.1).
ADAPTIVE_SAMPLING = Sampling()


@dataclass(frozen=True, slots=True)
class SequentialStopping:
    """Sequential stopping of MC sampling: at a probed state, draw ``batch`` rollouts at a time and stop
    once "MC(s) <= threshold or not" is settled at ``confidence``.

    The state's success rate ``p`` gets a Beta(``prior_a``, ``prior_b``) prior; after ``n`` rollouts of
    which a weighted fraction ``v`` (MC or MC-PPL) succeeded, the posterior is Beta(a + v n, b + (1 - v) n).
    The state is settled *bad* when ``P(p <= threshold) >= confidence`` and *good* when ``P(p >
    threshold) >= confidence``. A threshold of 0 is the hard-MC rule ("any rollout correct"): one
    correct rollout settles *good*; ``n_max`` rollouts without one settle *bad*. At ``n_max`` the point
    estimate decides (the caller's fallback), so the cost of a state is bounded as with a fixed N.
    """

    batch: int = 4
    n_max: int = 32
    confidence: float = 0.9
    prior_a: float = 1.0
    prior_b: float = 1.0

    def __post_init__(self) -> None:
        if not 1 <= self.batch <= self.n_max or not 0.5 < self.confidence < 1.0 or min(self.prior_a, self.prior_b) <= 0:
            raise ValueError(
                f"sequential stopping needs 1 <= batch <= n_max, 0.5 < confidence < 1, a, b > 0; got {self}"
            )

    def settled(self, value: float, rollouts: int, correct: int, threshold: float) -> bool | None:
        """``True`` (bad), ``False`` (good) or ``None`` (draw more) after ``rollouts`` with this ``value``."""
        if rollouts == 0:
            return None
        if threshold <= 0.0:
            return False if correct > 0 else (True if rollouts >= self.n_max else None)
        if threshold >= 1.0:
            return True
        from scipy.stats import beta

        successes = value * rollouts
        below = float(beta.cdf(threshold, self.prior_a + successes, self.prior_b + rollouts - successes))
        if below >= self.confidence:
            return True
        if 1.0 - below >= self.confidence:
            return False
        return None


@dataclass(frozen=True, slots=True)
class StateEstimate:
    """One MC estimate of the state through step ``step_index`` (0-based; ``-1`` is ``s_0``, the question)."""

    step_index: int
    value: float
    rollouts: int
    correct_rollouts: int
    weighted: bool


@dataclass(slots=True)
class CostTally:
    """What annotating one solution cost (EpicPRM Table 2 / UnPRM Table 2 columns, plus failures)."""

    verified_steps: int = 0
    rollouts: int = 0
    generated_tokens: int = 0
    wall_time_s: float = 0.0
    failures: Counter[str] = field(default_factory=Counter)
    #: rollouts taken from what was drawn before (a question's sampled solutions), not generated
    reused_rollouts: int = 0

    def as_dict(self) -> dict[str, object]:
        return {
            "verified_steps": self.verified_steps,
            "rollouts": self.rollouts,
            "generated_tokens": self.generated_tokens,
            "wall_time_s": self.wall_time_s,
            "failures": dict(self.failures),
        }


Graded = list[list[tuple["Rollout", bool]]]


class SharedStarts:
    """``MC(s_0)`` per question, estimated by the first solution that asks and shared with the rest
    (thread-safe: a solution asking while another estimates it waits for that estimate). Keeps the
    newest ``max_questions``."""

    def __init__(self, max_questions: int = 1000) -> None:
        self.max_questions = max_questions
        self._done: OrderedDict[Hashable, tuple[Graded, StateEstimate]] = OrderedDict()
        self._busy: dict[Hashable, threading.Lock] = {}
        self._lock = threading.Lock()
        self.shared = 0

    def get(
        self, key: Hashable, estimate: Callable[[], tuple[Graded, StateEstimate]]
    ) -> tuple[Graded, StateEstimate, bool]:
        """(graded rollouts, estimate, whether it was shared) for ``key``, running ``estimate`` once."""
        with self._lock:
            lock = self._busy.setdefault(key, threading.Lock())
        with lock:
            with self._lock:
                found = self._done.get(key)
                if found is not None:
                    self._done.move_to_end(key)
                    self.shared += 1
                    return [list(rollouts) for rollouts in found[0]], found[1], True
            graded, result = estimate()
            with self._lock:
                self._done[key] = ([list(rollouts) for rollouts in graded], result)
                while len(self._done) > self.max_questions:
                    old, _ = self._done.popitem(last=False)
                    self._busy.pop(old, None)
            return graded, result, False


class MCEstimator:
    """Estimates states of one solution, memoised per state, and keeps its cost ledger.

    Rollouts that hit ``max_tokens`` or whose answer could not be parsed count as incorrect and are
    tallied under ``failures``; a completer that raises is retried ``max_attempts`` times (each failure
    tallied as ``completer_error``) before :class:`AnnotationAborted` is raised.
    """

    def __init__(
        self,
        completers: Sequence[Completer],
        question: str,
        steps: Sequence[str],
        gold_answer: str,
        *,
        weighting: Weighting = "inv_ppl",
        checker: AnswerChecker = exact_match,
        final_state_known_wrong: bool = True,
        max_attempts: int = 3,
        starts: SharedStarts | None = None,
        starts_scope: Hashable = None,
        first_rollouts: Sequence[Sequence[tuple[Rollout, bool]]] | None = None,
    ) -> None:
        """``starts``: where ``MC(s_0)`` of each question is shared between its solutions (see the module);
        ``starts_scope``: what else must be equal to share it (the completers' models and prompt format;
        default: these very completer objects). ``first_rollouts[k]``: graded rollouts from ``s_0`` that
        completer ``k`` would have drawn and need not (the question's sampled solutions, drawn by its model
        at its settings): ``s_0`` takes them first, in order, as its adaptive sampling asks for rollouts,
        and draws only the rest."""
        if not completers:
            raise ValueError("MC estimation needs at least one completer")
        if weighting not in _WEIGHTINGS:
            raise ValueError(f"unknown MC weighting {weighting!r}; choose one of {', '.join(_WEIGHTINGS)}")
        self.completers = tuple(completers)
        self.question = question
        self.steps = tuple(steps)
        self.gold_answer = gold_answer
        self.weighting: Weighting = weighting
        self.checker = checker
        self.final_state_known_wrong = final_state_known_wrong
        self.max_attempts = max_attempts
        self.starts = starts
        self.starts_scope = starts_scope if starts_scope is not None else tuple(id(c) for c in self.completers)
        if first_rollouts is not None and len(first_rollouts) != len(self.completers):
            raise ValueError(f"first_rollouts needs one list per completer ({len(self.completers)})")
        self.first_rollouts = [list(r) for r in first_rollouts] if first_rollouts else [[] for _ in self.completers]
        self.ledger = CostTally()
        self.estimates: list[StateEstimate] = []
        self._cache: dict[int, StateEstimate] = {}
        self._graded: dict[int, list[list[tuple[Rollout, bool]]]] = {}

    @property
    def n_steps(self) -> int:
        return len(self.steps)

    def estimate(self, step_index: int, sampling: Sampling) -> StateEstimate:
        """MC estimate of ``s = [q; a_0..a_step_index]`` (memoised: a state is never sampled twice).

        The full solution of an incorrect solution states a wrong final answer, which no continuation
        changes, so with ``final_state_known_wrong`` its value is 0 without any rollout.
        """
        if not -1 <= step_index < self.n_steps:
            raise IndexError(f"step_index {step_index} is outside -1..{self.n_steps - 1}")
        if step_index in self._cache:
            return self._cache[step_index]
        weighted = self.weighting != "count"
        if step_index == self.n_steps - 1 and self.final_state_known_wrong:
            result = StateEstimate(step_index, 0.0, 0, 0, weighted)
        elif step_index == -1 and self.starts is not None:
            key = (self.starts_scope, self.question, sampling, self.weighting)
            self._graded[-1], result, _ = self.starts.get(key, lambda: self._sampled(-1, sampling))
        else:
            per_completer, result = self._sampled(step_index, sampling)
            self._graded[step_index] = per_completer
            if step_index >= 0:
                self.ledger.verified_steps += 1
        self._cache[step_index] = result
        self.estimates.append(result)
        return result

    def _sampled(self, step_index: int, sampling: Sampling) -> tuple[Graded, StateEstimate]:
        prefix = self.steps[: step_index + 1]
        per_completer = [
            self._sample(completer, prefix, sampling, self.first_rollouts[k] if step_index == -1 else [])
            for k, completer in enumerate(self.completers)
        ]
        return per_completer, self._summary(step_index, per_completer)

    def _summary(self, step_index: int, per_completer: Sequence[Sequence[tuple[Rollout, bool]]]) -> StateEstimate:
        return StateEstimate(
            step_index=step_index,
            value=mc_ppl(per_completer, self.weighting),
            rollouts=sum(len(rs) for rs in per_completer),
            correct_rollouts=sum(ok for rs in per_completer for _, ok in rs),
            weighted=self.weighting != "count",
        )

    def extend(self, step_index: int, n: int) -> StateEstimate:
        """Draw ``n`` more rollouts of the state (per completer) and merge them into its estimate.

        The first call for a state samples it (as :meth:`estimate` with a fixed ``n``); later calls add
        to what earlier probes drew, so a search that returns to a state reuses its rollouts.
        """
        if step_index not in self._cache:
            return self.estimate(step_index, Sampling.fixed(n))
        if step_index == self.n_steps - 1 and self.final_state_known_wrong:
            return self._cache[step_index]
        prefix = self.steps[: step_index + 1]
        graded = self._graded[step_index]
        for completer, rollouts in zip(self.completers, graded, strict=True):
            rollouts.extend((rollout, self._grade(rollout)) for rollout in self._call(completer, prefix, n))
        result = self._summary(step_index, graded)
        self._cache[step_index] = result
        self.estimates = [e for e in self.estimates if e.step_index != step_index] + [result]
        return result

    def confirm_zero(self, step_index: int, n_max: int) -> StateEstimate:
        """The estimate of a state none of whose rollouts reached the answer, topped up until one does or the
        state has ``n_max`` rollouts per completer, as many again at a time; any other state's as it is.

        EpicPRM grows ``N`` because the valid rollouts ``M`` "at both s_0 and s_t may be zero" (Sec. 3.2.2),
        yet grows it at ``s_0`` only. With few rollouts a state that solves the question half the time
        shows none correct in a quarter of its draws (two rollouts), which moves the first error early;
        a state the error really precedes stays at zero and costs the top-up only.
        """
        estimate = self._cache.get(step_index)
        if estimate is None:
            raise ValueError(f"the state through step {step_index} has not been estimated yet")
        per_completer = len(self.completers)
        while estimate.correct_rollouts == 0 and 0 < estimate.rollouts < n_max * per_completer:
            have = estimate.rollouts // per_completer
            estimate = self.extend(step_index, max(1, min(have, n_max - have)))
        return estimate

    def decide(self, step_index: int, threshold: float, stopping: SequentialStopping) -> bool:
        """Whether the state through ``step_index`` is *bad* (``MC <= threshold``), drawing rollouts in
        batches of ``stopping.batch`` only until the answer is settled (:class:`SequentialStopping`).

        Rollouts the state already has count; at ``stopping.n_max`` the point estimate decides.
        """
        if step_index == self.n_steps - 1 and self.final_state_known_wrong:
            return self.estimate(step_index, Sampling.fixed(1)).value <= threshold  # no rollout: MC = 0
        estimate = self._cache.get(step_index)
        while True:
            if estimate is not None:
                verdict = stopping.settled(estimate.value, estimate.rollouts, estimate.correct_rollouts, threshold)
                if verdict is not None:
                    return verdict
                if estimate.rollouts >= stopping.n_max * len(self.completers):
                    return estimate.value <= threshold
            estimate = self.extend(step_index, stopping.batch)

    def _sample(
        self,
        completer: Completer,
        prefix: Sequence[str],
        sampling: Sampling,
        drawn: Sequence[tuple[Rollout, bool]] = (),
    ) -> list[tuple[Rollout, bool]]:
        """The adaptive sampling of one state; rollouts ``drawn`` already are taken first, as if drawn now."""
        graded: list[tuple[Rollout, bool]] = []
        ready = list(drawn)
        want = sampling.n0
        while True:
            reused, ready = ready[:want], ready[want:]
            graded.extend(reused)
            self.ledger.reused_rollouts += len(reused)
            if want > len(reused):
                for rollout in self._call(completer, prefix, want - len(reused)):
                    graded.append((rollout, self._grade(rollout)))
            correct = sum(ok for _, ok in graded)
            if correct >= sampling.n_min_correct or len(graded) >= sampling.n_max:
                return graded
            want = min(sampling.grow_by, sampling.n_max - len(graded))

    def _call(self, completer: Completer, prefix: Sequence[str], n: int) -> list[Rollout]:
        last_error: Exception | None = None
        for _ in range(self.max_attempts):
            try:
                rollouts = list(completer.complete(self.question, prefix, n))
            except Exception as error:  # noqa: BLE001 - any engine failure is counted, never fatal
                self.ledger.failures["completer_error"] += 1
                last_error = error
                continue
            if not rollouts:
                self.ledger.failures["completer_error"] += 1
                last_error = RuntimeError("the completer returned no rollouts")
                continue
            self.ledger.rollouts += len(rollouts)
            self.ledger.generated_tokens += sum(r.tokens for r in rollouts)
            return rollouts
        raise AnnotationAborted(
            f"completer {getattr(completer, 'name', completer)!r} failed {self.max_attempts} times on the state "
            f"after {len(prefix)} step(s) of question {self.question[:60]!r}: {last_error!r}; "
            "check the model server, then re-run the annotator (labels are idempotent)"
        )

    def _grade(self, rollout: Rollout) -> bool:
        if rollout.finish_reason == "length":
            self.ledger.failures["max_tokens"] += 1
            return False
        if rollout.answer is None:
            self.ledger.failures["unparseable"] += 1
            return False
        return self.checker(rollout.answer, self.gold_answer)
