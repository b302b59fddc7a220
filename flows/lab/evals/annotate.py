"""``prmloop eval annotate``: label ProcessBench solutions with a real completer and compare with humans.

ProcessBench (``../shared/data/processbench/{gsm8k,math}.json``) gives, per solution, its steps, whether
its final answer is correct and the 0-based index of the first wrong step as judged by human experts
(-1: no wrong step). The gold answers are not in the file; they are looked up by problem text in
GSM8K test (``gsm8k`` subset) or MATH test (``math`` subset).

The annotation runs the same pieces as the annotator service
(:func:`~prmloop.consumers.annotator.build_annotator`): a :class:`GeneratorCompleter` over the
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
from typing import Any, Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from prmloop.consumers.annotator import AnnotatorSettings, build_annotator
from prmloop.models.processbench import load_processbench
from prmloop.models.questions import data_dir

__all__ = ["SERVICE_ONLY_ALL", "EvalAnnotateSettings", "evaluate_processbench"]


class EvalAnnotateSettings(AnnotatorSettings):
    """``prmloop eval annotate``: the annotator's options (smaller sample counts for a CPU) and the file."""

    model_config = SettingsConfigDict(env_prefix="PRMLOOP_EVAL_ANNOTATE_", frozen=True, extra="ignore")

    dataset: Literal["processbench", "arith"] = Field(
        default="processbench",
        description="processbench (human first errors) or arith (the model's own solutions, exact first errors)",
    )
    file: Path | None = Field(default=None, description="ProcessBench file (default: processbench/gsm8k.json)")
    limit: int = Field(default=5, ge=1, description="solutions with a wrong final answer to label")
    levels: str = Field(default="1,2,3", description="arith: curriculum levels to sample, comma-separated")
    strategies: str | None = Field(
        default=None,
        description=(
            "arith: strategies to compare, comma-separated, each NAME or NAME:WEIGHTING "
            "(default: sequential, binary, adaptive_binary, adaptive_binary:count, uncertainty_driven, bisection)"
        ),
    )
    k: int = Field(
        default=4, ge=1, description="arith: solutions sampled per question", json_schema_extra={"flag": "-k"}
    )
    sample_temperature: float = Field(default=0.7, ge=0.0, description="arith: temperature of the sampled solutions")
    rollouts: int = Field(default=8, ge=1, description="sequential/binary: rollouts per state (hard MC)")
    n0: int = Field(default=8, ge=1, description="adaptive sampling: first rollouts of a state (N0)")
    n_min: int = Field(default=4, ge=0, description="adaptive sampling: grow until this many correct (N_min)")
    n_max: int = Field(default=16, ge=1, description="adaptive sampling: at most this many rollouts (N_max)")
    max_new_tokens: int = Field(default=256, ge=1, description="rollout budget; longer rollouts count as wrong")
    out: Path | None = Field(default=None, description="also write the whole report (every solution) as JSON here")


#: Service options that mean nothing for a one-off evaluation (no topic, no group, no simulator).
SERVICE_ONLY = ("completer", "group", "topic", "until_idle", "max_solutions", "sim_latency")
SERVICE_ONLY_ALL = (*SERVICE_ONLY, "sim_n", "sim_seed", "correlation")


def evaluate_processbench(
    settings: EvalAnnotateSettings, *, progress: Callable[[dict[str, Any]], None] | None = None
) -> dict[str, Any]:
    """Annotate the first ``settings.limit`` ProcessBench solutions with a wrong final answer and a human
    label, with the annotator's own strategy and completer (:func:`~prmloop.consumers.annotator.build_annotator`).

    Returns the agreement and cost summary plus one row per solution (``per_solution``).
    """
    from prmloop.models.annotation.completer import GeneratorCompleter
    from prmloop.models.annotation.strategies import SolutionToLabel, annotate
    from prmloop.models.prompts import solution_prompt
    from prmloop.models.scoring import teacher_forced_logprobs
    from prmloop.models.uncertainty import step_uncertainty, uncertainty_deltas

    path = settings.file or data_dir() / "processbench" / "gsm8k.json"
    items, _ = load_processbench(path)
    usable = [i for i in items if i.gold_answer is not None]
    chosen = [i for i in usable if not i.final_answer_correct and i.label >= 0][: settings.limit]
    if not chosen:
        raise ValueError(f"{path}: no solution with a wrong final answer, a human label and a known gold answer")
    strategy, completers, _refs, checker = build_annotator(settings.model_copy(update={"completer": "model"}))
    [completer] = completers
    assert isinstance(completer, GeneratorCompleter)
    engine = completer.generator
    style = settings.prompt_format
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    for item in chosen:
        deltas = None
        if settings.strategy in ("uncertainty_driven", "bisection"):  # both read the Δu
            prompt = solution_prompt(engine, item.problem, style)
            logprobs, offsets = teacher_forced_logprobs(engine, prompt, item.steps, style)
            deltas = uncertainty_deltas(step_uncertainty(logprobs, offsets))
        solution = SolutionToLabel(item.problem, item.steps, item.gold_answer or "", False, deltas)
        result = annotate(solution, strategy, [completer], checker=checker)
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
        "strategy": settings.strategy,
        "sampling": {
            "n0": settings.n0,
            "n_min": settings.n_min,
            "n_max": settings.n_max,
            "rollouts": settings.rollouts,
            "max_new_tokens": settings.max_new_tokens,
        },
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
