"""The scoreboard's F1 intervals and the paired comparison promotion decides by."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prmloop.models.prm.scoreboard import draw_spread, f1_interval, f1_report, paired_f1_diff, rank_among
from prmloop.models.processbench import processbench_f1


def test_f1_is_processbench_harmonic_mean_by_hand() -> None:
    # erroneous: truth 0,1,2,1 predicted 0,1,2,-1 -> 3 of 4 right (0.75); correct: 2, predicted -1 and 0 -> 0.5
    predicted = [0, 1, 2, -1, -1, 0]
    truth = [0, 1, 2, 1, -1, -1]
    questions = ["a", "a", "b", "b", "c", "c"]
    result = f1_interval(predicted, truth, questions)
    assert result.f1 == pytest.approx(2 * 0.75 * 0.5 / 1.25)  # 0.6
    assert result.n == 6 and result.erroneous == 4
    assert result.lo is not None and result.hi is not None
    assert result.lo <= result.f1 <= result.hi


def test_interval_is_a_point_when_every_question_is_alike() -> None:
    # each question: one erroneous solution predicted right, one correct predicted wrong... and the same mix
    # in every question, so every bootstrap draw has the same totals: the interval is the point itself
    predicted = [1, -1, 1, -1, 1, -1]
    truth = [1, -1, 1, 0, 1, -1]
    questions = ["a", "a", "b", "b", "c", "c"]
    alike = f1_interval([1, -1] * 3, [1, -1] * 3, ["a", "a", "b", "b", "c", "c"])
    assert alike.f1 == alike.lo == alike.hi == pytest.approx(1.0)
    mixed = f1_interval(predicted, truth, questions)
    assert mixed.lo is not None and mixed.hi is not None and mixed.lo < mixed.hi  # question b differs


def test_no_f1_without_both_kinds() -> None:
    only_wrong = f1_interval([0, 1], [0, 1], ["a", "b"])
    assert only_wrong.f1 is None and only_wrong.lo is None and only_wrong.n == 2 and only_wrong.erroneous == 2


def test_report_has_every_level() -> None:
    report = f1_report([0, -1, 2, -1], [0, -1, 1, -1], ["q1", "q1", "q2", "q2"], ["L1", "L1", "L2", "L2"])
    assert set(report) == {"all", "L1", "L2"}
    assert report["L1"]["f1"] == pytest.approx(1.0)
    assert report["L2"]["f1"] == pytest.approx(0.0)  # the erroneous one missed: accuracy 0, F1 0
    assert report["all"]["f1"] == pytest.approx(2 * 0.5 * 1.0 / 1.5, abs=1e-4)  # rounded to 4 places


def test_paired_difference_of_a_model_with_itself_is_zero_and_not_worse() -> None:
    predicted = [0, -1, 2, 1, -1, 0]
    truth = [0, -1, 1, 1, -1, -1]
    questions = ["a", "a", "b", "b", "c", "c"]
    paired = paired_f1_diff(predicted, predicted, truth, questions)
    assert paired.diff == paired.lo == paired.hi == 0.0
    assert not paired.worse


def test_a_candidate_worse_on_every_question_is_worse_beyond_noise() -> None:
    truth = [0, -1] * 20
    questions = [f"q{i // 2}" for i in range(40)]
    good = list(truth)
    bad = [-1 if y >= 0 else 0 for y in truth]  # misses every error and flags every correct solution
    assert paired_f1_diff(bad, good, truth, questions).worse
    better = paired_f1_diff(good, bad, truth, questions)
    assert better.lo > 0 and not better.worse
    assert better.candidate == pytest.approx(1.0) and better.current == pytest.approx(0.0)


def test_a_small_difference_on_few_questions_is_noise() -> None:
    # the candidate is worse on one question of ten: within the noise, so it is not "worse"
    truth = [0, -1] * 10
    questions = [f"q{i // 2}" for i in range(20)]
    current = list(truth)
    candidate = list(truth)
    candidate[0] = -1
    paired = paired_f1_diff(candidate, current, truth, questions)
    assert paired.diff < 0
    assert paired.lo < 0 <= paired.hi
    assert not paired.worse


solutions = st.lists(st.tuples(st.integers(-1, 4), st.integers(-1, 4), st.integers(0, 6)), min_size=1, max_size=60)


@settings(max_examples=60, deadline=None)
@given(solutions)
def test_point_is_processbench_and_within_its_interval(rows: list[tuple[int, int, int]]) -> None:
    predicted = [p for p, _, _ in rows]
    truth = [y for _, y, _ in rows]
    questions = [f"q{q}" for _, _, q in rows]
    expected = processbench_f1(predicted, truth)["f1"]
    result = f1_interval(predicted, truth, questions, draws=200)
    if expected is None:
        assert result.f1 is None
        return
    assert result.f1 == pytest.approx(expected)
    assert result.lo is not None and result.hi is not None
    assert 0.0 <= result.lo <= result.hi <= 1.0
    assert result.lo - 1e-9 <= result.f1 <= result.hi + 1e-9 or result.lo == result.hi


@settings(max_examples=40, deadline=None)
@given(solutions, st.lists(st.integers(-1, 4), min_size=60, max_size=60))
def test_paired_difference_is_the_difference_of_the_points(rows: list[tuple[int, int, int]], other: list[int]) -> None:
    truth = [y for _, y, _ in rows]
    if not any(y >= 0 for y in truth) or not any(y < 0 for y in truth):
        return
    a = [p for p, _, _ in rows]
    b = other[: len(rows)]
    questions = [f"q{q}" for _, _, q in rows]
    paired = paired_f1_diff(a, b, truth, questions, draws=200)
    fa, fb = processbench_f1(a, truth)["f1"], processbench_f1(b, truth)["f1"]
    assert fa is not None and fb is not None
    assert paired.diff == pytest.approx(fa - fb)
    assert paired.lo <= paired.hi


def test_the_spread_over_draws_is_their_percentiles_by_hand() -> None:
    # five draws 0.1 .. 0.5: numpy's linear percentiles at 2.5 % and 97.5 % lie a tenth of a step inside
    spread = draw_spread([0.3, 0.1, 0.5, 0.2, 0.4])
    assert spread.median == pytest.approx(0.3) and spread.mean == pytest.approx(0.3)
    assert spread.lo == pytest.approx(0.1 + 0.1 * 0.1) and spread.hi == pytest.approx(0.5 - 0.1 * 0.1)
    assert spread.sd == pytest.approx(math.sqrt(0.02)) and spread.n == 5
    assert [spread.verdict(f) for f in (0.105, 0.115, 0.485, 0.495)] == ["below", "within", "within", "above"]
    with pytest.raises(ValueError, match="at least one"):
        draw_spread([])


def test_the_rank_among_draws_counts_ties_half() -> None:
    draws = [0.2, 0.4, 0.4, 0.6]
    assert rank_among(0.1, draws) == 0.0
    assert rank_among(0.4, draws) == 50.0  # beats 0.2, ties two: 1 + 2 * 0.5 of 4
    assert rank_among(0.5, draws) == 75.0
    assert rank_among(0.7, draws) == 100.0
    with pytest.raises(ValueError, match="at least one"):
        rank_among(0.5, [])
