"""How sure ``prmloop bench active`` is that one arm beats another: paired intervals over seeds.

Every arm of one seed starts from the same random labelled set and the same head initialisation
(:func:`prmloop.flows.lab.bench.active._curve`), on the same pool and held-out half, so the arms are
compared seed by seed: the per-seed differences ``d_s = a_s - b_s`` carry the comparison, and the
seed-to-seed spread that both arms share (a lucky first set) cancels out of them.

- ``t``: the mean difference with the Student t interval ``mean ± t_{(1+level)/2, n-1} · sd / √n``
  (``sd`` the sample standard deviation of the ``d_s``); the headline interval.
- ``bootstrap``: the percentile interval of the mean over ``resamples`` resamplings of the seeds with
  replacement (a fixed generator seed: the same numbers give the same interval); beside it, as a check
  that does not assume normal differences.

Both describe the training randomness on this pool and held-out half (which seeds change); neither
covers a different draw of the pool itself.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["bootstrap_interval", "compare_arms", "t_interval"]


def _differences(a: Sequence[float], b: Sequence[float]) -> list[float]:
    if len(a) != len(b) or not a:
        raise ValueError(f"paired values need the same number of seeds on both sides, got {len(a)} and {len(b)}")
    return [float(x) - float(y) for x, y in zip(a, b, strict=True)]


def t_interval(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """(mean difference, low, high): the Student t interval of the mean of ``a[s] - b[s]``.

    One seed gives no spread: the interval is then unbounded (``-inf``, ``inf``).
    """
    from scipy import stats

    d = _differences(a, b)
    mean = statistics.fmean(d)
    if len(d) < 2:
        return mean, -math.inf, math.inf
    half = float(stats.t.ppf((1 + level) / 2, len(d) - 1)) * statistics.stdev(d) / math.sqrt(len(d))
    return mean, mean - half, mean + half


def bootstrap_interval(
    a: Sequence[float], b: Sequence[float], level: float = 0.95, *, resamples: int = 10_000, seed: int = 0
) -> tuple[float, float]:
    """(low, high): the percentile bootstrap interval of the mean of ``a[s] - b[s]`` over resampled seeds."""
    d = np.asarray(_differences(a, b))
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, len(d), size=(resamples, len(d)))].mean(axis=1)
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(low), float(high)


def _row(a: Sequence[float], b: Sequence[float], level: float) -> dict[str, Any]:
    mean, low, high = t_interval(a, b, level)
    boot = bootstrap_interval(a, b, level)
    return {
        "difference": round(mean, 4),
        "ci": [round(low, 4), round(high, 4)],
        "bootstrap_ci": [round(boot[0], 4), round(boot[1], 4)],
    }


def compare_arms(
    a_aucs: Sequence[float],
    b_aucs: Sequence[float],
    a_f1: Sequence[Sequence[float]],
    b_f1: Sequence[Sequence[float]],
    shares: Sequence[float],
    *,
    names: tuple[str, str] = ("actprm", "random"),
    level: float = 0.95,
) -> dict[str, Any]:
    """``names[0]`` minus ``names[1]``, paired by seed: the AUC and the F1 at each budget after the first
    (the first is the same random set for every arm), each with its t and bootstrap interval.

    ``a_f1[s][i]`` is the held-out F1 of seed ``s`` at budget ``i`` (share ``shares[i]`` of the pool).
    The advantage survives when the AUC's t interval lies above zero.
    """
    auc = _row(a_aucs, b_aucs, level)
    at_budget = [
        {"share": round(shares[i], 4), **_row([r[i] for r in a_f1], [r[i] for r in b_f1], level)}
        for i in range(1, len(shares))
    ]
    low, high = auc["ci"]
    survives = low > 0
    percent = f"{level:.0%}".replace("%", " %")
    if survives:
        verdict = f"{names[0]} beats {names[1]}: the whole {percent} interval of the AUC difference is above zero"
    elif high < 0:
        verdict = f"{names[1]} beats {names[0]}: the whole {percent} interval of the AUC difference is below zero"
    else:
        verdict = f"no verdict: the {percent} interval of the AUC difference includes zero"
    return {
        "arms": f"{names[0]} - {names[1]}",
        "seeds": len(a_aucs),
        "level": level,
        "method": (
            "paired by seed (same first labelled set and head initialisation); mean of the per-seed "
            "differences with a Student t interval (ci) and a percentile bootstrap over seeds (bootstrap_ci)"
        ),
        "auc": auc,
        "f1_at_budget": at_budget,
        "advantage_survives": survives,
        "verdict": verdict,
    }
