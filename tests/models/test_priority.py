"""The question priority (models/priority.py) on hand-computed probes."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prmloop.models.priority import (
    PriorityWeights,
    Probe,
    answer_dispersion_normalized,
    estimate_reliability,
    priority,
    priority_signals,
    token_uncertainty,
)


def test_half_right_probe_by_hand() -> None:
    # answers {4: 2, 5: 1, none: 1}: H = 0.5 ln 2 + 2 * 0.25 ln 4 = 1.0397; / ln 4 = 0.75.
    # mean NLL 0 and ln 2: 1 - exp(-x) = 0 and 0.5, mean 0.25.
    probe = Probe(answers=("4", "4", "5", None), correct=(True, True, False, None), mean_nll=(0.0, math.log(2)))
    signals = priority_signals(probe)
    # one of the four was not gradable: q over the 3 graded, (2 + 1) / (3 + 2) = 0.6, 4q(1-q) = 0.96
    assert signals["q"] == pytest.approx(0.6)
    assert signals["reliability"] == pytest.approx(0.96)
    assert signals["dispersion"] == pytest.approx(0.75)
    assert signals["token"] == pytest.approx(0.25)
    # (0.5 * 0.96 + 0.2 * 0.75 + 0.1 * 0.25) / (0.5 + 0.2 + 0.1)
    assert priority(signals) == pytest.approx((0.48 + 0.15 + 0.025) / 0.8)


def test_all_wrong_probe_is_ranked_down_by_the_extreme_factor() -> None:
    probe = Probe(answers=("7",) * 4, correct=(False,) * 4)
    signals = priority_signals(probe)
    q = 1 / 6
    assert signals["q"] == pytest.approx(q)
    expected = (0.5 * 4 * q * (1 - q) + 0.2 * 0.0) / 0.7 * 0.1
    assert priority(signals) == pytest.approx(expected)
    # the same probe with one right answer is not extreme: no factor
    mixed = priority_signals(Probe(answers=("7", "7", "7", "8"), correct=(False, False, False, True)))
    assert priority(mixed) > 5 * priority(signals)


def test_all_right_probe_is_trivial() -> None:
    right = priority(priority_signals(Probe(answers=("3",) * 4, correct=(True,) * 4)))
    assert right == pytest.approx((0.5 * 4 * (5 / 6) * (1 / 6)) / 0.7 * 0.1)


def test_prm_spread_and_calibrated_reliability_without_gold() -> None:
    probe = Probe(answers=("1", "2"), prm_scores=(0.2, 0.8))
    signals = priority_signals(probe, calibrator=lambda p: p)
    assert signals["prm_spread"] == pytest.approx(0.6)  # 2 * pstdev(0.2, 0.8) = 2 * 0.3
    assert signals["q"] == pytest.approx(0.5) and signals["q_from_gold"] == 0.0
    assert estimate_reliability(probe) == (0.5, "majority")


def test_majority_share_when_nothing_else_is_known() -> None:
    assert estimate_reliability(Probe(answers=("a", "a", "b", None))) == (0.5, "majority")
    assert estimate_reliability(Probe(answers=(None, None))) == (0.0, "majority")


def test_dispersion_and_token_edge_cases() -> None:
    assert answer_dispersion_normalized(["x"]) == 0.0
    assert answer_dispersion_normalized(["a", "b", "c"]) == pytest.approx(1.0)
    assert token_uncertainty([]) is None
    assert token_uncertainty([float("nan"), 0.0]) == 0.0


def test_bad_weights_and_empty_probe_are_refused() -> None:
    with pytest.raises(ValueError, match="not all zero"):
        PriorityWeights(reliability=0, dispersion=0, token=0, prm_spread=0)
    with pytest.raises(ValueError, match="extreme_factor"):
        PriorityWeights(extreme_factor=2)
    with pytest.raises(ValueError, match="at least one sample"):
        priority_signals(Probe(answers=()))


outcomes = st.lists(st.sampled_from([True, False, None]), min_size=1, max_size=12)


@given(outcomes, st.lists(st.floats(0, 20), max_size=12))
def test_priority_is_in_unit_interval(correct: list[bool | None], nll: list[float]) -> None:
    answers = tuple("right" if c else (None if c is None else f"w{i}") for i, c in enumerate(correct))
    value = priority(priority_signals(Probe(answers=answers, correct=tuple(correct), mean_nll=tuple(nll))))
    assert 0.0 <= value <= 1.0


@given(st.integers(2, 16))
def test_reliability_term_peaks_at_half_right(n: int) -> None:
    def rel(c: int) -> float:
        probe = Probe(answers=("x",) * n, correct=(True,) * c + (False,) * (n - c))
        return priority_signals(probe)["reliability"]

    best = max(range(n + 1), key=rel)
    assert abs(best - n / 2) <= 0.5
