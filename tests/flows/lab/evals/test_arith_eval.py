"""Specification of the arithmetic-curriculum measurement (prmloop.flows.pools.levels).

A scripted generator pins the arithmetic of the report (which solutions are correct, which errors are
located); the tiny random Llama of ``tests/conftest.py`` runs the real sampling path end to end.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from prmloop.flows.pools.levels import measure_arith_levels, recheck, write_report
from prmloop.models.answers import extract_answer
from prmloop.models.arith import find_equations, generate_question, reference_solution
from prmloop.models.backends.base import Completion, SamplingParams
from prmloop.models.backends.registry import BACKENDS, BackendConfig
from prmloop.models.prompts import ARITH_EXAMPLES, solution_prompt, step_format, stop_strings


class ScriptedGenerator:
    """Answers every question with its reference solution (sample 0) and a wrong first step (sample 1).

    It recognises the question by its text (the prompt ends with the problem and the response prefix).
    """

    model_name = "scripted"

    def __init__(self, level: int, n: int) -> None:
        self.questions = [generate_question(level, 0, i) for i in range(n)]

    def _solutions(self, prompt: str) -> list[str]:
        [question] = [q for q in self.questions if q.problem in prompt]
        good = "".join(f"Step {i + 1}: {s}\n" for i, s in enumerate(reference_solution(question)))
        first = question.chain.steps[0]
        bad = f"Step 1: {first.left} {first.op} {first.right} = {first.result + 1}\nStep 2: The final answer is: 0\n"
        return [good, bad]

    def generate(self, prompts: Sequence[str], params: SamplingParams | None = None) -> list[list[Completion]]:
        assert params is not None and params.n == 2
        return [
            [
                Completion(text=t, token_ids=(1, 2, 3), logprobs=(-1.0,) * 3, finish_reason="stop", prompt_tokens=9)
                for t in self._solutions(p)
            ]
            for p in prompts
        ]

    def rollouts(self, prefix: str, n: int, params: SamplingParams | None = None) -> list[Completion]:
        raise NotImplementedError

    def score(self, pairs: Sequence[tuple[str, str]]) -> list[object]:
        raise NotImplementedError


def test_the_report_counts_correct_solutions_and_exactly_located_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(BACKENDS, "scripted", lambda _config: ScriptedGenerator(level=3, n=3))
    seen: list[dict[str, object]] = []
    result = measure_arith_levels(
        [3], n_questions=3, k=2, backend={"backend": "scripted"}, questions_per_call=2, progress=seen.append
    )
    [level] = result["levels"]
    assert level["level"] == 3
    assert (level["solutions"], level["correct"], level["accuracy"], level["pass_at_k"]) == (6, 3, 0.5, 1.0)
    # Every wrong solution has a false equation in step 0, after nothing: located exactly.
    assert (level["exact_first_error"], level["exact_first_error_fraction"]) == (3, 1.0)
    assert level["exact_all_correct_fraction"] == 1.0
    assert level["no_answer"] == 0
    assert level["completion_tokens"] == 18
    wrong = [s for s in result["solutions"] if not s["correct"]]
    assert {(s["check_status"], s["first_error_step"]) for s in wrong} == {("exact", 0)}
    # One progress report per generate call (2 questions, then 1).
    assert [p["questions_done"] for p in seen] == [2, 3]


def test_a_tiny_random_model_runs_the_whole_measurement_and_the_report_is_json(
    tiny_backend_config: BackendConfig, tmp_path: Path
) -> None:
    result = measure_arith_levels(
        [1, "L5"], n_questions=2, k=2, max_new_tokens=12, backend=tiny_backend_config, questions_per_call=2
    )
    assert [level["level"] for level in result["levels"]] == [1, 5]
    for level in result["levels"]:
        assert level["solutions"] == 4
        assert 0.0 <= level["accuracy"] <= 1.0
        assert level["completion_tokens"] > 0 and level["tokens_per_s"] > 0
    assert {s["check_status"] for s in result["solutions"]} <= {"exact", "unknown"}
    assert result["config"]["prompt_format"] == "step_k_arith"
    path = write_report(result, tmp_path / "out" / "arith_levels.json")
    assert json.loads(path.read_text())["levels"] == result["levels"]


def test_the_arithmetic_prompt_is_plain_step_k_with_the_curriculum_examples() -> None:
    problem = "Tom has 3 apples. He buys 4 more apples. How many apples does Tom have now?"
    prompt = solution_prompt(object(), problem, "step_k_arith")
    assert prompt.endswith(f"Question: {problem}\n")
    assert prompt.count("Question:") == len(ARITH_EXAMPLES) + 1
    assert "Step 1: The bags hold 4 * 3 = 12 shells.\nStep 2: He loses 2, so 12 - 2 = 10 shells.\n" in prompt
    assert "Step 3: The final answer is: 10\n" in prompt
    assert "right triangle" not in prompt  # EpicPRM's MATH examples are replaced, not added to
    # The model's next line is a step; a new "Question:" block or a blank line ends the solution.
    assert all(stop in prompt for stop in stop_strings("step_k_arith"))
    assert step_format("step_k_arith") == "step_k"


def test_the_few_shot_examples_are_right_by_the_checker_own_rules() -> None:
    for example in ARITH_EXAMPLES:
        steps, final = example.steps, example.final_answer
        equations = [e for s in steps for e in find_equations(s)]
        assert equations and all(e.holds for e in equations)
        assert extract_answer(final) == str(equations[-1].results()[0])


def test_the_report_can_use_the_few_shot_prompt(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(BACKENDS, "scripted", lambda _config: ScriptedGenerator(level=1, n=2))
    result = measure_arith_levels(
        [1], n_questions=2, k=2, backend={"backend": "scripted"}, prompt_format="step_k_arith"
    )
    assert result["levels"][0]["accuracy"] == 0.5
    assert result["config"]["prompt_format"] == "step_k_arith"


def test_recheck_recomputes_verdicts_from_the_kept_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(BACKENDS, "scripted", lambda _config: ScriptedGenerator(level=3, n=3))
    result = measure_arith_levels([3], n_questions=3, k=2, backend={"backend": "scripted"})
    stale = {
        **result,
        "solutions": [{**row, "check_status": "unknown", "first_error_step": None} for row in result["solutions"]],
    }
    stale["levels"] = [{**result["levels"][0], "exact_first_error": 0}]
    fresh = recheck(stale)
    assert fresh["levels"] == result["levels"]
    assert [r["first_error_step"] for r in fresh["solutions"]] == [r["first_error_step"] for r in result["solutions"]]
