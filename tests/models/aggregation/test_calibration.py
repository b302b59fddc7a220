"""Calibration (Kuang et al. section 4): what is fitted, where it crosses zero, how it is stored and
how it handles reward models whose scores are not probabilities."""

from __future__ import annotations

import json

import numpy as np
import pytest

from prmloop.models.aggregation import methods as m
from prmloop.models.aggregation.calibration import (
    AggregationCalibration,
    KdeWeighting,
    ScoreTransform,
    fit_calibration,
)
from prmloop.models.aggregation.pool import CandidatePool, ScoredCandidates, ScoreKind
from prmloop.models.aggregation.selection import select


def confident_majority_pool(n_questions: int = 30, score_kind: ScoreKind = "probability") -> CandidatePool:
    """Each question: 2 right candidates scored 0.8 and 6 wrong ones scored 0.45, all wrong ones
    agreeing. Majority and vanilla WV (1.6 < 2.7) pick the wrong answer; a zero crossing above 0.45
    (wrong votes count against their answer) picks the right one."""
    answers = np.tile(np.array([1, 0, 0, 1, 0, 0, 0, 0]), (n_questions, 1))
    correct = answers == 1
    scores = np.where(correct, 0.8, 0.45)
    if score_kind == "reward":
        scores = 10.0 * scores - 3.0  # same ranking, not probabilities
    return CandidatePool(
        question_ids=tuple(f"q{i}" for i in range(n_questions)),
        answers=answers,
        correct=correct,
        step_scores=scores[:, :, None],
        n_steps=np.ones(answers.shape, dtype=np.int64),
        generator="toy",
        prm_name="toy_prm",
        dataset="toy",
        score_kind=score_kind,
    )


def test_grid_search_puts_the_zero_crossing_above_the_wrong_candidates_scores() -> None:
    fit = fit_calibration(confident_majority_pool(), objective_ns=(8,))
    # every b in (0.45, ~1) is optimal here (above 0.8 both totals are negative and the right
    # answer's is the less negative); the median of the optimal grid points is taken
    assert fit.logit_b > 0.45
    assert fit.linear_b > 0.45
    assert 2 * m.logit_weights(np.array([0.8]), fit.logit_b) > 6 * m.logit_weights(np.array([0.45]), fit.logit_b)
    assert fit.calibration_accuracy["logit_wv"] == 1.0
    assert fit.calibration_accuracy["linear_wv"] == 1.0


def test_fitted_weights_beat_majority_and_vanilla_on_held_out_questions() -> None:
    fit = fit_calibration(confident_majority_pool(), objective_ns=(8,))
    test = ScoredCandidates.from_pool(confident_majority_pool(10))
    for method in ("majority", "vanilla_wv"):
        assert not test.selection_correct(select(method, test, fit)).any()
    for method in ("logit_wv", "linear_wv"):
        assert test.selection_correct(select(method, test, fit)).all()


def test_wrf_alpha_is_fitted_toward_the_reward_when_frequency_misleads() -> None:
    fit = fit_calibration(confident_majority_pool(), objective_ns=(8,))
    # m_hat = 1 / 0 and f_hat = 0 / 1 for right / wrong answers: reward wins iff alpha > 0.5
    assert fit.wrf_alpha > 0.5


def test_kde_weight_is_prm_log_ratio_plus_llm_term_with_estimated_q() -> None:
    rng = np.random.default_rng(0)
    p_right = 1 / (1 + np.exp(-rng.normal(2.0, 1.0, 400)))
    p_wrong = 1 / (1 + np.exp(-rng.normal(-1.0, 1.0, 400)))
    kde = KdeWeighting.fit(np.concatenate([p_right, p_wrong]), np.r_[np.ones(400, bool), np.zeros(400, bool)])
    # the PRM term crosses zero between the class means (logit 2 and -1; equal spreads: near 0.5)
    ratio = np.asarray(kde.log_density_ratio)
    grid = np.asarray(kde.logit_grid)
    inner = (grid > -1) & (grid < 2)
    crossing = grid[inner][np.argmin(np.abs(ratio[inner]))]
    assert -0.5 < crossing < 1.5
    # weights = PRM term + log(q_hat (m - 1) / (1 - q_hat)), q_hat the mean calibrated probability
    answers = np.array([[0, 1, 2]])
    p = np.array([[0.9, 0.3, 0.6]])
    q_hat = kde.calibrated_probability(p[0]).mean()
    expected = kde.prm_term(p[0]) + np.log(q_hat * 2 / (1 - q_hat))
    np.testing.assert_allclose(kde.weights(answers, p)[0], expected)


def test_kde_needs_both_classes_in_the_calibration_split() -> None:
    with pytest.raises(ValueError, match="more calibration questions"):
        KdeWeighting.fit(np.array([0.9, 0.8, 0.7]), np.array([True, True, True]))


def test_fit_is_a_plain_record_that_survives_a_json_round_trip() -> None:
    fit = fit_calibration(confident_majority_pool(), objective_ns=(4, 8))
    payload = json.loads(json.dumps(fit.model_dump(mode="json")))
    again = AggregationCalibration.model_validate(payload)
    assert again == fit
    test = ScoredCandidates.from_pool(confident_majority_pool(5))
    np.testing.assert_array_equal(select("kde_wv", test, again), select("kde_wv", test, fit))
    assert payload["calibration_question_ids"][:2] == ["q0", "q1"]


def test_the_record_rejects_a_zero_crossing_outside_the_paper_range() -> None:
    payload = fit_calibration(confident_majority_pool(), objective_ns=(8,)).model_dump()
    payload["logit_b"] = 1.0
    with pytest.raises(ValueError, match="logit_b"):
        AggregationCalibration.model_validate(payload)


# --- reward models whose scores are not probabilities ----------------------------------------------


def test_probability_rules_refuse_reward_scores_without_a_calibration() -> None:
    cands = ScoredCandidates.from_pool(confident_majority_pool(5, score_kind="reward"))
    with pytest.raises(ValueError, match="not probabilities"):
        select("vanilla_wv", cands)
    # rank- and normalisation-based rules accept any real score
    select("bon_min", cands)
    select("wrf", cands)
    select("hmr", cands)


def test_reward_scores_are_mapped_by_the_calibration_empirical_cdf() -> None:
    fit = fit_calibration(confident_majority_pool(score_kind="reward"), objective_ns=(8,))
    assert fit.score_transform.kind == "ecdf"
    p = fit.score_transform(np.array([-100.0, 1.5, 5.0, 100.0]))
    assert ((p > 0) & (p < 1)).all()
    assert np.all(np.diff(p) >= 0)  # monotone: Best-of-N is unchanged
    test = ScoredCandidates.from_pool(confident_majority_pool(10, score_kind="reward"))
    assert test.selection_correct(select("logit_wv", test, fit)).all()


def test_probability_transform_refuses_scores_outside_unit_interval() -> None:
    with pytest.raises(ValueError, match="score_kind as 'reward'"):
        ScoreTransform.fit(np.array([0.2, 1.7]), "probability")


def test_product_scores_are_not_offered_for_reward_models() -> None:
    cands = ScoredCandidates.from_pool(confident_majority_pool(3, score_kind="reward"))
    assert "product" not in cands.scores
    with pytest.raises(ValueError, match="product rule needs probability"):
        select("bon_product", cands)


def test_logit_of_saturated_scores_stays_finite_in_the_kde() -> None:
    p = np.array([1.0, 1.0, 0.999, 0.2, 0.0, 0.1])
    kde = KdeWeighting.fit(p, np.array([True, True, True, False, False, False]))
    assert np.isfinite(kde.log_density_ratio).all()
    assert kde.logit_grid[-1] == pytest.approx(float(m.logit(1.0)))
