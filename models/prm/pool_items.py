"""Solutions with exact first errors: the items of the loop's held-out set and of the active bench's pools,
their split, and the held-out F1 of an ensemble PRM on them.

The pools are built once by the loop's pool builder; what an item is and how a PRM is scored on
items live here, below every flow, so the loop's retraining and the benchmarks share one definition.
"""

from __future__ import annotations

import hashlib
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from prmloop.models.prm.data import PRMExample
from prmloop.models.prm.ensemble_prm import EnsemblePRM
from prmloop.models.prm.evaluate import first_below
from prmloop.models.processbench import processbench_f1

__all__ = [
    "PoolItem",
    "example_at",
    "example_of",
    "held_out_f1",
    "items_f1_report",
    "predict_first_errors",
    "split_pool",
]


@dataclass(frozen=True)
class PoolItem:
    """One solution of a pool.

    ``first_error`` is the truth (-1: no error); ``label_first_error`` what the labeller says (-1: no
    error; ``None``: the labeller gave no label, e.g. an unresolved MC search, though it paid for it);
    ``cost`` what the label cost (1 per label, or generated tokens for MC); ``correct`` the final
    answer's grade (the question-level priority uses it); ``subset`` the ProcessBench subset or level.
    """

    key: str
    question: str
    subset: str
    problem: str
    steps: tuple[str, ...]
    first_error: int
    label_first_error: int | None
    cost: float
    correct: bool | None
    answer: str | None = None


def split_pool(items: list[PoolItem]) -> tuple[list[PoolItem], list[PoolItem]]:
    """(pool half, held-out half) by the SHA-256 of each question: one question never straddles them."""
    pool: list[PoolItem] = []
    held_out: list[PoolItem] = []
    for item in items:
        bucket = int(hashlib.sha256(item.question.encode()).hexdigest()[:8], 16) % 2
        (pool if bucket == 0 else held_out).append(item)
    return pool, held_out


def example_of(item: PoolItem) -> PRMExample | None:
    """The labeller's label as a training example (steps through its first error), or ``None``."""
    first = item.label_first_error
    return None if first is None else example_at(item.problem, item.steps, first)


def example_at(problem: str, steps: tuple[str, ...], first_error: int) -> PRMExample:
    """A solution with its first error (-1: none) as a training example: the steps through that error."""
    if first_error < 0:
        return PRMExample(problem, steps, (True,) * len(steps))
    first = min(first_error, len(steps) - 1)
    return PRMExample(problem, steps[: first + 1], tuple(t < first for t in range(first + 1)))


def predict_first_errors(prm: EnsemblePRM, items: Sequence[PoolItem], features: dict[str, np.ndarray]) -> list[int]:
    """The PRM's predicted first error of each item (-1: none): the first step whose mean score is below τ."""
    return [first_below(s.mean, prm.threshold) for s in prm.ensemble.stats([features[i.key] for i in items])]


def held_out_f1(prm: EnsemblePRM | None, items: Sequence[PoolItem], features: dict[str, np.ndarray]) -> float:
    """Mean over subsets of the ProcessBench F1 (the model's τ; no model: every solution "no error")."""
    by_subset: dict[str, tuple[list[int], list[int]]] = {}
    predictions = predict_first_errors(prm, items, features) if prm is not None else [-1] * len(items)
    for item, predicted in zip(items, predictions, strict=True):
        preds, labels = by_subset.setdefault(item.subset if item.key.startswith("processbench") else "all", ([], []))
        preds.append(predicted)
        labels.append(item.first_error)
    scores = [processbench_f1(p, y)["f1"] for p, y in by_subset.values()]
    return float(statistics.fmean(s if s is not None else 0.0 for s in scores))


def items_f1_report(predicted: Sequence[int | None], items: Sequence[PoolItem], draws: int = 1) -> dict[str, dict]:
    """:func:`~prmloop.models.prm.scoreboard.f1_report` of predictions on ``items``, ``draws`` models'
    predictions pooled (one block of ``len(items)`` per model, in the items' order)."""
    from prmloop.models.prm.scoreboard import f1_report

    return f1_report(
        predicted,
        [i.first_error for i in items] * draws,
        [i.question for i in items] * draws,
        [i.subset for i in items] * draws,
    )
