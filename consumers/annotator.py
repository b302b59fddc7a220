"""The MC-PPL annotator: ``solutions.sampled`` -> ``steps.labeled`` with one configured strategy.

Runs on :class:`prmloop.store.consumer.ConsumerRuntime` (the handler works in a worker thread while the
partitions are paused, offsets are committed after the labels are acknowledged). Every ``StepsLabeled``
has a deterministic event id of (solution, strategy, parameters, completers), so an annotator killed in
the middle of a batch and restarted re-publishes the same ids and the sink keeps each label once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from prmloop.models.annotation.completer import AnswerChecker, Completer, exact_match
from prmloop.models.annotation.strategies import Annotation, AnnotationStrategy, SolutionToLabel, annotate
from prmloop.store.consumer import ConsumedEvent
from prmloop.store.events import (
    CostLedger,
    Envelope,
    MCEstimate,
    ModelRef,
    SolutionSampled,
    StepsLabeled,
    deterministic_event_id,
    make_event,
)

__all__ = ["Annotator", "labeled_event"]

log = logging.getLogger(__name__)

PRODUCER = "prmloop.annotator/1"


def labeled_event(
    sampled: SolutionSampled,
    annotation: Annotation,
    completers: Sequence[ModelRef],
    *,
    causation_id: Any = None,
) -> Envelope:
    """The ``StepsLabeled`` event of one annotation, with its deterministic id."""
    refs = tuple(completers)
    soft = annotation.soft_labels
    payload = StepsLabeled(
        solution_id=sampled.solution_id,
        question_id=sampled.question_id,
        method="all_correct" if annotation.status == "all_correct" else annotation.method,
        parameters=annotation.parameters,
        labels=annotation.labels,
        soft_labels=tuple(v for v in soft if v is not None) if soft and all(v is not None for v in soft) else None,
        first_error_step=annotation.first_error_step,
        mc_estimates=tuple(
            MCEstimate(
                step_index=e.step_index,
                value=e.value,
                rollouts=e.rollouts,
                correct_rollouts=e.correct_rollouts,
                weighted=e.weighted,
            )
            for e in annotation.estimates
        ),
        completers=refs,
        cost=CostLedger(**annotation.cost.as_dict()),
    )
    event_id = deterministic_event_id(
        "StepsLabeled",
        sampled.solution_id,
        annotation.method,
        annotation.parameters,
        [ref.model_dump() for ref in refs],
    )
    return make_event(payload, producer=PRODUCER, event_id=event_id, causation_id=causation_id)


class Annotator:
    """Batch handler: label every ``SolutionSampled`` of a batch and publish the labels before returning.

    ``question_text`` maps a question id to the problem text the completer continues (from
    ``questions.registered``; the default passes the id, which is what the simulator keys on).
    ``uncertainty_delta`` gives Δu per solution id (from ``steps.scored``) for the uncertainty-driven
    strategy. A solution the completer keeps failing on raises, so the runtime retries the batch with
    backoff (labels already published are re-published with the same ids). A solution that cannot be
    labelled at all (not graded, no steps, no Δu for ``uncertainty_driven``) is rejected to the DLQ.
    """

    def __init__(
        self,
        strategy: AnnotationStrategy,
        completers: Sequence[Completer],
        completer_refs: Sequence[ModelRef],
        publish: Callable[[list[Envelope]], object],
        *,
        checker: AnswerChecker = exact_match,
        uncertainty_delta: Mapping[str, tuple[float, ...]] | None = None,
        question_text: Callable[[str], str] = str,
    ) -> None:
        self.strategy = strategy
        self.completers = tuple(completers)
        self.completer_refs = tuple(completer_refs)
        self.publish = publish
        self.checker = checker
        self.uncertainty_delta = uncertainty_delta if uncertainty_delta is not None else {}
        self.question_text = question_text
        self.unresolved = 0

    def __call__(self, batch: list[ConsumedEvent]) -> Iterable[tuple[ConsumedEvent, str]]:
        out: list[Envelope] = []
        rejected: list[tuple[ConsumedEvent, str]] = []
        for consumed in batch:
            payload = consumed.event.payload
            if not isinstance(payload, SolutionSampled):
                continue
            reason = self._unlabelable(payload)
            if reason:
                rejected.append((consumed, reason))
                continue
            solution = SolutionToLabel(
                question=self.question_text(payload.question_id),
                steps=payload.steps,
                gold_answer=payload.gold_answer or "",
                correct=bool(payload.correct),
                uncertainty_delta=self.uncertainty_delta.get(payload.solution_id),
            )
            try:
                annotation = annotate(solution, self.strategy, self.completers, checker=self.checker)
            except ValueError as error:
                rejected.append((consumed, f"{payload.solution_id}: {error}"))
                continue
            if annotation.status == "aborted":
                raise RuntimeError(f"annotating {payload.solution_id} aborted: {annotation.error}")
            if annotation.status == "unresolved":
                self.unresolved += 1
                log.info("%s: no tried step fell below tau; not labelled (UnPRM drops it)", payload.solution_id)
                continue
            out.append(labeled_event(payload, annotation, self.completer_refs, causation_id=consumed.event.event_id))
        if out:
            self.publish(out)
        return rejected

    def _unlabelable(self, sampled: SolutionSampled) -> str | None:
        if sampled.correct is None:
            return f"{sampled.solution_id} is not graded (correct=None); grade it against the gold answer first"
        if not sampled.correct and not sampled.gold_answer:
            return f"{sampled.solution_id} has no gold answer, so rollouts cannot be graded"
        if not sampled.steps:
            return f"{sampled.solution_id} has no steps to label"
        return None
