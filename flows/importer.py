"""``prmloop import processbench``: bring labelled solutions sampled elsewhere into the loop.

ProcessBench solutions (human first-error labels, no token log-probabilities) become
``QuestionRegistered`` + ``SolutionSampled`` events, graded by the file's ``final_answer_correct``.
The step scorer teacher-forces them (``prmloop score --model ...``) and the annotator labels the
incorrect ones; the human label travels in the question's ``metadata`` (``processbench_label`` per
solution id) so SQL can compare it with the MC label. Event ids derive from the file's ids: importing
the same file twice stores nothing new.
"""

from __future__ import annotations

from collections.abc import Sequence

from prmloop.flows.eval_annotate import ProcessBenchItem
from prmloop.models.grading import extract_answer
from prmloop.store.events import (
    Envelope,
    ModelRef,
    QuestionRegistered,
    SamplingSpec,
    SolutionSampled,
    deterministic_event_id,
    make_event,
)

__all__ = ["PRODUCER", "processbench_events"]

PRODUCER = "prmloop.import/1"


def processbench_events(items: Sequence[ProcessBenchItem], subset: str) -> list[Envelope]:
    """One question per distinct problem and one solution per item (items without a gold answer are skipped)."""
    out: list[Envelope] = []
    questions: dict[str, str] = {}
    labels: dict[str, dict[str, int]] = {}
    for item in items:
        if item.gold_answer is None:
            continue
        question_id = questions.setdefault(item.problem, f"processbench/{subset}/q{len(questions)}")
        labels.setdefault(question_id, {})[f"processbench/{subset}/{item.id}"] = item.label
    for problem, question_id in questions.items():
        gold = next(i.gold_answer for i in items if i.problem == problem)
        payload = QuestionRegistered(
            question_id=question_id,
            dataset=f"processbench-{subset}",
            problem=problem,
            gold_answer=gold,
            source=f"ProcessBench {subset}",
            metadata={"processbench_label": labels[question_id]},
        )
        out.append(
            make_event(payload, producer=PRODUCER, event_id=deterministic_event_id("QuestionRegistered", question_id))
        )
    for item in items:
        if item.gold_answer is None:
            continue
        solution_id = f"processbench/{subset}/{item.id}"
        sampled = SolutionSampled(
            solution_id=solution_id,
            question_id=questions[item.problem],
            generator=ModelRef(backend="import", name=item.generator or "unknown"),
            sampling=SamplingSpec(),
            prompt_format="double_newline",
            text="\n\n".join(item.steps),
            steps=item.steps,
            final_answer=extract_answer(item.steps[-1]) if item.steps else None,
            correct=item.final_answer_correct,
            gold_answer=item.gold_answer,
        )
        out.append(
            make_event(sampled, producer=PRODUCER, event_id=deterministic_event_id("SolutionSampled", solution_id))
        )
    return out
