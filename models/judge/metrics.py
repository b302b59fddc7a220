"""How well a judge's uncertainty flags its own mistakes: the CoT Entropy paper's metrics (Sec. 5).

A step-wise verification ``ê_t`` is *correct* when it equals the ground truth ``y_t`` (1 = the step has
an error). A good uncertainty ``u_t`` is high where verifications are wrong:

- AUROC / AUPRC of ``-u_t`` as a score for "the verification is correct" (scikit-learn);
- Rejection-F1 at ``X %``: keep the ``X %`` of steps with the lowest uncertainty and compute the F1 of
  error detection (positive class ``y = 1``) on them (Figure 1 at 60-100 %);
- AU-F1C: the area under that F1-versus-coverage curve from 30 % to 100 % coverage, normalised by the
  range so it reads as a mean F1.

Random tie-breaking would make the curves depend on luck; ties in ``u`` are broken by step order, which
is fixed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["RejectionCurve", "error_detection_f1", "rejection_curve", "uncertainty_auc"]


def error_detection_f1(predicted: Sequence[bool], truth: Sequence[bool]) -> float:
    """F1 of the "has an error" class; 0 when there is nothing to find and nothing was found wrongly."""
    tp = sum(p and t for p, t in zip(predicted, truth, strict=True))
    fp = sum(p and not t for p, t in zip(predicted, truth, strict=True))
    fn = sum(t and not p for p, t in zip(predicted, truth, strict=True))
    return 0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn)


@dataclass(frozen=True)
class RejectionCurve:
    coverage: tuple[float, ...]
    f1: tuple[float, ...]

    def at(self, coverage: float) -> float:
        return float(np.interp(coverage, self.coverage, self.f1))

    def area(self, start: float = 0.3) -> float:
        """Mean F1 over coverage ``start``..1 (the AU-F1C, normalised by the range)."""
        grid = np.linspace(start, 1.0, 71)
        return float(np.mean([self.at(c) for c in grid]))


def rejection_curve(
    uncertainty: Sequence[float], predicted: Sequence[bool], truth: Sequence[bool], *, points: int = 71
) -> RejectionCurve:
    """F1 of error detection on the most confident ``coverage`` share of steps, for coverage 30..100 %."""
    n = len(uncertainty)
    if not n == len(predicted) == len(truth) or n == 0:
        raise ValueError(
            f"need as many uncertainties, predictions and labels (> 0), got {n}, {len(predicted)}, {len(truth)}"
        )
    order = np.argsort(np.asarray(uncertainty, dtype=float), kind="stable")
    coverage, f1 = [], []
    for c in np.linspace(0.3, 1.0, points):
        kept = order[: max(1, round(c * n))]
        coverage.append(float(c))
        f1.append(error_detection_f1([predicted[i] for i in kept], [truth[i] for i in kept]))
    return RejectionCurve(tuple(coverage), tuple(f1))


def uncertainty_auc(
    uncertainty: Sequence[float], verification_correct: Sequence[bool]
) -> tuple[float | None, float | None]:
    """(AUROC, AUPRC) of ``-uncertainty`` for "the verification is correct"; ``None`` with one class only."""
    from sklearn.metrics import average_precision_score, roc_auc_score

    labels = np.asarray(verification_correct, dtype=int)
    if labels.min(initial=1) == labels.max(initial=0):
        return None, None
    scores = -np.asarray(uncertainty, dtype=float)
    return float(roc_auc_score(labels, scores)), float(average_precision_score(labels, scores))
