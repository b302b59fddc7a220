"""``prmloop eval annotate --dataset arith``: every annotation strategy against exact first errors.

ProcessBench gives human first-error labels, but the embedded model almost never reaches a GSM8K answer
from any state, so MC annotation with it says nothing there. The arithmetic curriculum
(:mod:`prmloop.models.arith`) gives something better for a laptop: the model's *own* solutions, whose
first wrong step :func:`~prmloop.models.arith.check_steps` locates exactly (a false equation, an
invented number, a wrong final answer), and questions the model solves often enough that rollouts from
a correct state reach the answer.

The evaluation samples ``k`` solutions of generated questions (the ``step_k_arith`` prompt, as the
sampling flow does for arith), keeps the first ``limit`` incorrect ones whose first error the checker
locates exactly, and labels each of them with every strategy in ``strategies`` through the annotator's
own pieces (:func:`~prmloop.consumers.annotator.build_annotator`: the completer continues the
solution's prompt, math-verify checks rollout answers; ``uncertainty_driven`` gets Δu from teacher
forcing on the same model, as the step scorer does). A strategy ``name:weighting`` overrides the MC
weighting (``adaptive_binary:count`` is plain MC, ``adaptive_binary`` MC-PPL; EpicPRM Eq. 1-2).

Per strategy: ``first_error_accuracy`` over all chosen solutions (an unresolved search counts as a
miss: it produced no label), ``labelled_accuracy`` over the labelled ones, ``within_one``, and the
ledger (rollouts, generated tokens, tokens per solution, wall time). The selection of solutions is the
same for every strategy, so differences come from the search and its labelling rule.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from prmloop.consumers.annotator import AnnotatorSettings, build_annotator

__all__ = ["DEFAULT_STRATEGIES", "choose_solutions", "evaluate_arith", "parse_strategies"]

DEFAULT_STRATEGIES = (
    "sequential",
    "binary",
    "adaptive_binary",
    "adaptive_binary:count",
    "uncertainty_driven",
    "bisection",
)


def parse_strategies(text: str | Sequence[str] | None) -> list[tuple[str, str | None]]:
    """``"sequential,adaptive_binary:count"`` as ``[("sequential", None), ("adaptive_binary", "count")]``.

    Raises:
        ValueError: an unknown strategy or weighting, naming it.
    """
    from typing import get_args

    from prmloop.models.annotation.estimate import Weighting
    from prmloop.models.annotation.strategies import STRATEGIES

    items = DEFAULT_STRATEGIES if text is None else (text.split(",") if isinstance(text, str) else text)
    parsed: list[tuple[str, str | None]] = []
    for item in (i.strip() for i in items if i.strip()):
        name, _, weighting = item.partition(":")
        if name not in STRATEGIES:
            raise ValueError(f"unknown strategy {name!r} in --strategies; choose from {', '.join(STRATEGIES)}")
        if weighting and weighting not in get_args(Weighting):
            choices = ", ".join(get_args(Weighting))
            raise ValueError(f"unknown weighting {weighting!r} in --strategies; choose from {choices}")
        parsed.append((name, weighting or None))
    if not parsed:
        raise ValueError("--strategies names no strategy")
    return parsed


def choose_solutions(rows: Sequence[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    """The first ``limit`` sampled solutions that state a wrong answer and whose first error the checker
    located exactly (rows of :func:`~prmloop.flows.pools.levels.measure_arith_levels`)."""
    chosen = [r for r in rows if r["answer"] is not None and not r["correct"] and r["check_status"] == "exact"]
    return chosen[:limit]


def evaluate_arith(
    settings: AnnotatorSettings,
    *,
    levels: Sequence[int],
    limit: int,
    k: int = 4,
    sample_temperature: float = 0.7,
    sample_tokens: int = 160,
    max_questions: int = 400,
    seed: int = 0,
    strategies: str | Sequence[str] | None = None,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Sample arith solutions until ``limit`` incorrect ones with exact first errors are found (or
    ``max_questions`` per level were tried), then label them with every strategy.

    Returns the summary (``strategies``: one row per strategy) with ``per_solution`` rows.
    """
    from prmloop.flows.pools.levels import measure_arith_levels
    from prmloop.models.annotation.completer import GeneratorCompleter
    from prmloop.models.annotation.strategies import SolutionToLabel, annotate
    from prmloop.models.prompts import solution_prompt
    from prmloop.models.scoring import teacher_forced_logprobs
    from prmloop.models.uncertainty import step_uncertainty, uncertainty_deltas

    parsed = parse_strategies(strategies)
    started = time.perf_counter()
    settings = settings.model_copy(update={"completer": "model", "prompt_format": "step_k_arith"})
    _, completers, _refs, checker = build_annotator(settings)
    [completer] = completers
    assert isinstance(completer, GeneratorCompleter)
    engine = completer.generator

    # 1. Sample until enough incorrect solutions with an exactly located first error are found.
    chosen: list[dict[str, Any]] = []
    sampled = 0
    batch = max(4, min(32, limit))
    offset = 0
    while len(chosen) < limit and offset < max_questions:
        result = measure_arith_levels(
            levels,
            n_questions=batch,
            k=k,
            max_new_tokens=sample_tokens,
            temperature=sample_temperature,
            prompt_format="step_k_arith",
            seed=seed,
            engine=engine,
            first_question=offset,
            questions_per_call=4,
        )
        sampled += len(result["solutions"])
        chosen = choose_solutions([*chosen, *result["solutions"]], limit)
        offset += batch
        if progress is not None:
            progress({"phase": "sampling", "solutions": sampled, "chosen": len(chosen), "limit": limit})
    if not chosen:
        raise ValueError(f"no incorrect arith solution with an exact first error in {sampled} samples; raise --limit")

    # 2. Δu for the uncertainty-driven search (teacher forcing, as the step scorer does).
    deltas: dict[int, tuple[float, ...]] = {}
    if any(name in ("uncertainty_driven", "bisection") for name, _ in parsed):
        for i, row in enumerate(chosen):
            prompt = solution_prompt(engine, row["problem"], "step_k_arith")
            logprobs, offsets = teacher_forced_logprobs(engine, prompt, row["steps"], "step_k")
            deltas[i] = tuple(uncertainty_deltas(step_uncertainty(logprobs, offsets)))

    # 3. Every strategy on the same solutions.
    per_solution: list[dict[str, Any]] = []
    summaries: list[dict[str, Any]] = []
    for name, weighting in parsed:
        label = name if weighting is None else f"{name}:{weighting}"
        strategy = settings.model_copy(update={"strategy": name, "weighting": weighting}).make_strategy()
        rows: list[dict[str, Any]] = []
        tick = time.perf_counter()

        def label_one(i: int, row: dict[str, Any], strategy: Any = strategy) -> Any:
            solution = SolutionToLabel(row["problem"], tuple(row["steps"]), row["gold_answer"], False, deltas.get(i))
            return annotate(solution, strategy, [completer], checker=checker)

        # --in-flight N: N solutions searched at once; their probes reach the engine as one batch.
        # Results are read in order while the pool works, so progress lines come as solutions finish.
        pool = ThreadPoolExecutor(max_workers=settings.in_flight)
        try:
            results = pool.map(label_one, range(len(chosen)), chosen)
            for row, result_i in zip(chosen, results, strict=True):
                out = {
                    "strategy": label,
                    "question_id": row["question_id"],
                    "sample": row["sample"],
                    "steps": len(row["steps"]),
                    "exact_first_error": row["first_error_step"],
                    "status": result_i.status,
                    "predicted_first_error": result_i.first_error_step,
                    "rollouts": result_i.cost.rollouts,
                    "generated_tokens": result_i.cost.generated_tokens,
                    "verified_steps": result_i.cost.verified_steps,
                    "estimates": [
                        (e.step_index, round(e.value, 3), e.rollouts, e.correct_rollouts) for e in result_i.estimates
                    ],
                }
                rows.append(out)
                if progress is not None:
                    progress(
                        {
                            "phase": label,
                            **{
                                k_: out[k_]
                                for k_ in (
                                    "question_id",
                                    "sample",
                                    "exact_first_error",
                                    "predicted_first_error",
                                    "status",
                                    "rollouts",
                                )
                            },
                        }
                    )
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        summaries.append(_summarise(label, strategy.parameters(), rows, time.perf_counter() - tick))
        per_solution.extend(rows)
    return {
        "dataset": "arith",
        "levels": list(levels),
        "model": engine.model_name,
        "sampled": sampled,
        "solutions": len(chosen),
        "sampling": {"k": k, "temperature": sample_temperature, "max_new_tokens": sample_tokens, "seed": seed},
        "rollout": {"temperature": settings.temperature, "max_new_tokens": settings.max_new_tokens},
        "exact_first_error_histogram": _histogram(r["first_error_step"] for r in chosen),
        "strategies": summaries,
        "wall_s": round(time.perf_counter() - started, 1),
        "per_solution": per_solution,
    }


def _summarise(label: str, parameters: dict[str, Any], rows: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    labelled = [r for r in rows if r["status"] == "labelled"]
    hits = [r for r in labelled if r["predicted_first_error"] == r["exact_first_error"]]
    near = [r for r in labelled if abs(r["predicted_first_error"] - r["exact_first_error"]) <= 1]
    tokens = sum(r["generated_tokens"] for r in rows)
    return {
        "strategy": label,
        "parameters": parameters,
        "solutions": len(rows),
        "labelled": len(labelled),
        "unresolved": sum(r["status"] == "unresolved" for r in rows),
        "first_error_accuracy": round(len(hits) / len(rows), 4) if rows else None,
        "labelled_accuracy": round(len(hits) / len(labelled), 4) if labelled else None,
        "within_one": round(len(near) / len(labelled), 4) if labelled else None,
        "too_late": sum(r["predicted_first_error"] > r["exact_first_error"] for r in labelled),
        "too_early": sum(r["predicted_first_error"] < r["exact_first_error"] for r in labelled),
        "rollouts": sum(r["rollouts"] for r in rows),
        "generated_tokens": tokens,
        "tokens_per_solution": round(tokens / len(rows), 1) if rows else None,
        "wall_s": round(seconds, 1),
    }


def _histogram(values: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for value in values:
        counts[str(value)] = counts.get(str(value), 0) + 1
    return dict(sorted(counts.items()))
