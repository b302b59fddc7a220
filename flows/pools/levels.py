"""Measure the arithmetic curriculum on a real generator: accuracy per level and how often the first
error of a wrong solution is located exactly.

Why. The laptop loop needs questions its embedded model (SmolLM2-135M-Instruct) *sometimes* solves:
Monte-Carlo step labels (EpicPRM Sec. 3.1; Qwen "Lessons", Sec. 2) come from rollouts that reach the
gold answer from some steps and not from others. :mod:`prmloop.models.arith` generates such questions
in levels; this evaluation samples ``k`` solutions of ``n_questions`` questions per level with the
same pieces the sampling flow uses (:func:`~prmloop.models.prompts.solution_prompt`, the backend's
``generate``, :func:`~prmloop.models.steps.split_steps`, :func:`~prmloop.models.answers.extract_answer`
and :func:`~prmloop.models.grading.grade`) and runs the exact checker
(:func:`~prmloop.models.arith.check_steps`) on every solution.

Per level it reports: ``accuracy`` (correct solutions / sampled), ``pass_at_k`` (questions with at
least one correct solution: the ones MC annotation can label), ``exact_first_error_fraction`` (among
solutions that are not correct, the fraction whose first wrong step the checker locates exactly),
``exact_first_error_fraction_quantities`` (the exact judge's reading: restatements in the question's
words vouched for) and ``_numbers`` / ``_lenient`` (looser readings, which locate more errors and
fewer of them right; see :func:`~prmloop.models.arith.check_steps`),
``exact_all_correct_fraction`` (among correct ones, the fraction the checker verifies step by step),
``mean_steps`` and ``tokens_per_s`` (completion tokens over generation wall time).

Measured (SmolLM2-135M-Instruct on transformers, 12 questions x 4 samples per level, 160 new tokens;
``python -m prmloop.flows.pools.levels --temperature T``):

- ``step_k`` (EpicPRM's chat prompt with its MATH examples), T=0.7: accuracy 10 / 4 / 2 / 2 / 0 % for
  levels 1-5 (133 of 240 solutions state no answer within 160 tokens);
- ``step_k_arith`` (the curriculum's four examples as plain text, the default here), T=0.7: 21 / 15 /
  2 / 4 / 0 %; T=0.3: 69 / 33 / 10 / 8 / 0 % (pass@4 92 / 58 / 17 / 17 / 0 %).

No Prefect, no bus, no database: a plain function, so a test can run it on a tiny random model and a
person can run it from a shell (see :func:`measure_arith_levels`).
"""

from __future__ import annotations

import json
import statistics
import time
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from prmloop.models.answers import extract_answer
from prmloop.models.arith import check_steps, generate_question, level_spec
from prmloop.models.backends.base import Generator, SamplingParams
from prmloop.models.backends.registry import BackendConfig, build_backend
from prmloop.models.grading import grade
from prmloop.models.prompts import PROMPT_FORMATS, PromptFormat, solution_prompt, step_format, stop_strings
from prmloop.models.steps import split_steps
from prmloop.producers.arith import arith_questions

__all__ = ["main", "measure_arith_levels", "recheck", "write_report"]


def _prompt(model: object, problem: str, prompt_format: PromptFormat) -> str:
    return solution_prompt(model, problem, prompt_format)


def _sampling_seed(question_id: str, seed: int) -> int:
    """A per-question sampling seed: reproducible, and different across questions and runs."""
    return zlib.crc32(f"{seed}/{question_id}".encode())


def _rate(numerator: int, denominator: int) -> float | None:
    return round(numerator / denominator, 4) if denominator else None


def measure_arith_levels(
    levels: Sequence[int | str] = (1, 2, 3, 4, 5),
    n_questions: int = 12,
    k: int = 4,
    *,
    threads: int = 1,
    max_new_tokens: int = 160,
    temperature: float = 0.7,
    prompt_format: PromptFormat = "step_k_arith",
    seed: int = 0,
    backend: BackendConfig | dict[str, Any] | None = None,
    questions_per_call: int = 1,
    keep_solutions: bool = True,
    engine: Generator | None = None,
    first_question: int = 0,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Sample ``k`` solutions of ``n_questions`` questions of each level and grade and check them.

    Args:
        levels: curriculum levels (see :data:`prmloop.models.arith.LEVELS`).
        n_questions: questions per level (``arith/L<level>/<seed>/0..n-1``).
        k: solutions per question.
        threads: torch CPU threads for the default backend (the embedded SmolLM2 on transformers).
        max_new_tokens, temperature: sampling budget and temperature.
        prompt_format: ``step_k`` (EpicPRM's 2-shot prompt), ``double_newline`` (Qwen's), or
            ``step_k_arith`` (:func:`~prmloop.models.prompts.arith_prompt`: plain text, arithmetic examples).
        seed: question seed, also mixed into each question's sampling seed.
        backend: a backend configuration; ``None`` means SmolLM2 on transformers with ``threads``.
        questions_per_call: questions sampled in one ``generate`` call (``questions_per_call * k``
            sequences decode together, which is faster per token on a CPU).
        keep_solutions: include every sampled solution with its check in the result.
        engine: an already loaded generator (``backend`` and ``threads`` are then not used).
        first_question: skip the first questions of each level (``arith/L<level>/<seed>/<first>..``).
        progress: called with a small dict after every ``generate`` call.

    Returns:
        ``{"config": ..., "levels": [per-level summary, ...], "solutions": [...]}`` (JSON-able).
    """
    if k < 1 or n_questions < 1 or questions_per_call < 1:
        raise ValueError("k, n_questions and questions_per_call must be at least 1")
    config = (
        BackendConfig(backend="transformers", model="smollm2", options={"num_threads": threads})
        if backend is None
        else BackendConfig.model_validate(backend)
    )
    split_style = step_format(prompt_format)
    started = time.perf_counter()
    if engine is None:
        engine = build_backend(config)
    load_s = time.perf_counter() - started
    summaries: list[dict[str, Any]] = []
    solutions: list[dict[str, Any]] = []
    for level in levels:
        spec = level_spec(level)
        questions = arith_questions(first_question + n_questions, level=spec.level, seed=seed)[first_question:]
        rows: list[dict[str, Any]] = []
        generation_s = 0.0
        tokens = 0
        for start in range(0, len(questions), questions_per_call):
            batch = questions[start : start + questions_per_call]
            prompts = [_prompt(engine, q.problem, prompt_format) for q in batch]
            params = SamplingParams(
                n=k,
                max_new_tokens=max_new_tokens,
                temperature=temperature,
                stop=stop_strings(prompt_format),
                seed=_sampling_seed(batch[0].id, seed),
            )
            tick = time.perf_counter()
            completions = engine.generate(prompts, params)
            generation_s += time.perf_counter() - tick
            for question, samples in zip(batch, completions, strict=True):
                assert question.gold_answer is not None  # generated questions always have one
                chain = question.metadata["chain"]
                assert isinstance(chain, dict)
                for sample_index, completion in enumerate(samples):
                    tokens += completion.completion_tokens
                    steps = [s.text for s in split_steps(completion.text, split_style)]
                    answer = extract_answer(completion.text)
                    correct = answer is not None and grade(answer, question.gold_answer).is_correct
                    rows.append(
                        {
                            "question_id": question.id,
                            "level": spec.level,
                            "sample": sample_index,
                            "problem": question.problem,
                            "gold_answer": question.gold_answer,
                            "text": completion.text,
                            "steps": steps,
                            "answer": answer,
                            "correct": correct,
                            **_check_fields(chain, steps, question.problem),
                            "tokens": completion.completion_tokens,
                            "finish_reason": completion.finish_reason,
                        }
                    )
            if progress is not None:
                progress(
                    {
                        "level": spec.level,
                        "questions_done": min(start + questions_per_call, len(questions)),
                        "questions": len(questions),
                        "solutions": len(rows),
                        "correct": sum(r["correct"] for r in rows),
                        "elapsed_s": round(time.perf_counter() - started, 1),
                    }
                )
        summaries.append(
            _summarise(
                spec.level, spec.description, rows, n_questions=n_questions, k=k, tokens=tokens, seconds=generation_s
            )
        )
        if keep_solutions:
            solutions.extend(rows)
    return {
        "config": {
            "levels": [level_spec(level).level for level in levels],
            "n_questions": n_questions,
            "k": k,
            "seed": seed,
            "max_new_tokens": max_new_tokens,
            "temperature": temperature,
            "prompt_format": prompt_format,
            "backend": config.model_dump(mode="json"),
            "model_name": engine.model_name,
            "questions_per_call": questions_per_call,
            "load_s": round(load_s, 1),
            "total_s": round(time.perf_counter() - started, 1),
        },
        "levels": summaries,
        "solutions": solutions,
    }


def _check_fields(chain: Any, steps: list[str], problem: str | None = None) -> dict[str, Any]:
    """The checker's verdict as report fields: the default (``strictness="equations"``) and, with a
    suffix, ``quantities`` (the exact judge's: restatements held to ``problem``'s words) and the looser
    ``numbers`` and ``lenient`` readings (see :func:`~prmloop.models.arith.check_steps`)."""
    check = check_steps(chain, steps, problem=problem)
    fields: dict[str, Any] = {
        "check_status": check.status,
        "first_error_step": check.first_error_step,
        "wrong_step": check.wrong_step,
        "check_reason": check.reason,
        "verdicts": list(check.verdicts),
    }
    for strictness in ("quantities", "numbers", "lenient"):
        other = check_steps(chain, steps, strictness=strictness, problem=problem)
        fields[f"check_status_{strictness}"] = other.status
        fields[f"first_error_step_{strictness}"] = other.first_error_step
    return fields


def recheck(result: dict[str, Any]) -> dict[str, Any]:
    """Re-run the checker on the solutions a report kept, without sampling again.

    For a report written before a change to :func:`~prmloop.models.arith.check_steps`: the chain is
    regenerated from each question id (``arith/L<level>/<seed>/<index>``); token counts and timings
    are kept from the original summaries.
    """
    rows = [dict(row) for row in result["solutions"]]
    for row in rows:
        _, level, seed, index = row["question_id"].split("/")
        question = generate_question(int(level.removeprefix("L")), int(seed), int(index))
        row.update(_check_fields(question.chain.to_json(), row["steps"], question.problem))
    summaries = []
    for old in result["levels"]:
        level_rows = [row for row in rows if row["level"] == old["level"]]
        summary = _summarise(
            old["level"],
            old["description"],
            level_rows,
            n_questions=old["n_questions"],
            k=old["k"],
            tokens=old["completion_tokens"],
            seconds=old["generation_s"],
        )
        # Timings are the sampling run's, not recomputed from the rounded seconds.
        summary["tokens_per_s"] = old["tokens_per_s"]
        summaries.append(summary)
    return {**result, "levels": summaries, "solutions": rows}


def _summarise(
    level: int, description: str, rows: list[dict[str, Any]], *, n_questions: int, k: int, tokens: int, seconds: float
) -> dict[str, Any]:
    correct = [r for r in rows if r["correct"]]
    not_correct = [r for r in rows if not r["correct"]]
    wrong_answer = [r for r in not_correct if r["answer"] is not None]
    located = [r for r in not_correct if r["check_status"] == "exact" and r["first_error_step"] is not None]
    verified = [r for r in correct if r["check_status"] == "exact" and r["first_error_step"] is None]
    located_by = {
        strictness: sum(
            r.get(f"check_status_{strictness}") == "exact" and r.get(f"first_error_step_{strictness}") is not None
            for r in not_correct
        )
        for strictness in ("quantities", "numbers", "lenient")
    }
    solved = {r["question_id"] for r in correct}
    return {
        "level": level,
        "description": description,
        "n_questions": n_questions,
        "k": k,
        "solutions": len(rows),
        "correct": len(correct),
        "accuracy": _rate(len(correct), len(rows)),
        "pass_at_k": _rate(len(solved), n_questions),
        "not_correct": len(not_correct),
        "no_answer": len(not_correct) - len(wrong_answer),
        "exact_first_error": len(located),
        "exact_first_error_fraction": _rate(len(located), len(not_correct)),
        "exact_first_error_fraction_quantities": _rate(located_by["quantities"], len(not_correct)),
        "exact_first_error_fraction_numbers": _rate(located_by["numbers"], len(not_correct)),
        "exact_first_error_fraction_lenient": _rate(located_by["lenient"], len(not_correct)),
        "exact_first_error_fraction_wrong_answer": _rate(
            sum(r["first_error_step"] is not None and r["check_status"] == "exact" for r in wrong_answer),
            len(wrong_answer),
        ),
        "correct_with_error_found": sum(r["wrong_step"] is not None for r in correct),
        "exact_all_correct_fraction": _rate(len(verified), len(correct)),
        "mean_steps": round(statistics.fmean(len(r["steps"]) for r in rows), 2) if rows else None,
        "completion_tokens": tokens,
        "generation_s": round(seconds, 1),
        "tokens_per_s": round(tokens / seconds, 1) if seconds > 0 else None,
    }


def write_report(result: dict[str, Any], path: str | Path) -> Path:
    """Write :func:`measure_arith_levels`' result as JSON (parent folders created)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m prmloop.flows.pools.levels``: run :func:`measure_arith_levels`, print the table, save JSON."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m prmloop.flows.pools.levels", description=main.__doc__)
    parser.add_argument("--levels", nargs="+", default=["1", "2", "3", "4", "5"])
    parser.add_argument("--n-questions", type=int, default=12)
    parser.add_argument("-k", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--prompt-format", choices=list(PROMPT_FORMATS), default="step_k_arith")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--questions-per-call", type=int, default=4)
    parser.add_argument("--out", default="out/arith_levels.json")
    args = parser.parse_args(argv)
    result = measure_arith_levels(
        args.levels,
        args.n_questions,
        args.k,
        threads=args.threads,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        prompt_format=args.prompt_format,
        seed=args.seed,
        questions_per_call=args.questions_per_call,
        progress=lambda p: print(json.dumps(p), flush=True),
    )
    path = write_report(result, args.out)
    columns = (
        "level",
        "accuracy",
        "pass_at_k",
        "exact_first_error_fraction",
        "mean_steps",
        "solutions",
        "tokens_per_s",
    )
    print("\t".join(columns))
    for level in result["levels"]:
        print("\t".join(str(level[c]) for c in columns))
    print(f"saved {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
