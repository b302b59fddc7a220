"""``prmloop import processbench``: bring labelled solutions sampled elsewhere into the loop.

ProcessBench solutions (human first-error labels, no token log-probabilities) become
``QuestionRegistered`` + ``SolutionSampled`` events, graded by the file's ``final_answer_correct``.
The step scorer teacher-forces them (``prmloop score --model ...``) and the annotator labels the
incorrect ones. The human label travels in the solution's ``metadata`` (``processbench_label``), with
the file and the item's id, so SQL can compare it with the MC label.

Ids come from content, never from positions: a question's id is a digest of its problem text (two
files that share a problem share the question), a solution's id is the item's id plus a digest of its
problem and steps. Importing the same file twice stores nothing new; importing another file of the
same subset adds its own questions and solutions.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

from prmloop.models.answers import extract_answer
from prmloop.models.processbench import ProcessBenchItem
from prmloop.models.questions import Question
from prmloop.producers.events import question_registered, solution_sampled
from prmloop.store.events import Envelope, ModelRef

__all__ = ["PRODUCER", "processbench_events", "processbench_question_id", "processbench_solution_id"]

PRODUCER = "prmloop.import/1"


def _digest(*parts: str) -> str:
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:16]


def processbench_question_id(subset: str, problem: str) -> str:
    """``processbench/<subset>/q-<digest of the problem text>``."""
    return f"processbench/{subset}/q-{_digest(problem)}"


def processbench_solution_id(subset: str, item: ProcessBenchItem) -> str:
    """``processbench/<subset>/<item id>-<digest of problem and steps>``."""
    return f"processbench/{subset}/{item.key}-{_digest(item.problem, *item.steps)}"


def processbench_events(
    items: Sequence[ProcessBenchItem], subset: str, *, source: Path | None = None
) -> list[Envelope]:
    """One question per distinct problem and one solution per item; items without a gold answer are skipped."""
    out: list[Envelope] = []
    questions: dict[str, Question] = {}
    for item in items:
        if item.gold_answer is None or item.problem in questions:
            continue
        question = Question(
            id=processbench_question_id(subset, item.problem),
            dataset=f"processbench-{subset}",
            problem=item.problem,
            gold_answer=item.gold_answer,
            metadata={"source": f"ProcessBench {subset}"},
        )
        questions[item.problem] = question
        out.append(question_registered(question, producer=PRODUCER))
    for item in items:
        if item.gold_answer is None:
            continue
        solution_id = processbench_solution_id(subset, item)
        out.append(
            solution_sampled(
                questions[item.problem],
                solution_id=solution_id,
                generator=ModelRef(backend="import", name=item.generator or "unknown"),
                prompt_format="double_newline",
                text="\n\n".join(item.steps),
                steps=item.steps,
                final_answer=extract_answer(item.steps[-1]),
                correct=item.final_answer_correct,
                metadata={
                    "processbench_id": item.key,
                    "processbench_label": item.label,
                    "file": str(source) if source is not None else None,
                },
                identity=(solution_id,),
                producer=PRODUCER,
            )
        )
    return out
