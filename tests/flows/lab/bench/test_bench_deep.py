"""``bench deep``: the test set's split, and every arm trained and scored for real (SmolLM2, a LoRA
adapter through peft, the shipped test set) at a budget small enough for the suite."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from typer.testing import CliRunner

from prmloop.flows.cli import app
from prmloop.flows.lab.bench.deep import bench_deep, split_test_set


@dataclass(frozen=True)
class _Item:
    key: str
    question: str


def test_the_split_keeps_each_question_on_one_side_and_halves_the_questions() -> None:
    items = [_Item(f"q{q}/{s}", f"q{q}") for q in range(9) for s in range(1 + q % 3)]
    train, held = split_test_set(items, split_seed=7)
    assert {i.question for i in train}.isdisjoint({i.question for i in held})
    assert sorted(i.key for i in [*train, *held]) == sorted(i.key for i in items)
    assert len({i.question for i in train}) == 4 and len({i.question for i in held}) == 5
    again, _ = split_test_set(list(reversed(items)), split_seed=7)  # the order of the items does not matter
    assert sorted(i.key for i in again) == sorted(i.key for i in train)
    other, _ = split_test_set(items, split_seed=8)
    assert {i.question for i in other} != {i.question for i in train}


@pytest.mark.integration
def test_every_arm_trains_on_the_same_draw_and_is_scored_with_its_interval() -> None:
    lines: list[str] = []
    result = bench_deep(
        arms=["frozen", "lora_heads"], budgets=[8], seeds=1, epochs=1, held_limit=40, threads=2, say=lines.append
    )
    assert result["arms"] == ["frozen", "lora", "lora_heads"]  # the heads need the LoRA backbone
    assert result["held_out"] == 40 and result["train_pool"] > 700 and result["budgets"] == [8]
    rows = {r["arm"]: r for r in result["rows"]}
    assert set(rows) == {"frozen", "lora", "lora_heads"}
    for row in rows.values():
        assert row["labels"] == 8
        if row["f1"] is not None:
            assert row["lo"] <= row["f1"] <= row["hi"], row
    lora = rows["lora"]
    assert 0 < lora["trained_on"] < 8 and 0.0 <= lora["tau"] <= 1.0  # some questions choose its threshold
    assert lora["draws"] == 1 and lora["epochs"] == 1
    for arm in ("lora", "lora_heads"):
        if "vs_frozen" in rows[arm]:
            paired = rows[arm]["vs_frozen"]
            assert paired["lo"] <= paired["diff"] <= paired["hi"], paired
    assert any("lora step" in line for line in lines) and any("frozen at 8 labels" in line for line in lines)


def test_an_unknown_arm_or_layer_is_one_line_naming_the_choices() -> None:
    runner = CliRunner()
    bad = runner.invoke(app, ["bench", "deep", "--arms", "frozen,deeper"])
    assert bad.exit_code == 2 and "frozen,hidden,layers,lora,lora_heads" in bad.output
    worse = runner.invoke(app, ["bench", "deep", "--layers", "0.5,2"])
    assert worse.exit_code == 2 and "fractions of the depth" in worse.output
    with pytest.raises(ValueError, match="choose from"):
        bench_deep(arms=["nope"])
