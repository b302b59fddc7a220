"""``prmloop bench prm``: scoring every step in one forward pass against one pass per step prefix.

The same PRM (the embedded model with a fresh LoRA adapter: speed does not depend on training) scores
the same ProcessBench GSM8K solutions both ways in one run; the scores agree (causal attention) and
only the time differs. Target: at least 3x for solutions of 6 or more steps.
"""

from __future__ import annotations

import time
from typing import Any

from prmloop.models.prm.model import PRM, PRMConfig
from prmloop.models.processbench import read_processbench
from prmloop.models.questions import data_dir

__all__ = ["bench_prm"]


def bench_prm(
    *, solutions: int = 8, min_steps: int = 6, threads: int | None = None, prm: PRM | None = None
) -> dict[str, Any]:
    items, _ = read_processbench(data_dir() / "processbench" / "gsm8k.json")
    chosen = [i for i in items if len(i.steps) >= min_steps][:solutions]
    if not chosen:
        raise ValueError(f"no ProcessBench GSM8K solution has {min_steps} or more steps")
    prm = prm or PRM.create(PRMConfig(threads=threads))
    problems, steps = [i.problem for i in chosen], [list(i.steps) for i in chosen]
    prm.score_solutions(problems[:1], steps[:1])  # warm-up
    started = time.perf_counter()
    one_pass = prm.score_solutions(problems, steps, batch_size=1)
    one_pass_s = time.perf_counter() - started
    started = time.perf_counter()
    per_prefix = [prm.score_prefixes(p, s) for p, s in zip(problems, steps, strict=True)]
    per_prefix_s = time.perf_counter() - started
    n_steps = sum(len(s) for s in one_pass)
    diff = max(abs(a - b) for x, y in zip(one_pass, per_prefix, strict=True) for a, b in zip(x, y, strict=True))
    return {
        "bench": "prm",
        "solutions": len(chosen),
        "steps": n_steps,
        "mean_steps": n_steps / len(chosen),
        "one_pass_steps_per_s": n_steps / one_pass_s,
        "per_prefix_steps_per_s": n_steps / per_prefix_s,
        "speedup": per_prefix_s / one_pass_s,
        "max_score_difference": diff,
    }
