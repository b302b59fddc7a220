"""The judge metrics on hand-made cases: error-detection F1, the rejection curve, AUROC, ProcessBench F1."""

from __future__ import annotations

import pytest

from prmloop.models.judge.metrics import error_detection_f1, rejection_curve, uncertainty_auc
from prmloop.models.processbench import processbench_f1


def test_error_detection_f1_by_hand() -> None:
    # tp = 1, fp = 1, fn = 1 -> 2 / (2 + 1 + 1)
    assert error_detection_f1([True, True, False, False], [True, False, True, False]) == pytest.approx(0.5)
    assert error_detection_f1([False, False], [False, False]) == 0.0


def test_rejecting_the_uncertain_wrong_verifications_raises_f1() -> None:
    # Four steps: the two confident ones are verified right (an error found, a fine step passed), the two
    # uncertain ones wrong (an error missed, a fine step flagged).
    uncertainty = [0.1, 0.2, 0.8, 0.9]
    predicted = [True, False, False, True]
    truth = [True, False, True, False]
    curve = rejection_curve(uncertainty, predicted, truth)
    assert curve.at(1.0) == pytest.approx(0.5)  # tp 1, fp 1, fn 1
    assert curve.at(0.5) == pytest.approx(1.0)  # the two confident steps only
    assert curve.area(0.3) > curve.at(1.0)
    with pytest.raises(ValueError, match="as many"):
        rejection_curve([0.1], [True, False], [True])


def test_auroc_is_one_when_uncertainty_separates_right_from_wrong_verifications() -> None:
    auroc, auprc = uncertainty_auc([0.1, 0.2, 0.8, 0.9], [True, True, False, False])
    assert auroc == pytest.approx(1.0) and auprc == pytest.approx(1.0)
    assert uncertainty_auc([0.1, 0.2], [True, True]) == (None, None)


def test_processbench_protocol_by_hand() -> None:
    # Erroneous samples: labels 2, 0, 3; predictions 2 (right), 1 (wrong), unread (-2, wrong) -> 1/3.
    # Correct samples: labels -1, -1; predictions None (right), 4 (wrong) -> 1/2. F1 = 2 * (1/3 * 1/2) / (5/6) = 0.4
    scores = processbench_f1([2, 1, -2, None, 4], [2, 0, 3, -1, -1])
    assert scores["error_accuracy"] == pytest.approx(1 / 3) and scores["correct_accuracy"] == pytest.approx(0.5)
    assert scores["f1"] == pytest.approx(0.4)
    assert processbench_f1([1], [1])["f1"] is None
