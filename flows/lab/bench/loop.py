"""``prmloop bench loop``: does prioritizing pay? The loop's economics with and without it, same start.

Two arms spend the same token budget on the same question pool:

- ``prioritized``: probe every question with ``probe_k`` samples (their tokens count against the
  budget), rank by :func:`prmloop.models.priority.priority` (the code ``prmloop prioritize`` runs),
  then take questions highest first; a taken question's probe samples are real solutions and count
  among its ``k`` (``prmloop prioritize`` publishes them);
- ``random``: take questions in a random order, no probe.

Each taken question gets ``k`` solutions. Every solution is judged; an incorrect one is annotated
(first a check of ``s_0`` with ``rollouts`` rollouts, then the search); correct ones are labelled
"no error" for free (as the annotator does). The consensus filter accepts a label when the judge agrees.

The simulator (the ``simulated`` mode) draws each question's accuracy ``p`` from a Beta distribution
(most questions hard for a small model, as on GSM8K), answers from ``p`` (wrong answers spread over a
few values), mean token NLL that rises as ``p`` falls (with noise), and an annotation that resolves
only when a rollout from ``s_0`` reaches the answer (probability ``1 - (1 - p)^rollouts``: MC(s_0) > 0).
Costs are in generated tokens: ``solution_tokens`` per sample, ``rollout_tokens`` per rollout,
``judge_tokens`` per judged solution (defaults from this machine's measurements: SmolLM2 wrote about
200 tokens per solution and 213 judge tokens per judged step).

Reported per arm: accepted labels, accepted error labels (first errors found and agreed on) and
incorrect solutions per thousand generated tokens. The PRM's ProcessBench F1 after the same budget
needs a PRM trained per arm and is not part of this benchmark.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from prmloop.models.priority import Probe, priority, priority_signals

__all__ = ["LoopBenchSettings", "bench_loop", "simulate_arm"]


@dataclass(frozen=True)
class LoopBenchSettings:
    questions: int = 400
    budget_tokens: int = 1_000_000
    k: int = 8
    probe_k: int = 4
    rollouts: int = 8
    search_probes: int = 3
    solution_tokens: int = 200
    rollout_tokens: int = 100
    judge_tokens: int = 1200
    judge_accuracy: float = 0.75
    round_questions: int = 10
    oversample: int = 2
    difficulty_a: float = 0.4
    difficulty_b: float = 1.2
    seed: int = 0


@dataclass
class _Question:
    p: float
    wrong_answers: int


def _pool(s: LoopBenchSettings, rng: np.random.Generator) -> list[_Question]:
    ps = rng.beta(s.difficulty_a, s.difficulty_b, size=s.questions)
    return [_Question(float(p), int(rng.integers(1, 4))) for p in ps]


def _samples(q: _Question, n: int, rng: np.random.Generator) -> tuple[list[bool], list[str], list[float]]:
    correct = [bool(c) for c in rng.random(n) < q.p]
    answers = ["gold" if c else f"w{rng.integers(q.wrong_answers)}" for c in correct]
    nll = [max(0.0, 0.25 + 0.6 * (1.0 - q.p) + float(rng.normal(0, 0.1))) for _ in range(n)]
    return correct, answers, nll


def _probe(q: _Question, s: LoopBenchSettings, rng: np.random.Generator) -> tuple[float, list[bool]]:
    correct, answers, nll = _samples(q, s.probe_k, rng)
    probe = Probe(answers=tuple(answers), correct=tuple(correct), mean_nll=tuple(nll))
    return priority(priority_signals(probe)), correct


def _take(
    pool: list[_Question],
    i: int,
    *,
    reused: list[bool],
    s: LoopBenchSettings,
    rng: np.random.Generator,
    spent: dict[str, int],
    counts: dict[str, int],
) -> None:
    """Sample, judge, annotate and filter question ``i``; its probe samples count among its ``k``."""
    q = pool[i]
    counts["questions"] += 1
    fresh, _, _ = _samples(q, s.k - len(reused), rng)
    spent["sample"] += (s.k - len(reused)) * s.solution_tokens
    for ok in reused + fresh:
        counts["solutions"] += 1
        spent["judge"] += s.judge_tokens
        agrees = bool(rng.random() < s.judge_accuracy)
        if ok:
            counts["accepted"] += agrees
            continue
        counts["incorrect"] += 1
        spent["annotate"] += s.rollouts * s.rollout_tokens  # the check of s_0
        if rng.random() >= 1.0 - (1.0 - q.p) ** s.rollouts:
            counts["unresolved"] += 1  # MC(s_0) = 0: no rollout reached the answer
            continue
        spent["annotate"] += s.search_probes * s.rollouts * s.rollout_tokens
        counts["accepted"] += agrees
        counts["accepted_errors"] += agrees


def simulate_arm(arm: str, s: LoopBenchSettings) -> dict[str, Any]:
    """One arm on the pool of seed ``s.seed`` (both arms see the same questions in the same arrival order).

    The prioritized arm works in rounds, as the loop does: probe the next ``round_questions *
    oversample`` questions, add them to the queue, take the ``round_questions`` highest.
    """
    if arm not in ("prioritized", "random"):
        raise ValueError(f"unknown arm {arm!r}: prioritized or random")
    pool = _pool(s, np.random.default_rng(s.seed))
    arrival = [int(i) for i in np.random.default_rng(s.seed + 7).permutation(len(pool))]
    rng = np.random.default_rng(s.seed + (1 if arm == "prioritized" else 2))
    spent = {"probe": 0, "sample": 0, "annotate": 0, "judge": 0}
    counts = {"questions": 0, "solutions": 0, "incorrect": 0, "unresolved": 0, "accepted": 0, "accepted_errors": 0}
    taken_p: list[float] = []
    queue: list[tuple[float, int, list[bool]]] = []
    reused: list[bool]
    cursor = round_left = 0
    while sum(spent.values()) < s.budget_tokens:
        if arm == "random":
            if cursor >= len(arrival):
                break
            i, reused = arrival[cursor], []
            cursor += 1
        else:
            if round_left == 0 or not queue:
                round_left = s.round_questions
                for i in arrival[cursor : cursor + s.round_questions * s.oversample]:
                    value, probe = _probe(pool[i], s, rng)
                    spent["probe"] += s.probe_k * s.solution_tokens
                    queue.append((value, i, probe))
                cursor += s.round_questions * s.oversample
                queue.sort(key=lambda item: (-item[0], item[1]))
            if not queue:
                break
            _, i, reused = queue.pop(0)
            round_left -= 1
        _take(pool, i, reused=reused, s=s, rng=rng, spent=spent, counts=counts)
        taken_p.append(pool[i].p)
    total = sum(spent.values())
    per_k = 1000.0 / total if total else math.nan
    return {
        **counts,
        "tokens": total,
        "tokens_by_stage": spent,
        "accepted_per_1k_tokens": counts["accepted"] * per_k,
        "accepted_errors_per_1k_tokens": counts["accepted_errors"] * per_k,
        "incorrect_per_1k_tokens": counts["incorrect"] * per_k,
        "mean_p_taken": float(np.mean(taken_p)) if taken_p else None,
    }


def bench_loop(settings: LoopBenchSettings | None = None, repeats: int = 5) -> dict[str, Any]:
    """Both arms on ``repeats`` simulated pools (seeds ``seed .. seed + repeats - 1``); the arms' figures
    of the first pool and the ratios (prioritized / random) averaged over all pools."""
    s = settings or LoopBenchSettings()
    started = time.perf_counter()
    keys = ("accepted_per_1k_tokens", "accepted_errors_per_1k_tokens", "incorrect_per_1k_tokens")
    ratios: dict[str, list[float]] = {k: [] for k in keys}
    first: dict[str, Any] = {}
    for r in range(repeats):
        pool = replace(s, seed=s.seed + r)
        arms = {arm: simulate_arm(arm, pool) for arm in ("prioritized", "random")}
        first = first or arms
        for k in keys:
            if arms["random"][k]:
                ratios[k].append(arms["prioritized"][k] / arms["random"][k])
    mean = {k: (statistics.fmean(v) if v else None) for k, v in ratios.items()}
    return {
        "bench": "loop",
        "mode": "simulated",
        "settings": asdict(s),
        "repeats": repeats,
        "arms": first,
        "accepted_ratio": mean["accepted_per_1k_tokens"],
        "accepted_errors_ratio": mean["accepted_errors_per_1k_tokens"],
        "incorrect_ratio": mean["incorrect_per_1k_tokens"],
        "accepted_ratio_range": [
            min(ratios["accepted_per_1k_tokens"], default=None),
            max(ratios["accepted_per_1k_tokens"], default=None),
        ],
        "wall_s": time.perf_counter() - started,
    }
