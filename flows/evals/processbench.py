"""``prmloop eval processbench``: a PRM's ProcessBench F1 with the Qwen paper's protocol, and its
Best-of-N accuracy on a shared candidate pool.

Protocol (:mod:`prmloop.models.prm.evaluate`): each solution's predicted first error is the first step
scored below ``τ``; ``τ`` is the F1-maximising threshold on the GSM8K subset, applied unchanged to every
subset. ``--holdout`` keeps only the questions that :func:`~prmloop.store.snapshot.split_of` puts in the
test split, i.e. the ones a snapshot imported with the same ratios did not train on.
"""

from __future__ import annotations

import gzip
import json
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from prmloop.models.prm.evaluate import best_threshold, processbench_scores
from prmloop.models.processbench import read_processbench
from prmloop.models.questions import data_dir
from prmloop.store.snapshot import split_of

__all__ = ["best_of_n", "eval_processbench"]

Scorer = Callable[[list[str], list[list[str]]], list[list[float]]]


def _subset(name: str, limit: int | None, holdout: bool) -> tuple[list[Any], list[str]]:
    items, errors = read_processbench(data_dir() / "processbench" / f"{name}.json")
    if holdout:
        items = [i for i in items if split_of(f"processbench/{name}/{i.id}", (0.5, 0.0, 0.5)) == "test"]
    if not limit:
        return items, errors
    # ProcessBench files list erroneous solutions first: take both kinds, half and half, in file order.
    wrong = [i for i in items if i.label >= 0]
    right = [i for i in items if i.label < 0]
    half = limit // 2
    chosen = wrong[: limit - min(half, len(right))] + right[:half]
    return chosen[:limit], errors


def eval_processbench(
    score: Scorer,
    *,
    subsets: tuple[str, ...] = ("gsm8k", "math"),
    limit: int | None = 40,
    holdout: bool = False,
    progress: Callable[[str], None] = lambda _line: None,
) -> dict[str, Any]:
    """F1 per subset at the GSM8K-chosen threshold; ``score(problems, steps)`` gives step scores."""
    started = time.perf_counter()
    scored: dict[str, tuple[list[list[float]], list[int]]] = {}
    steps_scored = 0
    for name in subsets:
        items, _ = _subset(name, limit, holdout)
        scores = score([i.problem for i in items], [list(i.steps) for i in items])
        steps_scored += sum(len(s) for s in scores)
        scored[name] = (scores, [i.label for i in items])
        progress(f"{name}: {len(items)} solutions scored")
    anchor = "gsm8k" if "gsm8k" in scored else subsets[0]
    threshold = best_threshold(*scored[anchor])
    result: dict[str, Any] = {"threshold": threshold, "threshold_from": anchor, "holdout": holdout}
    for name, (scores, labels) in scored.items():
        result[name] = {**processbench_scores(scores, labels, threshold), "samples": len(labels)}
    result["steps_per_s"] = steps_scored / max(time.perf_counter() - started, 1e-9)
    return result


def best_of_n(score: Scorer, *, problems: int = 20, n: int = 8) -> dict[str, Any]:
    """Best-of-N accuracy on the shared GSM8K pool: the candidate with the highest minimum step score,
    against majority voting over the same ``n`` candidates."""
    path = data_dir() / "bon" / "gsm8k_candidates.jsonl.gz"
    picked = voted = total = 0
    with gzip.open(path, "rt") as handle:
        for line in handle:
            if total >= problems:
                break
            pool = json.loads(line)["candidates"][:n]
            steps = [[s["text"] for s in c["steps"]] or [c["raw_text"]] for c in pool]
            scores = score([c["problem"]["question"] for c in pool], steps)
            best = max(range(len(pool)), key=lambda k: min(scores[k]) if scores[k] else 0.0)
            picked += bool(pool[best]["is_correct"])
            answers = Counter(c["extracted_answer"] for c in pool if c["extracted_answer"] is not None)
            if answers:
                top = answers.most_common(1)[0][0]
                voted += bool(next(c["is_correct"] for c in pool if c["extracted_answer"] == top))
            total += 1
    return {
        "problems": total,
        "n": n,
        "prm_min_accuracy": picked / max(total, 1),
        "majority_accuracy": voted / max(total, 1),
    }
