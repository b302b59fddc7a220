"""The Prefect flow ``sample``: a question source in, ``solutions.sampled`` out.

A thin orchestration of :mod:`prmloop.producers`: load the questions (:func:`~prmloop.producers.sources.load_source`),
publish their registrations, sample them in batches (:func:`~prmloop.producers.sampler.sample_question`,
one Prefect task per batch, retried as a whole: the same seeds give the same samples), publish each
batch's events through the acknowledged producer and its outbox, and record a per-question table
artifact. Its one parameter is :class:`~prmloop.producers.sampler.SampleSettings`, whose field
descriptions are what the Prefect UI shows. :func:`run_sample` runs the same steps with or without a
Prefect API.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from prmloop.flows.concurrency import gpu_slot
from prmloop.models.backends.base import Generator
from prmloop.models.backends.registry import build_backend
from prmloop.models.questions import Question
from prmloop.producers.events import question_registered
from prmloop.producers.sampler import PRODUCER, SampledQuestion, SampleSettings, sample_question, summarize
from prmloop.producers.sources import load_source
from prmloop.store.events import Envelope, ModelRef

__all__ = ["ARTIFACT_KEY", "run_sample", "sample"]

ARTIFACT_KEY = "sample-per-question"

log = logging.getLogger(__name__)

_T = TypeVar("_T")


@task(name="load-questions", cache_policy=NO_CACHE)
def load_questions_task(settings: SampleSettings) -> tuple[list[Question], list[str]]:
    """Questions of the configured source, and one message per unusable input."""
    queue = None
    if settings.from_queue:
        from prmloop.store.settings import StateSettings

        queue = settings.db or StateSettings().store_location
    return load_source(
        dataset=settings.dataset,
        file=settings.file,
        limit=settings.limit,
        split=settings.split,
        level=settings.level,
        seed=settings.seed,
        queue=queue,
    )


@task(name="sample-batch", retries=2, retry_delay_seconds=2, cache_policy=NO_CACHE)
def sample_batch_task(
    generator: Generator, model: ModelRef, questions: list[Question], settings: SampleSettings
) -> list[SampledQuestion]:
    """Sample one batch of questions (retried as a whole: the same seeds give the same samples)."""
    return [sample_question(generator, model, q, settings) for q in questions]


@task(name="publish-events", retries=3, retry_delay_seconds=5, cache_policy=NO_CACHE)
def publish_task(bootstrap_servers: str, events: list[Envelope]) -> int:
    """Publish ``events`` with acknowledgements; each goes to the outbox first."""
    from prmloop.store.kafka.outbox import Outbox
    from prmloop.store.kafka.producer import EventProducer
    from prmloop.store.settings import StateSettings

    with EventProducer(bootstrap_servers, outbox=Outbox(StateSettings().outbox_dir, name="sample")) as producer:
        return producer.publish(events)


@task(name="per-question-table", cache_policy=NO_CACHE)
def artifact_task(summary: dict[str, Any]) -> None:
    from prefect.artifacts import create_table_artifact

    create_table_artifact(
        key=ARTIFACT_KEY,
        table=summary["per_question"],
        description=(
            f"sample: {summary['questions']} questions, k={summary['k']}, strategy={summary['strategy']}, "
            f"{summary['selected']} selected, {summary['dropped']} dropped (no parseable answer), "
            f"{summary['events_published']} events published"
        ),
    )


def _call(use_prefect: bool, t: Any, *args: Any) -> Any:
    """Run a task through Prefect (retries, UI) or as its plain function."""
    return t(*args) if use_prefect else t.fn(*args)


@contextmanager
def _progress(enabled: bool, total: int) -> Iterator[Callable[[int], None]]:
    if not enabled:
        yield lambda _n: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("sampling"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), transient=False
    ) as bar:
        job = bar.add_task("questions", total=total)
        yield lambda n: bar.advance(job, n)


def _batches(items: Sequence[_T], size: int) -> Iterator[list[_T]]:
    for start in range(0, len(items), size):
        yield list(items[start : start + size])


def _pipeline(
    settings: SampleSettings, *, use_prefect: bool, bootstrap_servers: str | None, progress: bool
) -> dict[str, Any]:
    logger = get_run_logger() if use_prefect else log
    started = time.perf_counter()
    questions, errors = _call(use_prefect, load_questions_task, settings)
    for error in errors:
        logger.warning("%s", error)
    if bootstrap_servers is None:
        from prmloop.store.kafka.broker_file import require_bootstrap_servers

        bootstrap_servers = require_bootstrap_servers()
    backend_config = settings.backend_config()
    generator = build_backend(backend_config)
    model = ModelRef(backend=backend_config.backend, name=generator.model_name)
    logger.info(
        "sampling %d questions with %s (k=%d, m=%d, n=%d, strategy=%s, seed=%d)",
        len(questions),
        model.name,
        settings.k,
        settings.m,
        settings.n,
        settings.strategy,
        settings.seed,
    )
    registrations = [question_registered(q, producer=PRODUCER) for q in questions]
    published = _call(use_prefect, publish_task, bootstrap_servers, registrations)
    results: list[SampledQuestion] = []
    sampling_s = 0.0
    with _progress(progress, len(questions)) as advance:
        for batch in _batches(questions, settings.batch_size):
            t0 = time.perf_counter()
            with gpu_slot(use_prefect):
                done: list[SampledQuestion] = _call(use_prefect, sample_batch_task, generator, model, batch, settings)
            sampling_s += time.perf_counter() - t0
            published += _call(use_prefect, publish_task, bootstrap_servers, [e for r in done for e in r.events])
            results.extend(done)
            advance(len(batch))
            for r in done:
                # Also a progress line where there is no terminal (logs, CI, Prefect workers).
                logger.info("%d/%d %s: %s", len(results), len(questions), r.question.id, r.row())
    summary = summarize(
        results,
        settings=settings,
        generator=model.name,
        errors=errors,
        published=published,
        sampling_s=sampling_s,
        wall_s=time.perf_counter() - started,
    )
    if use_prefect:
        _call(use_prefect, artifact_task, summary)
    logger.info(
        "sampled %d solutions of %d questions: %.1f%% correct, %d selected, %d dropped, %d events in %.1f s",
        summary["solutions"],
        summary["questions"],
        100 * summary["fraction_correct"],
        summary["selected"],
        summary["dropped"],
        published,
        summary["wall_s"],
    )
    return summary


@flow(name="sample")
def sample(
    settings: SampleSettings | None = None, bootstrap_servers: str | None = None, progress: bool = False
) -> dict[str, Any]:
    """Sample, grade, score and select solutions of a question set; publish the kept ones.

    Returns the summary of :func:`~prmloop.producers.sampler.summarize`.
    """
    return _pipeline(
        settings or SampleSettings(), use_prefect=True, bootstrap_servers=bootstrap_servers, progress=progress
    )


def run_sample(
    settings: SampleSettings,
    *,
    bootstrap_servers: str | None = None,
    progress: bool = False,
    prefect: bool = True,
) -> dict[str, Any]:
    """Run the sampling loop for ``settings`` and return its summary.

    Args:
        bootstrap_servers: the broker; default ``require_bootstrap_servers()`` (env or ``prmloop broker``).
        progress: show a rich progress bar on the terminal (progress lines are logged either way).
        prefect: run as the Prefect flow ``sample`` (tasks, retries, artifact); ``False`` runs the same
            steps as plain functions, without a Prefect API.
    """
    if prefect:
        return sample(settings, bootstrap_servers=bootstrap_servers, progress=progress)
    return _pipeline(settings, use_prefect=False, bootstrap_servers=bootstrap_servers, progress=progress)
