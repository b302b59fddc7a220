"""The probabilistic bisection and sequential stopping, checked on hand-computed cases."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prmloop.models.annotation.bisection import (
    ProbabilisticBisection,
    first_error_prior,
    split_point,
    update_posterior,
)
from prmloop.models.annotation.completer import Rollout
from prmloop.models.annotation.estimate import MCEstimator, SequentialStopping
from prmloop.models.annotation.strategies import SolutionToLabel, StateTest, annotate, make_strategy

GOLD = "42"


class ScriptedCompleter:
    """From the state through ``m`` steps, the first ``floor(p[m] * n)`` rollouts of every call are correct."""

    name = "scripted"

    def __init__(self, success: Sequence[float]) -> None:
        self.success = success
        self.calls: list[tuple[int, int]] = []

    def complete(self, question: str, steps: Sequence[str], n: int) -> list[Rollout]:
        self.calls.append((len(steps), n))
        k = math.floor(self.success[len(steps)] * n + 1e-9)
        return [Rollout(GOLD if j < k else "0", 5, -2.5) for j in range(n)]


def _solution(n_steps: int, deltas: Sequence[float] | None = None) -> SolutionToLabel:
    steps = tuple(f"step {t}" for t in range(n_steps))
    return SolutionToLabel("q", steps, GOLD, False, None if deltas is None else tuple(deltas))


def test_the_prior_mixes_a_softmax_of_the_deltas_with_a_uniform_floor() -> None:
    # softmax([0, ln 2, 0]) = [1/4, 1/2, 1/4]; 0.7 * that + 0.3 / 3
    prior = first_error_prior([0.0, math.log(2.0), 0.0], 3, temperature=1.0, floor=0.3)
    assert prior == pytest.approx([0.275, 0.45, 0.275])
    assert first_error_prior(None, 4) == pytest.approx([0.25] * 4)
    # A wrong number of deltas is no information, not an error.
    assert first_error_prior([1.0], 2) == pytest.approx([0.5, 0.5])


def test_the_difficulty_tilt_leans_late_for_an_easy_question_and_early_for_a_hard_one() -> None:
    # MC(s_0) = 1: factors exp(0.5 * (2t/2 - 1)) = exp(-0.5), 1, exp(0.5), normalised.
    easy = first_error_prior(None, 3, mc_s0=1.0, difficulty_tilt=1.0)
    factors = [math.exp(-0.5), 1.0, math.exp(0.5)]
    assert easy == pytest.approx([f / sum(factors) for f in factors])
    hard = first_error_prior(None, 3, mc_s0=0.0, difficulty_tilt=1.0)
    assert hard == pytest.approx(easy[::-1])


def test_one_noisy_observation_moves_the_mass_by_bayes_rule() -> None:
    # "state through step 1 is bad": e <= 1 gets 0.9, e > 1 gets 0.1, then normalise.
    assert update_posterior([0.25] * 4, 1, True, 0.1) == pytest.approx([0.45, 0.45, 0.05, 0.05])
    assert update_posterior([0.25] * 4, 1, False, 0.1) == pytest.approx([0.05, 0.05, 0.45, 0.45])


@given(
    st.lists(st.floats(0.01, 1.0), min_size=2, max_size=12), st.integers(0, 10), st.booleans(), st.floats(0.01, 0.49)
)
def test_the_posterior_stays_a_distribution(weights: list[float], probed: int, bad: bool, flip: float) -> None:
    total = sum(weights)
    posterior = update_posterior([w / total for w in weights], probed % len(weights), bad, flip)
    assert math.isclose(math.fsum(posterior), 1.0) and min(posterior) > 0


def test_the_probe_splits_the_mass_nearest_one_half_and_never_the_known_bad_last_state() -> None:
    # cumulative over steps 0..2: 0.1, 0.3, 0.6 (step 3 is the last: never probed)
    assert split_point([0.1, 0.2, 0.3, 0.4], exclude=set()) == (2, pytest.approx(0.6))
    assert split_point([0.1, 0.2, 0.3, 0.4], exclude={2}) == (1, pytest.approx(0.3))
    assert split_point([1.0], exclude=set()) is None


def test_sequential_stopping_settles_by_the_beta_posterior() -> None:
    stop = SequentialStopping(batch=4, n_max=32, confidence=0.9)
    # 0 of 4 correct: Beta(1, 5), P(p <= 0.5) = 1 - 0.5^5 = 0.96875 >= 0.9: bad.
    assert stop.settled(0.0, 4, 0, 0.5) is True
    # 4 of 4: Beta(5, 1), P(p <= 0.5) = 0.5^5: good.
    assert stop.settled(1.0, 4, 4, 0.5) is False
    # At 98 % the same 4 failures are not enough (0.96875 < 0.98).
    assert SequentialStopping(batch=4, n_max=32, confidence=0.98).settled(0.0, 4, 0, 0.5) is None
    # 2 of 4 against a threshold of 0.5 settles nothing.
    assert stop.settled(0.5, 4, 2, 0.5) is None
    # The hard rule (threshold 0): one correct rollout settles good; only n_max failures settle bad.
    assert stop.settled(0.25, 4, 1, 0.0) is False
    assert stop.settled(0.0, 28, 0, 0.0) is None and stop.settled(0.0, 32, 0, 0.0) is True
    with pytest.raises(ValueError, match="sequential stopping"):
        SequentialStopping(batch=8, n_max=4)


def test_decide_draws_only_until_settled_and_reuses_the_state_rollouts() -> None:
    completer = ScriptedCompleter([1.0, 1.0, 0.0, 0.0, 0.0])
    estimator = MCEstimator([completer], "q", tuple(f"s{t}" for t in range(4)), GOLD)
    stop = SequentialStopping(batch=4, n_max=32, confidence=0.9)
    assert estimator.decide(1, 0.5, stop) is True  # through step 1 = 2 steps: success 0
    assert completer.calls == [(2, 4)]  # one batch settled it
    assert estimator.decide(1, 0.5, stop) is True and completer.calls == [(2, 4)]  # reused, nothing drawn
    assert estimator.extend(1, 4).rollouts == 8 and completer.calls == [(2, 4), (2, 4)]
    assert estimator.decide(3, 0.5, stop) is True and len(completer.calls) == 2  # the last state is known bad


def test_the_bisection_finds_the_first_error_and_a_good_prior_saves_probes() -> None:
    success = [1.0] * 6 + [0.0] * 4  # states through 0..4 (len 1..5) reach the answer; error at step 5
    n_steps = 9

    def run(deltas: list[float] | None) -> tuple[int | None, int]:
        completer = ScriptedCompleter(success)
        result = annotate(_solution(n_steps, deltas), ProbabilisticBisection(), [completer])
        return result.first_error_step, result.cost.verified_steps

    uninformed, probes_uniform = run(None)
    informed, probes_prior = run([0.0] * 5 + [4.0] + [0.0] * 3)
    assert uninformed == informed == 5
    assert probes_prior <= probes_uniform
    # A prior pointing at the wrong step costs probes but not the answer.
    misled, _ = run([4.0] + [0.0] * 8)
    assert misled == 5


def test_baselines_take_the_relative_rule_and_the_stop_without_changing_old_parameters() -> None:
    assert "test" not in make_strategy("sequential").parameters()  # labels made before keep their ids
    relative = make_strategy("binary", test=StateTest("relative"), weighting="inv_ppl")
    # State through step 1 keeps 30 % of MC(s_0) = 1: below 0.5 MC(s_0), so bad under the relative rule,
    # while the hard rule (any correct rollout) calls it good and looks later.
    completer = ScriptedCompleter([1.0, 1.0, 0.3, 0.3, 0.0])
    assert annotate(_solution(4), relative, [completer]).first_error_step == 1
    assert (
        annotate(
            _solution(4), make_strategy("binary", n=10), [ScriptedCompleter([1.0, 1.0, 0.3, 0.3, 0.0])]
        ).first_error_step
        == 3
    )


class MisleadingCompleter:
    """Every rollout from a state reaches the answer iff the state is before ``error``, except the first
    call from the state through ``liar + 1`` steps: all of its rollouts fail (an unlucky first batch)."""

    name = "misleading"

    def __init__(self, error: int, liar: int) -> None:
        self.error, self.liar = error, liar
        self.lied = False
        self.calls: list[tuple[int, int]] = []

    def complete(self, question: str, steps: Sequence[str], n: int) -> list[Rollout]:
        self.calls.append((len(steps), n))
        good = len(steps) <= self.error  # the state through steps 0..error-1
        if len(steps) == self.liar + 1 and not self.lied:
            self.lied, good = True, False
        return [Rollout(GOLD if good else "0", 5, -2.5) for _ in range(n)]


def test_the_boundary_check_overturns_an_unlucky_verdict_and_the_search_goes_on() -> None:
    # Error at step 3 of 6. The state through step 1 is good, but its first batch of 4 all fail: under
    # Beta(1, 1) that is P(p <= 0.5) = 1 - 0.5^5 = 0.97 >= 0.9, settled bad at the probes' confidence.
    # Without the check the search ends on that false boundary (step 1); the check at 99.5 % needs more
    # than one batch, the state's later rollouts all succeed, its verdict flips and the search finds step 3.
    no_check = annotate(_solution(6), ProbabilisticBisection(check=None), [MisleadingCompleter(3, 1)])
    checked_completer = MisleadingCompleter(3, 1)
    checked = annotate(_solution(6), ProbabilisticBisection(), [checked_completer])
    assert no_check.first_error_step == 1
    assert checked.first_error_step == 3
    assert checked.cost.rollouts > no_check.cost.rollouts
    # Without an unlucky batch the check only re-settles what is already certain: the same answer.
    honest = annotate(_solution(6), ProbabilisticBisection(), [MisleadingCompleter(3, liar=99)])
    assert honest.first_error_step == 3
