"""Selection rules on hand-made pools: each test states one behaviour of a paper's equation or
algorithm (Kuang et al. Theorem 3.2 / sections 4-5; UnPRM Algorithms 2-3) and checks it on numbers
worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from prmloop.models.aggregation import methods as m
from prmloop.models.aggregation.pool import candidate_scores

NA = m.NO_ANSWER


def sel(values: np.ndarray) -> list[int]:
    return [int(v) for v in values]


# --- majority vote and the shared conventions ---------------------------------------------------


def test_majority_vote_picks_the_most_frequent_answer_in_every_row() -> None:
    answers = np.array([[0, 1, 1, 2], [0, 0, 1, 2]])
    assert sel(m.majority_vote(answers)) == [1, 0]


def test_majority_tie_goes_to_the_answer_seen_first() -> None:
    # clusters are numbered by first appearance, so the lowest id is the earliest answer
    assert sel(m.majority_vote(np.array([[0, 1, 1, 0]]))) == [0]
    assert sel(m.majority_vote(np.array([[0, 1, 2, 2, 1]]))) == [1]


def test_candidates_without_an_answer_cast_no_vote() -> None:
    answers = np.array([[NA, NA, NA, 0], [NA, NA, NA, NA]])
    assert sel(m.majority_vote(answers)) == [0, NA]


def test_an_absent_answer_never_wins_even_when_every_present_total_is_negative() -> None:
    # cluster 0 is absent (total 0 would beat -1 and -2 if absent clusters counted)
    answers = np.array([[1, 2, 2]])
    weights = np.array([[-1.0, -1.0, -1.5]])
    assert sel(m.weighted_vote(answers, weights)) == [1]


# --- Best-of-N and score rules ------------------------------------------------------------------


def test_best_of_n_selects_the_answer_of_the_highest_scored_candidate() -> None:
    answers = np.array([[0, 0, 0, 1]])
    assert sel(m.best_of_n(answers, np.array([[0.5, 0.6, 0.7, 0.9]]))) == [1]


def test_best_of_n_score_tie_goes_to_the_earliest_candidate_and_skips_unanswered() -> None:
    answers = np.array([[NA, 2, 1, 0]])
    assert sel(m.best_of_n(answers, np.array([[0.99, 0.8, 0.8, 0.1]]))) == [2]


def test_score_rules_reduce_nan_padded_steps_to_min_product_and_last() -> None:
    steps = np.array([[[0.9, 0.5, 0.8], [0.7, np.nan, np.nan]]])
    n_steps = np.array([[3, 1]])
    np.testing.assert_allclose(candidate_scores(steps, n_steps, "min"), [[0.5, 0.7]])
    np.testing.assert_allclose(candidate_scores(steps, n_steps, "product"), [[0.9 * 0.5 * 0.8, 0.7]])
    np.testing.assert_allclose(candidate_scores(steps, n_steps, "last"), [[0.8, 0.7]])


def test_best_of_n_winner_depends_on_the_score_rule() -> None:
    steps = np.array([[[0.95, 0.40, 0.99], [0.70, 0.70, 0.70]]])
    n_steps = np.array([[3, 3]])
    answers = np.array([[0, 1]])
    assert sel(m.best_of_n(answers, candidate_scores(steps, n_steps, "min"))) == [1]
    assert sel(m.best_of_n(answers, candidate_scores(steps, n_steps, "last"))) == [0]


def test_product_rule_is_refused_for_reward_model_scores() -> None:
    with pytest.raises(ValueError, match="not probabilities"):
        candidate_scores(np.ones((1, 1, 1)), np.ones((1, 1), dtype=np.int64), "product", "reward")


# --- vanilla, logit and linear weighted votes ------------------------------------------------------


def test_vanilla_weighted_vote_sums_raw_scores_per_answer() -> None:
    # majority says 0 (3 votes, total 0.3 + 0.3 + 0.3 = 0.9); answer 1 has 0.95 + 0.9 = 1.85
    answers = np.array([[0, 0, 0, 1, 1]])
    scores = np.array([[0.3, 0.3, 0.3, 0.95, 0.9]])
    assert sel(m.majority_vote(answers)) == [0]
    assert sel(m.vanilla_weighted_vote(answers, scores)) == [1]


def test_probability_rules_refuse_scores_outside_unit_interval_with_advice() -> None:
    with pytest.raises(ValueError, match="score_kind='reward'"):
        m.vanilla_weighted_vote(np.array([[0, 1]]), np.array([[2.5, -1.0]]))


def test_logit_weight_is_logit_p_minus_logit_b() -> None:
    w = m.logit_weights(np.array([0.9, 0.5, 0.2]), b=0.5)
    np.testing.assert_allclose(w, [math.log(9.0), 0.0, math.log(0.25)])
    assert m.logit_weights(np.array([0.7]), b=0.7)[0] == pytest.approx(0.0, abs=1e-12)


def test_linear_weight_is_p_minus_b() -> None:
    np.testing.assert_allclose(m.linear_weights(np.array([0.9, 0.2]), b=0.4), [0.5, -0.2])


def test_negative_weights_turn_many_weak_votes_against_their_answer() -> None:
    # answer 0: three weak candidates (0.4 each, vanilla total 1.2); answer 1: one strong (0.9)
    answers = np.array([[0, 0, 0, 1]])
    scores = np.array([[0.4, 0.4, 0.4, 0.9]])
    assert sel(m.vanilla_weighted_vote(answers, scores)) == [0]
    # logit, b = 0.5: answer 0 totals 3 * log(0.4/0.6) = -1.216, answer 1 log 9 = 2.197
    assert sel(m.logit_weighted_vote(answers, scores, b=0.5)) == [1]
    # linear, b = 0.5: answer 0 totals 3 * (-0.1) = -0.3, answer 1 0.4
    assert sel(m.linear_weighted_vote(answers, scores, b=0.5)) == [1]
    # with the zero crossing below every score, weights stay positive and votes add up again
    assert sel(m.linear_weighted_vote(answers, scores, b=0.0)) == [0]


def test_linear_weighted_vote_with_b_zero_is_vanilla_weighted_vote() -> None:
    rng = np.random.default_rng(3)
    answers = rng.integers(0, 4, size=(50, 8))
    scores = rng.random((50, 8))
    np.testing.assert_array_equal(
        m.linear_weighted_vote(answers, scores, 0.0), m.vanilla_weighted_vote(answers, scores)
    )


def test_logit_weighting_needs_b_strictly_inside_unit_interval() -> None:
    with pytest.raises(ValueError, match="0 < b < 1"):
        m.logit_weights(np.array([0.5]), b=1.0)


def test_saturated_probabilities_get_a_finite_logit() -> None:
    w = m.logit(np.array([0.0, 1.0]))
    assert np.isfinite(w).all()
    assert w[1] == pytest.approx(math.log((1 - m.LOGIT_EPS) / m.LOGIT_EPS))


# --- Hybrid Majority Reward (UnPRM Algorithm 2) ------------------------------------------------


def test_hmr_returns_the_majority_when_it_holds_exactly_half_of_the_votes() -> None:
    # f_maj = 2 >= N/2 = 2 -> majority answer 0, although answer 1 has the best min-reward
    answers = np.array([[0, 0, 1, 2]])
    rewards = np.array([[0.1, 0.1, 0.9, 0.2]])
    assert sel(m.hybrid_majority_reward(answers, rewards)) == [0]


def test_hmr_falls_back_to_best_reward_below_half() -> None:
    # N = 5: f_maj = 2 < 2.5 -> the candidate with the highest reward decides
    answers = np.array([[0, 0, 1, 2, 3]])
    rewards = np.array([[0.1, 0.1, 0.9, 0.2, 0.3]])
    assert sel(m.hybrid_majority_reward(answers, rewards)) == [1]


def test_hmr_counts_unanswered_candidates_in_n() -> None:
    # 2 of N = 5 (one unanswered) is below N/2 although it is the majority of answered candidates
    answers = np.array([[0, 0, 1, NA, 2]])
    rewards = np.array([[0.1, 0.1, 0.2, 0.0, 0.8]])
    assert sel(m.hybrid_majority_reward(answers, rewards)) == [2]


# --- Weighted Reward-Frequency (UnPRM Algorithm 3) ---------------------------------------------


def test_wrf_mixes_min_max_normalised_mean_reward_and_frequency() -> None:
    # answer 0: rewards 0.25, 0.5, 0.75 -> mean 0.5, f 3; answer 1: 1.0 -> mean 1.0, f 1;
    # answer 2: 0.5, 1.0 -> mean 0.75, f 2.  Normalised: m_hat = 0, 1, 0.5; f_hat = 1, 0, 0.5.
    answers = np.array([[0, 0, 0, 1, 2, 2]])
    rewards = np.array([[0.25, 0.5, 0.75, 1.0, 0.5, 1.0]])
    # alpha = 0.75: s = 0.25, 0.75, 0.5 -> answer 1
    assert sel(m.weighted_reward_frequency(answers, rewards, alpha=0.75)) == [1]
    # alpha = 0.25: s = 0.75, 0.25, 0.5 -> answer 0
    assert sel(m.weighted_reward_frequency(answers, rewards, alpha=0.25)) == [0]
    # alpha = 0.5: s = 0.5, 0.5, 0.5 exactly -> a three-way tie, broken toward the first answer
    assert sel(m.weighted_reward_frequency(answers, rewards, alpha=0.5)) == [0]
    answers_reordered = np.array([[2, 2, 2, 1, 0, 0]])
    assert sel(m.weighted_reward_frequency(answers_reordered, rewards, alpha=0.5)) == [0]


def test_wrf_sets_a_constant_component_to_one() -> None:
    # equal frequencies (f_max = f_min -> f_hat = 1 for all): the mean reward alone decides
    answers = np.array([[0, 1, 1, 0]])
    rewards = np.array([[0.2, 0.6, 0.6, 0.3]])
    assert sel(m.weighted_reward_frequency(answers, rewards, alpha=0.1)) == [1]


def test_wrf_accepts_unbounded_rewards() -> None:
    answers = np.array([[0, 1, 1]])
    assert sel(m.weighted_reward_frequency(answers, np.array([[7.0, -3.0, -4.0]]), alpha=1.0)) == [0]


def test_wrf_alpha_must_lie_in_unit_interval() -> None:
    with pytest.raises(ValueError, match="alpha"):
        m.weighted_reward_frequency(np.array([[0]]), np.array([[0.5]]), alpha=1.5)


# --- Theorem 3.2 and the bounds --------------------------------------------------------------------


def test_llm_signal_term_is_log_q_m_minus_1_over_1_minus_q() -> None:
    # q_M = 0.6, m = 3: log(0.6 * 2 / 0.4) = log 3
    assert m.llm_signal_term(0.6, 3) == pytest.approx(math.log(3.0))
    # a single distinct answer: nothing to choose, the term is 0
    assert m.llm_signal_term(0.6, 1) == 0.0


def test_optimal_weight_matches_theorem_3_2_on_a_hand_computed_question() -> None:
    # one right candidate (p = 0.9, answer 0) against three wrong ones (p = 0.2, answer 1)
    answers = np.array([[0, 1, 1, 1]])
    scores = np.array([[0.9, 0.2, 0.2, 0.2]])
    correct = np.array([[True, False, False, False]])
    w = m.optimal_weights(answers, scores, correct)
    # each class has zero spread, so both KDE bandwidths are the floor h; the PRM term at x is
    # log f1(x) - log f0(x) = -(x - x1)^2 / 2h^2 + (x - x0)^2 / 2h^2
    h = m.KDE_MIN_BANDWIDTH
    x1, x0 = math.log(0.9 / 0.1), math.log(0.2 / 0.8)
    prm = (x1 - x0) ** 2 / (2 * h * h)
    llm = math.log(0.25 * (2 - 1) / 0.75)  # q_M = 1/4, m = 2
    np.testing.assert_allclose(w[0], [prm + llm, -prm + llm, -prm + llm, -prm + llm], rtol=1e-9)
    assert sel(m.optimal_weighted_vote(answers, scores, correct)) == [0]


def test_optimal_weights_are_plain_votes_when_all_candidates_agree_on_correctness() -> None:
    answers = np.array([[0, 1], [0, 0]])
    w = m.optimal_weights(answers, np.array([[0.3, 0.4], [0.5, 0.5]]), np.array([[False, False], [True, True]]))
    np.testing.assert_array_equal(w, np.ones((2, 2)))


def test_pass_at_n_selects_a_correct_answer_whenever_one_exists() -> None:
    answers = np.array([[0, 0, 1], [0, 1, 1]])
    correct = np.array([[False, False, True], [False, False, False]])
    assert sel(m.pass_at_n(answers, correct)) == [1, 1]  # row 2: no correct answer, majority (wrong)


# --- validation ------------------------------------------------------------------------------------


def test_answers_must_be_a_two_dimensional_integer_array() -> None:
    with pytest.raises(ValueError, match="shape"):
        m.majority_vote(np.array([0, 1, 1]))
    with pytest.raises(ValueError, match="integer answer-cluster ids"):
        m.majority_vote(np.array([["a", "b"]]))


def test_scores_must_match_answers_and_be_finite_for_answered_candidates() -> None:
    with pytest.raises(ValueError, match="shape"):
        m.best_of_n(np.array([[0, 1]]), np.array([[0.5]]))
    with pytest.raises(ValueError, match="non-finite"):
        m.best_of_n(np.array([[0, 1]]), np.array([[0.5, np.nan]]))
    # an unanswered candidate may lack a score
    assert sel(m.best_of_n(np.array([[0, NA]]), np.array([[0.5, np.nan]]))) == [0]
