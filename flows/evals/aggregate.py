"""``prmloop eval aggregate``: accuracy of every aggregation method at N = 1..32 on a Best-of-N pool,
the compute fraction of the calibrated methods, and PNG plots (accuracy vs N, fitted weights)."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prmloop.models.aggregation.evaluation import DEFAULT_NS, AggregationEvaluation, evaluate_aggregation
from prmloop.models.aggregation.loader import load_pool
from prmloop.models.aggregation.plots import plot_accuracy_vs_n, plot_weighting_functions
from prmloop.models.aggregation.pool import CandidatePool, ScoreKind, ScoreRule
from prmloop.models.questions import data_dir


def default_data_dir() -> Path:
    """The shared data folder: ``$PRMLOOP_DATA_DIR``, else ``../shared/data`` beside the repository."""
    return data_dir()


def resolve_pool_paths(
    pool: str | Path, scores: str | Path | None = None, prm: str = "qwen_prm", reference: str | Path | None = None
) -> tuple[Path, Path, Path | None]:
    """Pool file, score file and reference file for ``pool``.

    ``scores`` defaults to ``step_scores/{prm}_{dataset}.jsonl.gz`` beside the pool, where
    ``dataset`` is the pool file's name before ``_candidates``; ``reference`` defaults to
    ``../math/math500_test.jsonl`` for the MATH-500 pool (its stored correctness is wrong).
    """
    pool_path = Path(pool)
    dataset = pool_path.name.split("_candidates")[0]
    score_path = Path(scores) if scores is not None else pool_path.parent / "step_scores" / f"{prm}_{dataset}.jsonl.gz"
    if not score_path.exists():
        available = sorted(p.name for p in (pool_path.parent / "step_scores").glob(f"*_{dataset}.jsonl.gz"))
        raise FileNotFoundError(
            f"no step scores at {score_path}; pass --scores, or --prm with one of: {available or 'none found'}"
        )
    ref: Path | None = Path(reference) if reference is not None else None
    if ref is None and dataset == "math500":
        guess = pool_path.parent.parent / "math" / "math500_test.jsonl"
        ref = guess if guess.exists() else None
    return pool_path, score_path, ref


def load_for_eval(
    pool: str | Path,
    scores: str | Path | None = None,
    *,
    prm: str = "qwen_prm",
    reference: str | Path | None = None,
    score_kind: ScoreKind | None = None,
    limit: int | None = None,
) -> CandidatePool:
    """:func:`load_pool` with the paths of :func:`resolve_pool_paths`."""
    pool_path, score_path, ref = resolve_pool_paths(pool, scores, prm, reference)
    return load_pool(pool_path, score_path, reference_path=ref, score_kind=score_kind, limit=limit)


def slug(*parts: str) -> str:
    """A Prefect artifact key / folder name: lowercase letters, digits and dashes."""
    return re.sub(r"[^a-z0-9]+", "-", "-".join(parts).lower()).strip("-")


def write_outputs(ev: AggregationEvaluation, out_dir: str | Path) -> dict[str, str]:
    """PNG plots, the evaluation JSON and split 0's calibration fit into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "accuracy_png": str(plot_accuracy_vs_n(ev, out / "accuracy_vs_n.png")),
        "weights_png": str(plot_weighting_functions(ev.fits[0], out / "weighting_functions.png")),
    }
    (out / "evaluation.json").write_text(json.dumps(ev.to_dict(), indent=2))
    (out / "calibration_fit.json").write_text(ev.fits[0].model_dump_json(indent=2))
    paths["evaluation_json"] = str(out / "evaluation.json")
    paths["calibration_json"] = str(out / "calibration_fit.json")
    return paths


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
