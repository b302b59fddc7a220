"""``prmloop eval aggregate``: accuracy of every aggregation method at N = 1..32 on a Best-of-N pool,
the compute fraction of the calibrated methods, and PNG plots (accuracy vs N, fitted weights)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prmloop.models.aggregation.evaluation import DEFAULT_NS, evaluate_aggregation
from prmloop.models.aggregation.loader import load_for_eval
from prmloop.models.aggregation.plots import slug, write_outputs
from prmloop.models.aggregation.pool import ScoreKind, ScoreRule


def eval_aggregate(
    pool: str | Path,
    scores: str | Path | None = None,
    *,
    prm: str = "qwen_prm",
    reference: str | Path | None = None,
    score_rule: ScoreRule = "min",
    score_kind: ScoreKind | None = None,
    ns: Sequence[int] = DEFAULT_NS,
    subsamples: int = 50,
    splits: int = 5,
    calibration_size: int = 100,
    seed: int = 0,
    out_dir: str | Path | None = "out/aggregate",
    limit: int | None = None,
) -> dict[str, Any]:
    """Evaluate every aggregation method on a pool.

    Returns :meth:`AggregationEvaluation.to_dict` plus ``table`` (one dict per method: ``method``,
    ``N=1`` ... ``N=32`` as ``"mean ± std"`` percent, ``compute fraction``), ``table_markdown`` and
    ``files``: PNGs, ``evaluation.json`` and split 0's ``calibration_fit.json`` written under
    ``out_dir/<dataset>-<prm>-<score rule>/`` (nothing is written when ``out_dir`` is ``None``).
    """
    loaded = load_for_eval(pool, scores, prm=prm, reference=reference, score_kind=score_kind, limit=limit)
    ev = evaluate_aggregation(
        loaded,
        ns=[n for n in ns if n <= loaded.n_candidates],
        subsamples=subsamples,
        splits=splits,
        calibration_size=calibration_size,
        score_rule=score_rule,
        seed=seed,
    )
    result = ev.to_dict()
    result["table"] = ev.table_rows()
    result["table_markdown"] = ev.markdown()
    target = Path(out_dir) / slug(loaded.dataset, loaded.prm_name, score_rule) if out_dir is not None else None
    result["files"] = write_outputs(ev, target) if target is not None else {}
    return result
