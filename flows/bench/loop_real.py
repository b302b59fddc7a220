"""``prmloop bench loop --real``: the two arms briefly on a real model (the embedded SmolLM2 by default).

The pool mixes arithmetic-curriculum levels (so questions differ in difficulty). The prioritized arm
probes ``questions`` questions with ``probe_k`` samples each (:func:`~prmloop.producers.prioritize.prioritize_question`,
the code ``prmloop prioritize`` runs), takes the ``take`` highest and samples ``k - probe_k`` more
solutions of each (the probe's count among its ``k``); the random arm samples ``k`` solutions of ``take``
random questions. Reported per arm, per thousand generated tokens: incorrect solutions, and
*labelable* incorrect solutions, those of a question where at least one of its solutions was right (an
annotator's rollouts from ``s_0`` can then reach the answer: MC(s_0) > 0). No annotation, judging or
training runs here: that would take hours on a CPU.
"""

from __future__ import annotations

import random
import time
from typing import Any

from prmloop.models.backends.registry import EngineSettings, build_backend
from prmloop.producers.arith import arith_questions
from prmloop.producers.prioritize import PrioritizeSettings, prioritize_question
from prmloop.producers.sampler import SampleSettings, sample_question
from prmloop.store.events import ModelRef

__all__ = ["bench_loop_real"]


def _arm_counts(correct_by_question: list[list[bool | None]], tokens: int) -> dict[str, Any]:
    incorrect = sum(c is False for cs in correct_by_question for c in cs)
    labelable = sum(sum(c is False for c in cs) for cs in correct_by_question if any(c is True for c in cs))
    per_k = 1000.0 / tokens if tokens else 0.0
    return {
        "questions": len(correct_by_question),
        "solutions": sum(len(cs) for cs in correct_by_question),
        "correct": sum(c is True for cs in correct_by_question for c in cs),
        "incorrect": incorrect,
        "labelable_incorrect": labelable,
        "tokens": tokens,
        "incorrect_per_1k_tokens": incorrect * per_k,
        "labelable_per_1k_tokens": labelable * per_k,
    }


def bench_loop_real(
    *,
    questions: int = 8,
    take: int = 3,
    k: int = 4,
    probe_k: int = 2,
    levels: tuple[int, ...] = (1, 2),
    max_new_tokens: int = 160,
    seed: int = 0,
    threads: int | None = None,
    engine: EngineSettings | None = None,
) -> dict[str, Any]:
    started = time.perf_counter()
    engine = engine or EngineSettings(threads=threads)
    generator = build_backend(engine.backend_config())
    model = ModelRef(backend=engine.backend, name=generator.model_name)
    per_level = -(-questions // len(levels))
    pool = [q for level in levels for q in arith_questions(per_level, level=level, seed=seed)][:questions]
    common = {
        "backend": engine.backend,
        "model": engine.model,
        "threads": engine.threads,
        "max_new_tokens": max_new_tokens,
    }
    probe_settings = PrioritizeSettings(k=probe_k, seed=seed, publish_probes=True, prefect=False, **common)
    probed = [prioritize_question(generator, model, q, probe_settings) for q in pool]
    probe_tokens = sum(p.probe.tokens for p in probed)
    top = sorted(probed, key=lambda p: (-p.priority, p.question.id))[:take]
    rest = SampleSettings(k=k - probe_k, m=0, n=0, publish_unselected=True, seed=seed + 1, prefect=False, **common)
    prioritized, tokens = [], probe_tokens
    for p in top:
        more = sample_question(generator, model, p.question, rest)
        prioritized.append(list(p.probe.correct) + list(more.correct))
        tokens += more.completion_tokens
    chosen = random.Random(seed).sample(pool, take)
    full = SampleSettings(k=k, m=0, n=0, publish_unselected=True, seed=seed + 2, prefect=False, **common)
    randomly, random_tokens = [], 0
    for q in chosen:
        sampled = sample_question(generator, model, q, full)
        randomly.append(list(sampled.correct))
        random_tokens += sampled.completion_tokens
    arms = {"prioritized": _arm_counts(prioritized, tokens), "random": _arm_counts(randomly, random_tokens)}
    p, r = arms["prioritized"], arms["random"]
    return {
        "bench": "loop",
        "mode": "real",
        "model": model.name,
        "pool": {"questions": len(pool), "levels": list(levels), "take": take, "k": k, "probe_k": probe_k},
        "arms": arms,
        "probe_tokens": probe_tokens,
        "labelable_ratio": (p["labelable_per_1k_tokens"] / r["labelable_per_1k_tokens"])
        if r["labelable_per_1k_tokens"]
        else None,
        "incorrect_ratio": (p["incorrect_per_1k_tokens"] / r["incorrect_per_1k_tokens"])
        if r["incorrect_per_1k_tokens"]
        else None,
        "wall_s": time.perf_counter() - started,
    }
