"""Answer-selection rules for Best-of-N pools, vectorized over all questions at once.

Every rule reads a pool as integer answer-cluster ids ``answers`` of shape ``[Q, N]`` (one row per
question, one column per candidate; candidates in one cluster gave mathematically equivalent
answers) and per-candidate scores or weights of the same shape, and returns the selected cluster id
per question, shape ``[Q]``.

Conventions shared by every rule (and by :mod:`prmloop.models.aggregation.naive`):

* ``-1`` (:data:`NO_ANSWER`) marks a candidate without an extracted answer: it casts no vote, cannot
  be selected, and a question whose candidates all lack an answer selects ``-1`` (counted wrong).
* A cluster that no candidate of the question voted for can never win, even when every present
  answer has a negative total (negative weights, Kuang et al. section 3.2).
* Ties are broken toward the lowest cluster id. Loaders number clusters by first appearance in the
  pool's candidate order, so that is the answer seen first; Best-of-N breaks score ties toward the
  earliest candidate. Subsamples keep the candidates' original order, so neither rule depends on
  the order in which a subsample was drawn.

References:
    Kuang et al., "Optimal aggregation of LLM and PRM signals for efficient test-time scaling"
    (``optimal-aggregation-llm-prm-signals-calibration.txt``): Theorem 3.2, section 4, section 5.1.
    Han et al., "UnPRM" (``unprm-uncertainty-driven-prm-data-and-aggregation.txt``): section 4,
    Algorithms 2 (HMR) and 3 (WRF).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

NO_ANSWER = -1
"""Cluster id of a candidate whose final answer could not be extracted."""

LOGIT_EPS = 1e-6
"""Probabilities are clipped to ``[LOGIT_EPS, 1 - LOGIT_EPS]`` before a logit: fp16 PRM heads emit
exact 0.0 and 1.0 (``qwen_prm`` does on about 1 candidate in 4), whose logit is infinite."""


# ---------------------------------------------------------------------------------------------
# validation


def as_answers(answers: npt.ArrayLike) -> IntArray:
    """Return ``answers`` as an int64 ``[Q, N]`` array, or raise a ``ValueError`` saying what is wrong."""
    arr = np.asarray(answers)
    if arr.ndim != 2:
        raise ValueError(
            f"answers must have shape [questions, candidates], got shape {arr.shape}; "
            "pass one row of answer-cluster ids per question"
        )
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(
            f"answers must be integer answer-cluster ids, got dtype {arr.dtype}; group answers with "
            "prmloop.models.grading.group_equivalent_answers first (see aggregation.loader)"
        )
    out = arr.astype(np.int64, copy=False)
    if out.size and out.min() < NO_ANSWER:
        raise ValueError(f"answer-cluster ids must be >= {NO_ANSWER} (-1 = no answer), got {out.min()}")
    return out


def as_values(answers: IntArray, values: npt.ArrayLike, name: str) -> FloatArray:
    """Return per-candidate ``values`` as float64 of the same shape as ``answers``; answered
    candidates must have finite values."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.shape != answers.shape:
        raise ValueError(
            f"{name} has shape {arr.shape} but answers has shape {answers.shape}; give one value per candidate"
        )
    bad = (answers != NO_ANSWER) & ~np.isfinite(arr)
    if bad.any():
        q, i = np.argwhere(bad)[0]
        raise ValueError(
            f"{name} has {int(bad.sum())} non-finite values for answered candidates "
            f"(first: question row {q}, candidate {i}: {arr[q, i]}); every answered candidate needs a score"
        )
    return arr


def check_probabilities(answers: IntArray, scores: FloatArray, name: str = "scores") -> None:
    """Raise a ``ValueError`` unless every answered candidate's score lies in ``[0, 1]``.

    Vanilla, Logit, Linear and KDE weighted votes read the score as the PRM's probability that the
    solution is correct. Reward models with unbounded outputs (the internlm2 reward files) must be
    mapped to ``[0, 1]`` first: :class:`prmloop.models.aggregation.calibration.ScoreTransform`
    (empirical CDF fitted on the calibration split) does that.
    """
    mask = answers != NO_ANSWER
    if not mask.any():
        return
    vals = scores[mask]
    lo, hi = float(vals.min()), float(vals.max())
    if lo < 0.0 or hi > 1.0:
        raise ValueError(
            f"{name} are not probabilities (min {lo:.4g}, max {hi:.4g}); this rule needs PRM "
            "probabilities in [0, 1]. For reward models with unbounded scores fit a calibration with "
            "score_kind='reward' (empirical-CDF transform) and select through it, or use a rule that "
            "accepts any real score (best_of_n, hybrid_majority_reward, weighted_reward_frequency)"
        )


def logit(p: npt.ArrayLike) -> FloatArray:
    """``logit(p) = log(p / (1 - p))`` (Kuang et al. section 4.1), with ``p`` clipped to
    ``[LOGIT_EPS, 1 - LOGIT_EPS]``."""
    q = np.clip(np.asarray(p, dtype=np.float64), LOGIT_EPS, 1.0 - LOGIT_EPS)
    return np.log(q) - np.log1p(-q)


# ---------------------------------------------------------------------------------------------
# vote primitives


def n_clusters_of(answers: IntArray) -> int:
    """Number of cluster slots needed for ``answers`` (largest id + 1, at least 1)."""
    return max(int(answers.max()) + 1, 1) if answers.size else 1


def cluster_counts(answers: IntArray, n_clusters: int | None = None) -> IntArray:
    """``N_k``: how many candidates of each question voted for cluster ``k``; shape ``[Q, K]``."""
    k = n_clusters_of(answers) if n_clusters is None else n_clusters
    q = answers.shape[0]
    mask = answers != NO_ANSWER
    rows = np.broadcast_to(np.arange(q)[:, None], answers.shape)
    flat = rows[mask] * k + answers[mask]
    return np.bincount(flat, minlength=q * k).reshape(q, k).astype(np.int64)


def cluster_sums(answers: IntArray, weights: FloatArray, n_clusters: int | None = None) -> FloatArray:
    """``sum_{i: s_i = alpha_k} w_i`` per question and cluster, shape ``[Q, K]``.

    Sums are accumulated in candidate order (``np.bincount``), the same order as a per-question
    Python loop, so both give bit-identical totals.
    """
    k = n_clusters_of(answers) if n_clusters is None else n_clusters
    q = answers.shape[0]
    mask = answers != NO_ANSWER
    rows = np.broadcast_to(np.arange(q)[:, None], answers.shape)
    flat = rows[mask] * k + answers[mask]
    sums: FloatArray = np.bincount(flat, weights=weights[mask], minlength=q * k).astype(np.float64)
    return sums.reshape(q, k)


def argmax_present(totals: FloatArray, present: BoolArray) -> IntArray:
    """Index of the largest total among present clusters, ties toward the lowest id; ``-1`` for
    questions with no present cluster."""
    masked = np.where(present, totals, -np.inf)
    sel = np.argmax(masked, axis=1).astype(np.int64)
    sel[~present.any(axis=1)] = NO_ANSWER
    return sel


def weighted_vote(answers: npt.ArrayLike, weights: npt.ArrayLike) -> IntArray:
    """Weighted majority vote: ``argmax_{alpha_k} Score(alpha_k)``, ``Score(alpha_k) = sum_{i: s_i =
    alpha_k} w_i`` (Kuang et al. Theorem 3.2 and section 4: ``alpha_hat = argmax_k sum_{i: s_i =
    alpha_k} w(p_i)``). Weights may be negative; absent answers never win."""
    ans = as_answers(answers)
    w = as_values(ans, weights, "weights")
    k = n_clusters_of(ans)
    return argmax_present(cluster_sums(ans, w, k), cluster_counts(ans, k) > 0)


# ---------------------------------------------------------------------------------------------
# baselines


def majority_vote(answers: npt.ArrayLike) -> IntArray:
    """Majority vote (self-consistency): ``argmax_{alpha_k} sum_i I(s_i = alpha_k)`` (Kuang et al.
    section 5.1, Baselines)."""
    ans = as_answers(answers)
    return weighted_vote(ans, np.ones(ans.shape))


def best_of_n(answers: npt.ArrayLike, scores: npt.ArrayLike) -> IntArray:
    """Best-of-N: ``alpha_hat = s_{i*}``, ``i* = argmax_i p_i`` (Kuang et al. section 5.1). Works for
    any real-valued score; the score rule (min / product / last step) is chosen by the caller
    (:func:`prmloop.models.aggregation.pool.candidate_scores`). Candidates without an answer are
    skipped; score ties go to the earliest candidate."""
    ans = as_answers(answers)
    s = as_values(ans, scores, "scores")
    answered = ans != NO_ANSWER
    idx = np.argmax(np.where(answered, s, -np.inf), axis=1)
    sel = np.take_along_axis(ans, idx[:, None], axis=1)[:, 0].copy()
    sel[~answered.any(axis=1)] = NO_ANSWER
    return sel


def vanilla_weighted_vote(answers: npt.ArrayLike, scores: npt.ArrayLike) -> IntArray:
    """Vanilla weighted vote: ``argmax_{alpha_k} sum_{i: s_i = alpha_k} p_i`` with the raw PRM
    probability as weight (Kuang et al. section 5.1). Refuses scores outside ``[0, 1]``."""
    ans = as_answers(answers)
    p = as_values(ans, scores, "scores")
    check_probabilities(ans, p)
    return weighted_vote(ans, p)


def hybrid_majority_reward(answers: npt.ArrayLike, rewards: npt.ArrayLike) -> IntArray:
    """Hybrid Majority Reward vote (UnPRM Algorithm 2).

    ``a_maj`` is the most frequent answer and ``f_maj`` its frequency (lines 2-4). If ``f_maj >= N/2``
    the majority answer is returned (line 14); otherwise the answer of the candidate with the
    highest reward ``r_i`` (``r_i = min R(s_i)`` in the paper, lines 7-12). ``N`` is the number of
    sampled candidates, including any without an answer. Rewards may be any real numbers.
    """
    ans = as_answers(answers)
    r = as_values(ans, rewards, "rewards")
    n = ans.shape[1]
    counts = cluster_counts(ans)
    maj = argmax_present(counts.astype(np.float64), counts > 0)
    f_maj = counts.max(axis=1)
    use_majority = 2 * f_maj >= n  # f_maj >= N/2 without float rounding
    return np.where(use_majority, maj, best_of_n(ans, r))


def weighted_reward_frequency(answers: npt.ArrayLike, rewards: npt.ArrayLike, alpha: float = 0.5) -> IntArray:
    """Weighted Reward-Frequency vote (UnPRM Algorithm 3).

    Per answer ``a``: mean reward ``m_a = mean_{r in G[a]} r`` and frequency ``f_a = |G[a]|`` (lines
    10-13); min-max normalized over the question's answers, ``m_hat_a = (m_a - M_min) / (M_max -
    M_min)`` and ``1.0`` when ``M_max = M_min`` (lines 14-26, same for ``f``); combined score ``s_a =
    alpha * m_hat_a + (1 - alpha) * f_hat_a`` (line 29); ``argmax_a s_a`` (line 31). The paper sets
    ``alpha = 0.5``; the calibration fits it by grid search.
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must lie in [0, 1] (UnPRM Algorithm 3), got {alpha}")
    ans = as_answers(answers)
    r = as_values(ans, rewards, "rewards")
    k = n_clusters_of(ans)
    counts = cluster_counts(ans, k)
    present = counts > 0
    sums = cluster_sums(ans, np.where(ans != NO_ANSWER, r, 0.0), k)
    mean = np.divide(sums, counts, out=np.zeros_like(sums), where=present)
    m_hat = _min_max(mean, present)
    f_hat = _min_max(counts.astype(np.float64), present)
    score = alpha * m_hat + (1.0 - alpha) * f_hat
    return argmax_present(score, present)


def _min_max(values: FloatArray, present: BoolArray) -> FloatArray:
    """Min-max normalization over each row's present entries; ``1.0`` where max equals min."""
    lo = np.where(present, values, np.inf).min(axis=1, keepdims=True)
    hi = np.where(present, values, -np.inf).max(axis=1, keepdims=True)
    span = hi - lo
    flat = ~(span > 0)  # also true for rows without any present entry
    safe_span = np.where(flat, 1.0, span)
    return np.where(flat, 1.0, (values - lo) / safe_span)


# ---------------------------------------------------------------------------------------------
# calibrated parametric weighting (Kuang et al. section 4.2)


def logit_weights(p: npt.ArrayLike, b: float) -> FloatArray:
    """Logit weighting ``w_logit(p) = logit(p) - logit(b)`` (Kuang et al. section 4.2); the weight is
    negative for scores below the zero crossing ``b``."""
    if not 0.0 < b < 1.0:
        raise ValueError(f"logit weighting needs 0 < b < 1 (its zero crossing), got b={b}")
    return logit(p) - float(logit(b))


def linear_weights(p: npt.ArrayLike, b: float) -> FloatArray:
    """Linear weighting ``w_linear(p) = p - b`` (Kuang et al. section 4.2), ``b`` searched in
    ``[-1, 1]``."""
    return np.asarray(p, dtype=np.float64) - b


def logit_weighted_vote(answers: npt.ArrayLike, scores: npt.ArrayLike, b: float) -> IntArray:
    """Logit weighted vote: weighted vote with ``w(p) = logit(p) - logit(b)``."""
    ans = as_answers(answers)
    p = as_values(ans, scores, "scores")
    check_probabilities(ans, p)
    return weighted_vote(ans, np.where(ans != NO_ANSWER, logit_weights(p, b), 0.0))


def linear_weighted_vote(answers: npt.ArrayLike, scores: npt.ArrayLike, b: float) -> IntArray:
    """Linear weighted vote: weighted vote with ``w(p) = p - b``."""
    ans = as_answers(answers)
    p = as_values(ans, scores, "scores")
    check_probabilities(ans, p)
    return weighted_vote(ans, np.where(ans != NO_ANSWER, linear_weights(p, b), 0.0))


def llm_signal_term(q_m: npt.ArrayLike, m: npt.ArrayLike) -> FloatArray:
    """LLM signal term of Theorem 3.2: ``log(q_M * (m - 1) / (1 - q_M))``.

    ``q_M`` is the probability that the generator answers correctly and ``m`` the number of distinct
    answers. With ``m = 1`` there is nothing to choose and the term (``log 0``) is set to ``0``;
    ``q_M`` is clipped to ``[LOGIT_EPS, 1 - LOGIT_EPS]``.
    """
    q = np.clip(np.asarray(q_m, dtype=np.float64), LOGIT_EPS, 1.0 - LOGIT_EPS)
    mm = np.asarray(m, dtype=np.float64)
    safe_m = np.where(mm > 1, mm, 2.0)
    return np.where(mm > 1, np.log(q) + np.log(safe_m - 1.0) - np.log1p(-q), 0.0)


def distinct_answers(answers: IntArray) -> IntArray:
    """``m``: number of distinct answers per question, shape ``[Q]``."""
    return (cluster_counts(answers) > 0).sum(axis=1)


# ---------------------------------------------------------------------------------------------
# bounds (need the ground truth)


def cluster_correctness(answers: npt.ArrayLike, correct: npt.ArrayLike, n_clusters: int | None = None) -> BoolArray:
    """Whether each answer cluster is correct, shape ``[Q, K]`` (a cluster is correct if any of its
    candidates is graded correct; loaders grade clusters, so members agree)."""
    ans = as_answers(answers)
    c = np.asarray(correct, dtype=bool)
    if c.shape != ans.shape:
        raise ValueError(f"correct has shape {c.shape} but answers has shape {ans.shape}")
    return cluster_counts(np.where(c, ans, NO_ANSWER), n_clusters) > 0


def pass_at_n(answers: npt.ArrayLike, correct: npt.ArrayLike) -> IntArray:
    """Pass@N bound as a selection: the lowest-id correct cluster when one of the N candidates is
    correct, else the majority answer (which is then wrong). Accuracy = fraction of questions with
    at least one correct candidate (Kuang et al. section 5.1)."""
    ans = as_answers(answers)
    ok = cluster_correctness(ans, correct)
    has = ok.any(axis=1)
    first_ok = np.argmax(ok, axis=1).astype(np.int64)
    return np.where(has, first_ok, majority_vote(ans))


KDE_MIN_BANDWIDTH = 0.25
"""Floor on KDE bandwidths in logit units: Silverman's rule gives 0 for a class whose scores are
all equal (one candidate, or fp16 scores saturated at 1.0)."""


def silverman_bandwidth(std: npt.ArrayLike, n: npt.ArrayLike) -> FloatArray:
    """Gaussian-kernel bandwidth ``h = 1.06 * sigma * n^(-1/5)`` (Silverman's rule of thumb),
    floored at :data:`KDE_MIN_BANDWIDTH`."""
    s = np.asarray(std, dtype=np.float64)
    nn = np.maximum(np.asarray(n, dtype=np.float64), 1.0)
    return np.maximum(1.06 * s * nn ** (-0.2), KDE_MIN_BANDWIDTH)


def optimal_weights(answers: npt.ArrayLike, scores: npt.ArrayLike, correct: npt.ArrayLike) -> FloatArray:
    """Per-question optimal weights, the oracle bound of Kuang et al. section 3.2.

    ``w_i = log(P(p_i | c=1) / P(p_i | c=0)) + log(q_M (m - 1) / (1 - q_M))`` (Theorem 3.2) where,
    for each question separately and using its ground truth, ``P(p | c)`` is a Gaussian KDE in logit
    space over that question's candidates of class ``c`` (eq. 2, bandwidth by Silverman's rule) and
    ``q_M`` is the true fraction of correct candidates. Questions with no correct or no wrong
    candidate get weight 1 (plain majority: every choice is then equally right or wrong).
    """
    ans = as_answers(answers)
    p = as_values(ans, scores, "scores")
    check_probabilities(ans, p)
    c = np.asarray(correct, dtype=bool)
    if c.shape != ans.shape:
        raise ValueError(f"correct has shape {c.shape} but answers has shape {ans.shape}")
    valid = ans != NO_ANSWER
    n1_all = (valid & c).sum(axis=1)
    mixed = (n1_all > 0) & (n1_all < valid.sum(axis=1))
    w = np.ones(ans.shape)
    if not mixed.any():
        return w
    # Only questions with both right and wrong candidates need the O(N^2) kernel sums.
    rows = np.flatnonzero(mixed)
    a_m, valid_m, c_m = ans[rows], valid[rows], c[rows]
    x = np.where(valid_m, logit(p[rows]), 0.0)
    diff = x[:, :, None] - x[:, None, :]
    d2 = diff * diff  # shared by both classes' kernels
    log_f = []
    for cls in (valid_m & c_m, valid_m & ~c_m):
        n_c = cls.sum(axis=1)
        mean = np.where(cls, x, 0.0).sum(axis=1) / n_c
        var = np.where(cls, (x - mean[:, None]) ** 2, 0.0).sum(axis=1) / np.maximum(n_c - 1, 1)
        h = silverman_bandwidth(np.sqrt(var), n_c)
        scale = (-0.5 / (h * h))[:, None, None]
        d2_c = np.where(cls[:, None, :], d2, np.inf)
        nearest = d2_c.min(axis=2, keepdims=True)  # the largest kernel term, factored out (log-sum-exp)
        lse = np.log(np.exp((d2_c - nearest) * scale).sum(axis=2)) + (nearest * scale)[:, :, 0]
        log_f.append(lse - np.log(h)[:, None] - np.log(n_c)[:, None])
    q_m = (valid_m & c_m).sum(axis=1) / valid_m.sum(axis=1)
    llm = llm_signal_term(q_m, distinct_answers(a_m))
    w[rows] = np.where(valid_m, log_f[0] - log_f[1] + llm[:, None], 1.0)
    return w


def optimal_weighted_vote(answers: npt.ArrayLike, scores: npt.ArrayLike, correct: npt.ArrayLike) -> IntArray:
    """Weighted vote with :func:`optimal_weights` (the "Optimal" rows of Kuang et al. Table 1)."""
    ans = as_answers(answers)
    return weighted_vote(ans, optimal_weights(ans, scores, correct))
