"""Importing ProcessBench: gold answers found, strict types, content-derived ids, bad files refused by name."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from prmloop.models.processbench import ProcessBenchFileError, load_processbench, read_processbench
from prmloop.producers.import_processbench import processbench_events, processbench_question_id
from prmloop.store.events import QuestionRegistered, SolutionSampled


@pytest.fixture(scope="module")
def processbench(shared_data_dir: Path) -> Path:
    return shared_data_dir / "processbench" / "gsm8k.json"


def test_processbench_items_get_their_gsm8k_gold_answer(processbench: Path) -> None:
    items, errors = load_processbench(processbench)
    assert len(items) == 400 and errors == []
    found = [i for i in items if i.gold_answer is not None]
    assert len(found) >= 390  # ProcessBench's GSM8K subset comes from GSM8K test
    first = items[0]
    assert first.key == "gsm8k-0" and first.label == 1 and not first.final_answer_correct


def test_events_share_questions_and_keep_ids_across_imports(processbench: Path) -> None:
    items = load_processbench(processbench)[0][:12]
    events = processbench_events(items, "gsm8k", source=processbench)
    questions = [e.payload for e in events if isinstance(e.payload, QuestionRegistered)]
    solutions = [e.payload for e in events if isinstance(e.payload, SolutionSampled)]
    assert len(solutions) == sum(i.gold_answer is not None for i in items)
    assert len(questions) == len({i.problem for i in items if i.gold_answer is not None})
    item = items[0]
    [imported] = [s for s in solutions if s.metadata["processbench_id"] == item.key]
    assert imported.steps == item.steps and imported.correct is item.final_answer_correct
    assert imported.problem == item.problem and imported.question_id == processbench_question_id("gsm8k", item.problem)
    assert imported.token_logprobs is None  # the scorer teacher-forces these
    assert imported.metadata["processbench_label"] == item.label
    assert [e.event_id for e in events] == [
        e.event_id for e in processbench_events(items, "gsm8k", source=processbench)
    ]


def _item(**overrides: object) -> dict[str, object]:
    row: dict[str, object] = {
        "id": "x-0",
        "problem": "What is 2+2?",
        "steps": ["2+2=4.", "The answer is 4."],
        "label": -1,
        "final_answer_correct": True,
    }
    row.update(overrides)
    return row


def test_wrong_types_are_refused_per_item_never_coerced(tmp_path: Path) -> None:
    path = tmp_path / "gsm8k.json"
    rows = [
        _item(),
        _item(id="x-1", final_answer_correct="false"),  # a string is not a boolean
        _item(id="x-2", steps="2+2=4."),  # a string is not a list of steps
        _item(id="x-3", steps=None),
        _item(id="x-4", label="1"),
    ]
    path.write_text(json.dumps(rows))
    items, errors = read_processbench(path)
    assert [i.key for i in items] == ["x-0"]
    assert [e.split(":", 1)[0] for e in errors] == [f"{path}[{n}]" for n in range(1, 5)]
    assert "final_answer_correct" in errors[0] and "steps" in errors[1] and "steps" in errors[2]


def test_a_second_file_of_the_same_subset_gets_its_own_ids(tmp_path: Path) -> None:
    first = [_item(), _item(id="x-1", problem="What is 3+3?", steps=["3+3=6."])]
    second = [_item(id="x-0", problem="What is 5+5?", steps=["5+5=10."])]  # same position, same item id
    ids = []
    for n, rows in enumerate((first, second)):
        path = tmp_path / f"f{n}.json"
        path.write_text(json.dumps(rows))
        items = [i.model_copy(update={"gold_answer": "1"}) for i in read_processbench(path)[0]]
        ids.append({e.correlation_id for e in processbench_events(items, "gsm8k")})
    assert ids[0].isdisjoint(ids[1])


@pytest.mark.parametrize(
    ("content", "message"),
    [("not json", "not JSON"), ("[]", "non-empty JSON list"), ('[{"id": 1}]', "no valid ProcessBench solution")],
)
def test_a_bad_file_is_refused_with_its_name(tmp_path: Path, content: str, message: str) -> None:
    bad = tmp_path / "gsm8k.json"
    bad.write_text(content)
    with pytest.raises(ProcessBenchFileError, match=message) as error:
        load_processbench(bad)
    assert str(bad) in str(error.value)
    result = subprocess.run(
        [sys.executable, "-m", "prmloop.flows.cli", "import", "processbench", str(bad)],
        capture_output=True,
        text=True,
        env={"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        check=False,
    )
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
