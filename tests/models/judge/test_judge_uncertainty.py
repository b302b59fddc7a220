"""CoT Entropy paper, Eq. 5, 7 and 9, on hand-computed cases."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prmloop.models.judge.uncertainty import (
    DecisionSample,
    binary_entropy,
    cot_entropy,
    decision_probability,
    discrete_cot_entropy,
    naive_entropy,
    uncertainty_split,
)

# Three rationales: two decide "error" with p(error) 0.9 and 0.6, one decides "no error" with p(error) 0.2.
SAMPLES = [DecisionSample(True, 0.9), DecisionSample(True, 0.6), DecisionSample(False, 0.2)]


def h(p: float) -> float:
    return -(p * math.log(p) + (1 - p) * math.log(1 - p))


def test_eq5_normalises_the_two_decision_tokens() -> None:
    # p(yes) = 0.3, p(no) = 0.1 -> 0.3 / 0.4
    assert decision_probability(math.log(0.3), math.log(0.1)) == pytest.approx(0.75)
    assert decision_probability(-1000.0, -1001.0) == pytest.approx(math.e / (math.e + 1))  # no underflow
    with pytest.raises(ValueError, match="undefined"):
        decision_probability(-math.inf, -math.inf)


def test_eq7_sums_each_decision_clusters_own_probabilities() -> None:
    # error cluster: 0.9 + 0.6 = 1.5; no-error cluster: 1 - 0.2 = 0.8; p = 1.5 / 2.3
    assert cot_entropy(SAMPLES) == pytest.approx(h(1.5 / 2.3))
    assert cot_entropy(SAMPLES) == pytest.approx(0.646091, abs=1e-6)


def test_the_discrete_variant_uses_decision_frequencies() -> None:
    assert discrete_cot_entropy(SAMPLES) == pytest.approx(h(2 / 3))  # 0.636514
    assert discrete_cot_entropy([DecisionSample(False, 0.4)] * 4) == 0.0


def test_eq9_splits_predictive_entropy_into_epistemic_and_aleatoric() -> None:
    split = uncertainty_split(SAMPLES)
    assert split is not None
    assert split.predictive == pytest.approx(h(1.7 / 3))  # mean p(error) = 0.5667 -> 0.684232
    assert split.aleatoric == pytest.approx((h(0.9) + h(0.6) + h(0.2)) / 3)  # 0.499499
    assert split.epistemic == pytest.approx(0.184733, abs=1e-6)


def test_naive_entropy_is_the_mean_length_normalised_nll() -> None:
    samples = [DecisionSample(True, 0.5, (-1.0, -1.0)), DecisionSample(False, 0.5, (-2.0,))]
    assert naive_entropy(samples) == pytest.approx(1.5)


def test_no_parsed_sample_means_no_estimate() -> None:
    assert cot_entropy([]) is None and discrete_cot_entropy([]) is None
    assert uncertainty_split([]) is None and naive_entropy([]) is None


def test_unanimous_confident_judges_have_zero_entropy() -> None:
    sure = [DecisionSample(False, 0.0)] * 5
    assert cot_entropy(sure) == 0.0
    split = uncertainty_split(sure)
    assert split is not None and split.predictive == split.epistemic == split.aleatoric == 0.0


@given(st.lists(st.tuples(st.booleans(), st.floats(0.0, 1.0)), min_size=1, max_size=12))
def test_estimates_are_entropies_of_a_binary_variable(raw: list[tuple[bool, float]]) -> None:
    samples = [DecisionSample(e, p) for e, p in raw]
    for value in (cot_entropy(samples), discrete_cot_entropy(samples)):
        assert value is None or 0.0 <= value <= math.log(2) + 1e-12
    split = uncertainty_split(samples)
    assert split is not None
    assert split.epistemic >= 0.0 and split.aleatoric >= 0.0
    assert split.epistemic + split.aleatoric == pytest.approx(max(split.predictive, split.aleatoric), abs=1e-9)
    assert binary_entropy(0.5) == pytest.approx(math.log(2))
