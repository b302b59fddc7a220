"""The annotation algorithms on hand-computed cases (EpicPRM Eq. 1-5 and Algorithm 1, UnPRM Algorithm 1)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prmloop.models.annotation.completer import Rollout
from prmloop.models.annotation.estimate import MCEstimator, Sampling, SharedStarts, StateEstimate, mc_ppl
from prmloop.models.annotation.strategies import (
    STRATEGIES,
    AdaptiveBinarySearch,
    BinarySearch,
    SequentialSearch,
    SolutionToLabel,
    UncertaintyDrivenSearch,
    annotate,
    difficulty_level,
    first_midpoint,
    labels_from_first_error,
    make_strategy,
)

GOLD = "42"


def _rollout(correct: bool, mean_logprob: float, tokens: int = 4) -> Rollout:
    return Rollout(GOLD if correct else "7", tokens, mean_logprob * tokens)


class ScriptedCompleter:
    """From the state through ``m`` steps, the first ``floor(p[m] * n)`` of every batch are correct."""

    name = "scripted"

    def __init__(self, success: Sequence[float], tokens: int = 5) -> None:
        self.success = success
        self.tokens = tokens
        self.calls: list[tuple[int, int]] = []

    def complete(self, question: str, steps: Sequence[str], n: int) -> list[Rollout]:
        self.calls.append((len(steps), n))
        k = math.floor(self.success[len(steps)] * n + 1e-9)
        return [Rollout(GOLD if j < k else "0", self.tokens, -0.5 * self.tokens) for j in range(n)]


def _solution(n_steps: int, deltas: Sequence[float] | None = None, correct: bool = False) -> SolutionToLabel:
    steps = tuple(f"step {t}" for t in range(n_steps))
    return SolutionToLabel("q", steps, GOLD, correct, None if deltas is None else tuple(deltas))


def test_mc_ppl_as_printed_weighs_each_rollout_by_its_log_perplexity() -> None:
    # log PPL = -mean log p: 1.0 (correct), 0.5 (wrong), 0.25 (correct) -> (1 + 0.25) / 1.75
    rollouts = [(_rollout(True, -1.0), True), (_rollout(False, -0.5), False), (_rollout(True, -0.25), True)]
    assert mc_ppl([rollouts], "log_ppl") == pytest.approx(1.25 / 1.75)


def test_mc_ppl_public_code_variant_weighs_each_rollout_by_inverse_perplexity() -> None:
    rollouts = [(_rollout(True, -1.0), True), (_rollout(False, -0.5), False), (_rollout(True, -0.25), True)]
    weights = [math.exp(-1.0), math.exp(-0.5), math.exp(-0.25)]
    assert mc_ppl([rollouts], "inv_ppl") == pytest.approx((weights[0] + weights[2]) / sum(weights))


def test_mc_ppl_count_weighting_is_hard_mc() -> None:
    rollouts = [(_rollout(True, -1.0), True), (_rollout(False, -0.5), False), (_rollout(True, -0.25), True)]
    assert mc_ppl([rollouts], "count") == pytest.approx(2 / 3)


def test_mc_ppl_averages_over_completers() -> None:
    first = [(_rollout(True, -1.0), True), (_rollout(False, -0.5), False), (_rollout(True, -0.25), True)]
    second = [(_rollout(True, -0.5), True), (_rollout(False, -0.5), False)]
    assert mc_ppl([first, second], "log_ppl") == pytest.approx((1.25 / 1.75 + 0.5) / 2)


def test_adaptive_sampling_grows_until_enough_correct_rollouts() -> None:
    # 25% success: 16 -> 4 correct, 32 -> 8, 48 -> 12 >= 10, stop.
    completer = ScriptedCompleter([0.25, 0.25])
    estimator = MCEstimator([completer], "q", ["a"], GOLD)
    estimate = estimator.estimate(-1, Sampling())
    assert (estimate.rollouts, estimate.correct_rollouts) == (48, 12)
    assert completer.calls == [(0, 16), (0, 16), (0, 16)]


def test_adaptive_sampling_stops_at_n_max() -> None:
    completer = ScriptedCompleter([0.0, 0.0])
    estimate = MCEstimator([completer], "q", ["a"], GOLD).estimate(-1, Sampling())
    assert estimate.rollouts == 72
    assert [n for _, n in completer.calls] == [16, 16, 16, 16, 8]


def test_a_state_is_estimated_once() -> None:
    completer = ScriptedCompleter([0.5, 0.5, 0.0])
    estimator = MCEstimator([completer], "q", ["a", "b"], GOLD)
    estimator.estimate(0, Sampling.fixed(10))
    estimator.estimate(0, Sampling.fixed(10))
    assert len(completer.calls) == 1
    assert estimator.ledger.verified_steps == 1


def test_difficulty_level_is_eq4() -> None:
    assert [difficulty_level(v) for v in (0.0, 0.14, 0.15, 0.55, 1.0)] == [0, 1, 2, 6, 10]


def test_first_midpoint_follows_eq5() -> None:
    # l=0, r=9, Len=10: floor(9/2) = 4, floor(10/4) = 2
    assert first_midpoint(0, 9, 10, mc_s0=0.1) == 2  # d=1 < 2: earlier
    assert first_midpoint(0, 9, 10, mc_s0=0.3) == 4  # 2 <= d < 6
    assert first_midpoint(0, 9, 10, mc_s0=0.54) == 4  # d=5
    assert first_midpoint(0, 9, 10, mc_s0=0.55) == 6  # d=6: later
    assert first_midpoint(0, 3, 4, mc_s0=0.0) == 0  # 1 - 1


def test_contribution_at_alpha_is_an_error_and_above_alpha_is_not() -> None:
    # V = MC(s_0) = 0.8; H = 0.5 * 0.8 = 0.4. Step 0's state at 0.4 (C = 0.5 <= alpha): step 0 is wrong.
    strategy = AdaptiveBinarySearch(sampling=Sampling.fixed(10), weighting="count")
    at_alpha = annotate(_solution(2), strategy, [ScriptedCompleter([0.8, 0.4, 0.0])])
    assert at_alpha.first_error_step == 0
    # ... at 0.5 (C = 0.625 > alpha) step 0 is right and the (known-wrong) last step is the error.
    above = annotate(_solution(2), strategy, [ScriptedCompleter([0.8, 0.5, 0.0])])
    assert above.first_error_step == 1
    assert above.labels == (True, False)


def test_adaptive_binary_search_walks_algorithm_1_from_the_eq5_midpoint() -> None:
    # 10 steps, first error at step 2 (states through steps >= 2 fail); V = 0.9, d = 9: start at 4 + 2 = 6.
    success = [0.9, 0.9, 0.9] + [0.1] * 8
    result = annotate(_solution(10), AdaptiveBinarySearch(sampling=Sampling.fixed(10)), [ScriptedCompleter(success)])
    assert [e.step_index for e in result.estimates] == [-1, 6, 2, 0, 1]
    assert result.first_error_step == 2
    assert result.labels == (True, True) + (False,) * 8
    assert (result.cost.verified_steps, result.cost.rollouts, result.cost.generated_tokens) == (4, 50, 250)


def test_adaptive_binary_search_uses_the_s0_sample_count_for_later_states() -> None:
    completer = ScriptedCompleter([0.25] * 5)
    annotate(_solution(4), AdaptiveBinarySearch(), [completer])
    assert completer.calls[:3] == [(0, 16)] * 3
    assert all(n == 48 for m, n in completer.calls[3:])


def test_uncertainty_driven_tries_steps_by_descending_delta_u_and_labels_the_first_below_tau() -> None:
    # Δu order: 2, 3, 1, 0, 4. The true first error is step 3; step 2's state keeps MC = tau (not below).
    success = [0.5, 0.6, 0.6, 0.5, 0.0, 0.0]
    result = annotate(
        _solution(5, [0.1, 0.5, 2.0, 1.0, -1.0]),
        UncertaintyDrivenSearch(sampling=Sampling.fixed(10)),
        [ScriptedCompleter(success)],
    )
    assert [e.step_index for e in result.estimates] == [-1, 2, 3]
    assert result.first_error_step == 3
    assert result.labels == (True, True, True, False, False)


def test_uncertainty_driven_labels_the_most_uncertain_wrong_step_not_the_first() -> None:
    # True first error at step 1, but step 2 has the largest Δu and is also wrong: UnPRM labels step 2.
    success = [0.5, 0.6, 0.0, 0.0, 0.0, 0.0]
    result = annotate(
        _solution(5, [0.1, 0.5, 2.0, 1.0, -1.0]),
        UncertaintyDrivenSearch(sampling=Sampling.fixed(10)),
        [ScriptedCompleter(success)],
    )
    assert result.first_error_step == 2
    assert result.labels == (True, True, False, False, False)


def test_uncertainty_driven_without_delta_u_says_what_to_run() -> None:
    with pytest.raises(ValueError, match="step-uncertainty consumer"):
        annotate(_solution(3), UncertaintyDrivenSearch(), [ScriptedCompleter([0.5] * 4)])


def test_sequential_search_stops_at_the_first_state_without_a_correct_rollout() -> None:
    # Step 2's state has 1/48 correct (self-correction): hard MC calls it right; step 3's has none.
    success = [0.5, 0.5, 0.5, 1 / 48, 0.0, 0.0]
    completer = ScriptedCompleter(success)
    result = annotate(_solution(5), SequentialSearch(), [completer])
    assert result.first_error_step == 3
    assert [m for m, _ in completer.calls] == [1, 2, 3, 4]
    assert result.cost.rollouts == 4 * 48


def test_binary_search_halves_on_the_hard_label() -> None:
    success = [0.5] * 4 + [0.0] * 6  # states through steps >= 3 fail
    result = annotate(_solution(9), BinarySearch(), [ScriptedCompleter(success)])
    assert [e.step_index for e in result.estimates] == [4, 1, 2, 3]
    assert result.first_error_step == 3


def test_correct_solutions_are_all_true_without_sampling() -> None:
    completer = ScriptedCompleter([0.5] * 4)
    for name in STRATEGIES:
        result = annotate(_solution(3, [0.0] * 3, correct=True), make_strategy(name), [completer])
        assert (result.status, result.labels, result.cost.rollouts) == ("all_correct", (True,) * 3, 0)
    assert completer.calls == []


class FlakyCompleter(ScriptedCompleter):
    def __init__(self, success: Sequence[float], failures: int) -> None:
        super().__init__(success)
        self.failures = failures

    def complete(self, question: str, steps: Sequence[str], n: int) -> list[Rollout]:
        if self.failures:
            self.failures -= 1
            raise ConnectionError("engine down")
        return super().complete(question, steps, n)


def test_a_completer_error_is_retried_and_counted() -> None:
    result = annotate(_solution(3), SequentialSearch(n=4), [FlakyCompleter([0.5, 0.5, 0.0, 0.0], failures=1)])
    assert result.status == "labelled"
    assert result.first_error_step == 1
    assert result.cost.failures["completer_error"] == 1


def test_a_completer_that_keeps_failing_aborts_the_solution_without_raising() -> None:
    result = annotate(_solution(3), SequentialSearch(n=4), [FlakyCompleter([0.5] * 4, failures=100)])
    assert result.status == "aborted"
    assert result.labels == ()
    assert result.cost.failures["completer_error"] == 3
    assert result.error is not None and "re-run" in result.error


class TruncatingCompleter:
    name = "truncating"

    def complete(self, question: str, steps: Sequence[str], n: int) -> list[Rollout]:
        return [Rollout(None, 100, -10.0, "length"), Rollout(None, 3, -1.0, "stop")] + [
            Rollout(GOLD, 3, -1.0) for _ in range(n - 2)
        ]


def test_truncated_and_unparseable_rollouts_count_as_wrong_and_are_tallied() -> None:
    estimator = MCEstimator([TruncatingCompleter()], "q", ["a", "b"], GOLD, weighting="count")
    estimate = estimator.estimate(0, Sampling.fixed(4))
    assert (estimate.value, estimate.correct_rollouts) == (0.5, 2)
    assert dict(estimator.ledger.failures) == {"max_tokens": 1, "unparseable": 1}
    assert estimator.ledger.generated_tokens == 100 + 3 * 3


def test_labels_follow_the_first_error() -> None:
    assert labels_from_first_error(4, 2) == (True, True, False, False)
    assert labels_from_first_error(2, None) == (True, True)


def test_an_unknown_strategy_names_the_choices() -> None:
    with pytest.raises(ValueError, match="adaptive_binary"):
        make_strategy("nope")


def test_mc_s0_is_estimated_once_per_question_and_shared_by_its_solutions() -> None:
    # Same question, two incorrect solutions: the first pays s_0's 10 rollouts, the second none of them
    # (s_0 is the question alone, EpicPRM Eq. 4's difficulty), and both search from the same MC(s_0).
    success = [0.9, 0.9, 0.9] + [0.1] * 8
    completer = ScriptedCompleter(success)
    starts = SharedStarts()
    strategy = AdaptiveBinarySearch(sampling=Sampling.fixed(10))
    first = annotate(_solution(10), strategy, [completer], starts=starts, starts_scope="m")
    second = annotate(_solution(10), strategy, [completer], starts=starts, starts_scope="m")
    assert first.first_error_step == second.first_error_step == 2
    assert [e.step_index for e in first.estimates] == [e.step_index for e in second.estimates]
    assert first.estimates[0] == second.estimates[0]  # the same MC(s_0), shared
    assert first.cost.rollouts - second.cost.rollouts == 10 and starts.shared == 1
    assert [c for c in completer.calls if c[0] == 0] == [(0, 10)]  # s_0 sampled once
    # another scope (other completers or prompt format): estimated again
    annotate(_solution(10), strategy, [completer], starts=starts, starts_scope="other")
    assert [c for c in completer.calls if c[0] == 0] == [(0, 10), (0, 10)]


def test_a_question_no_rollout_solves_leaves_its_other_solutions_unresolved_at_no_cost() -> None:
    completer = ScriptedCompleter([0.0] * 5)
    starts = SharedStarts()
    first = annotate(_solution(4), AdaptiveBinarySearch(), [completer], starts=starts, starts_scope="m")
    second = annotate(_solution(4), AdaptiveBinarySearch(), [completer], starts=starts, starts_scope="m")
    assert first.status == second.status == "unresolved"
    assert first.cost.rollouts > 0 and second.cost.rollouts == 0


def test_shared_starts_keep_the_newest_questions_only() -> None:
    starts = SharedStarts(max_questions=2)
    made: list[str] = []

    def estimate(key: str) -> tuple[list[list[tuple[Rollout, bool]]], StateEstimate]:
        made.append(key)
        return [[]], StateEstimate(-1, 0.5, 2, 1, False)

    for key in ("a", "b", "a", "c", "b"):
        starts.get(key, lambda key=key: estimate(key))  # type: ignore[misc]
    assert made == ["a", "b", "c", "b"]  # "a" was used again before "c" came, so "b" was the one dropped


def test_rollouts_drawn_already_are_the_first_of_s0_and_none_is_generated_when_they_suffice() -> None:
    # N0 = 2, N_min = 1, N_max = 4: two samples of the question, one correct (mean log p -0.5), one wrong
    # (-1.0), are s_0's two first rollouts; one correct >= N_min, so nothing is drawn. MC-PPL (1/PPL weights):
    # e^-0.5 / (e^-0.5 + e^-1).
    completer = ScriptedCompleter([0.0, 0.0])
    drawn = [(_rollout(True, -0.5), True), (_rollout(False, -1.0), False)]
    estimator = MCEstimator([completer], "q", ["a"], GOLD, first_rollouts=[drawn])
    s0 = estimator.estimate(-1, Sampling(n0=2, n_min_correct=1, n_max=4, grow_by=2))
    assert completer.calls == []
    assert s0.rollouts == 2 and s0.correct_rollouts == 1
    assert s0.value == pytest.approx(math.exp(-0.5) / (math.exp(-0.5) + math.exp(-1.0)))
    assert estimator.ledger.rollouts == 0 and estimator.ledger.reused_rollouts == 2


def test_rollouts_drawn_already_are_topped_up_as_the_adaptive_sampling_asks() -> None:
    # One wrong sample: N0 = 2 takes it and draws 1; none correct < N_min = 1, so 2 more (grow_by), N_max 4.
    completer = ScriptedCompleter([0.5, 0.5])
    estimator = MCEstimator([completer], "q", ["a"], GOLD, first_rollouts=[[(_rollout(False, -1.0), False)]])
    s0 = estimator.estimate(-1, Sampling(n0=2, n_min_correct=1, n_max=4, grow_by=2))
    # the drawn batch of 1 at 50 %: floor(0.5) = 0 correct; the batch of 2: 1 correct
    assert completer.calls == [(0, 1), (0, 2)]
    assert s0.rollouts == 4 and s0.correct_rollouts == 1
    assert estimator.ledger.rollouts == 3 and estimator.ledger.reused_rollouts == 1


def test_no_more_drawn_rollouts_are_taken_than_the_adaptive_sampling_would_draw() -> None:
    # Three samples, the first two correct: N0 = 2 is met with 2 correct >= N_min, so the third is left out
    # and s_0's count (the per-state N of the later states) stays 2, as with fresh rollouts.
    drawn = [(_rollout(True, -0.5), True), (_rollout(True, -0.5), True), (_rollout(False, -0.5), False)]
    estimator = MCEstimator([ScriptedCompleter([0.0, 0.0])], "q", ["a"], GOLD, first_rollouts=[drawn])
    s0 = estimator.estimate(-1, Sampling(n0=2, n_min_correct=1, n_max=4, grow_by=2))
    assert (s0.rollouts, s0.correct_rollouts, s0.value) == (2, 2, 1.0)


def test_drawn_rollouts_count_for_s0_only_and_need_one_list_per_completer() -> None:
    completer = ScriptedCompleter([1.0, 0.0, 0.0])
    drawn = [(_rollout(True, -0.5), True)] * 2
    estimator = MCEstimator([completer], "q", ["a", "b"], GOLD, first_rollouts=[drawn])
    step0 = estimator.estimate(0, Sampling.fixed(2))
    assert completer.calls == [(1, 2)] and step0.correct_rollouts == 0  # the state after step 0 draws its own
    with pytest.raises(ValueError, match="one list per completer"):
        MCEstimator([completer], "q", ["a"], GOLD, first_rollouts=[drawn, drawn])


def test_a_question_its_samples_solved_is_located_where_fresh_rollouts_found_none() -> None:
    # The completer never solves the question from s_0 (fresh rollouts: unresolved), but a sample did:
    # with the samples first, MC(s_0) > 0 and the search runs.
    success = [0.0, 1.0, 0.0, 0.0]
    strategy = AdaptiveBinarySearch(sampling=Sampling(n0=2, n_min_correct=1, n_max=4, grow_by=2))
    fresh = annotate(_solution(3), strategy, [ScriptedCompleter(success)])
    assert fresh.status == "unresolved" and fresh.cost.rollouts == 4
    drawn = [(_rollout(True, -0.5), True), (_rollout(False, -0.5), False)]
    seeded = annotate(_solution(3), strategy, [ScriptedCompleter(success)], first_rollouts=[drawn])
    assert seeded.status == "labelled" and seeded.first_error_step == 1
    assert seeded.cost.reused_rollouts == 2


class _Sequence:
    """A completer whose draws from any state are the next outcomes of one fixed sequence."""

    name = "sequence"

    def __init__(self, outcomes: Sequence[bool]) -> None:
        self.outcomes = list(outcomes)
        self.drawn = 0

    def complete(self, question: str, steps: Sequence[str], n: int) -> list[Rollout]:
        out = [_rollout(self.outcomes[self.drawn + j], -0.5) for j in range(n)]
        self.drawn += n
        return out


@given(
    outcomes=st.lists(st.booleans(), min_size=8, max_size=8),
    taken=st.integers(0, 8),
    plan=st.tuples(st.integers(1, 4), st.integers(0, 3), st.integers(0, 4), st.integers(1, 4)),
)
def test_s0_with_samples_first_is_s0_drawn_fresh_when_the_samples_are_the_same_draws(
    outcomes: list[bool], taken: int, plan: tuple[int, int, int, int]
) -> None:
    # Whatever the adaptive sampling: the first `taken` draws given as samples and the rest generated give
    # the same rollouts, the same MC(s_0) and the same count as generating all of them, and only the ones
    # not taken from the samples are generated.
    n0, n_min, extra, grow_by = plan
    sampling = Sampling(n0=n0, n_min_correct=n_min, n_max=n0 + extra, grow_by=grow_by)
    fresh = MCEstimator([_Sequence(outcomes)], "q", ["a"], GOLD).estimate(-1, sampling)
    drawn = [(_rollout(ok, -0.5), ok) for ok in outcomes[:taken]]
    completer = _Sequence(outcomes[taken:] + [False] * 8)
    estimator = MCEstimator([completer], "q", ["a"], GOLD, first_rollouts=[drawn])
    seeded = estimator.estimate(-1, sampling)
    assert seeded == fresh
    assert estimator.ledger.reused_rollouts == min(taken, fresh.rollouts)
    assert estimator.ledger.rollouts == completer.drawn == fresh.rollouts - min(taken, fresh.rollouts)


class _PerState:
    """A completer whose draws from the state after ``m`` steps are the next outcomes of ``outcomes[m]``."""

    name = "per-state"

    def __init__(self, outcomes: dict[int, Sequence[bool]]) -> None:
        self.outcomes = {m: list(seq) for m, seq in outcomes.items()}
        self.calls: list[tuple[int, int]] = []

    def complete(self, question: str, steps: Sequence[str], n: int) -> list[Rollout]:
        self.calls.append((len(steps), n))
        queue = self.outcomes[len(steps)]
        drawn, self.outcomes[len(steps)] = queue[:n], queue[n:]
        return [_rollout(ok, -0.5) for ok in drawn]


def test_a_state_with_no_correct_rollout_is_topped_up_before_its_step_is_called_wrong() -> None:
    # 3 steps, the error in step 1 (the state through step 0 solves the question half the time, the one
    # through step 1 never). s_0: 1 of 2 correct, MC = 0.5, H = 0.25, so every state gets 2 (EpicPRM).
    # Midpoint 1: 0 of 2, bad. Then step 0: its first two rollouts fail (a quarter of its draws do).
    outcomes = {0: [True, False], 1: [False, False, True, True], 2: [False] * 4}
    sampling = Sampling(n0=2, n_min_correct=1, n_max=4, grow_by=2)
    paper = annotate(_solution(3), AdaptiveBinarySearch(sampling=sampling), [_PerState(outcomes)])
    assert paper.first_error_step == 0 and paper.cost.rollouts == 6
    # Topped up to 4: the state through step 1 draws 2 more, none correct: still bad (0 <= H). The state
    # through step 0 draws 2 more, both correct: MC = 2/4 = 0.5 > H, good, so the error is step 1.
    completer = _PerState(outcomes)
    strategy = AdaptiveBinarySearch(sampling=sampling, state_n_max=4)
    topped = annotate(_solution(3), strategy, [completer])
    assert completer.calls == [(0, 2), (2, 2), (2, 2), (1, 2), (1, 2)]
    assert topped.first_error_step == 1 and topped.labels == (True, False, False)
    assert topped.cost.rollouts == 10 and topped.soft_labels == (0.5, 0.0, None)
    assert strategy.parameters()["state_n_max"] == 4
    assert "state_n_max" not in AdaptiveBinarySearch(sampling=sampling).parameters()  # old label ids kept


def test_a_top_up_that_finds_one_correct_rollout_may_still_call_the_step_wrong() -> None:
    # The same start (H = 0.25); the state through step 0 draws 0 of 2, then 1 of 2: MC = 1/4 = H, so
    # C = 0.5 <= alpha and step 0 stays wrong (the top-up stops at the first correct rollout's batch).
    # The state through step 1 never solves it: 2, then 2 more, then 4 more, the cap of 8 reached.
    outcomes = {0: [True, False], 1: [False, False, True, False, True, True], 2: [False] * 8}
    sampling = Sampling(n0=2, n_min_correct=1, n_max=4, grow_by=2)
    completer = _PerState(outcomes)
    result = annotate(_solution(3), AdaptiveBinarySearch(sampling=sampling, state_n_max=8), [completer])
    assert result.first_error_step == 0
    assert completer.calls == [(0, 2), (2, 2), (2, 2), (2, 4), (1, 2), (1, 2)]  # one correct ends a top-up


def test_confirm_zero_leaves_a_state_with_a_correct_rollout_and_the_known_wrong_end_alone() -> None:
    completer = _PerState({1: [True, False, True, True], 2: []})
    estimator = MCEstimator([completer], "q", ["a", "b"], GOLD)
    with pytest.raises(ValueError, match="not been estimated"):
        estimator.confirm_zero(0, 4)
    first = estimator.estimate(0, Sampling.fixed(2))
    assert estimator.confirm_zero(0, 4) == first and completer.calls == [(1, 2)]
    end = estimator.estimate(1, Sampling.fixed(2))  # the final state of an incorrect solution: no rollout
    assert estimator.confirm_zero(1, 4) == end and end.rollouts == 0 and completer.calls == [(1, 2)]


def test_confirm_zero_grows_as_many_again_at_a_time_up_to_its_cap() -> None:
    # 3 rollouts, none correct, cap 8: 3 more (6), then 2 (8), all failing: 8 rollouts, MC 0.
    completer = _PerState({1: [False] * 8, 2: []})
    estimator = MCEstimator([completer], "q", ["a", "b"], GOLD)
    estimator.estimate(0, Sampling.fixed(3))
    result = estimator.confirm_zero(0, 8)
    assert completer.calls == [(1, 3), (1, 3), (1, 2)]
    assert (result.rollouts, result.correct_rollouts, result.value) == (8, 0, 0.0)
    with pytest.raises(ValueError, match="state_n_max"):
        AdaptiveBinarySearch(state_n_max=0)
