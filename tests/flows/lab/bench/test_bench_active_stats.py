"""actprm minus random, paired by seed: the t and bootstrap intervals on hand-computed cases."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prmloop.flows.lab.bench.active_stats import bootstrap_interval, compare_arms, t_interval


def test_the_t_interval_of_three_paired_differences_by_hand() -> None:
    # d = 0.2, 0.1, 0.3: mean 0.2, sd 0.1, se 0.1 / sqrt(3); t(0.975, 2 df) = 4.302653
    mean, low, high = t_interval([0.8, 0.7, 0.9], [0.6, 0.6, 0.6])
    half = 4.302653 * 0.1 / math.sqrt(3)
    assert mean == pytest.approx(0.2)
    assert (low, high) == (pytest.approx(0.2 - half, abs=1e-6), pytest.approx(0.2 + half, abs=1e-6))
    # Five seeds, d = 1, 2, 3, 4, 5: mean 3, sd sqrt(2.5), t(0.975, 4 df) = 2.776445
    mean, low, high = t_interval([1, 2, 3, 4, 5], [0, 0, 0, 0, 0])
    assert (low, high) == (
        pytest.approx(3 - 2.776445 * math.sqrt(2.5 / 5), abs=1e-5),
        pytest.approx(3 + 2.776445 * math.sqrt(2.5 / 5), abs=1e-5),
    )
    # A 90 % interval is narrower: t(0.95, 4 df) = 2.131847
    _, low90, _ = t_interval([1, 2, 3, 4, 5], [0, 0, 0, 0, 0], level=0.9)
    assert low90 == pytest.approx(3 - 2.131847 * math.sqrt(0.5), abs=1e-5)


def test_pairing_cancels_what_both_arms_share_by_seed() -> None:
    # Seeds differ a lot (0.3 to 0.7) but actprm is 0.05 above random on every one: no spread in d.
    random_aucs = [0.3, 0.5, 0.7, 0.4, 0.6]
    mean, low, high = t_interval([r + 0.05 for r in random_aucs], random_aucs)
    assert mean == pytest.approx(0.05) and low == pytest.approx(0.05) and high == pytest.approx(0.05)


def test_one_seed_gives_no_interval_and_unpaired_lengths_are_refused() -> None:
    mean, low, high = t_interval([0.7], [0.6])
    assert mean == pytest.approx(0.1) and low == -math.inf and high == math.inf
    with pytest.raises(ValueError, match="same number of seeds"):
        t_interval([0.7, 0.8], [0.6])


def test_the_bootstrap_of_two_seeds_by_hand() -> None:
    # d = 0, 1: a resample's mean is 0 (1/4), 0.5 (1/2) or 1 (1/4), so its 2.5th and 97.5th percentiles are 0 and 1.
    assert bootstrap_interval([0.0, 1.0], [0.0, 0.0]) == (0.0, 1.0)
    # Equal differences: every resample has the same mean.
    assert bootstrap_interval([0.5, 0.5, 0.5], [0.25, 0.25, 0.25]) == (0.25, 0.25)


@given(st.lists(st.floats(min_value=-1, max_value=1, allow_nan=False), min_size=2, max_size=12))
def test_the_bootstrap_interval_lies_within_the_differences_and_holds_their_mean(d: list[float]) -> None:
    low, high = bootstrap_interval(d, [0.0] * len(d), resamples=2000)
    assert min(d) - 1e-9 <= low <= high <= max(d) + 1e-9
    mean = sum(d) / len(d)
    assert low - 1e-9 <= mean <= high + 1e-9 or max(d) - min(d) < 1e-12


def test_compare_arms_says_whether_the_advantage_survives() -> None:
    shares = [0.05, 0.1, 0.2]
    f1_a = [[0.5, 0.6, 0.7], [0.5, 0.65, 0.72], [0.5, 0.62, 0.69]]
    f1_b = [[0.5, 0.55, 0.6], [0.5, 0.6, 0.66], [0.5, 0.6, 0.61]]
    row = compare_arms([0.66, 0.68, 0.65], [0.60, 0.61, 0.61], f1_a, f1_b, shares)
    assert row["advantage_survives"] is True and row["verdict"].startswith("actprm beats random")
    assert row["auc"]["difference"] == pytest.approx((0.06 + 0.07 + 0.04) / 3, abs=1e-4)
    # The first budget is the same random set for every arm: compared from the second on.
    assert [b["share"] for b in row["f1_at_budget"]] == [0.1, 0.2]
    assert row["f1_at_budget"][0]["difference"] == pytest.approx((0.05 + 0.05 + 0.02) / 3, abs=1e-4)
    assert row["seeds"] == 3 and "Student t" in row["method"]

    mixed = compare_arms([0.66, 0.58, 0.65], [0.60, 0.61, 0.61], [], [], [])
    assert mixed["advantage_survives"] is False and mixed["verdict"].startswith("no verdict")
    worse = compare_arms([0.50, 0.51, 0.52], [0.60, 0.61, 0.61], [], [], [])
    assert worse["advantage_survives"] is False and worse["verdict"].startswith("random beats actprm")
