"""``prmloop eval consensus``: how many of the loop's labels consensus keeps, and at which judge certainty.

Reads every solution's newest MC label (``StepsLabeled``) and judge verdict (``StepsJudged``) from the
store and applies the consensus rule (:func:`~prmloop.consumers.consensus.labels_decision`) at each
CoT-entropy threshold: the retention rate (the Qwen paper kept about 40 %) and the reasons for
rejection. (Whether an accepted label is *right* is measured where the truth is known:
``prmloop eval annotate --dataset arith`` for the MC side.)
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prmloop.consumers.consensus import labels_decision
from prmloop.store.events import StepsJudged, StepsLabeled
from prmloop.store.tables.duck import query

__all__ = ["DEFAULT_THRESHOLDS", "consensus_retention"]

DEFAULT_THRESHOLDS: tuple[float | None, ...] = (None, 0.69, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1)

_NEWEST = """
SELECT event_type, payload FROM events
WHERE event_type IN ('StepsLabeled', 'StepsJudged')
QUALIFY row_number() OVER (PARTITION BY event_type, payload->>'solution_id' ORDER BY occurred_at DESC, event_id) = 1
"""


def consensus_retention(db: Path, thresholds: Sequence[float | None] = DEFAULT_THRESHOLDS) -> dict[str, Any]:
    """Retention of the consensus rule at each threshold over the store's labelled and judged solutions."""
    rows = query(db, _NEWEST).rows
    labeled: dict[str, StepsLabeled] = {}
    judged: dict[str, StepsJudged] = {}
    for event_type, payload in rows:
        data = json.loads(payload) if isinstance(payload, str) else payload
        if event_type == "StepsLabeled":
            item = StepsLabeled.model_validate(data)
            labeled[item.solution_id] = item
        else:
            verdict = StepsJudged.model_validate(data)
            judged[verdict.solution_id] = verdict
    both = sorted(set(labeled) & set(judged))
    out: list[dict[str, Any]] = []
    for threshold in thresholds:
        decisions = [labels_decision(labeled[s], judged[s], entropy_threshold=threshold) for s in both]
        kept = sum(d.accept for d in decisions)
        reasons = Counter(d.reason.split(":")[0] for d in decisions if not d.accept)
        out.append(
            {
                "entropy_threshold": threshold,
                "accepted": kept,
                "retention": round(kept / len(both), 4) if both else None,
                "rejections": dict(reasons.most_common()),
            }
        )
    return {
        "db": str(db),
        "labelled": len(labeled),
        "judged": len(judged),
        "both": len(both),
        "incorrect_with_both": sum(labeled[s].first_error_step is not None for s in both),
        "per_threshold": out,
    }
