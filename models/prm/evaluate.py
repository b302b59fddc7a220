"""A scalar PRM on ProcessBench, with the Qwen paper's protocol.

The predicted first error of a solution is the first step whose score is below the threshold ``τ``
(none below: "no error", -1). For a PRM that outputs a scalar, ``τ`` is chosen on the GSM8K subset (the
value that maximises its F1) and then used unchanged on every subset. F1 is the harmonic mean of the
accuracy on erroneous samples (predicted first error == label) and on correct samples (predicted -1)
(:func:`~prmloop.models.processbench.processbench_f1`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from prmloop.models.processbench import processbench_f1

__all__ = ["best_threshold", "first_below", "processbench_scores"]


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
