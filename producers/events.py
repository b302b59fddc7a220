"""The one builder of each event a producer emits: ``QuestionRegistered``, ``QuestionPrioritized`` and
``SolutionSampled``.

Every question source (a data set, a JSONL file, ProcessBench, the simulator, the prioritized queue)
goes through these two functions, so every path derives event ids the same way and every solution
carries what its consumers need: the problem text and the gold answer come from the :class:`Question`
itself, never from a second argument that could disagree with it.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from prmloop.models.questions import Question
from prmloop.store.events import (
    Envelope,
    ModelRef,
    QuestionPrioritized,
    QuestionRegistered,
    SamplingSpec,
    SolutionSampled,
    SolutionUncertainty,
    deterministic_event_id,
    make_event,
)

__all__ = ["question_prioritized", "question_registered", "solution_sampled"]


def question_registered(question: Question, *, producer: str) -> Envelope:
    """``QuestionRegistered`` of ``question``; its event id is a function of the question id alone."""
    source = question.metadata.get("source")
    payload = QuestionRegistered(
        question_id=question.id,
        dataset=question.dataset,
        problem=question.problem,
        gold_answer=question.gold_answer,
        source=source if isinstance(source, str) and source else question.id,
        metadata=dict(question.metadata),
    )
    return make_event(payload, producer=producer, event_id=deterministic_event_id("QuestionRegistered", question.id))


def question_prioritized(
    question: Question,
    *,
    priority: float,
    round: int,
    signals: Mapping[str, float],
    identity: Sequence[object],
    producer: str,
    prm: ModelRef | None = None,
    causation_id: uuid.UUID | None = None,
) -> Envelope:
    """``QuestionPrioritized`` of ``question`` in prioritization round ``round``.

    Args:
        identity: what makes this the same decision on a re-run (question, round, probe seed, model);
            the event id is a UUIDv5 of it, so re-running a round stores nothing new.
    """
    payload = QuestionPrioritized(
        question_id=question.id, priority=priority, round=round, signals=dict(signals), prm=prm
    )
    event_id = deterministic_event_id("QuestionPrioritized", question.id, *identity)
    return make_event(payload, producer=producer, event_id=event_id, causation_id=causation_id)


def solution_sampled(
    question: Question,
    *,
    solution_id: str,
    generator: ModelRef,
    prompt_format: str,
    text: str,
    steps: Sequence[str],
    correct: bool | None,
    final_answer: str | None,
    identity: Sequence[object],
    producer: str,
    sampling: SamplingSpec | None = None,
    step_token_offsets: Sequence[int] | None = None,
    token_logprobs: Sequence[float] | None = None,
    uncertainty: SolutionUncertainty | None = None,
    selected_by: str | None = None,
    completion_tokens: int = 0,
    metadata: Mapping[str, Any] | None = None,
    causation_id: uuid.UUID | None = None,
) -> Envelope:
    """``SolutionSampled`` of one solution of ``question``.

    Args:
        identity: what makes this the same fact on a re-run (the sampler: question, generator, seed,
            sample index; an import: the solution id); the event id is a UUIDv5 of it.
        causation_id: the ``QuestionRegistered`` (or prioritization) it reacts to.
    """
    payload = SolutionSampled(
        solution_id=solution_id,
        question_id=question.id,
        problem=question.problem,
        generator=generator,
        sampling=sampling or SamplingSpec(),
        prompt_format=prompt_format,
        text=text,
        steps=tuple(steps),
        step_token_offsets=tuple(step_token_offsets) if step_token_offsets is not None else None,
        token_logprobs=tuple(token_logprobs) if token_logprobs is not None else None,
        final_answer=final_answer,
        correct=correct,
        gold_answer=question.gold_answer,
        uncertainty=uncertainty,
        selected_by=selected_by,
        completion_tokens=completion_tokens,
        metadata={k: v for k, v in (metadata or {}).items() if v is not None},
    )
    event_id = deterministic_event_id("SolutionSampled", *identity)
    return make_event(payload, producer=producer, event_id=event_id, causation_id=causation_id)
