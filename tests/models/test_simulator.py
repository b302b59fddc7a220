"""The simulated completer: its statistics match its ground truth, and it is deterministic."""

from __future__ import annotations

import math

import pytest

from prmloop.flows.lab.bench.annotate import bench_annotate
from prmloop.models.annotation.completer import Completer
from prmloop.models.simulator import (
    SimulatedCompleter,
    SimulatedCompleterError,
    SimulatorConfig,
    simulate_solutions,
)


def _success_rate(completer: SimulatedCompleter, question: str, steps: tuple[str, ...], gold: str, n: int) -> float:
    rollouts = completer.complete(question, steps, n)
    return sum(r.answer == gold for r in rollouts) / n


def test_the_simulator_is_a_completer() -> None:
    assert isinstance(SimulatedCompleter(simulate_solutions(1)), Completer)


def test_same_seed_same_solutions_and_rollouts() -> None:
    a, b = simulate_solutions(20, seed=3), simulate_solutions(20, seed=3)
    assert a == b
    assert a != simulate_solutions(20, seed=4)
    s = a[0]
    first = SimulatedCompleter(a, seed=1).complete(s.question, s.steps[:2], 8)
    again = SimulatedCompleter(a, seed=1).complete(s.question, s.steps[:2], 8)
    assert first == again


def test_success_rate_before_and_after_the_error_matches_the_ground_truth() -> None:
    config = SimulatorConfig(p_unparseable=0.0, p_after_error=0.1)
    solution = next(s for s in simulate_solutions(50, config) if 1 <= s.first_error_step <= s.n_steps - 2)
    completer = SimulatedCompleter([solution], config)
    n = 4000
    before = solution.first_error_step  # the state through steps 0..e-1: error not yet included
    for m, expected in ((0, solution.p_start), (before, solution.success_probability(before)), (before + 1, 0.1)):
        rate = _success_rate(completer, solution.question, solution.steps[:m], solution.gold_answer, n)
        assert abs(rate - expected) < 4 * math.sqrt(expected * (1 - expected) / n) + 1e-9


def test_success_grows_with_progress_until_the_error() -> None:
    s = simulate_solutions(1, SimulatorConfig(progress_gain=0.5))[0]
    probs = [s.success_probability(m) for m in range(s.first_error_step + 1)]
    assert probs == sorted(probs)
    assert s.success_probability(s.first_error_step + 1) == s.p_after_error


@pytest.mark.parametrize(("rho", "low", "high"), [(1.0, 1.0, 1.0), (0.0, 0.0, 0.25)])
def test_uncertainty_correlation_sets_how_often_the_error_has_the_largest_delta_u(
    rho: float, low: float, high: float
) -> None:
    solutions = simulate_solutions(400, SimulatorConfig(uncertainty_correlation=rho))
    top = [max(range(s.n_steps), key=lambda t, s=s: s.uncertainty_delta[t]) == s.first_error_step for s in solutions]
    assert low <= sum(top) / len(top) <= high


def test_hard_questions_go_wrong_earlier_when_difficulty_is_linked() -> None:
    solutions = simulate_solutions(400, SimulatorConfig(difficulty_position_link=1.0))
    hard = [s.first_error_step / s.n_steps for s in solutions if s.p_start < 0.3]
    easy = [s.first_error_step / s.n_steps for s in solutions if s.p_start > 0.7]
    assert sum(hard) / len(hard) < sum(easy) / len(easy)


def test_rollouts_over_budget_end_by_length_without_an_answer() -> None:
    config = SimulatorConfig(max_tokens=50)
    s = simulate_solutions(1, config)[0]
    rollouts = SimulatedCompleter([s], config).complete(s.question, (), 20)
    assert all(r.finish_reason == "length" and r.answer is None and r.tokens == 50 for r in rollouts)


def test_injected_engine_failures_raise() -> None:
    config = SimulatorConfig(p_completer_error=1.0)
    s = simulate_solutions(1, config)[0]
    with pytest.raises(SimulatedCompleterError):
        SimulatedCompleter([s], config).complete(s.question, (), 4)


def test_bench_reports_every_strategy_with_the_shape_the_cli_prints() -> None:
    result = bench_annotate(n_solutions=30, sweep=(0.0, 1.0), compare_weightings=False)
    keys = {"first_error_accuracy", "step_accuracy", "verified_steps", "rollouts", "generated_tokens"}
    papers = {"sequential", "binary", "adaptive_binary", "uncertainty_driven"}
    assert papers | {"bisection", "sequential@relative", "binary@relative"} <= set(result["strategies"])
    assert all(keys | {"rule", "tokens_vs_adaptive"} <= set(row) for row in result["strategies"].values())
    rows = result["strategies"]
    assert rows["sequential"]["rule"] == "hard MC, N=48" and rows["adaptive_binary"]["tokens_vs_adaptive"] == 1.0
    assert rows["sequential@relative"]["rule"] == rows["adaptive_binary"]["rule"]
    # Under adaptive binary search's rule the baselines find the first error as often as it does: the
    # gap of the published baselines is their hard rule, not their search.
    assert rows["sequential@relative"]["first_error_accuracy"] > rows["sequential"]["first_error_accuracy"] + 0.2
    assert rows["binary@relative"]["first_error_accuracy"] > rows["binary"]["first_error_accuracy"] + 0.2
    sweep = result["correlation_sweep"]
    assert (
        sweep[1]["uncertainty_driven"]["first_error_accuracy"] > sweep[0]["uncertainty_driven"]["first_error_accuracy"]
    )
    # Sequential stopping makes the bisection cheaper than adaptive binary search at any correlation.
    assert all(row["bisection"]["tokens_vs_adaptive"] < 0.8 for row in sweep)
