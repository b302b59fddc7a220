"""A scalar PRM on ProcessBench, with the Qwen paper's protocol.

The predicted first error of a solution is the first step whose score is below the threshold ``τ``
(none below: "no error", -1). For a PRM that outputs a scalar, ``τ`` is chosen on the GSM8K subset (the
value that maximises its F1) and then used unchanged on every subset. F1 is the harmonic mean of the
accuracy on erroneous samples (predicted first error == label) and on correct samples (predicted -1)
(:func:`~prmloop.models.processbench.processbench_f1`).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from typing import Any

from prmloop.models.processbench import processbench_f1, read_processbench
from prmloop.models.questions import data_dir

__all__ = ["Scorer", "best_threshold", "first_below", "processbench_scores", "score_processbench"]

#: ``score(problems, steps)``: one list of step scores per solution.
Scorer = Callable[[list[str], list[list[str]]], list[list[float]]]


def first_below(scores: Sequence[float], threshold: float) -> int:
    """Index of the first step scored below ``threshold``; -1 when there is none."""
    for index, score in enumerate(scores):
        if score < threshold:
            return index
    return -1


def processbench_scores(
    step_scores: Sequence[Sequence[float]], labels: Sequence[int], threshold: float
) -> dict[str, Any]:
    """ProcessBench accuracies and F1 of the predictions at ``threshold``."""
    predicted = [first_below(s, threshold) for s in step_scores]
    return {"threshold": threshold, **processbench_f1(predicted, labels)}


def best_threshold(step_scores: Sequence[Sequence[float]], labels: Sequence[int]) -> float:
    """The threshold with the highest F1 on these solutions (candidates: midpoints of the sorted
    distinct scores, and the ends); ties go to the threshold closest to 0.5."""
    values = sorted({float(s) for scores in step_scores for s in scores})
    candidates = {0.0, 1.0 + 1e-9, 0.5}
    candidates.update((a + b) / 2 for a, b in itertools.pairwise(values))
    if values:
        candidates.update({values[0] - 1e-9, values[-1] + 1e-9})

    def key(t: float) -> tuple[float, float]:
        f1 = processbench_scores(step_scores, labels, t)["f1"]
        return (f1 if f1 is not None else -1.0, -abs(t - 0.5))

    return max(sorted(candidates), key=key)


def _subset(name: str, limit: int | None, keep: Callable[[str], bool] | None) -> tuple[list[Any], list[str]]:
    items, errors = read_processbench(data_dir() / "processbench" / f"{name}.json")
    if keep is not None:
        items = [i for i in items if keep(f"processbench/{name}/{i.id}")]
    if not limit:
        return items, errors
    # ProcessBench files list erroneous solutions first: take both kinds, half and half, in file order.
    wrong = [i for i in items if i.label >= 0]
    right = [i for i in items if i.label < 0]
    half = limit // 2
    chosen = wrong[: limit - min(half, len(right))] + right[:half]
    return chosen[:limit], errors


def score_processbench(
    score: Scorer,
    *,
    subsets: tuple[str, ...] = ("gsm8k", "math"),
    limit: int | None = 40,
    keep: Callable[[str], bool] | None = None,
    progress: Callable[[str], None] = lambda _line: None,
) -> dict[str, Any]:
    """F1 per subset at the GSM8K-chosen threshold; ``score(problems, steps)`` gives step scores.

    ``keep`` chooses solutions by their id (``processbench/<subset>/<id>``), e.g. a held-out split;
    ``limit`` takes that many of each subset, erroneous and correct ones half and half."""
    started = time.perf_counter()
    scored: dict[str, tuple[list[list[float]], list[int]]] = {}
    steps_scored = 0
    for name in subsets:
        items, _ = _subset(name, limit, keep)
        scores = score([i.problem for i in items], [list(i.steps) for i in items])
        steps_scored += sum(len(s) for s in scores)
        scored[name] = (scores, [i.label for i in items])
        progress(f"{name}: {len(items)} solutions scored")
    anchor = "gsm8k" if "gsm8k" in scored else subsets[0]
    threshold = best_threshold(*scored[anchor])
    result: dict[str, Any] = {"threshold": threshold, "threshold_from": anchor, "holdout": keep is not None}
    for name, (scores, labels) in scored.items():
        result[name] = {**processbench_scores(scores, labels, threshold), "samples": len(labels)}
    result["steps_per_s"] = steps_scored / max(time.perf_counter() - started, 1e-9)
    return result
