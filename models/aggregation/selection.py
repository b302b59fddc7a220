"""Registry of aggregation methods by name: one place that says which score rule, which fitted
parameters and which ground truth each method reads, so evaluation, benchmark and callers agree."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from prmloop.models.aggregation import methods as m
from prmloop.models.aggregation.calibration import AggregationCalibration
from prmloop.models.aggregation.methods import NO_ANSWER, FloatArray, IntArray
from prmloop.models.aggregation.pool import ScoredCandidates, ScoreRule

Selector = Callable[[ScoredCandidates, AggregationCalibration | None, ScoreRule], IntArray]


@dataclass(frozen=True)
class AggregationMethod:
    """A named selection rule.

    Attributes:
        name: registry key (``logit_wv``).
        label: name in tables and plots ("Logit WV").
        select: ``(candidates, calibration or None, score rule) -> selected cluster per row``.
        needs_calibration: reads fitted parameters (``b``, ``alpha``, the KDE).
        needs_ground_truth: a bound, not a method (pass@N, per-question optimal).
    """

    name: str
    label: str
    select: Selector
    needs_calibration: bool = False
    needs_ground_truth: bool = False


def probabilities(c: ScoredCandidates, cal: AggregationCalibration | None, rule: ScoreRule) -> FloatArray:
    """Candidate probabilities: through the calibration's transform when there is one; raw scores
    only when they are declared probabilities (reward-model scores must be calibrated first)."""
    if cal is not None:
        return cal.probabilities(c)
    if c.score_kind != "probability":
        raise ValueError(
            "these scores come from a reward model (score_kind='reward'), not probabilities; fit a "
            "calibration (fit_calibration) and pass it: its empirical-CDF transform maps them to [0, 1]"
        )
    p = c.rule_scores(rule)
    return np.where(c.answers != NO_ANSWER, p, 0.0)


def _need(cal: AggregationCalibration | None, name: str) -> AggregationCalibration:
    if cal is None:
        raise ValueError(f"method {name!r} needs a fitted calibration: run fit_calibration on a calibration split")
    return cal


def _truth(c: ScoredCandidates, name: str) -> np.ndarray:
    if c.correct is None:
        raise ValueError(f"{name!r} is a bound that reads the ground truth; these candidates carry none")
    return c.correct


def _rule(cal: AggregationCalibration | None, rule: ScoreRule) -> ScoreRule:
    return cal.score_rule if cal is not None else rule


METHODS: dict[str, AggregationMethod] = {
    a.name: a
    for a in [
        AggregationMethod("majority", "Majority", lambda c, cal, r: m.majority_vote(c.answers)),
        AggregationMethod("bon_min", "BoN (min)", lambda c, cal, r: m.best_of_n(c.answers, c.rule_scores("min"))),
        AggregationMethod(
            "bon_product", "BoN (product)", lambda c, cal, r: m.best_of_n(c.answers, c.rule_scores("product"))
        ),
        AggregationMethod("bon_last", "BoN (last)", lambda c, cal, r: m.best_of_n(c.answers, c.rule_scores("last"))),
        AggregationMethod(
            "vanilla_wv",
            "Vanilla WV",
            lambda c, cal, r: m.vanilla_weighted_vote(c.answers, probabilities(c, cal, r)),
        ),
        AggregationMethod(
            "hmr",
            "HMR",
            lambda c, cal, r: m.hybrid_majority_reward(c.answers, c.rule_scores(_rule(cal, r))),
        ),
        AggregationMethod(
            "wrf",
            "WRF (alpha=0.5)",
            lambda c, cal, r: m.weighted_reward_frequency(c.answers, c.rule_scores(_rule(cal, r)), 0.5),
        ),
        AggregationMethod(
            "wrf_cal",
            "WRF (fitted alpha)",
            lambda c, cal, r: _need(cal, "wrf_cal").weighted_reward_frequency(c),
            needs_calibration=True,
        ),
        AggregationMethod(
            "logit_wv",
            "Logit WV",
            lambda c, cal, r: _need(cal, "logit_wv").logit_weighted_vote(c),
            needs_calibration=True,
        ),
        AggregationMethod(
            "linear_wv",
            "Linear WV",
            lambda c, cal, r: _need(cal, "linear_wv").linear_weighted_vote(c),
            needs_calibration=True,
        ),
        AggregationMethod(
            "kde_wv",
            "KDE WV",
            lambda c, cal, r: _need(cal, "kde_wv").kde_weighted_vote(c),
            needs_calibration=True,
        ),
        AggregationMethod(
            "pass_at_n",
            "Pass@N",
            lambda c, cal, r: m.pass_at_n(c.answers, _truth(c, "pass_at_n")),
            needs_ground_truth=True,
        ),
        AggregationMethod(
            "optimal",
            "Optimal",
            lambda c, cal, r: m.optimal_weighted_vote(c.answers, probabilities(c, cal, r), _truth(c, "optimal")),
            needs_ground_truth=True,
        ),
    ]
}
"""Every method by name, in table order."""

CALIBRATED_METHODS = tuple(name for name, a in METHODS.items() if a.needs_calibration)


def available_methods(candidates: ScoredCandidates, calibration: AggregationCalibration | None) -> list[str]:
    """Method names that can run on ``candidates`` (product scores need probabilities; calibrated
    methods need a fit; bounds need the ground truth)."""
    out = []
    for name, a in METHODS.items():
        if a.needs_calibration and calibration is None:
            continue
        if a.needs_ground_truth and candidates.correct is None:
            continue
        if name == "bon_product" and "product" not in candidates.scores:
            continue
        if name in ("vanilla_wv", "optimal") and calibration is None and candidates.score_kind != "probability":
            continue
        out.append(name)
    return out


def select(
    method: str,
    candidates: ScoredCandidates,
    calibration: AggregationCalibration | None = None,
    score_rule: ScoreRule = "min",
) -> IntArray:
    """Selected answer cluster per row by ``method``. ``score_rule`` is used by the rules that read one
    score per candidate when no calibration is given (a calibration carries its own rule)."""
    if method not in METHODS:
        raise ValueError(f"unknown aggregation method {method!r}; choose from {sorted(METHODS)}")
    return METHODS[method].select(candidates, calibration, score_rule)


def select_all(
    candidates: ScoredCandidates,
    calibration: AggregationCalibration | None = None,
    methods: Iterable[str] | None = None,
    score_rule: ScoreRule = "min",
) -> dict[str, IntArray]:
    """Selections of every requested (default: every available) method."""
    names = list(methods) if methods is not None else available_methods(candidates, calibration)
    return {name: select(name, candidates, calibration, score_rule) for name in names}
