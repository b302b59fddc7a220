"""ActPRM's confidence rule on hand-computed head outputs (Duan et al., 2025, Sec. 3.2)."""

from __future__ import annotations

import math

import pytest

from prmloop.models.prm.active import Thresholds, checked_steps, decide, rank_uncertain, step_confident
from prmloop.models.prm.ensemble import StepStats


def test_the_steps_checked_run_through_the_first_predicted_error() -> None:
    assert checked_steps([0.9, 0.8, 0.4, 0.1, 0.9]) == 3  # step 2 (0.4 < 0.5) is the first predicted error
    assert checked_steps([0.9, 0.8, 0.7]) == 3  # no predicted error: every step
    assert checked_steps([0.2, 0.9]) == 1
    assert checked_steps([0.6, 0.55], tau=0.6) == 2  # 0.55 < 0.6
    assert checked_steps([]) == 0


def test_a_step_is_confident_only_when_heads_agree_and_the_mean_is_extreme() -> None:
    th = Thresholds(delta=0.9, std_max=0.05)
    assert step_confident(0.95, 0.01, th)  # extreme and agreed
    assert step_confident(0.05, 0.01, th)  # extreme toward "wrong" counts too
    assert step_confident(0.9, 0.0, th)  # mean >= delta is confident (the boundary is inclusive)
    assert not step_confident(0.95, 0.05, th)  # std must be strictly below std_max
    assert not step_confident(0.7, 0.01, th)  # agreed, but a 70/30 call is aleatorically uncertain
    assert not step_confident(0.99, 0.2, th)  # extreme mean, heads disagree


def test_single_criterion_rules_ignore_the_other_criterion() -> None:
    assert step_confident(0.7, 0.01, Thresholds(delta=0.9, std_max=0.05, rule="epistemic"))
    assert not step_confident(0.99, 0.2, Thresholds(delta=0.9, std_max=0.05, rule="epistemic"))
    assert step_confident(0.99, 0.2, Thresholds(delta=0.9, std_max=0.05, rule="aleatoric"))
    assert not step_confident(0.7, 0.01, Thresholds(delta=0.9, std_max=0.05, rule="aleatoric"))


def test_a_confident_solution_is_skipped_and_its_score_is_the_largest_relative_uncertainty() -> None:
    th = Thresholds(delta=0.9, std_max=0.05)
    # step 0: e = 0.01/0.05 = 0.2, a = 0.04/0.1 = 0.4; step 1: e = 0.04/0.05 = 0.8, a = 0.02/0.1 = 0.2
    decision = decide(StepStats(mean=(0.96, 0.98), std=(0.01, 0.04)), th)
    assert not decision.label
    assert decision.checked == 2
    assert decision.step == 1
    assert decision.score == pytest.approx(0.8)
    assert "confident" in decision.reason


def test_one_uncertain_step_before_the_first_predicted_error_sends_the_solution_to_the_labeller() -> None:
    th = Thresholds(delta=0.9, std_max=0.05)
    # step 1: mean 0.8 -> a = 0.2/0.1 = 2.0 (uncertain); step 2 (0.02) is the first predicted error
    decision = decide(StepStats(mean=(0.97, 0.8, 0.02, 0.5), std=(0.01, 0.02, 0.01, 0.3)), th)
    assert decision.label
    assert decision.checked == 3  # step 3 (std 0.3) comes after the first predicted error: not checked
    assert decision.step == 1
    assert decision.score == pytest.approx(2.0)


def test_what_follows_the_first_predicted_error_does_not_count() -> None:
    th = Thresholds(delta=0.9, std_max=0.05)
    decision = decide(StepStats(mean=(0.97, 0.03, 0.5), std=(0.01, 0.01, 0.4)), th)
    assert not decision.label
    assert decision.checked == 2


def test_the_epistemic_rule_scores_by_disagreement_alone() -> None:
    th = Thresholds(delta=0.9, std_max=0.05, rule="epistemic")
    decision = decide(StepStats(mean=(0.7, 0.96), std=(0.01, 0.1)), th)
    assert decision.label
    assert decision.step == 1
    assert decision.score == pytest.approx(2.0)  # 0.1 / 0.05


def test_a_solution_without_scores_is_always_labelled() -> None:
    decision = decide(StepStats(mean=(), std=()))
    assert decision.label
    assert math.isinf(decision.score)


def test_the_labelling_order_is_uncertain_first_then_least_confident() -> None:
    th = Thresholds(delta=0.9, std_max=0.05)
    decisions = [
        decide(StepStats((0.96,), (0.01,)), th),  # confident, score 0.4
        decide(StepStats((0.6,), (0.01,)), th),  # uncertain, score 4.0
        decide(StepStats((0.92,), (0.03,)), th),  # confident, score 0.8
        decide(StepStats((0.97,), (0.08,)), th),  # uncertain, score 1.6
    ]
    assert rank_uncertain(decisions) == [1, 3, 2, 0]


@pytest.mark.parametrize(("field", "value"), [("delta", 0.5), ("delta", 1.0), ("std_max", 0.0), ("tau", 1.0)])
def test_thresholds_out_of_range_are_refused(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        Thresholds(**{field: value})
