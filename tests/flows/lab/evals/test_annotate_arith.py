"""``eval annotate --dataset arith``: every strategy labels the same solutions against exact first errors.

A scripted world pins the truth: each question is answered once by its reference solution and once
with a wrong first equation; a rollout reaches the gold answer exactly when its state holds no wrong
equation. Every search must then put the first error at step 0, and the report must say so per
strategy, with the ledger of each.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from typer.testing import CliRunner

from prmloop.consumers.annotator import AnnotatorSettings
from prmloop.flows.lab.evals.annotate_arith import choose_solutions, evaluate_arith, parse_strategies
from prmloop.models.arith import generate_question, reference_solution
from prmloop.models.backends.base import Completion, SamplingParams
from prmloop.models.backends.registry import BACKENDS


class ScriptedWorld:
    model_name = "scripted-world"

    def __init__(self, level: int, n: int) -> None:
        self.questions = [generate_question(level, 0, i) for i in range(n)]
        self.rollout_calls = 0

    def _question(self, prompt: str):  # type: ignore[no-untyped-def]
        # The prompt ends with its own question (the few-shot examples come before it).
        return max((q for q in self.questions if q.problem in prompt), key=lambda q: prompt.rindex(q.problem))

    def generate(self, prompts: Sequence[str], params: SamplingParams | None = None) -> list[list[Completion]]:
        assert params is not None
        out = []
        for prompt in prompts:
            question = self._question(prompt)
            good = "".join(f"Step {i + 1}: {s}\n" for i, s in enumerate(reference_solution(question)))
            first = question.chain.steps[0]
            bad = (
                f"Step 1: {first.left} {first.op} {first.right} = {first.result + 1}\nStep 2: The final answer is: 0\n"
            )
            texts = [good, bad] * params.n
            out.append([Completion(t, (1, 2, 3), (-1.0,) * 3, "stop", 9) for t in texts[: params.n]])
        return out

    def rollouts(self, prefix: str, n: int, params: SamplingParams | None = None) -> list[Completion]:
        self.rollout_calls += 1
        question = self._question(prefix)
        first = question.chain.steps[0]
        poisoned = f"= {first.result + 1}\n" in prefix.rsplit(question.problem, maxsplit=1)[-1]
        answer = "0" if poisoned else str(question.answer)
        return [Completion(f"The final answer is: {answer}", (1, 2), (-0.5, -0.5), "stop", 9)] * n


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> ScriptedWorld:
    instance = ScriptedWorld(level=3, n=64)
    monkeypatch.setitem(BACKENDS, "scripted", lambda _config: instance)
    return instance


def test_every_strategy_finds_the_exact_first_error_of_the_same_solutions(world: ScriptedWorld) -> None:
    settings = AnnotatorSettings(backend="scripted", rollouts=4, n0=4, n_min=1, n_max=8)
    seen: list[dict[str, object]] = []
    report = evaluate_arith(
        settings, levels=[3], limit=3, k=2, strategies="sequential,binary,adaptive_binary:count", progress=seen.append
    )
    assert report["solutions"] == 3 and report["exact_first_error_histogram"] == {"0": 3}
    rows = {row["strategy"]: row for row in report["strategies"]}
    assert list(rows) == ["sequential", "binary", "adaptive_binary:count"]
    for row in rows.values():
        assert row["labelled"] == 3 and row["first_error_accuracy"] == 1.0 and row["too_late"] == 0
        assert row["rollouts"] > 0 and row["tokens_per_solution"] > 0
    assert rows["adaptive_binary:count"]["parameters"]["weighting"] == "count"
    # Sequential probes the state after step 1 first; it already fails: 1 state x N=4 rollouts each.
    assert rows["sequential"]["rollouts"] == 3 * 1 * 4
    solutions = {(r["question_id"], r["sample"]) for r in report["per_solution"]}
    assert len(solutions) == 3  # the same three solutions for every strategy
    assert any(p["phase"] == "sampling" for p in seen) and any(p["phase"] == "binary" for p in seen)


def test_only_wrong_answers_with_an_exact_first_error_are_chosen() -> None:
    rows = [
        {"answer": "3", "correct": True, "check_status": "exact"},
        {"answer": None, "correct": False, "check_status": "exact"},
        {"answer": "4", "correct": False, "check_status": "unknown"},
        {"answer": "5", "correct": False, "check_status": "exact", "id": "a"},
        {"answer": "6", "correct": False, "check_status": "exact", "id": "b"},
    ]
    assert [r["id"] for r in choose_solutions(rows, 1)] == ["a"]
    assert [r["id"] for r in choose_solutions(rows, 5)] == ["a", "b"]


def test_strategy_lists_are_checked_and_named() -> None:
    assert parse_strategies("sequential, adaptive_binary:count") == [("sequential", None), ("adaptive_binary", "count")]
    assert [name for name, _ in parse_strategies(None)][-1] == "bisection" and len(parse_strategies(None)) == 6
    with pytest.raises(ValueError, match="unknown strategy 'bisect'"):
        parse_strategies("bisect")
    with pytest.raises(ValueError, match="unknown weighting 'ppl'"):
        parse_strategies("binary:ppl")


def test_the_command_reports_one_json_line_and_refuses_a_bad_strategy(world: ScriptedWorld, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    from prmloop.flows.cli import app

    runner = CliRunner()
    args = ["eval", "annotate", "--dataset", "arith", "--backend", "scripted", "--levels", "3", "--limit", "2"]
    result = runner.invoke(app, [*args, "--strategies", "binary", "--rollouts", "2", "--out", str(tmp_path / "r.json")])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["strategies"][0]["first_error_accuracy"] == 1.0 and "per_solution" not in summary
    assert len(json.loads((tmp_path / "r.json").read_text())["per_solution"]) == 2
    bad = runner.invoke(app, [*args, "--strategies", "bisect"])
    assert bad.exit_code == 2 and "bisect" in bad.output


def test_solutions_searched_in_flight_get_the_same_labels(world: ScriptedWorld) -> None:
    serial = AnnotatorSettings(backend="scripted", rollouts=4, n0=4, n_min=1, n_max=8)
    one = evaluate_arith(serial, levels=[3], limit=4, k=2, strategies="binary")
    four = evaluate_arith(serial.model_copy(update={"in_flight": 4}), levels=[3], limit=4, k=2, strategies="binary")
    key = [("question_id", "sample", "predicted_first_error", "rollouts")]
    assert [tuple(r[k] for k in key[0]) for r in one["per_solution"]] == [
        tuple(r[k] for k in key[0]) for r in four["per_solution"]
    ]
