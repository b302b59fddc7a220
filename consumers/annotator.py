"""The MC-PPL annotator: ``solutions.sampled`` -> ``steps.labeled`` with one configured strategy.

Runs on :class:`prmloop.store.consumer.ConsumerRuntime` in a consumer group (run several processes
with the same ``group_id`` to share the partitions): the handler works in a worker thread while the
partitions are paused, and offsets are committed after the labels are acknowledged by the broker.
Every ``StepsLabeled`` has a deterministic event id of (solution, strategy, parameters, completers),
so an annotator killed in the middle of a solution and restarted re-publishes the same id and the sink
keeps each label once.

Inputs besides the solution: the question's text (``questions.registered``, through
:func:`prmloop.store.index.question_index`) for the completer's prompt, and for the uncertainty-driven
strategy each step's Δu: from ``steps.scored`` (the step-uncertainty consumer) or, when the solution
carries token log-probabilities and step offsets, computed here with the same function.
Several solutions of a batch are annotated at once (``max_in_flight`` threads): worth it when the
engine batches concurrent requests (vLLM, an OpenAI-compatible server); local engines serialise.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from prmloop.models.annotation.completer import AnswerChecker, Completer, exact_match
from prmloop.models.annotation.strategies import Annotation, AnnotationStrategy, SolutionToLabel, annotate
from prmloop.models.uncertainty import PAPER_TEMPERATURE, step_uncertainty, uncertainty_deltas
from prmloop.store.consumer import ConsumedEvent, ConsumerRuntime
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
from prmloop.store.settings import KafkaSettings

__all__ = ["ANNOTATOR_GROUP", "Annotator", "AnnotatorStats", "labeled_event", "run_annotator"]

log = logging.getLogger(__name__)

PRODUCER = "prmloop.annotator/1"
ANNOTATOR_GROUP = "prmloop-annotator"


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


DeltaLookup = Callable[[SolutionSampled], "tuple[float, ...] | None"]


class AnnotatorStats:
    """What an annotator did (thread-safe counters; ``as_dict`` for a JSON summary)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.rollouts = 0
        self.generated_tokens = 0
        self.verified_steps = 0
        self.failures: Counter[str] = Counter()
        #: Wall-clock (``time.time()``) when the first solution was taken up and the last label published:
        #: the busy window, without start-up and group-join time (what the scaling benchmark compares).
        self.first_started: float | None = None
        self.last_published: float | None = None

    def started(self) -> None:
        with self._lock:
            if self.first_started is None:
                self.first_started = time.time()

    def add(self, annotation: Annotation) -> None:
        with self._lock:
            self.counts[annotation.status] += 1
            self.rollouts += annotation.cost.rollouts
            self.generated_tokens += annotation.cost.generated_tokens
            self.verified_steps += annotation.cost.verified_steps
            self.failures.update(annotation.cost.failures)

    def count(self, what: str, n: int = 1) -> None:
        with self._lock:
            self.counts[what] += n

    def as_dict(self) -> dict[str, Any]:
        with self._lock:
            return {
                "labelled": self.counts["labelled"],
                "all_correct": self.counts["all_correct"],
                "unresolved": self.counts["unresolved"],
                "aborted": self.counts["aborted"],
                "rejected": self.counts["rejected"],
                "published": self.counts["published"],
                "rollouts": self.rollouts,
                "generated_tokens": self.generated_tokens,
                "verified_steps": self.verified_steps,
                "failures": dict(self.failures),
                "first_started": self.first_started,
                "last_published": self.last_published,
            }


class Annotator:
    """Batch handler: label every ``SolutionSampled`` of a batch and publish the labels before returning.

    Args:
        strategy, completers, completer_refs: how to label and with which models (refs go in the event).
        publish: sends a list of events and returns once they are acknowledged.
        checker: does a rollout's answer match the gold answer (``math_equivalent`` for real models).
        uncertainty_delta: Δu per solution for ``uncertainty_driven``: a mapping by solution id, or a
            callable given the solution (``None`` when unknown). Solutions with token log-probabilities
            and step offsets get Δu computed here when the lookup has none.
        question_text: the problem text the completer continues, by question id (default: the id).
        max_in_flight: solutions of a batch annotated at once.
        max_aborts: a solution whose annotation aborts (the completer kept failing) makes the batch fail
            and retry with backoff; after this many aborts it is dead-lettered instead, so one poison
            solution cannot stall its partition.

    A solution that cannot be labelled at all (not graded, no steps, no Δu for ``uncertainty_driven``,
    an unknown question) is rejected to the DLQ with the reason.
    """

    def __init__(
        self,
        strategy: AnnotationStrategy,
        completers: Sequence[Completer],
        completer_refs: Sequence[ModelRef],
        publish: Callable[[list[Envelope]], object],
        *,
        checker: AnswerChecker = exact_match,
        uncertainty_delta: Mapping[str, tuple[float, ...]] | DeltaLookup | None = None,
        question_text: Callable[[str], str] = str,
        max_in_flight: int = 1,
        max_aborts: int = 3,
        uncertainty_temperature: float = PAPER_TEMPERATURE,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, got {max_in_flight}")
        self.strategy = strategy
        self.completers = tuple(completers)
        self.completer_refs = tuple(completer_refs)
        self.publish = publish
        self.checker = checker
        if uncertainty_delta is None:
            self._delta_lookup: DeltaLookup = lambda sampled: None
        elif callable(uncertainty_delta):
            self._delta_lookup = uncertainty_delta
        else:
            table = uncertainty_delta
            self._delta_lookup = lambda sampled: table.get(sampled.solution_id)
        self.question_text = question_text
        self.max_in_flight = max_in_flight
        self.max_aborts = max_aborts
        self.uncertainty_temperature = uncertainty_temperature
        self.stats = AnnotatorStats()
        self._aborts: Counter[str] = Counter()
        self._pool = ThreadPoolExecutor(max_workers=max_in_flight, thread_name_prefix="annotate")

    @property
    def unresolved(self) -> int:
        return self.stats.counts["unresolved"]

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def __call__(self, batch: list[ConsumedEvent]) -> Iterable[tuple[ConsumedEvent, str]]:
        todo = [c for c in batch if isinstance(c.event.payload, SolutionSampled)]
        self.stats.started()
        if self.max_in_flight == 1 or len(todo) <= 1:
            results = [self._one(c) for c in todo]
        else:
            results = list(self._pool.map(self._one, todo))
        out: list[Envelope] = []
        rejected: list[tuple[ConsumedEvent, str]] = []
        failed: list[str] = []
        for consumed, (kind, value) in zip(todo, results, strict=True):
            if kind == "event":
                assert isinstance(value, Envelope)
                out.append(value)
            elif kind == "reject":
                rejected.append((consumed, str(value)))
            elif kind == "abort":
                failed.append(str(value))
        # Publish what succeeded before failing the batch: a retry re-publishes the same ids (no harm).
        if out:
            self.publish(out)
            self.stats.count("published", len(out))
            self.stats.last_published = time.time()
        self.stats.count("rejected", len(rejected))
        if failed:
            raise RuntimeError("; ".join(failed))
        return rejected

    def _one(self, consumed: ConsumedEvent) -> tuple[str, Envelope | str | None]:
        payload = consumed.event.payload
        assert isinstance(payload, SolutionSampled)
        reason = self._unlabelable(payload)
        if reason:
            return "reject", reason
        deltas: tuple[float, ...] | None = None
        if self.strategy.name == "uncertainty_driven" and not payload.correct:
            try:
                deltas = self._deltas(payload)
            except LookupError as error:
                return "reject", f"{payload.solution_id}: {error}"
        try:
            question = self.question_text(payload.question_id)
        except LookupError as error:
            return "reject", (
                f"{payload.solution_id}: question {payload.question_id!r} is not registered ({error}); "
                "publish its QuestionRegistered event (prmloop sample does) and re-drive the DLQ"
            )
        solution = SolutionToLabel(
            question=question,
            steps=payload.steps,
            gold_answer=payload.gold_answer or "",
            correct=bool(payload.correct),
            uncertainty_delta=deltas,
        )
        try:
            annotation = annotate(solution, self.strategy, self.completers, checker=self.checker)
        except ValueError as error:
            return "reject", f"{payload.solution_id}: {error}"
        self.stats.add(annotation)
        if annotation.status == "aborted":
            self._aborts[payload.solution_id] += 1
            message = f"annotating {payload.solution_id} aborted: {annotation.error}"
            if self._aborts[payload.solution_id] >= self.max_aborts:
                return "reject", f"{message} ({self.max_aborts} times; given up)"
            return "abort", message
        if annotation.status == "unresolved":
            log.info("%s: no tried step fell below tau; not labelled (UnPRM drops it)", payload.solution_id)
            return "skip", None
        return "event", labeled_event(payload, annotation, self.completer_refs, causation_id=consumed.event.event_id)

    def _deltas(self, sampled: SolutionSampled) -> tuple[float, ...]:
        found = self._delta_lookup(sampled)
        if found is not None:
            return tuple(found)
        if sampled.token_logprobs is not None and sampled.step_token_offsets is not None:
            u = step_uncertainty(
                sampled.token_logprobs, sampled.step_token_offsets, temperature=self.uncertainty_temperature
            )
            return uncertainty_deltas(u)
        raise LookupError(
            "uncertainty_driven needs each step's Δu: no StepsScored for this solution and no token "
            "log-probs to compute it; run `prmloop score` (the step-uncertainty consumer) first"
        )

    def _unlabelable(self, sampled: SolutionSampled) -> str | None:
        if sampled.correct is None:
            return f"{sampled.solution_id} is not graded (correct=None); grade it against the gold answer first"
        if not sampled.correct and not sampled.gold_answer:
            return f"{sampled.solution_id} has no gold answer, so rollouts cannot be graded"
        if not sampled.steps:
            return f"{sampled.solution_id} has no steps to label"
        return None


def run_annotator(
    *,
    bootstrap_servers: str,
    strategy: AnnotationStrategy,
    completers: Sequence[Completer],
    completer_refs: Sequence[ModelRef],
    checker: AnswerChecker = exact_match,
    group_id: str = ANNOTATOR_GROUP,
    topic: str = SolutionSampled.TOPIC,
    max_in_flight: int = 1,
    max_batch: int | None = None,
    kafka: KafkaSettings | None = None,
    outbox_dir: Path | None = None,
    until: Callable[[], bool] | None = None,
    idle_timeout_s: float | None = None,
    max_solutions: int | None = None,
    lookup_timeout_s: float = 30.0,
    install_signal_handlers: bool = True,
) -> dict[str, Any]:
    """Run the annotator until SIGTERM/SIGINT, ``until()``, ``idle_timeout_s`` without new solutions, or
    ``max_solutions`` incorrect solutions searched (labelled or unresolved; what is left stays uncommitted
    for the next run).

    Reads ``topic`` in consumer group ``group_id`` (start more processes with the same group to share
    the partitions), looks question texts up in ``questions.registered`` and (for
    ``uncertainty_driven``) Δu in ``steps.scored``, publishes ``StepsLabeled`` through the acknowledged
    producer (and an outbox under ``outbox_dir`` when given, for ``prmloop reconcile``). Returns the
    annotator's counters, the runtime's and the wall time.
    """
    from prmloop.store.index import question_index, step_score_index
    from prmloop.store.kafka import EventProducer
    from prmloop.store.outbox import Outbox

    started = time.monotonic()
    questions = question_index(bootstrap_servers, kafka=kafka)
    scores = step_score_index(bootstrap_servers, kafka=kafka) if strategy.name == "uncertainty_driven" else None
    outbox = Outbox(outbox_dir, name="annotator") if outbox_dir is not None else None
    producer = EventProducer(bootstrap_servers, kafka=kafka, outbox=outbox)

    def deltas(sampled: SolutionSampled) -> tuple[float, ...] | None:
        if scores is None:
            return None
        found = scores.peek(sampled.solution_id)
        if found is None and sampled.token_logprobs is None:
            found = scores.get(sampled.solution_id, timeout_s=lookup_timeout_s)
        return found.uncertainty_delta if found is not None else None

    handler = Annotator(
        strategy,
        completers,
        completer_refs,
        producer.publish,
        checker=checker,
        uncertainty_delta=deltas,
        question_text=lambda qid: questions.get(qid, timeout_s=lookup_timeout_s).problem,
        max_in_flight=max_in_flight,
    )
    runtime = ConsumerRuntime(
        topics=[topic],
        group_id=group_id,
        bootstrap_servers=bootstrap_servers,
        handler=handler,
        kafka=kafka,
        max_batch=max_batch or max_in_flight,
        name="annotator",
    )

    def done() -> bool:
        counts = handler.stats.counts
        if max_solutions is not None and counts["labelled"] + counts["unresolved"] >= max_solutions:
            return True
        return until is not None and until()

    try:
        stats = runtime.run(until=done, idle_timeout_s=idle_timeout_s, install_signal_handlers=install_signal_handlers)
    finally:
        handler.close()
        producer.close()
        questions.close()
        if scores is not None:
            scores.close()
    return {
        **handler.stats.as_dict(),
        "batches": stats.batches,
        "dead_lettered": stats.dead_lettered,
        "retries": stats.retries,
        "wall_s": round(time.monotonic() - started, 3),
    }
