"""Reference implementations: the aggregation methods as a plain per-question Python loop.

They follow the papers' pseudo-code line by line (dicts of answer -> votes, UnPRM Algorithms 2-3) and
exist to check the vectorized methods (tests) and to measure them (``bench_aggregate``). Per-candidate
weight functions (logit, KDE interpolation) are evaluated with the same numpy functions on the
question's own row, so both implementations see bit-identical weights and must select identically.
"""

from __future__ import annotations

import numpy as np
from prmloop.models.aggregation import methods as m
from prmloop.models.aggregation.calibration import AggregationCalibration
from prmloop.models.aggregation.methods import NO_ANSWER, IntArray
from prmloop.models.aggregation.pool import ScoredCandidates, ScoreRule


def _argmax_dict(score: dict[int, float]) -> int:
    """Largest score, ties toward the lowest answer id; -1 for an empty dict."""
    best, best_s = NO_ANSWER, -np.inf
    for a in sorted(score):
        if best == NO_ANSWER or score[a] > best_s:
            best, best_s = a, score[a]
    return best


def weighted_vote_row(answers: list[int], weights: list[float]) -> int:
    score: dict[int, float] = {}
    for a, w in zip(answers, weights, strict=True):
        if a != NO_ANSWER:
            score[a] = score.get(a, 0.0) + w
    return _argmax_dict(score)


def best_of_n_row(answers: list[int], scores: list[float]) -> int:
    best, best_s = NO_ANSWER, -np.inf
    for a, s in zip(answers, scores, strict=True):
        if a != NO_ANSWER and (best == NO_ANSWER or s > best_s):
            best, best_s = a, s
    return best


def hybrid_majority_reward_row(answers: list[int], rewards: list[float]) -> int:
    freq: dict[int, int] = {}
    for a in answers:
        if a != NO_ANSWER:
            freq[a] = freq.get(a, 0) + 1
    if not freq:
        return NO_ANSWER
    a_maj = _argmax_dict({a: float(f) for a, f in freq.items()})
    if freq[a_maj] < len(answers) / 2:
        return best_of_n_row(answers, rewards)
    return a_maj


def weighted_reward_frequency_row(answers: list[int], rewards: list[float], alpha: float) -> int:
    groups: dict[int, list[float]] = {}
    for a, r in zip(answers, rewards, strict=True):
        if a != NO_ANSWER:
            groups.setdefault(a, []).append(r)
    if not groups:
        return NO_ANSWER
    mean = {a: sum(rs) / len(rs) for a, rs in groups.items()}
    freq = {a: float(len(rs)) for a, rs in groups.items()}
    m_lo, m_hi = min(mean.values()), max(mean.values())
    f_lo, f_hi = min(freq.values()), max(freq.values())
    score = {}
    for a in groups:
        m_hat = 1.0 if m_hi == m_lo else (mean[a] - m_lo) / (m_hi - m_lo)
        f_hat = 1.0 if f_hi == f_lo else (freq[a] - f_lo) / (f_hi - f_lo)
        score[a] = alpha * m_hat + (1.0 - alpha) * f_hat
    return _argmax_dict(score)


def select_naive(
    method: str,
    candidates: ScoredCandidates,
    calibration: AggregationCalibration | None = None,
    score_rule: ScoreRule = "min",
) -> IntArray:
    """``method``'s selection per row, one question at a time."""
    rule = calibration.score_rule if calibration is not None else score_rule
    out = np.empty(candidates.answers.shape[0], dtype=np.int64)
    for q in range(candidates.answers.shape[0]):
        row = candidates.answers[q]
        answers = [int(a) for a in row]
        out[q] = _select_row(method, candidates, q, answers=answers, cal=calibration, rule=rule)
    return out


def _probs_row(c: ScoredCandidates, q: int, cal: AggregationCalibration | None, rule: ScoreRule) -> np.ndarray:
    raw = c.rule_scores(rule)[q]
    p = cal.score_transform(raw) if cal is not None else raw
    return np.where(c.answers[q] != NO_ANSWER, p, 0.0)


_BON_RULES: dict[str, ScoreRule] = {"bon_min": "min", "bon_product": "product", "bon_last": "last"}


def _select_row(
    method: str,
    c: ScoredCandidates,
    q: int,
    *,
    answers: list[int],
    cal: AggregationCalibration | None,
    rule: ScoreRule,
) -> int:
    if method == "majority":
        return weighted_vote_row(answers, [1.0] * len(answers))
    if method.startswith("bon_"):
        bon_rule: ScoreRule = _BON_RULES[method]
        return best_of_n_row(answers, c.rule_scores(bon_rule)[q].tolist())
    if method == "hmr":
        return hybrid_majority_reward_row(answers, c.rule_scores(rule)[q].tolist())
    if method == "wrf":
        return weighted_reward_frequency_row(answers, c.rule_scores(rule)[q].tolist(), 0.5)
    if method == "pass_at_n":
        assert c.correct is not None
        for a in sorted({a for a, ok in zip(answers, c.correct[q], strict=True) if ok and a != NO_ANSWER}):
            return a
        return weighted_vote_row(answers, [1.0] * len(answers))
    p = _probs_row(c, q, cal, rule)
    if method == "vanilla_wv":
        return weighted_vote_row(answers, p.tolist())
    if method == "optimal":
        assert c.correct is not None
        w = m.optimal_weights(c.answers[q : q + 1], p[None, :], c.correct[q : q + 1])[0]
        return weighted_vote_row(answers, w.tolist())
    if cal is None:
        raise ValueError(f"method {method!r} needs a calibration")
    if method == "wrf_cal":
        return weighted_reward_frequency_row(answers, c.rule_scores(rule)[q].tolist(), cal.wrf_alpha)
    if method == "logit_wv":
        return weighted_vote_row(answers, m.logit_weights(p, cal.logit_b).tolist())
    if method == "linear_wv":
        return weighted_vote_row(answers, m.linear_weights(p, cal.linear_b).tolist())
    if method == "kde_wv":
        w = cal.kde.weights(c.answers[q : q + 1], p[None, :])[0]
        return weighted_vote_row(answers, w.tolist())
    raise ValueError(f"unknown aggregation method {method!r}")
