"""`prmloop bench loop`: the two arms of the simulated loop."""

from __future__ import annotations

import json
from typing import Any

import pytest
from typer.testing import CliRunner

from prmloop.flows.cli import app
from prmloop.flows.lab.bench.loop import LoopBenchSettings, bench_loop, simulate_arm


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


def test_f1_at_equal_tokens_is_the_newest_retrain_within_the_budget() -> None:
    from prmloop.flows.lab.bench.loop_real import f1_at_tokens

    curve = [
        {"f1": 0.2, "tokens": 1_000},
        {"f1": None, "tokens": 1_500},  # a retrain that trained nothing
        {"f1": 0.4, "tokens": 3_000},
        {"f1": 0.5, "tokens": 5_000},
    ]
    assert f1_at_tokens(curve, 4_000) == 0.4
    assert f1_at_tokens(curve, 1_600) == 0.2
    assert f1_at_tokens(curve, 999) is None


def test_the_ratios_compare_per_minute_and_per_token() -> None:
    from prmloop.flows.lab.bench.loop_real import _ratios

    out: dict[str, Any] = {
        "streaming": {
            "accepted_per_minute": 12.0,
            "accepted_per_1k_tokens": 3.0,
            "generated_tokens": 9_000,
            "retrains": [{"f1": 0.3, "tokens": 2_000}, {"f1": 0.6, "tokens": 8_000}],
        },
        "rounds": {"accepted_per_minute": 2.0},
        "random_order": {
            "accepted_per_1k_tokens": 2.0,
            "generated_tokens": 7_000,
            "retrains": [{"f1": 0.25, "tokens": 6_500}],
        },
    }
    _ratios(out)
    assert out["streaming_to_rounds_ratio"] == 6.0 and out["priority_to_random_ratio"] == 1.5
    assert out["f1_at_equal_tokens"] == {"tokens": 7_000, "streaming": 0.3, "random_order": 0.25}


def test_real_mode_refuses_an_unknown_arm() -> None:
    out = CliRunner().invoke(app, ["bench", "loop", "--real", "--arms", "streaming,batch"])
    assert out.exit_code == 2 and "--arms must name some of streaming, rounds, random_order" in out.output


def test_every_arm_knows_the_engines_key_and_prefects_auth_string(tmp_path: Any) -> None:
    from prmloop.flows.lab.bench.loop_real import share_credentials
    from prmloop.store.auth.credentials import load_credentials

    source, arm = tmp_path / "home", tmp_path / "home" / "bench" / "loop" / "streaming"
    share_credentials(source, arm)
    theirs, ours = load_credentials(arm), load_credentials(source)
    assert theirs.engine_api_key == ours.engine_api_key and theirs.prefect_auth_string == ours.prefect_auth_string
    assert (arm / "credentials.json").stat().st_mode & 0o777 == 0o600


def test_the_rounds_arm_takes_the_streaming_arms_levels_in_turn() -> None:
    """Seen: the rounds arm sampled level 1 only while the streaming arms sampled levels 1 and 2, so its
    labels cost fewer tokens and the comparison favoured it."""
    from prmloop.flows.lab.bench.rounds import DemoSettings

    assert [DemoSettings(levels=(1, 2)).level_of(i) for i in range(4)] == [1, 2, 1, 2]
    assert [DemoSettings(level=3).level_of(i) for i in range(3)] == [3, 3, 3]


def test_held_out_features_are_warmed_once_for_every_arm(
    tmp_path: Any, tiny_backend: Any, smollm2_tokenizer: Any
) -> None:
    """The bench computes the held-out set's features before the first arm, so no arm's first retrain
    pays for them; an arm's retrain then finds all of them in the cache."""
    from types import SimpleNamespace

    from prmloop.flows.lab.bench.loop_real import warm_features
    from prmloop.models.prm.features import FeatureCache, FeatureExtractor, FeatureSpec, cached_features

    spec = FeatureSpec(backbone="smollm2")
    loads: list[int] = []

    def backbone() -> FeatureExtractor:
        loads.append(1)
        return FeatureExtractor(FeatureSpec(backbone="tiny"), model=tiny_backend.model, tokenizer=smollm2_tokenizer)

    items = [SimpleNamespace(problem=f"What is {a} + 1?", steps=(f"{a} + 1 = {a + 1}", "Done.")) for a in range(3)]
    assert warm_features(items, tmp_path / "features", spec=spec, extractor=backbone) == 3
    assert loads == [1]
    again = cached_features(
        [i.problem for i in items],
        [list(i.steps) for i in items],
        cache=FeatureCache(tmp_path / "features", spec),
        extractor=backbone,
    )
    assert loads == [1] and [a.shape[0] for a in again] == [2, 2, 2]


def test_the_json_names_where_in_process_models_run(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    import torch

    from prmloop.flows.lab.bench.loop_real import in_process_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert in_process_device() == f"cpu ({os.cpu_count()} cores)"
    # No GPU exists in CI: torch's answers are what is faked, to check the other branch.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "NVIDIA H200")
    assert in_process_device() == "cuda (NVIDIA H200)"


def test_the_quick_rounds_arm_runs_the_smallest_round_past_its_budget_until_three_retrains() -> None:
    """Seen: `bench loop --real --quick` gave the rounds arm 80 s, which held one round (its fixed cost is
    about 20 s a round with 1 s drains), so its curve had one point against the streaming arms' three."""
    from prmloop.flows.lab.bench.rounds_arm import OVERTIME_FACTOR, SMALLEST_ROUND, next_round, round_seconds

    common = {"rounds": 3, "overhead_s": 20.0, "budget_s": 80.0}
    # 25 tokens/s, 80 s left, 3 rounds of 20 s fixed cost: 3 rounds leave 20 s (166 tokens each), 2 leave
    # 40 s (500 each), one leaves 60 s (1,500 tokens): int(0.4 x 1500 / (6 x 70)) = 1 question,
    # int(0.6 x 1500 / 500) = 1 solution annotated.
    plan, overtime = next_round(
        tokens_per_s=25.0, left_s=80.0, index=0, retrains=0, until_retrains=3, elapsed_s=0.0, **common
    )
    assert plan is not None and (plan.questions, plan.k, plan.annotate) == (1, 4, 1) and not overtime
    # 5 s left after that round: no planned round fits; with retrains owed the smallest runs past the budget.
    late = {"tokens_per_s": 25.0, "left_s": 5.0, "index": 1, "elapsed_s": 75.0}
    assert next_round(retrains=1, until_retrains=3, **late, **common) == (SMALLEST_ROUND, True)
    assert next_round(retrains=1, until_retrains=None, **late, **common) == (None, False)
    assert next_round(retrains=3, until_retrains=3, **late, **common) == (None, False)
    # The cap: past OVERTIME_FACTOR x the budget no round runs, retrains owed or not.
    capped = {**late, "index": 6, "elapsed_s": OVERTIME_FACTOR * 80.0 + 1}
    assert next_round(retrains=2, until_retrains=3, **capped, **common) == (None, False)
    # Past the planned rounds, time left or not, only an owed retrain runs one more round.
    after = {"tokens_per_s": 25.0, "left_s": 500.0, "index": 3, "elapsed_s": 60.0}
    assert next_round(retrains=2, until_retrains=3, **after, **common) == (SMALLEST_ROUND, True)
    assert next_round(retrains=2, until_retrains=None, **after, **common) == (None, False)
    # The smallest round's time: its fixed cost twice and MIN_ROUND_TOKENS (6 x 70 / 0.4 = 1,050) at 25/s.
    assert round_seconds(25.0, 20.0) == pytest.approx(40.0 + 42.0)


def test_the_rounds_arm_takes_the_streaming_loops_rollouts_a_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """The round-based arm's MC stage rolls out as many a state as the streaming loop's annotator, the
    loop's settings read where the user set them (so the arms compare like with like)."""
    from prmloop.flows.lab.bench.rounds import StateRollouts, _loop_rollouts

    monkeypatch.setenv("PRMLOOP_LOOP_STATE_N_MAX", "6")
    monkeypatch.setenv("PRMLOOP_LOOP_N0", "3")
    rollouts = _loop_rollouts()
    assert isinstance(rollouts, StateRollouts)
    assert (rollouts.n0, rollouts.state_n_max) == (3, 6)
    monkeypatch.delenv("PRMLOOP_LOOP_STATE_N_MAX")
    assert _loop_rollouts().state_n_max == 4  # the loop's default top-up of a state with no correct rollout
