"""F1 with its interval, per level, and the paired comparison promotion decides by.

The F1 is ProcessBench's (Zheng et al., 2024; :func:`prmloop.models.processbench.processbench_f1`): the
harmonic mean of the accuracy on erroneous solutions (predicted first error = the true one) and on
correct ones (predicted "no error"). Its 95 % interval is a percentile bootstrap over *questions*, not
solutions: a question's four solutions share its difficulty, so resampling them one by one would
understate the spread. Each bootstrap draw resamples the questions with replacement and recomputes
both accuracies from per-question counts (a multinomial weight per question), so 2,000 draws over 1,500
solutions take milliseconds.

Promotion compares two models on the *same* validation solutions: the paired bootstrap draws the same
questions for both and takes the difference of their F1 in each draw. A candidate is "not worse beyond
noise" unless the whole 95 % interval of (candidate - current) lies below zero; the newest such model
is put in force, so the model follows the data rather than the luckiest draw.

That interval answers "how good is *this* model": the test questions are the sample. Whether one set of
N labels is worth more than another needs a second spread, over the *training* sets: on the shipped
sets, models trained on 8 random exact labels of the validation set score 0.16 to 0.61 test F1 (the
middle 80 % of 30 draws; sd 0.18, 0.15 at 15 labels, 0.04-0.07 at 30 and 56), where the interval over
test questions is about +-0.02.
:func:`draw_spread` gives that spread from models trained on many random draws, and
:func:`rank_among` places one training set's F1 in it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from prmloop.models.processbench import processbench_f1

__all__ = [
    "DrawSpread",
    "F1Interval",
    "PairedDiff",
    "draw_spread",
    "f1_interval",
    "f1_report",
    "paired_f1_diff",
    "rank_among",
]

#: Bootstrap draws for every interval (enough for a stable 2.5 % / 97.5 % percentile).
DRAWS = 2000


@dataclass(frozen=True)
class F1Interval:
    """An F1 with its 95 % bootstrap interval over ``n`` solutions (``None``: no F1, one kind missing)."""

    f1: float | None
    lo: float | None
    hi: float | None
    n: int
    #: of the ``n``: solutions with a first error (the rest are correct); a level with none of one kind
    #: has no F1 (SmolLM2 answers no level-5 question right)
    erroneous: int = 0

    def as_dict(self) -> dict[str, float | int | None]:
        r = 4
        return {
            "f1": None if self.f1 is None else round(self.f1, r),
            "lo": None if self.lo is None else round(self.lo, r),
            "hi": None if self.hi is None else round(self.hi, r),
            "n": self.n,
            "erroneous": self.erroneous,
        }


@dataclass(frozen=True)
class PairedDiff:
    """F1(candidate) - F1(current) on the same solutions, with its 95 % paired-bootstrap interval."""

    diff: float
    lo: float
    hi: float
    candidate: float
    current: float

    @property
    def worse(self) -> bool:
        """The candidate is worse beyond noise: the whole interval lies below zero."""
        return self.hi < 0.0


def _per_question(
    predicted: Sequence[int | None], truth: Sequence[int], questions: Sequence[str]
) -> tuple[np.ndarray, list[str]]:
    """Per question: [erroneous, erroneous right, correct, correct right] (rows in first-seen order)."""
    if not (len(predicted) == len(truth) == len(questions)):
        raise ValueError(f"{len(predicted)} predictions, {len(truth)} labels, {len(questions)} questions")
    index: dict[str, int] = {}
    rows: list[list[int]] = []
    for p, y, q in zip(predicted, truth, questions, strict=True):
        at = index.setdefault(q, len(rows))
        if at == len(rows):
            rows.append([0, 0, 0, 0])
        normal = -1 if p is None else p
        if y >= 0:
            rows[at][0] += 1
            rows[at][1] += int(normal == y)
        else:
            rows[at][2] += 1
            rows[at][3] += int(normal == -1)
    return np.asarray(rows, dtype=np.float64).reshape(-1, 4), list(index)


def _f1_of(totals: np.ndarray) -> np.ndarray:
    """F1 of count totals (..., 4); NaN where one kind has no solution."""
    with np.errstate(divide="ignore", invalid="ignore"):
        acc_err = totals[..., 1] / totals[..., 0]
        acc_cor = totals[..., 3] / totals[..., 2]
        f1 = np.where(acc_err + acc_cor > 0, 2 * acc_err * acc_cor / (acc_err + acc_cor), 0.0)
    return np.where((totals[..., 0] > 0) & (totals[..., 2] > 0), f1, np.nan)


def _weights(questions: int, draws: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.multinomial(questions, np.full(questions, 1.0 / questions), size=draws).astype(np.float64)


def f1_interval(
    predicted: Sequence[int | None],
    truth: Sequence[int],
    questions: Sequence[str],
    *,
    draws: int = DRAWS,
    seed: int = 0,
) -> F1Interval:
    """ProcessBench F1 of ``predicted`` against ``truth`` and its 95 % bootstrap interval over questions."""
    point = processbench_f1(list(predicted), list(truth))["f1"]
    if not truth:
        return F1Interval(None, None, None, 0)
    counts, _ = _per_question(predicted, truth, questions)
    erroneous = sum(y >= 0 for y in truth)
    if point is None:
        return F1Interval(None, None, None, len(truth), erroneous)
    sampled = _f1_of(_weights(len(counts), draws, seed) @ counts)
    sampled = sampled[~np.isnan(sampled)]
    lo, hi = (float(v) for v in np.percentile(sampled, [2.5, 97.5])) if sampled.size else (point, point)
    return F1Interval(float(point), lo, hi, len(truth), erroneous)


def f1_report(
    predicted: Sequence[int | None],
    truth: Sequence[int],
    questions: Sequence[str],
    subsets: Sequence[str],
    *,
    draws: int = DRAWS,
    seed: int = 0,
) -> dict[str, dict[str, float | int | None]]:
    """``{"all": ..., "<subset>": ...}``: the F1 with its interval over all and per subset (level)."""
    out = {"all": f1_interval(predicted, truth, questions, draws=draws, seed=seed).as_dict()}
    for subset in sorted(set(subsets)):
        chosen = [i for i, s in enumerate(subsets) if s == subset]
        out[subset] = f1_interval(
            [predicted[i] for i in chosen],
            [truth[i] for i in chosen],
            [questions[i] for i in chosen],
            draws=draws,
            seed=seed,
        ).as_dict()
    return out


def paired_f1_diff(
    candidate: Sequence[int | None],
    current: Sequence[int | None],
    truth: Sequence[int],
    questions: Sequence[str],
    *,
    draws: int = DRAWS,
    seed: int = 0,
) -> PairedDiff:
    """F1(candidate) - F1(current) on the same solutions, the same questions drawn for both."""
    a, _ = _per_question(candidate, truth, questions)
    b, _ = _per_question(current, truth, questions)
    fa = processbench_f1(list(candidate), list(truth))["f1"]
    fb = processbench_f1(list(current), list(truth))["f1"]
    if fa is None or fb is None:
        raise ValueError("a paired F1 needs both erroneous and correct solutions")
    weights = _weights(len(a), draws, seed)
    diffs = _f1_of(weights @ a) - _f1_of(weights @ b)
    diffs = diffs[~np.isnan(diffs)]
    lo, hi = (float(v) for v in np.percentile(diffs, [2.5, 97.5])) if diffs.size else (fa - fb, fa - fb)
    return PairedDiff(diff=float(fa - fb), lo=lo, hi=hi, candidate=float(fa), current=float(fb))


@dataclass(frozen=True)
class DrawSpread:
    """The F1s of models trained on ``n`` random draws of the same size: their mean, 2.5 %, 50 % and
    97.5 % percentiles (linear interpolation) and standard deviation: what a random choice of labels gives.

    The mean of the draws' F1s, not the F1 of their predictions pooled: F1 is a harmonic mean of two
    accuracies, and pooling models that lean different ways (one says "no error" everywhere, another
    flags every step) averages the accuracies first, which gives the mixture a higher F1 than any of
    them. At 2-8 labels the pooled F1 of random draws came out above every single draw's."""

    mean: float
    lo: float
    median: float
    hi: float
    sd: float
    n: int

    def as_dict(self) -> dict[str, float | int]:
        return {
            "mean": round(self.mean, 4),
            "lo": round(self.lo, 4),
            "median": round(self.median, 4),
            "hi": round(self.hi, 4),
            "sd": round(self.sd, 4),
            "n": self.n,
        }

    def verdict(self, f1: float) -> str:
        """``above``/``below`` the draws' 95 % range, or ``within`` it."""
        return "above" if f1 > self.hi else "below" if f1 < self.lo else "within"


def draw_spread(f1s: Sequence[float]) -> DrawSpread:
    """:class:`DrawSpread` of the draws' F1s (at least one)."""
    if not f1s:
        raise ValueError("a spread over draws needs at least one draw's F1")
    values = np.asarray(f1s, dtype=np.float64)
    lo, median, hi = (float(v) for v in np.percentile(values, [2.5, 50.0, 97.5]))
    return DrawSpread(mean=float(values.mean()), lo=lo, median=median, hi=hi, sd=float(values.std()), n=len(values))


def rank_among(f1: float, f1s: Sequence[float]) -> float:
    """The percentage of ``f1s`` that ``f1`` beats, a tie counting half: 50 is a median draw's F1."""
    if not f1s:
        raise ValueError("a rank among draws needs at least one draw's F1")
    below = sum(v < f1 for v in f1s) + 0.5 * sum(v == f1 for v in f1s)
    return round(100.0 * below / len(f1s), 1)
