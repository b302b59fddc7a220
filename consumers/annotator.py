"""The MC-PPL annotator: ``steps.selected`` (or ``steps.scored``) -> ``steps.labeled``, one strategy.

Each event carries the solution as the annotator needs it (problem, steps, grade, gold answer, each
step's Δu where known), so it reads one topic and looks nothing up. It runs on
:class:`prmloop.store.kafka.runtime.ConsumerRuntime` in a consumer group (processes with one ``group`` share
the partitions); offsets are committed after the labels are acknowledged. Every ``StepsLabeled`` has a
deterministic id of (solution, strategy, parameters, completers), so a restarted annotator re-publishes
the same id and the sink keeps each label once. ``in_flight`` solutions of a batch are annotated at
once (worth it where the engine batches concurrent requests), each label published as its search ends.
:class:`AnnotatorSettings` (:mod:`prmloop.consumers.annotator_settings`) declares every option once
(``prmloop annotate``, ``PRMLOOP_ANNOTATOR_*``); :func:`build_annotator` builds the strategy, the
completers and the answer checker from them.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from prmloop.consumers.annotator_ahead import SearchesAhead
from prmloop.consumers.annotator_samples import QuestionSamples, rollout_specs
from prmloop.consumers.annotator_settings import AnnotatorSettings
from prmloop.consumers.annotator_stats import AnnotatorStats
from prmloop.models.annotation.completer import AnswerChecker, Completer, GeneratorCompleter, exact_match
from prmloop.models.annotation.estimate import SharedStarts
from prmloop.models.annotation.strategies import Annotation, AnnotationStrategy, SolutionToLabel, annotate
from prmloop.models.prompts import prompt_format_of
from prmloop.store.events import (
    CostLedger,
    Envelope,
    MCEstimate,
    ModelRef,
    SolutionSelected,
    StepsLabeled,
    StepsScored,
    deterministic_event_id,
    make_event,
    scored_to_label,
)
from prmloop.store.kafka.poison import TransientError
from prmloop.store.kafka.runtime import ConsumedEvent
from prmloop.store.kafka.service import run_service
from prmloop.store.settings import KafkaSettings

__all__ = [
    "ANNOTATOR_GROUP",
    "Annotator",
    "AnnotatorSettings",
    "AnnotatorStats",
    "build_annotator",
    "labeled_event",
    "labelling_order",
    "run_annotator",
]

log = logging.getLogger(__name__)

PRODUCER = "prmloop.annotator/1"
ANNOTATOR_GROUP = "prmloop-annotator"


def build_annotator(
    settings: AnnotatorSettings,
) -> tuple[AnnotationStrategy, list[Completer], list[ModelRef], AnswerChecker]:
    """The strategy, completers, their provenance and the answer checker ``settings`` describe.

    ``completer="simulator"`` rebuilds the simulated world of ``--sim-n/--sim-seed/--correlation``
    (exact-match answers); otherwise the model backend is loaded once and wrapped in a
    :class:`~prmloop.models.annotation.completer.GeneratorCompleter` (math-verify answers).
    """
    strategy = settings.make_strategy()
    if settings.completer == "simulator":
        from prmloop.models.simulator import SIMULATOR_NAME, SimulatedCompleter

        config, world = settings.world()
        completer = SimulatedCompleter(world, config, seed=settings.sim_seed, latency_s=settings.sim_latency)
        return strategy, [completer], [ModelRef(backend=SIMULATOR_NAME, name=completer.name)], exact_match
    from prmloop.models.annotation.completer import math_equivalent
    from prmloop.models.backends.base import SamplingParams
    from prmloop.models.backends.registry import build_backend

    engine = build_backend(settings.backend_config())
    local = settings.backend == "transformers"
    if local and settings.in_flight > 1:
        # The in-flight solutions' probes go to the local engine together, as one batch per call.
        from prmloop.models.backends.coalesce import CoalescingGenerator

        engine = CoalescingGenerator(engine, expected=settings.in_flight)
        local = False  # the coalescer serialises engine calls itself
    sampling = SamplingParams(
        temperature=settings.temperature,
        max_new_tokens=settings.max_new_tokens,
        stop_at_answer=settings.stop_at_answer,
    )
    generator_completer = GeneratorCompleter(
        engine,
        style=settings.prompt_format,
        params=sampling,
        seed=settings.seed,
        lock=local,
    )
    return (
        strategy,
        [generator_completer],
        [ModelRef(backend=settings.backend, name=engine.model_name)],
        math_equivalent,
    )


def labeled_event(
    scored: StepsScored,
    annotation: Annotation,
    completers: Sequence[ModelRef],
    *,
    causation_id: Any = None,
) -> Envelope:
    """The ``StepsLabeled`` event of one annotation, with its deterministic id."""
    refs = tuple(completers)
    soft = annotation.soft_labels
    payload = StepsLabeled(
        solution_id=scored.solution_id,
        question_id=scored.question_id,
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
        scored.solution_id,
        annotation.method,
        annotation.parameters,
        [ref.model_dump() for ref in refs],
    )
    return make_event(payload, producer=PRODUCER, event_id=event_id, causation_id=causation_id)


def labelling_order(batch: list[ConsumedEvent]) -> list[ConsumedEvent]:
    """Correct solutions first (their labels cost no rollout), then the most uncertain by the selector's
    score: a run stopped by ``--max-solutions`` or its time leaves the least useful ones behind."""
    return sorted(batch, key=lambda c: (not _free(c.event.payload), -_selection_score(c.event.payload)))


def _free(payload: object) -> bool:
    scored = scored_to_label(payload) if isinstance(payload, SolutionSelected | StepsScored) else None
    return bool(scored is not None and scored.correct)


def _selection_score(payload: object) -> float:
    if isinstance(payload, SolutionSelected) and payload.score is not None:
        return payload.score
    return float("inf")  # nothing known about it: as uncertain as can be


class Annotator:
    """Batch handler: label every ``StepsScored`` of a batch and publish the labels before returning.

    Args:
        strategy, completers, completer_refs: how to label and with which models (refs go in the event).
        publish: sends a list of events and returns once they are acknowledged.
        checker: does a rollout's answer match the gold answer (``math_equivalent`` for real models).
        max_in_flight: solutions of a batch annotated at once.
        max_aborts: a solution whose annotation aborts (the completer kept failing) makes the batch fail
            and retry with backoff; after this many aborts it is dead-lettered instead, so one poison
            solution cannot stall its partition.

    A solution that cannot be labelled at all (not graded, no steps, no problem text, no Δu for
    ``uncertainty_driven``) is rejected to the DLQ with the reason.
    """

    def __init__(
        self,
        strategy: AnnotationStrategy,
        completers: Sequence[Completer],
        completer_refs: Sequence[ModelRef],
        publish: Callable[[list[Envelope]], object],
        *,
        checker: AnswerChecker = exact_match,
        max_in_flight: int = 1,
        max_aborts: int = 3,
        look_ahead: bool = True,
        free_only: bool = False,
        reuse_samples: bool = True,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, got {max_in_flight}")
        self.strategy = strategy
        self.completers = tuple(completers)
        self.completer_refs = tuple(completer_refs)
        self.publish = publish
        self.checker = checker
        self.max_in_flight = max_in_flight
        self.max_aborts = max_aborts
        self.looks_ahead = look_ahead
        self.free_only = free_only
        self.reuse_samples = reuse_samples
        self.stats = AnnotatorStats()
        self._aborts: Counter[str] = Counter()
        self._pool = ThreadPoolExecutor(max_workers=max_in_flight, thread_name_prefix="annotate")
        self._ahead: SearchesAhead[tuple[str, Annotation | str]] = SearchesAhead()  # :meth:`look_ahead`'s
        self.starts = SharedStarts()  # MC(s_0) once per question (models/annotation/estimate.py)
        self.samples = QuestionSamples()  # a question's samples, its first rollouts from s_0
        self._specs = rollout_specs(self.completers, self.completer_refs)

    @property
    def unresolved(self) -> int:
        return self.stats.counts["unresolved"]

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)  # look-ahead searches not started yet: none

    def __call__(self, batch: list[ConsumedEvent]) -> Iterable[tuple[ConsumedEvent, str]]:
        self._ahead.drop_all_but(batch)
        self.samples.add_all([c.event.payload for c in batch])  # each counts in MC(s_0) before any search
        todo = [c for c in batch if scored_to_label(c.event.payload) is not None]
        skipped = [c for c in batch if isinstance(c.event.payload, SolutionSelected) and c not in todo]
        self.stats.count("skipped_by_selection", len(skipped))
        if self.free_only:
            costly = [c for c in todo if not _free(c.event.payload)]
            self.stats.count("left_for_rollouts", len(costly))
            todo = [c for c in todo if c not in costly]
        todo = labelling_order(todo)
        self.stats.started(len(batch))
        # Labels that cost no rollout are published at once: consensus need not wait for the batch's rollouts.
        free = [c for c in todo if _free(c.event.payload)]
        rejected = self._settle(free, [self._one(c) for c in free])
        costly = todo[len(free) :]  # labelling_order puts the free ones first
        if self.max_in_flight == 1 or len(costly) <= 1:
            return rejected + self._settle(costly, [self._one(c) for c in costly])
        return rejected + self._settle_as_done(costly)

    def look_ahead(self, events: list[ConsumedEvent]) -> None:
        """Start the next batch's searches (the runtime shows its records as it fetches them ahead) behind
        this batch's, so a worker whose search ends takes one at once instead of idling until this batch's
        slowest is done; their labels and offsets still go with the next batch (:mod:`.annotator_ahead`)."""
        if self.max_in_flight == 1 or self.free_only or not self.looks_ahead:
            return
        self.samples.add_all([c.event.payload for c in events])
        todo = labelling_order([c for c in events if scored_to_label(c.event.payload) is not None])
        self._ahead.start((c for c in todo if not _free(c.event.payload)), lambda c: self._pool.submit(self._search, c))

    def _claim(self, consumed: ConsumedEvent) -> Future[tuple[str, Annotation | str]] | None:
        future = self._ahead.claim(consumed)
        if future is not None:
            self.stats.count("started_ahead")
        return future

    def _settle_as_done(self, costly: list[ConsumedEvent]) -> list[tuple[ConsumedEvent, str]]:
        """Annotate ``costly`` ``max_in_flight`` at a time and publish each label the moment its search
        ends, not when the batch's slowest search does: consensus and retraining see it at once. The batch's
        offsets are still committed after the last (a restart re-publishes the same ids; the sink keeps one)."""
        futures = {(self._claim(c) or self._pool.submit(self._search, c)): i for i, c in enumerate(costly)}
        rest: dict[int, tuple[str, Envelope | str | None]] = {}
        for future in as_completed(futures):
            i = futures[future]
            result = self._finish(costly[i], future.result())
            if result[0] == "event":
                self._settle([costly[i]], [result])
            else:
                rest[i] = result
        order = sorted(rest)  # rejections and aborts settle as before, in the batch's order
        return self._settle([costly[i] for i in order], [rest[i] for i in order])

    def _settle(
        self, todo: list[ConsumedEvent], results: list[tuple[str, Envelope | str | None]]
    ) -> list[tuple[ConsumedEvent, str]]:
        """Publish what succeeded (before failing the batch: a retry re-publishes the same ids, no harm),
        return the rejected, and raise :class:`TransientError` when the completer kept failing (an engine
        outage may pass; the runtime retries the batch with backoff)."""
        out = [v for kind, v in results if kind == "event" and isinstance(v, Envelope)]
        rejected = [(c, str(v)) for c, (kind, v) in zip(todo, results, strict=True) if kind == "reject"]
        if out:
            self.publish(out)
            self.stats.count("published", len(out))
            self.stats.last_published = time.time()
        self.stats.count("rejected", len(rejected))
        failed = [str(v) for kind, v in results if kind == "abort"]
        if failed:
            raise TransientError("; ".join(failed))
        return rejected

    def _one(self, consumed: ConsumedEvent) -> tuple[str, Envelope | str | None]:
        """Label one solution: the search :meth:`look_ahead` started for it, else one now."""
        ahead = self._claim(consumed)
        return self._finish(consumed, ahead.result() if ahead is not None else self._search(consumed))

    def _search(self, consumed: ConsumedEvent) -> tuple[str, Annotation | str]:
        """The search itself (thread-safe, counts nothing): ``("done", annotation)`` or ``("reject", why)``."""
        scored = scored_to_label(consumed.event.payload)
        assert scored is not None
        reason = self._unlabelable(scored)
        if reason:
            return "reject", reason
        solution = SolutionToLabel(
            question=scored.problem or "",
            steps=scored.steps,
            gold_answer=scored.gold_answer or "",
            correct=bool(scored.correct),
            uncertainty_delta=scored.uncertainty_delta,
        )
        try:
            annotation = annotate(
                solution,
                self.strategy,
                self._completers_for(scored),
                checker=self.checker,
                starts=self.starts,
                starts_scope=(self.completer_refs, scored.prompt_format),
                first_rollouts=(
                    self.samples.rollouts(scored.question_id, scored.prompt_format, self._specs)
                    if self.reuse_samples
                    else None
                ),
            )
        except ValueError as error:
            return "reject", f"{scored.solution_id}: {error}"
        return "done", annotation

    def _finish(
        self, consumed: ConsumedEvent, searched: tuple[str, Annotation | str]
    ) -> tuple[str, Envelope | str | None]:
        """Count a search's outcome and make its event (``event``), or say why not (``reject``, ``abort``, ``skip``)."""
        kind, annotation = searched
        if kind == "reject" or isinstance(annotation, str):
            return "reject", str(annotation)
        scored = scored_to_label(consumed.event.payload)
        assert scored is not None
        self.stats.add(annotation)
        if annotation.status == "aborted":
            self._aborts[scored.solution_id] += 1
            message = f"annotating {scored.solution_id} aborted: {annotation.error}"
            if self._aborts[scored.solution_id] >= self.max_aborts:
                return "reject", f"{message} ({self.max_aborts} times; given up)"
            return "abort", message
        if annotation.status == "unresolved":
            start = next((e for e in annotation.estimates if e.step_index == -1), None)
            why = (
                f"no rollout of {start.rollouts} from the question reached the answer (MC(s_0) = 0)"
                if start is not None and start.correct_rollouts == 0
                else "no tried step fell below tau (UnPRM drops it)"
            )
            log.info("%s: not labelled: %s", scored.solution_id, why)
            return "skip", None
        return "event", labeled_event(scored, annotation, self.completer_refs, causation_id=consumed.event.event_id)

    def _completers_for(self, scored: StepsScored) -> tuple[Completer, ...]:
        """The completers, each continuing the prompt format the solution was sampled with."""
        style = prompt_format_of(scored.prompt_format)
        return tuple(c.with_style(style) if isinstance(c, GeneratorCompleter) else c for c in self.completers)

    def _unlabelable(self, scored: StepsScored) -> str | None:
        sid = scored.solution_id
        if scored.correct is None:
            return f"{sid} is not graded (correct=None); grade it against the gold answer first"
        if not scored.steps:
            return f"{sid} has no steps to label"
        if scored.correct:
            return None
        if not scored.gold_answer:
            return f"{sid} has no gold answer, so rollouts cannot be graded"
        if not scored.problem:
            return f"{sid} carries no problem text (scored by an older scorer); re-run `prmloop score` on it"
        if self.strategy.name == "uncertainty_driven" and scored.uncertainty_delta is None:
            return (
                f"{sid}: uncertainty_driven needs each step's Δu, and the scorer had no log-probs for it; "
                "run `prmloop score --model ...` to teacher-force such solutions"
            )
        return None


def run_annotator(
    settings: AnnotatorSettings,
    *,
    bootstrap_servers: str,
    kafka: KafkaSettings | None = None,
    outbox_dir: Path | None = None,
    until: Callable[[], bool] | None = None,
    install_signal_handlers: bool = True,
    components: tuple[AnnotationStrategy, Sequence[Completer], Sequence[ModelRef], AnswerChecker] | None = None,
) -> dict[str, Any]:
    """Run the annotator until SIGTERM/SIGINT, ``until()``, ``settings.until_idle`` seconds without input,
    or ``settings.max_solutions`` incorrect solutions searched (labelled or unresolved).

    Publishes ``StepsLabeled`` through the acknowledged producer (and an outbox under ``outbox_dir``
    when given, for ``prmloop reconcile``). ``components`` replaces :func:`build_annotator` (a model
    already loaded in this process). Returns the annotator's counters, the runtime's and the wall time.
    """
    from prmloop.store.kafka.outbox import Outbox
    from prmloop.store.kafka.producer import EventProducer

    started = time.monotonic()
    strategy, completers, refs, checker = components or build_annotator(settings)
    outbox = Outbox(outbox_dir, name="annotator") if outbox_dir is not None else None
    producer = EventProducer(bootstrap_servers, kafka=kafka, outbox=outbox)
    handler = Annotator(
        strategy,
        completers,
        refs,
        producer.publish,
        checker=checker,
        max_in_flight=settings.in_flight,
        look_ahead=settings.look_ahead,
        free_only=settings.free_only,
        reuse_samples=settings.reuse_samples,
    )
    max_solutions = settings.max_solutions

    def done() -> bool:
        counts = handler.stats.counts
        return max_solutions is not None and counts["labelled"] + counts["unresolved"] >= max_solutions

    return run_service(
        "annotator",
        handler,
        topics=[settings.topic],
        group_id=settings.group,
        bootstrap_servers=bootstrap_servers,
        counters=handler.stats.as_dict,
        kafka=kafka,
        max_batch=settings.taken_at_once,
        until=until,
        done=done,
        idle_timeout_s=settings.until_idle,
        install_signal_handlers=install_signal_handlers,
        close=[handler.close, producer.close],
        started=started,
    ).as_dict()
