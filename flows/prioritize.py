"""The Prefect flow ``prioritize``: questions in, ``QuestionPrioritized`` out.

A thin orchestration of :mod:`prmloop.producers.prioritize`: load the questions (any question source),
publish their registrations, probe each with a few samples (one Prefect task per question, retried: the
probe's seed is fixed, so a retry draws the same samples), publish the probe's graded solutions (real
samples the loop labels like any other) and the priorities, and record a table
artifact ``prioritize-queue`` (the queue, highest first). ``prmloop sample --from-queue`` then samples
the highest-priority questions first.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from prmloop.flows.concurrency import gpu_slot
from prmloop.flows.sample import publish_task
from prmloop.models.backends.base import Generator
from prmloop.models.backends.registry import build_backend
from prmloop.models.questions import Question
from prmloop.producers.events import question_registered
from prmloop.producers.prioritize import PRODUCER, Prioritized, PrioritizeSettings, SolutionScorer, prioritize_question
from prmloop.producers.sources import load_source
from prmloop.store.events import ModelRef

__all__ = ["ARTIFACT_KEY", "prioritize", "run_prioritize"]

ARTIFACT_KEY = "prioritize-queue"

log = logging.getLogger(__name__)


@task(name="probe-question", retries=2, retry_delay_seconds=2, cache_policy=NO_CACHE)
def probe_task(
    generator: Generator, model: ModelRef, question: Question, settings: PrioritizeSettings, prm: Any
) -> Prioritized:
    """Probe one question and compute its priority."""
    return prioritize_question(generator, model, question, settings, prm=prm)


@task(name="queue-table", cache_policy=NO_CACHE)
def artifact_task(summary: dict[str, Any]) -> None:
    from prefect.artifacts import create_table_artifact

    create_table_artifact(
        key=ARTIFACT_KEY,
        table=summary["queue"],
        description=(
            f"prioritize round {summary['round']}: {summary['questions']} questions probed with k={summary['k']} "
            f"({summary['probe_tokens']} tokens); {summary['hopeless']} all wrong, {summary['trivial']} all right"
        ),
    )


def _run(t: Any, use_prefect: bool, *args: Any) -> Any:
    return t(*args) if use_prefect else t.fn(*args)


def summarize(
    results: list[Prioritized], settings: PrioritizeSettings, errors: list[str], wall_s: float
) -> dict[str, Any]:
    """The run summary ``prmloop prioritize`` prints and the flow returns (queue highest first)."""
    graded = [r for r in results if r.probe.graded]
    ranked = sorted(results, key=lambda r: (-r.priority, r.question.id))
    return {
        "round": settings.round,
        "questions": len(results),
        "question_errors": errors,
        "k": settings.k,
        "probe_tokens": sum(r.probe.tokens for r in results),
        "hopeless": sum(r.probe.n_correct == 0 for r in graded),
        "trivial": sum(r.probe.n_correct == sum(c is not None for c in r.probe.correct) for r in graded),
        "wall_s": wall_s,
        "queue": [r.row() for r in ranked],
    }


def _pipeline(
    settings: PrioritizeSettings,
    *,
    use_prefect: bool,
    bootstrap_servers: str | None,
    prm: SolutionScorer | None,
    on_question: Callable[[Prioritized], None] | None,
) -> dict[str, Any]:
    logger = get_run_logger() if use_prefect else log
    started = time.perf_counter()
    if bootstrap_servers is None:
        from prmloop.store.kafka.broker_file import require_bootstrap_servers

        bootstrap_servers = require_bootstrap_servers()
    questions, errors = load_source(
        dataset=settings.dataset,
        file=settings.file,
        limit=settings.limit,
        split=settings.split,
        level=settings.level,
        seed=settings.seed,
    )
    for error in errors:
        logger.warning("%s", error)
    config = settings.backend_config()
    generator = build_backend(config)
    model = ModelRef(backend=config.backend, name=generator.model_name)
    logger.info(
        "prioritize round %d: probing %d questions with %s, k=%d",
        settings.round,
        len(questions),
        model.name,
        settings.k,
    )
    _run(publish_task, use_prefect, bootstrap_servers, [question_registered(q, producer=PRODUCER) for q in questions])
    results: list[Prioritized] = []
    for question in questions:
        with gpu_slot(use_prefect):
            done: Prioritized = _run(probe_task, use_prefect, generator, model, question, settings, prm)
        _run(publish_task, use_prefect, bootstrap_servers, [*done.solutions, done.event])
        results.append(done)
        if on_question is not None:
            on_question(done)
        # A progress line also where there is no terminal (logs, CI, Prefect workers).
        logger.info(
            "%d/%d %s: priority %.3f %s", len(results), len(questions), question.id, done.priority, done.signals
        )
    summary = summarize(results, settings, errors, time.perf_counter() - started)
    if use_prefect:
        _run(artifact_task, use_prefect, summary)
    return summary


@flow(name="prioritize")
def prioritize(settings: PrioritizeSettings | None = None, bootstrap_servers: str | None = None) -> dict[str, Any]:
    """Probe questions with a few samples each and publish their priorities (``QuestionPrioritized``)."""
    return _pipeline(
        settings or PrioritizeSettings(),
        use_prefect=True,
        bootstrap_servers=bootstrap_servers,
        prm=None,
        on_question=None,
    )


def run_prioritize(
    settings: PrioritizeSettings,
    *,
    bootstrap_servers: str | None = None,
    prm: SolutionScorer | None = None,
    on_question: Callable[[Prioritized], None] | None = None,
) -> dict[str, Any]:
    """Run one prioritization round for ``settings`` (as the Prefect flow when ``settings.prefect``).

    ``prm`` (a loaded PRM) adds the spread of its solution scores to the signals; ``on_question`` is
    called with each question's result. Either makes it a plain run (no flow run in Prefect).
    """
    if settings.prefect and prm is None and on_question is None:
        return prioritize(settings, bootstrap_servers=bootstrap_servers)
    # A loaded PRM or a callback is no flow parameter (Prefect records parameters as JSON): plain run.
    return _pipeline(settings, use_prefect=False, bootstrap_servers=bootstrap_servers, prm=prm, on_question=on_question)
