"""`prmloop bench loop`: the two arms of the simulated loop."""

from __future__ import annotations

import json
from typing import Any

import pytest
from typer.testing import CliRunner

from prmloop.flows.bench.loop import LoopBenchSettings, bench_loop, simulate_arm
from prmloop.flows.cli import app


def test_arms_spend_the_budget_and_count_consistently() -> None:
    s = LoopBenchSettings(questions=200, budget_tokens=200_000, seed=3)
    for arm in ("prioritized", "random"):
        out = simulate_arm(arm, s)
        one_question = s.k * (
            s.solution_tokens + s.judge_tokens + s.rollouts * s.rollout_tokens * (1 + s.search_probes)
        )
        assert (
            s.budget_tokens
            <= out["tokens"]
            <= s.budget_tokens + one_question + s.round_questions * s.oversample * s.probe_k * s.solution_tokens
        )
        assert out["solutions"] == out["questions"] * s.k
        assert out["accepted_errors"] <= out["incorrect"] - out["unresolved"]
        assert out["tokens"] == sum(out["tokens_by_stage"].values())
    assert simulate_arm("random", s)["tokens_by_stage"]["probe"] == 0


def test_prioritizing_avoids_hopeless_questions_when_most_are_hopeless() -> None:
    # Most questions nearly unsolvable (Beta(0.2, 3)): the probe sees that and the arm skips them.
    s = LoopBenchSettings(
        questions=300, budget_tokens=1_500_000, difficulty_a=0.2, difficulty_b=3.0, judge_accuracy=1.0, oversample=3
    )
    p, r = simulate_arm("prioritized", s), simulate_arm("random", s)
    assert p["mean_p_taken"] > 1.5 * r["mean_p_taken"]
    assert p["unresolved"] / p["incorrect"] < r["unresolved"] / r["incorrect"]
    assert p["accepted_errors_per_1k_tokens"] > r["accepted_errors_per_1k_tokens"]


def test_unknown_arm_is_refused() -> None:
    with pytest.raises(ValueError, match="prioritized or random"):
        simulate_arm("greedy", LoopBenchSettings())


def test_command_prints_one_json_line_with_both_arms() -> None:
    out = CliRunner().invoke(app, ["bench", "loop", "--questions", "60", "--budget-tokens", "100000", "--repeats", "2"])
    assert out.exit_code == 0, out.output
    [line] = out.output.strip().splitlines()
    result = json.loads(line)
    assert set(result["arms"]) == {"prioritized", "random"} and result["repeats"] == 2
    assert result["accepted_ratio"] == pytest.approx(
        bench_loop(LoopBenchSettings(questions=60, budget_tokens=100_000), repeats=2)["accepted_ratio"]
    )


def test_the_real_arms_on_a_tiny_model(tiny_backend_config: Any) -> None:
    from prmloop.flows.bench.loop_real import bench_loop_real
    from prmloop.models.backends.registry import EngineSettings

    engine = EngineSettings(backend=tiny_backend_config.backend, model=tiny_backend_config.model)
    out = bench_loop_real(questions=4, take=2, k=3, probe_k=1, max_new_tokens=8, engine=engine)
    p, r = out["arms"]["prioritized"], out["arms"]["random"]
    assert p["questions"] == r["questions"] == 2
    assert p["solutions"] == r["solutions"] == 6
    assert p["tokens"] > out["probe_tokens"] > 0 and r["tokens"] > 0
    assert p["labelable_incorrect"] <= p["incorrect"] and r["labelable_incorrect"] <= r["incorrect"]


def test_real_mode_refuses_a_large_pool() -> None:
    out = CliRunner().invoke(app, ["bench", "loop", "--real", "--questions", "400"])
    assert out.exit_code == 2 and "40 or fewer" in out.output
