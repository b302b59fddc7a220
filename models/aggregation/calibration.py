"""Calibration of aggregation weights for one (generator, PRM, score rule) pair (Kuang et al.
section 4): fit Logit/Linear zero crossings ``b``, the WRF mix ``alpha`` and the KDE weighting on a
calibration split; the fit is a plain, serializable record applied at selection time."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Literal

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field, model_validator

from prmloop.models.aggregation import methods as m
from prmloop.models.aggregation.methods import NO_ANSWER, FloatArray, IntArray
from prmloop.models.aggregation.pool import (
    CandidatePool,
    ScoredCandidates,
    ScoreKind,
    ScoreRule,
    subsample_indices,
)

CALIBRATION_SCHEMA_VERSION = 1

LOGIT_B_GRID: FloatArray = np.unique(
    np.concatenate([np.linspace(0.01, 0.99, 99), 1.0 / (1.0 + np.exp(-np.linspace(-8.0, 13.0, 85)))])
)
"""Zero crossings searched for Logit WV: the paper's range ``(0, 1)`` (uniform) plus points uniform
in logit space, which resolve the region near 1 where confident PRMs put most scores."""

LINEAR_B_GRID: FloatArray = np.unique(np.concatenate([np.linspace(-1.0, 1.0, 201), 1.0 - np.logspace(-5.0, -1.0, 41)]))
"""Zero crossings searched for Linear WV: the paper's range ``[-1, 1]``, refined near 1."""

WRF_ALPHA_GRID: FloatArray = np.linspace(0.0, 1.0, 21)
"""Mixing weights searched for WRF (UnPRM fixes ``alpha = 0.5``)."""


class ScoreTransform(BaseModel):
    """Map from a PRM's candidate scores to probabilities in ``[0, 1]``.

    ``identity`` for PRMs that output probabilities. ``ecdf`` for reward models with arbitrary
    scales (internlm2): the calibration split's empirical CDF, ``p = F_cal(score)`` (mid-ranks at
    ``knots``, linear in between, clamped to ``[1/(2n), 1 - 1/(2n)]``). It is monotone, so Best-of-N
    is unchanged, and it is fitted on calibration data only.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["identity", "ecdf"]
    knots: list[float] = Field(default_factory=list)
    levels: list[float] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check(self) -> ScoreTransform:
        if self.kind == "ecdf":
            if len(self.knots) < 2 or len(self.knots) != len(self.levels):
                raise ValueError("an ecdf transform needs at least 2 knots and one level per knot")
            if np.any(np.diff(self.knots) <= 0):
                raise ValueError("ecdf knots must be strictly increasing")
        return self

    def __call__(self, scores: npt.ArrayLike) -> FloatArray:
        s = np.asarray(scores, dtype=np.float64)
        if self.kind == "identity":
            return s
        return np.interp(s, self.knots, self.levels)

    @classmethod
    def fit(cls, scores: FloatArray, kind: ScoreKind, max_knots: int = 257) -> ScoreTransform:
        """``identity`` for probabilities (checked to lie in [0, 1]); ``ecdf`` for rewards."""
        vals = np.sort(np.asarray(scores, dtype=np.float64).ravel())
        vals = vals[np.isfinite(vals)]
        if kind == "probability":
            if vals.size and (vals[0] < 0.0 or vals[-1] > 1.0):
                raise ValueError(
                    f"scores declared as probabilities lie in [{vals[0]:.4g}, {vals[-1]:.4g}]; "
                    "declare the PRM's score_kind as 'reward' to fit an empirical-CDF transform"
                )
            return cls(kind="identity")
        if vals.size < 2 or vals[0] == vals[-1]:
            raise ValueError("cannot fit an ecdf transform: need at least two distinct calibration scores")
        knots = np.unique(np.quantile(vals, np.linspace(0.0, 1.0, max_knots)))
        n = vals.size
        mid = (np.searchsorted(vals, knots, "left") + np.searchsorted(vals, knots, "right")) / (2.0 * n)
        levels = np.clip(mid, 0.5 / n, 1.0 - 0.5 / n)
        return cls(kind="ecdf", knots=knots.tolist(), levels=levels.tolist())


class KdeWeighting(BaseModel):
    """KDE weighting ``w_KDE(p) = log f1(p) - log f0(p) + log(q_M) + log(m - 1) - log(1 - q_M)``
    (Kuang et al. section 4.1).

    ``log_density_ratio`` is ``log f1 - log f0`` tabulated at ``logit_grid`` (spanning the
    calibration scores), where ``f_c`` is the Gaussian KDE of calibration scores of class ``c`` in
    logit space (eq. 2, bandwidth by Silverman's rule per class); between grid points it is
    interpolated linearly and beyond the grid held constant. ``q_M`` is estimated per question as
    the mean of the binned calibrator ``g`` over its candidates: ``g(p) = calibrator_probs[j]`` for
    ``p`` in bin ``j`` of ``calibrator_edges`` (interior edges).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    logit_grid: list[float]
    log_density_ratio: list[float]
    bandwidth_correct: float
    bandwidth_incorrect: float
    n_correct: int
    n_incorrect: int
    calibrator_edges: list[float]
    calibrator_probs: list[float]

    @model_validator(mode="after")
    def _check(self) -> KdeWeighting:
        if len(self.logit_grid) != len(self.log_density_ratio) or len(self.logit_grid) < 2:
            raise ValueError("logit_grid and log_density_ratio must have the same length (>= 2)")
        if len(self.calibrator_probs) != len(self.calibrator_edges) + 1:
            raise ValueError("a binned calibrator has one probability per bin: len(edges) + 1")
        return self

    def prm_term(self, p: npt.ArrayLike) -> FloatArray:
        """``log(f1(p) / f0(p))``, the PRM signal term."""
        return np.interp(m.logit(p), self.logit_grid, self.log_density_ratio)

    def calibrated_probability(self, p: npt.ArrayLike) -> FloatArray:
        """``g(p)``: calibrated probability that a candidate with score ``p`` is correct."""
        idx = np.searchsorted(np.asarray(self.calibrator_edges), np.asarray(p, dtype=np.float64), "right")
        return np.asarray(self.calibrator_probs)[idx]

    def weights(self, answers: IntArray, p: FloatArray) -> FloatArray:
        """Per-candidate weights ``w_KDE(p_i)`` with ``q_hat_M = mean_i g(p_i)`` over the question's
        answered candidates and ``m`` its number of distinct answers."""
        valid = answers != NO_ANSWER
        g = np.where(valid, self.calibrated_probability(np.where(valid, p, 0.0)), 0.0)
        q_hat = g.sum(axis=1) / np.maximum(valid.sum(axis=1), 1)
        llm = m.llm_signal_term(q_hat, m.distinct_answers(answers))
        return np.where(valid, self.prm_term(np.where(valid, p, 0.5)) + llm[:, None], 0.0)

    @classmethod
    def fit(cls, p: FloatArray, correct: npt.NDArray[np.bool_], grid_size: int = 512, bins: int = 10) -> KdeWeighting:
        """Fit eq. 2 per class and the binned calibrator on calibration candidates ``p`` (flat)."""
        x = m.logit(p)
        cls_x = (x[correct], x[~correct])
        if min(v.size for v in cls_x) < 2:
            raise ValueError(
                f"the calibration split has {cls_x[0].size} correct and {cls_x[1].size} incorrect "
                "candidates; the KDE needs at least 2 of each: use more calibration questions"
            )
        hs = [float(m.silverman_bandwidth(v.std(ddof=1), v.size)) for v in cls_x]
        # Tabulated over the calibration data only: beyond it the ratio of two Gaussian tails with
        # different bandwidths diverges quadratically, which is extrapolation, not evidence.
        grid = np.linspace(float(x.min()), float(x.max()), grid_size)
        log_f = [_log_kde(grid, v, h) for v, h in zip(cls_x, hs, strict=True)]
        edges = np.unique(np.quantile(p, np.linspace(0.0, 1.0, bins + 1)[1:-1]))
        idx = np.searchsorted(edges, p, "right")
        n_bin = np.bincount(idx, minlength=edges.size + 1)
        k_bin = np.bincount(idx, weights=correct.astype(np.float64), minlength=edges.size + 1)
        probs = (k_bin + 1.0) / (n_bin + 2.0)  # Laplace smoothing keeps g in (0, 1)
        return cls(
            logit_grid=grid.tolist(),
            log_density_ratio=(log_f[0] - log_f[1]).tolist(),
            bandwidth_correct=hs[0],
            bandwidth_incorrect=hs[1],
            n_correct=int(cls_x[0].size),
            n_incorrect=int(cls_x[1].size),
            calibrator_edges=edges.tolist(),
            calibrator_probs=probs.tolist(),
        )


def _log_kde(at: FloatArray, data: FloatArray, h: float) -> FloatArray:
    """``log f(x) = log( 1/(n h) sum_i K((x - x_i) / h) )`` with a Gaussian ``K`` (eq. 2)."""
    z = (at[:, None] - data[None, :]) / h
    log_k = -0.5 * z * z
    top = log_k.max(axis=1, keepdims=True)
    lse = np.log(np.exp(log_k - top).sum(axis=1)) + top[:, 0]
    return lse - np.log(data.size * h) - 0.5 * np.log(2.0 * np.pi)


class AggregationCalibration(BaseModel):
    """A fitted calibration for one (generator, PRM, score rule) pair; ``model_dump()`` is the
    payload of a ``CalibrationFitted`` event.

    Attributes:
        generator, prm_name, dataset: what the calibration split was sampled and scored with.
        score_rule: how step scores become a candidate score (``min`` / ``product`` / ``last``).
        score_kind: whether the PRM emits probabilities; ``reward`` scores pass ``score_transform``.
        score_transform: raw candidate score -> probability used by every probability rule.
        logit_b: zero crossing of ``w(p) = logit(p) - logit(b)`` (Kuang et al. section 4.2).
        linear_b: zero crossing of ``w(p) = p - b`` (section 4.2).
        wrf_alpha: reward/frequency mix of WRF (UnPRM Algorithm 3).
        kde: the KDE weighting (section 4.1).
        calibration_question_ids: questions the fit saw (exclude them from any evaluation).
        objective_ns, objective_repeats: the grid-search objective is calibration accuracy averaged
            over random subsamples of these sizes.
        calibration_accuracy: the objective reached by each fitted rule.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: int = CALIBRATION_SCHEMA_VERSION
    generator: str
    prm_name: str
    dataset: str
    score_rule: ScoreRule
    score_kind: ScoreKind
    score_transform: ScoreTransform
    logit_b: float = Field(gt=0.0, lt=1.0)
    linear_b: float = Field(ge=-1.0, le=1.0)
    wrf_alpha: float = Field(ge=0.0, le=1.0)
    kde: KdeWeighting
    calibration_question_ids: list[str]
    objective_ns: list[int]
    objective_repeats: int
    calibration_accuracy: dict[str, float]

    def probabilities(self, candidates: ScoredCandidates) -> FloatArray:
        """Candidate scores under ``score_rule``, mapped to probabilities by ``score_transform``."""
        p = self.score_transform(candidates.rule_scores(self.score_rule))
        return np.where(candidates.answers != NO_ANSWER, p, 0.0)

    def logit_weighted_vote(self, candidates: ScoredCandidates) -> IntArray:
        return m.logit_weighted_vote(candidates.answers, self.probabilities(candidates), self.logit_b)

    def linear_weighted_vote(self, candidates: ScoredCandidates) -> IntArray:
        return m.linear_weighted_vote(candidates.answers, self.probabilities(candidates), self.linear_b)

    def kde_weighted_vote(self, candidates: ScoredCandidates) -> IntArray:
        """Weighted vote with ``w_KDE`` (Kuang et al. section 4.1)."""
        p = self.probabilities(candidates)
        m.check_probabilities(candidates.answers, p)
        return m.weighted_vote(candidates.answers, self.kde.weights(candidates.answers, p))

    def weighted_reward_frequency(self, candidates: ScoredCandidates) -> IntArray:
        return m.weighted_reward_frequency(candidates.answers, candidates.rule_scores(self.score_rule), self.wrf_alpha)


def objective_candidates(
    candidates: ScoredCandidates, ns: list[int], repeats: int, rng: np.random.Generator
) -> list[ScoredCandidates]:
    """Subsamples of the calibration split at each size in ``ns`` (one draw when ``n`` is the full
    pool: it is the pool itself)."""
    q, full = candidates.answers.shape
    out = []
    for n in ns:
        reps = 1 if n == full else repeats
        out.append(candidates.subsample(subsample_indices(q, full, n, reps, rng)))
    return out


Part = tuple[ScoredCandidates, FloatArray]
"""A calibration subsample and its candidates' probabilities."""


def _accuracy(parts: list[Part], select: Callable[[ScoredCandidates, FloatArray], IntArray]) -> float:
    return float(np.mean([part.selection_correct(select(part, p)).mean() for part, p in parts]))


def _call_with(
    select: Callable[[ScoredCandidates, FloatArray, float], IntArray],
    value: float,
    c: ScoredCandidates,
    p: FloatArray,
) -> IntArray:
    return select(c, p, value)


def _grid_search(
    grid: FloatArray, parts: list[Part], select: Callable[[ScoredCandidates, FloatArray, float], IntArray]
) -> tuple[float, float]:
    """Best grid value for ``select(part, probabilities, value) -> selections``; the objective is
    accuracy averaged over ``parts``. Among equally good values the median one is taken
    (deterministic, and away from the edge of a plateau)."""
    acc = np.array([_accuracy(parts, functools.partial(_call_with, select, float(g))) for g in grid])
    best = np.flatnonzero(acc >= acc.max() - 1e-12)
    pick = int(best[(best.size - 1) // 2])
    return float(grid[pick]), float(acc[pick])


def fit_calibration(
    pool: CandidatePool,
    *,
    score_rule: ScoreRule = "min",
    objective_ns: tuple[int, ...] = (4, 8, 16, 32),
    objective_repeats: int = 4,
    seed: int = 0,
) -> AggregationCalibration:
    """Fit every calibrated rule on ``pool`` (the calibration split, with ground truth).

    ``b`` of Logit and Linear WV and WRF's ``alpha`` are grid-searched to maximize calibration
    accuracy (Kuang et al. section 4.2: "the objective used in the grid search is the accuracy on
    the held-out calibration set"); since one fit serves every budget ``N``, that accuracy is
    averaged over random subsamples of sizes ``objective_ns`` (sizes above the pool's ``N`` are
    dropped). The KDE and the binned calibrator are fitted on all calibration candidates.
    """
    if pool.n_questions < 2:
        raise ValueError(f"a calibration split needs several questions, got {pool.n_questions}")
    raw = pool.scores(score_rule)
    valid = pool.answers != NO_ANSWER
    transform = ScoreTransform.fit(raw[valid], pool.score_kind)
    p_all = transform(raw[valid])
    kde = KdeWeighting.fit(p_all, pool.correct[valid])

    cands = ScoredCandidates.from_pool(pool)
    ns = sorted({n for n in objective_ns if 1 <= n <= pool.n_candidates} or {pool.n_candidates})
    parts: list[Part] = []
    for part in objective_candidates(cands, ns, objective_repeats, np.random.default_rng(seed)):
        p = transform(part.rule_scores(score_rule))
        parts.append((part, np.where(part.answers != NO_ANSWER, p, 0.5)))

    logit_b, logit_acc = _grid_search(LOGIT_B_GRID, parts, lambda c, p, b: m.logit_weighted_vote(c.answers, p, b))
    linear_b, linear_acc = _grid_search(LINEAR_B_GRID, parts, lambda c, p, b: m.linear_weighted_vote(c.answers, p, b))
    wrf_alpha, wrf_acc = _grid_search(
        WRF_ALPHA_GRID,
        parts,
        lambda c, p, a: m.weighted_reward_frequency(c.answers, c.rule_scores(score_rule), a),
    )
    kde_acc = _accuracy(parts, lambda c, p: m.weighted_vote(c.answers, kde.weights(c.answers, p)))
    return AggregationCalibration(
        generator=pool.generator,
        prm_name=pool.prm_name,
        dataset=pool.dataset,
        score_rule=score_rule,
        score_kind=pool.score_kind,
        score_transform=transform,
        logit_b=logit_b,
        linear_b=linear_b,
        wrf_alpha=wrf_alpha,
        kde=kde,
        calibration_question_ids=list(pool.question_ids),
        objective_ns=ns,
        objective_repeats=objective_repeats,
        calibration_accuracy={
            "logit_wv": logit_acc,
            "linear_wv": linear_acc,
            "wrf": wrf_acc,
            "kde_wv": kde_acc,
        },
    )
