"""Specification of the question loaders (prmloop.models.questions) on the real shared data files."""

from __future__ import annotations

from pathlib import Path

import pytest

from prmloop.models.grading import grade
from prmloop.models.questions import DATASETS, Question, data_dir, load_gsm8k, load_gsm_plus, load_questions


@pytest.mark.parametrize(
    ("dataset", "count", "first_id", "first_gold"),
    [
        ("gsm8k", 1319, "gsm8k/test/0", "18"),
        ("math500", 500, "math500/test/precalculus/807.json", r"\left( 3, \frac{\pi}{2} \right)"),
        ("math", 5000, "math/test/0", "2"),
        ("gsm_plus", 2100, "gsm_plus/testmini/0", "4.33"),
    ],
)
def test_each_dataset_loads_every_answerable_row_with_its_gold_answer(
    shared_data_dir: Path, dataset: str, count: int, first_id: str, first_gold: str
) -> None:
    questions = load_questions(dataset, root=shared_data_dir)
    assert len(questions) == count
    assert (questions[0].id, questions[0].dataset, questions[0].gold_answer) == (
        first_id,
        dataset,
        first_gold,
    )
    assert len({q.id for q in questions}) == count
    assert all(q.problem and q.gold_answer for q in questions)


def test_gsm8k_train_split_and_limit(shared_data_dir: Path) -> None:
    assert len(load_gsm8k("train", root=shared_data_dir)) == 7473
    assert [q.id for q in load_gsm8k(limit=2, root=shared_data_dir)] == ["gsm8k/test/0", "gsm8k/test/1"]


def test_gsm_plus_critical_thinking_items_have_no_gold_answer(shared_data_dir: Path) -> None:
    questions = load_gsm_plus(include_unanswerable=True, root=shared_data_dir)
    unanswerable = [q for q in questions if q.gold_answer is None]
    assert len(questions) == 2400
    assert len(unanswerable) == 300
    assert {q.metadata["perturbation_type"] for q in unanswerable} == {"critical thinking"}


def test_gsm8k_reference_solutions_grade_correct(shared_data_dir: Path) -> None:
    for question in load_gsm8k(limit=50, root=shared_data_dir):
        assert question.gold_answer is not None
        assert grade(f"{question.metadata['solution']}\n#### {question.gold_answer}", question.gold_answer).is_correct


def test_questions_are_frozen(shared_data_dir: Path) -> None:
    question = load_gsm8k(limit=1, root=shared_data_dir)[0]
    with pytest.raises(ValueError, match="frozen"):
        question.problem = "changed"
    assert Question.model_validate(question.model_dump()) == question


def test_data_dir_follows_the_environment_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRMLOOP_DATA_DIR", str(tmp_path))
    assert data_dir() == tmp_path
    with pytest.raises(FileNotFoundError, match="PRMLOOP_DATA_DIR"):
        load_gsm8k()


def test_a_malformed_line_is_reported_with_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "gsm8k").mkdir()
    path = tmp_path / "gsm8k" / "test.jsonl"
    path.write_text('{"question": "1+1?", "answer": "2\\n#### 2"}\n\n{"question": "oops"\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"test\.jsonl:3: not valid JSON"):
        load_gsm8k(root=tmp_path)


def test_a_row_without_a_gold_answer_is_reported_with_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "gsm8k").mkdir()
    path = tmp_path / "gsm8k" / "test.jsonl"
    path.write_text('{"question": "1+1?", "answer": "it is 2"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"test\.jsonl:1: GSM8K answer has no '#### <answer>' line"):
        load_gsm8k(root=tmp_path)
    path.write_text('{"question": "1+1?"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"test\.jsonl:1: missing or non-string field\(s\) \['answer'\]"):
        load_gsm8k(root=tmp_path)


def test_an_unknown_dataset_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="gsm8k"):
        load_questions("aime")
    assert set(DATASETS) == {"gsm8k", "math500", "math", "gsm_plus"}
