"""``prmloop eval processbench``: a PRM's ProcessBench F1 with the Qwen paper's protocol, and its
Best-of-N accuracy on a shared candidate pool.

Protocol (:mod:`prmloop.models.prm.evaluate`): each solution's predicted first error is the first step
scored below ``τ``; ``τ`` is the F1-maximising threshold on the GSM8K subset, applied unchanged to every
subset. ``--holdout`` keeps only the questions that :func:`~prmloop.store.tables.snapshot.split_of` puts in the
test split, i.e. the ones a snapshot imported with the same ratios did not train on.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from collections.abc import Callable
from typing import Any

from prmloop.models.prm.evaluate import Scorer, score_processbench
from prmloop.models.questions import data_dir
from prmloop.store.tables.snapshot import split_of

__all__ = ["best_of_n", "eval_processbench"]


def eval_processbench(
    score: Scorer,
    *,
    subsets: tuple[str, ...] = ("gsm8k", "math"),
    limit: int | None = 40,
    holdout: bool = False,
    progress: Callable[[str], None] = lambda _line: None,
) -> dict[str, Any]:
    """:func:`~prmloop.models.prm.evaluate.score_processbench`, on the test split only with ``holdout``."""
    keep = (lambda key: split_of(key, (0.5, 0.0, 0.5)) == "test") if holdout else None
    return score_processbench(score, subsets=subsets, limit=limit, keep=keep, progress=progress)


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
