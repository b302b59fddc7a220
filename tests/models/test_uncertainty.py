"""UnPRM's token uncertainty (Sec. 3) on sequences small enough to compute by hand."""

from __future__ import annotations

import math

import pytest

from prmloop.models.uncertainty import (
    UNPRM_CODE_TEMPERATURE,
    answer_dispersion,
    label_entropy,
    mean_nll,
    perplexity,
    rank_steps_by_delta,
    sequence_entropy,
    split_by_offsets,
    step_uncertainty,
    uncertainty_deltas,
)


def test_equal_logprobs_give_the_uniform_maximum_log_n() -> None:
    # z = softmax([-2, -2, -2]) = [1/3, 1/3, 1/3]  =>  u = -3 * (1/3) log(1/3) = log 3
    assert sequence_entropy([-2.0, -2.0, -2.0]) == pytest.approx(math.log(3))


def test_two_tokens_by_hand() -> None:
    # p = [0, -ln 3]: exp(p) = [1, 1/3], z = [3/4, 1/4]; u = -(3/4 ln 3/4 + 1/4 ln 1/4)
    expected = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    assert sequence_entropy([0.0, -math.log(3)]) == pytest.approx(expected)


def test_temperature_divides_logprobs_before_the_softmax() -> None:
    # UnPRM's code: z = softmax(p / 5). p = [0, -5 ln 3] / 5 = [0, -ln 3] -> the case above.
    expected = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    got = sequence_entropy([0.0, -5 * math.log(3)], temperature=UNPRM_CODE_TEMPERATURE)
    assert got == pytest.approx(expected)
    assert got > sequence_entropy([0.0, -5 * math.log(3)])  # a higher T flattens z


def test_empty_and_single_token_sequences_have_zero_uncertainty() -> None:
    assert sequence_entropy([]) == 0.0
    assert sequence_entropy([-3.7]) == pytest.approx(0.0)


def test_invalid_temperature_and_nan_are_rejected() -> None:
    with pytest.raises(ValueError, match="temperature"):
        sequence_entropy([-1.0], temperature=0.0)
    with pytest.raises(ValueError, match="NaN"):
        sequence_entropy([-1.0, math.nan])


def test_negative_infinity_logprob_gets_zero_weight() -> None:
    # z = [1/2, 1/2, 0]: the impossible token adds nothing, u = log 2
    assert sequence_entropy([-1.0, -1.0, -math.inf]) == pytest.approx(math.log(2))


def test_step_uncertainty_uses_each_steps_own_tokens() -> None:
    logprobs = [-0.5, -1.0, -1.0, -2.0, 0.0, -math.log(3)]
    offsets = [1, 3, 4]  # token 0 is a preamble that belongs to no step
    # steps: [-1.0, -1.0] -> log 2; [-2.0] -> 0; [0, -ln 3] -> the 3/4, 1/4 case
    expected = (math.log(2), 0.0, -(0.75 * math.log(0.75) + 0.25 * math.log(0.25)))
    assert step_uncertainty(logprobs, offsets) == pytest.approx(expected)
    assert split_by_offsets(logprobs, offsets)[0] == (-1.0, -1.0)


def test_a_solution_without_steps_has_no_step_uncertainty() -> None:
    assert step_uncertainty([-1.0, -2.0], []) == ()


def test_offsets_that_decrease_or_overrun_are_rejected() -> None:
    with pytest.raises(ValueError, match="must not decrease"):
        split_by_offsets([-1.0] * 4, [2, 1])
    with pytest.raises(ValueError, match="outside"):
        split_by_offsets([-1.0] * 4, [0, 5])


def test_deltas_define_u_s0_as_zero() -> None:
    assert uncertainty_deltas([1.0, 3.0, 2.5]) == pytest.approx((1.0, 2.0, -0.5))
    assert uncertainty_deltas([1.0, 3.0], initial=1.0) == pytest.approx((0.0, 2.0))
    assert uncertainty_deltas([]) == ()


def test_ranking_leaves_the_first_step_out_like_algorithm_1() -> None:
    deltas = (5.0, 2.0, -0.5, 2.0)
    assert rank_steps_by_delta(deltas) == (1, 3, 2)
    assert rank_steps_by_delta(deltas, include_first=True) == (0, 1, 3, 2)


def test_mean_nll_and_perplexity() -> None:
    logprobs = [math.log(0.5), math.log(0.25)]
    assert mean_nll(logprobs) == pytest.approx(-(math.log(0.5) + math.log(0.25)) / 2)
    # PPL = exp(mean NLL) = (1 / (0.5 * 0.25)) ** (1/2) = sqrt(8)
    assert perplexity(logprobs) == pytest.approx(math.sqrt(8))
    with pytest.raises(ValueError, match="empty"):
        mean_nll([])


def test_label_entropy() -> None:
    assert label_entropy([]) == 0.0
    assert label_entropy(["a", "a"]) == pytest.approx(0.0)
    # {a: 2, b: 1, c: 1} of 4 -> -(1/2 ln 1/2 + 2 * 1/4 ln 1/4) = 1.5 ln 2
    assert label_entropy(["a", "b", "a", "c"]) == pytest.approx(1.5 * math.log(2))


def test_answer_dispersion_groups_equivalent_answers_and_skips_missing_ones() -> None:
    # 0.5 == 1/2 -> clusters {0.5, 1/2}, {3}: H = log 2; None is left out
    assert answer_dispersion(["0.5", r"\frac{1}{2}", "3", "3", None]) == pytest.approx(math.log(2))
    assert answer_dispersion([None, None]) == 0.0
