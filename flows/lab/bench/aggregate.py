"""``prmloop bench aggregate``: every aggregation method on a 500 x 32 pool, the vectorized
implementation against a plain per-question Python loop, in the same run and on the same inputs."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from prmloop.models.aggregation.calibration import fit_calibration
from prmloop.models.aggregation.loader import load_for_eval
from prmloop.models.aggregation.naive import select_naive
from prmloop.models.aggregation.pool import ScoredCandidates, ScoreRule
from prmloop.models.aggregation.selection import available_methods, select
from prmloop.models.questions import data_dir


def _best_of(repeats: int, fn: Callable[[], np.ndarray]) -> tuple[float, np.ndarray]:
    """Fastest of ``repeats`` runs (the machine is shared; the minimum is the least disturbed)."""
    best, out = float("inf"), np.empty(0)
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def bench_aggregate(
    pool: str | Path | None = None,
    scores: str | Path | None = None,
    *,
    prm: str = "qwen_prm",
    score_rule: ScoreRule = "min",
    calibration_size: int = 100,
    repeats: int = 5,
    limit: int | None = None,
) -> dict[str, Any]:
    """Time all methods on the whole pool (default ``bon/gsm8k_candidates.jsonl.gz``, 500 x 32).

    The calibration is fitted once on the first ``calibration_size`` questions (not timed); both
    implementations then select on all questions from the same precomputed candidate scores.
    ``vectorized_s`` and ``naive_s`` are sums over methods of the fastest of ``repeats`` runs
    (``repeats // 2`` for the slow loop). ``limit`` keeps the first questions only (tests).
    """
    pool = pool if pool is not None else data_dir() / "bon" / "gsm8k_candidates.jsonl.gz"
    loaded = load_for_eval(pool, scores, prm=prm, limit=limit)
    fit = fit_calibration(loaded.take(np.arange(min(calibration_size, loaded.n_questions))), score_rule=score_rule)
    cands = ScoredCandidates.from_pool(loaded)
    per_method: dict[str, dict[str, float | bool]] = {}
    identical = True
    for name in available_methods(cands, fit):
        vec_s, vec_sel = _best_of(repeats, functools.partial(select, name, cands, fit))
        naive_s, naive_sel = _best_of(max(1, repeats // 2), functools.partial(select_naive, name, cands, fit))
        same = bool(np.array_equal(vec_sel, naive_sel))
        identical &= same
        per_method[name] = {"vectorized_s": vec_s, "naive_s": naive_s, "identical": same}
    vectorized_s = sum(float(v["vectorized_s"]) for v in per_method.values())
    naive_s = sum(float(v["naive_s"]) for v in per_method.values())
    return {
        "pool": str(pool),
        "prm": loaded.prm_name,
        "questions": loaded.n_questions,
        "candidates": loaded.n_candidates,
        "methods": list(per_method),
        "vectorized_s": vectorized_s,
        "naive_s": naive_s,
        "speedup": naive_s / vectorized_s if vectorized_s > 0 else float("inf"),
        "identical_selections": identical,
        "per_method": per_method,
    }
