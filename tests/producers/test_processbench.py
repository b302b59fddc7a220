"""Importing ProcessBench: gold answers found, questions shared, ids stable, bad files refused by name."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from prmloop.flows.evals.annotate import load_processbench
from prmloop.producers.processbench import processbench_events
from prmloop.store.events import QuestionRegistered, SolutionSampled


@pytest.fixture(scope="module")
def processbench(shared_data_dir: Path) -> Path:
    return shared_data_dir / "processbench" / "gsm8k.json"


def test_processbench_items_get_their_gsm8k_gold_answer(processbench: Path) -> None:
    items = load_processbench(processbench)
    assert len(items) == 400
    found = [i for i in items if i.gold_answer is not None]
    assert len(found) >= 390  # ProcessBench's GSM8K subset comes from GSM8K test
    first = items[0]
    assert first.id == "gsm8k-0" and first.label == 1 and not first.final_answer_correct


def test_events_share_questions_and_keep_ids_across_imports(processbench: Path) -> None:
    items = load_processbench(processbench)[:12]
    events = processbench_events(items, "gsm8k")
    questions = [e.payload for e in events if isinstance(e.payload, QuestionRegistered)]
    solutions = [e.payload for e in events if isinstance(e.payload, SolutionSampled)]
    assert len(solutions) == sum(i.gold_answer is not None for i in items)
    assert len(questions) == len({i.problem for i in items if i.gold_answer is not None})
    by_id = {s.solution_id: s for s in solutions}
    item = items[0]
    imported = by_id[f"processbench/gsm8k/{item.id}"]
    assert imported.steps == item.steps and imported.correct is item.final_answer_correct
    assert imported.token_logprobs is None  # the scorer teacher-forces these
    question = next(q for q in questions if q.question_id == imported.question_id)
    assert question.metadata["processbench_label"][imported.solution_id] == item.label
    assert [e.event_id for e in events] == [e.event_id for e in processbench_events(items, "gsm8k")]


@pytest.mark.parametrize(
    ("content", "message"),
    [("not json", "not JSON"), ("[]", "non-empty JSON list"), ('[{"id": 1}]', "non-empty JSON list")],
)
def test_a_bad_file_is_refused_with_its_name(tmp_path: Path, content: str, message: str) -> None:
    bad = tmp_path / "gsm8k.json"
    bad.write_text(content)
    with pytest.raises(ValueError, match=message) as error:
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
