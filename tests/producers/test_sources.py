"""Question sources: bad lines of a question file are reported by line and cost nothing else."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from prmloop.producers.prioritize import PrioritizeSettings
from prmloop.producers.sampler import SampleSettings
from prmloop.producers.sources import (
    DATASET_NAMES,
    MAX_LINE_BYTES,
    QuestionFileError,
    check_source,
    load_source,
    read_question_file,
)


def write_lines(path: Path, lines: Sequence[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_question_file_reports_bad_lines_and_keeps_the_good_ones(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "q.jsonl",
        [
            json.dumps({"id": "a", "problem": "1+1?", "answer": "2"}),
            "{not json",
            json.dumps({"id": "b", "problem": "2+2?"}),
            json.dumps({"id": "a", "problem": "again", "answer": "3"}),
            "",
            json.dumps({"problem": "no id", "answer": "1"}),
            json.dumps({"id": "c", "question": "3+3?", "gold_answer": 6}),
        ],
    )
    questions, errors = read_question_file(path)
    assert [q.id for q in questions] == ["a", "c"]
    assert questions[1].gold_answer == "6" and questions[1].problem == "3+3?"
    assert [e.split(": ", 1)[0] for e in errors] == [f"{path}:{n}" for n in (2, 3, 4, 6)]
    assert "not valid JSON" in errors[0]
    assert "gold_answer" in errors[1] and "Field required" in errors[1]
    assert "duplicate id 'a' (first on line 1)" in errors[2]
    assert "id: Field required" in errors[3]


def test_hostile_lines_are_reported_one_by_one_and_valid_lines_still_load(tmp_path: Path) -> None:
    path = tmp_path / "hostile.jsonl"
    good = json.dumps({"id": "ok", "problem": "1+1?", "answer": "2"}).encode()
    lines = [
        good,
        b'{"id": "latin1", "problem": "caf\xe9", "answer": "1"}',  # not UTF-8
        b"[" * 100_000 + b"]" * 100_000,  # nesting far beyond the parser's recursion limit
        json.dumps({"id": True, "problem": "bool id", "answer": "1"}).encode(),  # not an id
        json.dumps({"id": "big", "problem": "x" * (MAX_LINE_BYTES + 10), "answer": "1"}).encode(),
        json.dumps({"id": "s", "problem": "steps", "answer": False}).encode(),  # not an answer
        json.dumps({"id": "n", "problem": None, "answer": "1"}).encode(),
    ]
    path.write_bytes(b"\n".join(lines) + b"\n")
    questions, errors = read_question_file(path)
    assert [q.id for q in questions] == ["ok"]
    assert [e.split(": ", 1)[0] for e in errors] == [f"{path}:{n}" for n in range(2, 8)]
    assert "not UTF-8" in errors[0]
    assert "nested too deeply" in errors[1] or "not valid JSON" in errors[1]
    assert errors[2].startswith(f"{path}:4: id")
    assert "longer than" in errors[3]
    assert "gold_answer" in errors[4] and "problem" in errors[5]


def test_a_source_needs_exactly_one_of_dataset_and_file(tmp_path: Path) -> None:
    with pytest.raises(QuestionFileError, match="exactly one"):
        load_source()
    with pytest.raises(QuestionFileError, match="not found"):
        load_source(file=tmp_path / "missing.jsonl")
    empty = write_lines(tmp_path / "empty.jsonl", ["{not json"])
    with pytest.raises(QuestionFileError, match="no usable questions; 1 problems"):
        load_source(file=empty)


def test_the_arith_source_generates_the_curriculum_at_a_level() -> None:
    questions, errors = load_source(dataset="arith", limit=3, level=2, seed=5)
    assert errors == [] and [q.id for q in questions] == [f"arith/L2/5/{i}" for i in range(3)]
    assert all(q.dataset == "arith" and q.gold_answer for q in questions)
    assert all(q.metadata["level"] == 2 and "chain" in q.metadata for q in questions)
    again, _ = load_source(dataset="arith", limit=3, level=2, seed=5)
    assert [q.problem for q in again] == [q.problem for q in questions]


def test_a_truncated_gzip_question_file_keeps_the_questions_before_the_cut(tmp_path: Path) -> None:
    import gzip

    data = b"".join(
        json.dumps({"id": f"q{i}", "problem": f"{i}+1?", "answer": str(i + 1)}).encode() + b"\n" for i in range(400)
    )
    packed = gzip.compress(data)
    path = tmp_path / "q.jsonl.gz"
    path.write_bytes(packed[: len(packed) * 3 // 4])
    questions, errors = read_question_file(path)
    assert 0 < len(questions) < 400 and [q.id for q in questions] == [f"q{i}" for i in range(len(questions))]
    [error] = errors
    assert error.startswith(f"{path}:{len(questions) + 1}: the file ends early (truncated?)")


_VALID = ("arith", "gsm8k", "gsm_plus", "math", "math500")


@given(name=st.one_of(st.sampled_from(_VALID), st.text(max_size=12)))
@settings(max_examples=150, deadline=None)
def test_the_settings_take_exactly_the_dataset_names_that_load(name: str) -> None:
    """Seen: `--dataset nosuch` failed inside the flow run, and its list of choices left out arith."""
    for settings_cls in (SampleSettings, PrioritizeSettings):
        if name in _VALID:
            assert settings_cls(dataset=name).dataset == name
            continue
        with pytest.raises(ValidationError) as caught:
            settings_cls(dataset=name)
        message = str(caught.value)
        assert repr(name) in message and all(valid in message for valid in _VALID)
    assert set(DATASET_NAMES) == set(_VALID)


@pytest.mark.parametrize(
    ("dataset", "split", "ok"),
    [
        ("gsm8k", "train", True),
        ("gsm8k", "dev", False),
        ("math500", "test", True),
        ("math500", "train", False),
        ("arith", "test", False),
        (None, "train", True),
    ],
)
def test_a_split_the_dataset_lacks_is_refused_by_the_settings(dataset: str | None, split: str, ok: bool) -> None:
    """Seen: `sample --dataset math500 --split train` ended in a TypeError traceback inside the flow."""
    if ok:
        assert SampleSettings(dataset=dataset, split=split).split == split
        return
    with pytest.raises(ValidationError, match=rf"has no split '{split}'"):
        SampleSettings(dataset=dataset, split=split)


def test_a_missing_shared_data_folder_is_found_before_any_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRMLOOP_DATA_DIR", str(tmp_path))
    with pytest.raises(
        QuestionFileError, match=r"gsm8k/train\.jsonl not found; put the shared folder beside the clone"
    ):
        check_source(dataset="gsm8k", split="train")
    with pytest.raises(QuestionFileError, match="no split 'dev'"):
        check_source(dataset="gsm8k", split="dev")
    with pytest.raises(QuestionFileError, match=r"missing\.jsonl not found"):
        check_source(file=tmp_path / "missing.jsonl")
    check_source(dataset="arith")  # generated: needs no file
