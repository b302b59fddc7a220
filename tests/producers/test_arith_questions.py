"""Specification of the ``arith`` question source (prmloop.producers.arith).

(Named ``test_arith_questions.py``, not ``test_arith.py``: the test folders have no ``__init__.py``,
so two test modules called ``test_arith`` would collide in pytest's default import mode.)
"""

from __future__ import annotations

import json

import pytest

from prmloop.models.arith import ARITH_DATASET, ArithChain, check_steps, generate_question
from prmloop.models.questions import Question
from prmloop.producers.arith import arith_questions


def test_questions_have_stable_ids_and_the_arith_dataset() -> None:
    questions = arith_questions(3, level=2, seed=5)
    assert [q.id for q in questions] == ["arith/L2/5/0", "arith/L2/5/1", "arith/L2/5/2"]
    assert {q.dataset for q in questions} == {ARITH_DATASET}
    assert arith_questions(3, level="L2", seed=5) == questions
    assert arith_questions(5, level=2, seed=5)[:3] == questions


def test_a_question_is_the_generated_question_with_its_gold_answer_as_text() -> None:
    [question] = arith_questions(1, level=4, seed=1)
    generated = generate_question(4, seed=1, index=0)
    assert question.problem == generated.problem
    assert question.gold_answer == str(generated.answer)
    assert question.metadata["level"] == 4
    assert question.metadata["seed"] == 1
    assert question.metadata["source"] == "arith L4"


def test_metadata_is_json_and_carries_a_chain_the_checker_reads_back() -> None:
    for level in (1, 3, 5):
        for question in arith_questions(4, level=level, seed=2):
            metadata = json.loads(json.dumps(question.metadata))
            assert metadata == question.metadata
            chain = ArithChain.from_json(metadata["chain"])
            assert str(chain.answer) == question.gold_answer
            check = check_steps(metadata["chain"], metadata["reference_steps"])
            assert (check.status, check.first_error_step) == ("exact", None)


def test_questions_survive_a_round_trip_through_their_json_form() -> None:
    [question] = arith_questions(1, level=5, seed=9)
    assert Question.model_validate_json(question.model_dump_json()) == question


def test_unknown_levels_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown arithmetic level"):
        arith_questions(2, level=0)
    with pytest.raises(ValueError, match="at least 0"):
        arith_questions(-1, level=1)
