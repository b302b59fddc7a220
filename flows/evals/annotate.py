"""``prmloop eval annotate``: label ProcessBench solutions with a real completer and compare with humans.

ProcessBench (``../shared/data/processbench/{gsm8k,math}.json``) gives, per solution, its steps, whether
its final answer is correct and the 0-based index of the first wrong step as judged by human experts
(-1: no wrong step). The gold answers are not in the file; they are looked up by problem text in
GSM8K test (``gsm8k`` subset) or MATH test (``math`` subset).

The annotation runs the same pieces as the annotator service: a :class:`GeneratorCompleter` over the
configured backend, the chosen strategy, math-verify as the answer checker and, for
``uncertainty_driven``, Δu from teacher-forcing the solution on the same model (what the step scorer
does for imported data). Solutions with a wrong final answer are the ones an MC annotator labels;
ProcessBench solutions whose final answer is right but whose process is wrong are labelled all-correct
by outcome-based annotation (reported separately: MC labelling cannot see those errors).

A completer that never reaches the gold answer from the question alone (MC(s_0) = 0, counted as
``unresolved``; ``completer_solved_s0`` counts the others) cannot locate an error: such solutions get
no label. Agreement: ``first_error_accuracy`` (predicted first error == human label), ``step_accuracy`` (per-step
labels, steps before the first error True), ``within_one`` (|predicted - human| <= 1), over the
labelled solutions; cost: rollouts, generated tokens, verified states, wall time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prmloop.models.processbench import load_processbench
from prmloop.models.questions import data_dir

__all__ = ["evaluate_processbench"]


def evaluate_processbench(
    path: Path | None = None,
    *,
    limit: int = 5,
    strategy: str = "adaptive_binary",
    n0: int = 8,
    n_min: int = 4,
    n_max: int = 16,
    backend: dict[str, Any] | None = None,
    max_new_tokens: int = 256,
    temperature: float = 0.7,
    seed: int = 0,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Annotate the first ``limit`` ProcessBench solutions with a wrong final answer and a human label.

    Returns the agreement and cost summary plus one row per solution (``per_solution``).
    """
    from prmloop.models.annotation.completer import GeneratorCompleter, math_equivalent
    from prmloop.models.annotation.estimate import Sampling
    from prmloop.models.annotation.strategies import SolutionToLabel, annotate, make_strategy
    from prmloop.models.backends.base import SamplingParams
    from prmloop.models.backends.registry import BackendConfig, build_backend
    from prmloop.models.prompts import solution_prompt
    from prmloop.models.scoring import teacher_forced_logprobs
    from prmloop.models.uncertainty import step_uncertainty, uncertainty_deltas

    path = path or data_dir() / "processbench" / "gsm8k.json"
    items, _ = load_processbench(path)
    usable = [i for i in items if i.gold_answer is not None]
    chosen = [i for i in usable if not i.final_answer_correct and i.label >= 0][:limit]
    if not chosen:
        raise ValueError(f"{path}: no solution with a wrong final answer, a human label and a known gold answer")
    params: dict[str, Any] = (
        {"n": n0}
        if strategy in ("sequential", "binary")
        else {"sampling": Sampling(n0=n0, n_min_correct=n_min, n_max=n_max)}
    )
    chosen_strategy = make_strategy(strategy, **params)
    engine = build_backend(BackendConfig.model_validate(backend or {}))
    completer = GeneratorCompleter(
        engine, style="step_k", params=SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens), seed=seed
    )
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    for item in chosen:
        deltas = None
        if strategy == "uncertainty_driven":
            logprobs, offsets = teacher_forced_logprobs(
                engine,
                solution_prompt(engine, item.problem, "step_k"),
                item.steps,
                "step_k",
            )
            deltas = uncertainty_deltas(step_uncertainty(logprobs, offsets))
        solution = SolutionToLabel(item.problem, item.steps, item.gold_answer or "", False, deltas)
        result = annotate(solution, chosen_strategy, [completer], checker=math_equivalent)
        human = tuple(t < item.label for t in range(len(item.steps)))
        row = {
            "id": item.key,
            "steps": len(item.steps),
            "human_first_error": item.label,
            "status": result.status,
            "predicted_first_error": result.first_error_step,
            "step_agreement": (
                sum(a == b for a, b in zip(result.labels, human, strict=True)) / len(human) if result.labels else None
            ),
            "rollouts": result.cost.rollouts,
            "generated_tokens": result.cost.generated_tokens,
            "verified_steps": result.cost.verified_steps,
            "wall_s": round(result.cost.wall_time_s, 1),
            "failures": dict(result.cost.failures),
            "estimates": [(e.step_index, round(e.value, 3), e.rollouts, e.correct_rollouts) for e in result.estimates],
        }
        rows.append(row)
        if progress is not None:
            progress(row)
    labelled = [r for r in rows if r["status"] == "labelled"]
    outcome_blind = sum(1 for i in usable if i.final_answer_correct and i.label >= 0)
    return {
        "file": str(path),
        "model": engine.model_name,
        "strategy": strategy,
        "sampling": {"n0": n0, "n_min": n_min, "n_max": n_max, "max_new_tokens": max_new_tokens},
        "solutions": len(rows),
        "labelled": len(labelled),
        "unresolved": sum(r["status"] == "unresolved" for r in rows),
        "completer_solved_s0": sum(bool(r["estimates"]) and r["estimates"][0][3] > 0 for r in rows),
        # Agreement over the labelled solutions; None when none was labelled (not 0: nothing was compared).
        "first_error_accuracy": _share(labelled, lambda r: r["predicted_first_error"] == r["human_first_error"]),
        "within_one": _share(labelled, lambda r: abs(r["predicted_first_error"] - r["human_first_error"]) <= 1),
        "step_accuracy": round(sum(r["step_agreement"] for r in labelled) / len(labelled), 4) if labelled else None,
        "rollouts": sum(r["rollouts"] for r in rows),
        "generated_tokens": sum(r["generated_tokens"] for r in rows),
        "verified_steps": sum(r["verified_steps"] for r in rows),
        "wall_s": round(time.perf_counter() - started, 1),
        "outcome_blind_in_file": outcome_blind,
        "per_solution": rows,
    }


def _share(rows: list[dict[str, Any]], hit: Callable[[dict[str, Any]], bool]) -> float | None:
    return round(sum(hit(r) for r in rows) / len(rows), 4) if rows else None
