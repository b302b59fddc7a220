"""Reference implementations: the aggregation methods as a plain per-question Python loop.

They follow the papers' pseudo-code line by line (dicts of answer -> votes, UnPRM Algorithms 2-3;
per-candidate weights with ``math``, one question and one candidate at a time) and exist to check
the vectorized methods (tests) and to measure them (``bench_aggregate``). The same tie rule applies:
the lowest answer id among equal totals, the earliest candidate among equal Best-of-N scores.
"""

from __future__ import annotations

import bisect
import math

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


def _probs_row(c: ScoredCandidates, q: int, cal: AggregationCalibration | None, rule: ScoreRule) -> list[float]:
    raw = c.rule_scores(rule)[q].tolist()
    if cal is None or cal.score_transform.kind == "identity":
        return [float(v) for v in raw]
    knots, levels = cal.score_transform.knots, cal.score_transform.levels
    return [_interp(v, knots, levels) for v in raw]


def _interp(x: float, xp: list[float], fp: list[float]) -> float:
    """Piecewise-linear interpolation, constant beyond the ends."""
    if x <= xp[0]:
        return fp[0]
    if x >= xp[-1]:
        return fp[-1]
    j = bisect.bisect_right(xp, x) - 1
    t = (x - xp[j]) / (xp[j + 1] - xp[j])
    return fp[j] + t * (fp[j + 1] - fp[j])


def logit_py(p: float) -> float:
    q = min(max(p, m.LOGIT_EPS), 1.0 - m.LOGIT_EPS)
    return math.log(q) - math.log1p(-q)


def llm_signal_term_py(q_m: float, n_distinct: int) -> float:
    if n_distinct <= 1:
        return 0.0
    q = min(max(q_m, m.LOGIT_EPS), 1.0 - m.LOGIT_EPS)
    return math.log(q) + math.log(n_distinct - 1.0) - math.log1p(-q)


def kde_weights_row(cal: AggregationCalibration, answers: list[int], p: list[float]) -> list[float]:
    """``w_KDE(p_i) = log f1(p_i) - log f0(p_i) + log(q_hat (m - 1) / (1 - q_hat))`` for one question."""
    kde = cal.kde
    used = [pi for a, pi in zip(answers, p, strict=True) if a != NO_ANSWER]
    g = [kde.calibrator_probs[bisect.bisect_right(kde.calibrator_edges, pi)] for pi in used]
    q_hat = sum(g) / max(len(used), 1)
    llm = llm_signal_term_py(q_hat, len({a for a in answers if a != NO_ANSWER}))
    return [_interp(logit_py(pi), kde.logit_grid, kde.log_density_ratio) + llm for pi in p]


def _log_kde_at(x: float, data: list[float], h: float) -> float:
    terms = [-0.5 * ((x - d) / h) ** 2 for d in data]
    top = max(terms)
    return top + math.log(sum(math.exp(t - top) for t in terms)) - math.log(h) - math.log(len(data))


def optimal_weights_row(answers: list[int], p: list[float], correct: list[bool]) -> list[float]:
    """Theorem 3.2 weights with a per-question KDE on the question's own labels (one question)."""
    x = [logit_py(pi) for pi in p]
    classes: list[list[float]] = [[], []]
    for a, xi, ok in zip(answers, x, correct, strict=True):
        if a != NO_ANSWER:
            classes[0 if ok else 1].append(xi)
    if not classes[0] or not classes[1]:
        return [1.0] * len(answers)
    hs = []
    for data in classes:
        mean = sum(data) / len(data)
        var = sum((d - mean) ** 2 for d in data) / max(len(data) - 1, 1)
        hs.append(max(1.06 * math.sqrt(var) * len(data) ** -0.2, m.KDE_MIN_BANDWIDTH))
    q_m = len(classes[0]) / (len(classes[0]) + len(classes[1]))
    llm = llm_signal_term_py(q_m, len({a for a in answers if a != NO_ANSWER}))
    return [
        _log_kde_at(xi, classes[0], hs[0]) - _log_kde_at(xi, classes[1], hs[1]) + llm if a != NO_ANSWER else 1.0
        for a, xi in zip(answers, x, strict=True)
    ]


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
    if method in _BON_RULES:
        return best_of_n_row(answers, c.rule_scores(_BON_RULES[method])[q].tolist())
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
        return weighted_vote_row(answers, p)
    if method == "optimal":
        assert c.correct is not None
        return weighted_vote_row(answers, optimal_weights_row(answers, p, [bool(v) for v in c.correct[q]]))
    if cal is None:
        raise ValueError(f"method {method!r} needs a calibration")
    if method == "wrf_cal":
        return weighted_reward_frequency_row(answers, c.rule_scores(rule)[q].tolist(), cal.wrf_alpha)
    if method == "logit_wv":
        lb = logit_py(cal.logit_b)
        return weighted_vote_row(answers, [logit_py(pi) - lb for pi in p])
    if method == "linear_wv":
        return weighted_vote_row(answers, [pi - cal.linear_b for pi in p])
    if method == "kde_wv":
        return weighted_vote_row(answers, kde_weights_row(cal, answers, p))
    raise ValueError(f"unknown aggregation method {method!r}")
