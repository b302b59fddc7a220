"""The exact checker as a judge (models/arith/verifier.py) and in the judge service's handler."""

from __future__ import annotations

import re

from prmloop.consumers.judge import EXACT_JUDGE_NAME, JudgeHandler, JudgeSettings, build_judge
from prmloop.models.arith import arith_question_id
from prmloop.models.arith.curriculum import generate_question
from prmloop.models.arith.verifier import CHECKER_RULES, ExactVerifier, chain_of
from prmloop.store.events import Envelope, ModelRef, StepsJudged, StepsScored, make_event
from prmloop.store.kafka.runtime import ConsumedEvent


def _wrong_at(steps: list[str], k: int) -> list[str]:
    """Step ``k`` with its result off by one (``a op b = r`` -> ``= r+1``)."""
    out = list(steps)
    match = re.search(r"=\s*(-?\d+)", out[k])
    assert match, out[k]
    value = int(match.group(1)) + 1
    out[k] = out[k][: match.start(1)] + str(value) + out[k][match.end(1) :]
    return out


def test_chain_is_rebuilt_from_the_question_id() -> None:
    question = generate_question(2, 7, 3)
    assert chain_of(arith_question_id(2, 7, 3)) == question.chain
    assert chain_of("gsm8k/test/3") is None and chain_of("arith/L2/7/x") is None


def test_verdicts_on_reference_and_corrupted_solutions() -> None:
    verifier = ExactVerifier()
    question = generate_question(4, 0, 1)
    qid = arith_question_id(4, 0, 1)
    steps = list(question.reference_steps)
    equations = [k for k, step in enumerate(steps) if "=" in step]
    assert len(equations) >= 2
    right = verifier.judge_question(qid, steps)
    assert right.decided and right.first_error_step is None
    second = equations[1]
    wrong = verifier.judge_question(qid, _wrong_at(steps, second))
    assert wrong.decided and wrong.first_error_step == second
    assert not verifier.judge_question("gsm8k/test/0", steps).decided


def test_the_service_publishes_exact_verdicts_without_a_model() -> None:
    judge, ref = build_judge(JudgeSettings(method="exact"))
    assert isinstance(judge, ExactVerifier) and ref == ModelRef(backend="exact", name=EXACT_JUDGE_NAME)
    question = generate_question(1, 0, 0)
    steps = _wrong_at(list(question.reference_steps), 0)
    scored = StepsScored(
        solution_id="s1",
        question_id=arith_question_id(1, 0, 0),
        scorer=ModelRef(backend="test", name="t"),
        step_uncertainty=None,
        uncertainty_delta=None,
        step_order=None,
        problem=question.problem,
        steps=tuple(steps),
        correct=False,
        gold_answer=str(question.answer),
    )
    published: list[Envelope] = []
    handler = JudgeHandler(judge, ref, published.extend)
    assert list(handler([ConsumedEvent(make_event(scored, producer="test"), "steps.scored", 0, 0, 0)])) == []
    [event] = published
    payload = event.payload
    assert isinstance(payload, StepsJudged) and payload.method == "exact"
    assert payload.first_error_step == 0 and payload.verdicts == (False,) * len(steps)
    assert payload.parameters == {"strictness": "quantities", "rules": CHECKER_RULES}
    assert payload.reason is None  # decided: no reason to give


def test_an_undecided_solution_keeps_its_verified_prefix_and_says_why() -> None:
    question = generate_question(1, 0, 0)
    chain = question.chain
    a, b = chain.steps[0].left, chain.steps[0].right
    name = question.problem.split()[0]
    # Step 0 restates the question, step 1 states no number, step 2 is wrong: the error is found but
    # not located (step 1 could be anything), so the judge decides nothing and says why.
    steps = [f"{name} has {a} {question.problem.split()[3]}", "Then something happens.", f"{a} + {b} = {a + b + 1}"]
    verdict = ExactVerifier().judge_question(arith_question_id(1, 0, 0), steps)
    assert not verdict.decided and verdict.verdicts == (True, None, None)
    assert "step 1 before it could not be verified (states no number" in verdict.reason
    assert verdict.step_reasons[0] == "verified"
    published: list[Envelope] = []
    handler = JudgeHandler(ExactVerifier(), ModelRef(backend="exact", name=EXACT_JUDGE_NAME), published.extend)
    scored = StepsScored(
        solution_id="s2",
        question_id=arith_question_id(1, 0, 0),
        scorer=ModelRef(backend="test", name="t"),
        step_uncertainty=None,
        uncertainty_delta=None,
        step_order=None,
        problem=question.problem,
        steps=tuple(steps),
        correct=False,
        gold_answer=str(question.answer),
    )
    list(handler([ConsumedEvent(make_event(scored, producer="test"), "steps.scored", 0, 0, 0)]))
    [event] = published
    payload = event.payload
    assert isinstance(payload, StepsJudged)
    assert payload.first_error_step is None and payload.verdicts == (True, None, None)
    assert payload.reason == verdict.reason and payload.cost.failures == {"undecided": 1}
    assert handler.counts["undecided"] == 1


def test_the_strictness_is_the_judge_s_setting() -> None:
    judge, _ = build_judge(JudgeSettings(method="exact", strictness="equations"))
    assert isinstance(judge, ExactVerifier) and judge.parameters()["strictness"] == "equations"
    question = generate_question(1, 0, 0)
    steps = [question.problem.split(".")[0] + ".", *question.reference_steps]
    assert not judge.judge_question(arith_question_id(1, 0, 0), steps).decided  # a restatement vouches for nothing
    assert ExactVerifier().judge_question(arith_question_id(1, 0, 0), steps).decided
