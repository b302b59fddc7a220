"""Accuracy of every aggregation method versus the sampling budget N, over calibration/test splits
and random subsamples, and the compute fraction of Kuang et al. section 5.2 (the budget at which a
calibrated method matches vanilla weighted vote at the full budget)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from prmloop.models.aggregation.calibration import AggregationCalibration, fit_calibration
from prmloop.models.aggregation.pool import CandidatePool, ScoredCandidates, ScoreRule, subsample_indices
from prmloop.models.aggregation.selection import CALIBRATED_METHODS, METHODS, available_methods, select_all

DEFAULT_NS: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
BASELINE_METHOD = "vanilla_wv"


@dataclass
class AggregationEvaluation:
    """Result of :func:`evaluate_aggregation`.

    Attributes:
        accuracy: ``accuracy[method][s][j]``: split ``s``'s test accuracy at budget ``ns[j]``,
            averaged over the random subsamples.
        fits: the calibration fitted on each split.
        compute_fraction: per method, smallest ``N`` in ``ns`` whose mean accuracy reaches vanilla
            weighted vote's at the largest budget, divided by that budget (``None``: never reached).
        compute_fraction_interp: the same with ``N`` interpolated linearly in ``log2 N`` between
            the grid points around the crossing (the paper reads its 21.3% off such a curve).
    """

    pool: dict[str, Any]
    ns: list[int]
    splits: int
    subsamples: int
    calibration_size: int
    score_rule: ScoreRule
    seed: int
    methods: list[str]
    accuracy: dict[str, list[list[float]]]
    fits: list[AggregationCalibration]
    compute_fraction: dict[str, float | None] = field(default_factory=dict)
    compute_fraction_interp: dict[str, float | None] = field(default_factory=dict)

    def mean(self, method: str) -> list[float]:
        return np.asarray(self.accuracy[method]).mean(axis=0).tolist()

    def std(self, method: str) -> list[float]:
        return np.asarray(self.accuracy[method]).std(axis=0).tolist()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (fits as their ``model_dump``)."""
        return {
            "pool": self.pool,
            "ns": self.ns,
            "splits": self.splits,
            "subsamples": self.subsamples,
            "calibration_size": self.calibration_size,
            "score_rule": self.score_rule,
            "seed": self.seed,
            "accuracy_mean": {k: self.mean(k) for k in self.methods},
            "accuracy_std": {k: self.std(k) for k in self.methods},
            "baseline": f"{BASELINE_METHOD}@N={self.ns[-1]}",
            "compute_fraction": self.compute_fraction,
            "compute_fraction_interp": self.compute_fraction_interp,
            "fitted": [
                {
                    "logit_b": f.logit_b,
                    "linear_b": f.linear_b,
                    "wrf_alpha": f.wrf_alpha,
                    "calibration_accuracy": f.calibration_accuracy,
                }
                for f in self.fits
            ],
        }

    def table_rows(self) -> list[dict[str, str]]:
        """One row per method: ``mean ± std`` accuracy (percent) per budget and compute fraction."""
        rows = []
        for k in self.methods:
            row = {"method": METHODS[k].label}
            for n, mu, sd in zip(self.ns, self.mean(k), self.std(k), strict=True):
                row[f"N={n}"] = f"{100 * mu:.1f} ± {100 * sd:.1f}"
            cf, cfi = self.compute_fraction.get(k), self.compute_fraction_interp.get(k)
            row["compute fraction"] = "-" if cf is None else f"{100 * cf:.1f}% ({100 * (cfi or cf):.1f}%)"
            rows.append(row)
        return rows

    def markdown(self) -> str:
        """The accuracy table as GitHub markdown."""
        rows = self.table_rows()
        head = list(rows[0])
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(r[h] for h in head) + " |" for r in rows]
        return "\n".join(lines)


def split_questions(n_questions: int, calibration_size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A random calibration/test split of question rows (Kuang et al. section 5.1: a random
    calibration set per run, the other questions for testing)."""
    if not 2 <= calibration_size <= n_questions - 1:
        raise ValueError(
            f"calibration_size must leave at least one test question: got {calibration_size} of {n_questions}"
        )
    perm = np.random.default_rng(seed).permutation(n_questions)
    return np.sort(perm[:calibration_size]), np.sort(perm[calibration_size:])


def accuracy_curve(
    test: CandidatePool,
    calibration: AggregationCalibration | None,
    *,
    ns: Sequence[int],
    subsamples: int,
    rng: np.random.Generator,
    methods: Sequence[str],
) -> dict[str, list[float]]:
    """Mean accuracy of each method at each budget ``n`` over ``subsamples`` random draws of ``n``
    of the pool's candidates per question (one draw at the full budget)."""
    cands = ScoredCandidates.from_pool(test)
    out: dict[str, list[float]] = {k: [] for k in methods}
    for n in ns:
        reps = 1 if n == test.n_candidates else subsamples
        sub = cands.subsample(subsample_indices(test.n_questions, test.n_candidates, n, reps, rng))
        for k, sel in select_all(sub, calibration, methods, score_rule=_rule(calibration)).items():
            out[k].append(float(sub.selection_correct(sel).mean()))
    return out


def _rule(calibration: AggregationCalibration | None) -> ScoreRule:
    return calibration.score_rule if calibration is not None else "min"


def compute_fraction(ns: Sequence[int], acc: Sequence[float], target: float) -> tuple[float | None, float | None]:
    """Smallest budget reaching ``target``, as a fraction of ``ns[-1]``: on the grid, and interpolated
    linearly in ``log2 N`` between the two budgets around the crossing."""
    for j, (n, a) in enumerate(zip(ns, acc, strict=True)):
        if a >= target - 1e-12:
            if j == 0 or acc[j] == acc[j - 1]:
                return n / ns[-1], n / ns[-1]
            t = (target - acc[j - 1]) / (acc[j] - acc[j - 1])
            log_n = math.log2(ns[j - 1]) + t * (math.log2(n) - math.log2(ns[j - 1]))
            return n / ns[-1], 2.0**log_n / ns[-1]
    return None, None


def evaluate_aggregation(
    pool: CandidatePool,
    *,
    ns: Sequence[int] = DEFAULT_NS,
    subsamples: int = 50,
    splits: int = 5,
    calibration_size: int = 100,
    score_rule: ScoreRule = "min",
    seed: int = 0,
    methods: Sequence[str] | None = None,
) -> AggregationEvaluation:
    """Evaluate every method on ``pool`` (with ground truth).

    For each of ``splits`` random calibration/test splits: fit the calibration on
    ``calibration_size`` questions (:func:`fit_calibration`), then measure test accuracy at each
    budget in ``ns`` averaged over ``subsamples`` random subsets of candidates. Reported: mean and
    standard deviation over splits; compute fraction against vanilla weighted vote at ``ns[-1]``.
    """
    ns = sorted(set(ns))
    if ns[0] < 1 or ns[-1] > pool.n_candidates:
        raise ValueError(f"budgets must lie in [1, {pool.n_candidates}] (the pool's N), got {ns}")
    fits: list[AggregationCalibration] = []
    per_split: list[dict[str, list[float]]] = []
    chosen: list[str] | None = list(methods) if methods is not None else None
    for s in range(splits):
        cal_rows, test_rows = split_questions(pool.n_questions, calibration_size, seed + s)
        fit = fit_calibration(pool.take(cal_rows), score_rule=score_rule, seed=seed + s)
        test = pool.take(test_rows)
        if chosen is None:
            chosen = available_methods(ScoredCandidates.from_pool(test), fit)
        per_split.append(
            accuracy_curve(
                test, fit, ns=ns, subsamples=subsamples, rng=np.random.default_rng([seed, s]), methods=chosen
            )
        )
        fits.append(fit)
    assert chosen is not None
    result = AggregationEvaluation(
        pool={
            "generator": pool.generator,
            "prm_name": pool.prm_name,
            "dataset": pool.dataset,
            "score_kind": pool.score_kind,
            "questions": pool.n_questions,
            "candidates": pool.n_candidates,
        },
        ns=list(ns),
        splits=splits,
        subsamples=subsamples,
        calibration_size=calibration_size,
        score_rule=score_rule,
        seed=seed,
        methods=chosen,
        accuracy={k: [curve[k] for curve in per_split] for k in chosen},
        fits=fits,
    )
    if BASELINE_METHOD in chosen:
        target = result.mean(BASELINE_METHOD)[-1]
        for k in chosen:
            if METHODS[k].needs_ground_truth:
                continue
            grid, interp = compute_fraction(ns, result.mean(k), target)
            result.compute_fraction[k] = grid
            result.compute_fraction_interp[k] = interp
    return result


__all__ = [
    "BASELINE_METHOD",
    "CALIBRATED_METHODS",
    "DEFAULT_NS",
    "AggregationEvaluation",
    "accuracy_curve",
    "compute_fraction",
    "evaluate_aggregation",
    "split_questions",
]
