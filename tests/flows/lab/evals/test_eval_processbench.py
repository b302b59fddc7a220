"""`eval processbench` on the shared data with hand-made scorers whose F1 is known."""

from __future__ import annotations

from pathlib import Path

import pytest

from prmloop.flows.lab.evals.processbench import eval_processbench
from prmloop.models.processbench import read_processbench


@pytest.mark.usefixtures("shared_data_dir")
def test_an_oracle_scores_f1_one_and_a_yes_man_f1_zero(shared_data_dir: Path) -> None:
    items = {}
    for name in ("gsm8k", "math"):
        found, _ = read_processbench(shared_data_dir / "processbench" / f"{name}.json")
        items.update({(i.problem, tuple(i.steps)): i.label for i in found})

    def oracle(problems: list[str], steps: list[list[str]]) -> list[list[float]]:
        return [
            [0.1 if k == items[p, tuple(s)] else 0.9 for k in range(len(s))]
            for p, s in zip(problems, steps, strict=True)
        ]

    def yes_man(problems: list[str], steps: list[list[str]]) -> list[list[float]]:
        return [[0.9] * len(s) for s in steps]

    perfect = eval_processbench(oracle, limit=10)
    assert perfect["gsm8k"]["f1"] == 1.0 and perfect["math"]["f1"] == 1.0
    assert perfect["gsm8k"]["samples"] == 10 and 0.1 < perfect["threshold"] <= 0.9
    lazy = eval_processbench(yes_man, limit=10)
    assert (
        lazy["gsm8k"]["correct_accuracy"] == 1.0
        and lazy["gsm8k"]["error_accuracy"] == 0.0
        and lazy["gsm8k"]["f1"] == 0.0
    )
    held = eval_processbench(oracle, limit=10, holdout=True, subsets=("gsm8k",))
    assert held["holdout"] and held["gsm8k"]["f1"] == 1.0
