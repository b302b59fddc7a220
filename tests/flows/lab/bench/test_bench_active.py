"""bench active's pieces on hand-computed cases: the pool split, labels as training examples, budgets,
the curve summary (AUC and the share of labels to reach 95 % of full), and a whole small run on a pool
whose features are made up (no backbone)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from prmloop.flows.lab.bench import active
from prmloop.flows.lab.bench.active import ActiveSettings, _summarise, _take
from prmloop.models.prm.ensemble import EnsembleConfig
from prmloop.models.prm.pool_items import PoolItem, example_of, held_out_f1, split_pool


def _item(key: str, first_error: int, *, label: int | None = None, cost: float = 1.0, steps: int = 3) -> PoolItem:
    return PoolItem(
        key=key,
        question=f"q/{key}",
        subset="all",
        problem=f"problem {key}",
        steps=tuple(f"step {i}" for i in range(steps)),
        first_error=first_error,
        label_first_error=first_error if label is None else label,
        cost=cost,
        correct=first_error < 0,
    )


@given(st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=40))
def test_a_question_never_straddles_the_pool_and_the_held_out_half(questions: list[str]) -> None:
    items = [
        PoolItem(f"k{i}", q, "all", "p", ("s",), -1, -1, 1.0, True) for i, q in enumerate(questions + questions[:5])
    ]
    pool, held = split_pool(items)
    assert len(pool) + len(held) == len(items)
    assert not {i.question for i in pool} & {i.question for i in held}


def test_a_label_becomes_the_steps_through_its_first_error() -> None:
    wrong = example_of(_item("a", 1))
    assert wrong is not None and wrong.completions == ("step 0", "step 1") and wrong.labels == (True, False)
    right = example_of(_item("b", -1))
    assert right is not None and right.labels == (True, True, True)
    unresolved = PoolItem(**{**_item("c", 1).__dict__, "label_first_error": None})
    assert example_of(unresolved) is None  # the labeller paid and gave no label


def test_a_budget_takes_items_in_order_until_spent_and_free_labels_as_they_come() -> None:
    items = [_item("a", 0, cost=5), _item("b", -1, cost=0), _item("c", 1, cost=5), _item("d", 2, cost=5)]
    assert _take([0, 1, 2, 3], items, budget=5, spent=0) == ([0, 1], 5)  # b is free: taken with a
    assert _take([0, 2, 3], items, budget=12, spent=0) == ([0, 2, 3], 15)  # the last one crosses the budget
    assert _take([3], items, budget=5, spent=5) == ([], 5)


def test_auc_and_the_share_to_reach_95_percent_of_full_by_hand() -> None:
    def run(f1s: list[float]) -> list[dict[str, float]]:
        return [{"cost": c, "labels": c, "f1": f} for c, f in zip((10.0, 20.0, 50.0), f1s, strict=True)]

    curves = {
        "full": [[{"cost": 100.0, "labels": 100.0, "f1": 0.8}]],
        "random": [run([0.2, 0.4, 0.6]), run([0.4, 0.6, 0.8])],  # mean 0.3, 0.5, 0.7
        "actprm": [run([0.5, 0.78, 0.8])],
    }
    arms = _summarise(curves, total_cost=100.0)
    assert arms["full"]["f1"] == 0.8
    assert arms["random"]["f1"] == [0.3, 0.5, 0.7]
    # trapezoid over x = 0.1, 0.2, 0.5 divided by the width 0.4: (0.1 x 0.35 + 0.3 x 0.6) / 0.4 = 0.5375 (mean of runs)
    assert arms["random"]["auc"] == pytest.approx((0.1 * 0.3 + 0.3 * 0.5 + 0.1 * 0.5 + 0.3 * 0.7) / 0.4 / 2, abs=1e-4)
    assert arms["random"]["label_fraction_to_95"] == 1.0  # 0.7 < 0.95 x 0.8 = 0.76: never
    assert arms["actprm"]["label_fraction_to_95"] == 0.2  # 0.78 >= 0.76 at 20 % of the pool's cost


def test_a_small_run_gives_every_arm_a_curve_and_full_the_ceiling(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    rng = np.random.default_rng(0)
    items = [_item(f"s{i}", int(rng.integers(-1, 3))) for i in range(120)]
    # Features that carry the truth: a step is "wrong" where coordinate 0 is negative.
    features = {}
    for item in items:
        x = rng.normal(size=(3, 5)).astype(np.float32)
        x[:, 0] = np.abs(x[:, 0]) + 0.5
        if item.first_error >= 0:
            x[item.first_error, 0] = -x[item.first_error, 0]
        features[item.key] = x
    monkeypatch.setattr(active, "build_pool", lambda *a, **k: items)
    monkeypatch.setattr(active, "_load_features", lambda *a, **k: features)
    settings = ActiveSettings(
        pool="arith",
        budgets=(0.1, 0.3, 0.6),
        seeds=2,
        ensemble=EnsembleConfig(heads=6, hidden=4, pca_dims=0, epochs=60, learning_rate=3e-2, threads=1),
    )
    result = active.run_active(settings, root=tmp_path, out_dir=tmp_path, say=lambda _line: None)
    assert set(result["arms"]) == set(active.ARMS)
    for arm in ("random", "actprm", "epistemic", "aleatoric", "priority"):
        assert len(result["arms"][arm]["f1"]) == 3 and 0.0 <= result["arms"][arm]["auc"] <= 1.0
        assert result["arms"][arm]["labels"] == sorted(result["arms"][arm]["labels"])
    assert result["arms"]["full"]["f1"] > 0.6  # the features make the task learnable
    assert Path(result["png"]).is_file()
    assert set(result["target"]) == {
        "actprm_label_fraction_to_95",
        "reaches_95_with_half",
        "above_random_at_every_budget",
    }
    pool, held = split_pool(items)
    assert result["pool_solutions"] == len(pool) and result["held_out_solutions"] == len(held)
    versus = result["actprm_vs_random"]  # paired by seed: the same first set, so the first budget ties
    assert versus["seeds"] == 2 and [b["share"] for b in versus["f1_at_budget"]] == [0.3, 0.6]
    aucs = {arm: result["arms"][arm]["auc"] for arm in ("actprm", "random")}
    assert versus["auc"]["difference"] == pytest.approx(aucs["actprm"] - aucs["random"], abs=2e-4)
    assert versus["advantage_survives"] == (versus["auc"]["ci"][0] > 0)


def test_without_a_model_every_held_out_solution_counts_as_no_error() -> None:
    items = [_item("a", -1), _item("b", 1)]
    # "no error" for both: right on the correct one, wrong on the erroneous one -> F1 = 0
    assert held_out_f1(None, items, {}) == 0.0


def test_the_reference_held_out_set_pairs_each_question_with_a_corrupted_copy() -> None:
    from prmloop.flows.retrain_ensemble import EVAL_SEED, eval_items

    items = eval_items("arith-reference", limit=5)
    right = [i for i in items if i.first_error < 0]
    wrong = [i for i in items if i.first_error >= 0]
    assert len(right) == 15 and 12 <= len(wrong) <= 15  # 5 questions x 3 levels; a copy where one can be made
    assert all(i.question.startswith("arith/L") and f"/{EVAL_SEED}/" in i.question for i in items)
    assert len({i.key for i in items}) == len(items)
    assert {i.question for i in wrong} <= {i.question for i in right}


def test_an_mc_label_is_checked_against_the_questions_own_answer() -> None:
    from prmloop.flows.pools.build import _gold
    from prmloop.models.arith import arith_question_id, generate_question

    item = _item("x", 0)
    item = PoolItem(**{**item.__dict__, "question": arith_question_id(2, 0, 7)})
    assert _gold(item) == str(generate_question(2, 0, 7).answer)


@pytest.mark.integration
def test_quick_runs_on_the_shipped_test_sets_halves_and_gives_a_verdict(tmp_path: Path) -> None:
    """`bench active --quick`: no pool to build, the shipped features, the real heads, a verdict with its interval."""
    import json

    from typer.testing import CliRunner

    from prmloop.flows.cli import app
    from prmloop.flows.pools.testset import load_testset

    out = CliRunner().invoke(
        app, ["bench", "active", "--quick", "--arms", "random,actprm,full", "--seeds", "2", "--out", str(tmp_path)]
    )
    assert out.exit_code == 0, out.output
    result = json.loads(out.stdout.strip().splitlines()[-1])
    _, items = load_testset()
    pool, held = split_pool(items)
    assert result["quick"] is True and result["pool"] == "testset"
    assert (result["pool_solutions"], result["held_out_solutions"]) == (len(pool), len(held))
    assert sum(result["test_set"]["decided_solutions_per_level"].values()) == len(items)
    assert "through the backbone" not in out.output  # every feature came from the shipped file: no forward pass
    random_arm, full = result["arms"]["random"], result["arms"]["full"]
    assert random_arm["labels"] == sorted(random_arm["labels"]) and len(random_arm["f1"]) == 4
    assert full["f1"] > random_arm["f1"][0]  # the whole pool half teaches more than its first tenth
    versus = result["actprm_vs_random"]
    assert versus["seeds"] == 2 and versus["verdict"] and isinstance(versus["advantage_survives"], bool)
    assert Path(result["png"]).is_file()
