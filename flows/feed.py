"""The Prefect flow ``feed``: the streaming loop's sampler, one small batch of questions per flow run.

The loop's driver (:mod:`prmloop.flows.loop.driver`) keeps the engine a little ahead of the consumers by
starting one ``feed`` run whenever the solutions waiting for annotation run short. A run does two
things, both through the one engine, with the questions of a batch sampled concurrently so the
engine's continuous batching sees them together:

1. **probe** new questions with ``probe_k`` samples each and compute their priority
   (:func:`~prmloop.producers.prioritize.prioritize_question`: ``4q(1-q)``, answer dispersion, token
   uncertainty, and the spread of the promoted PRM's scores once one exists). The probe's graded
   solutions are published like any other sample (they are labelled too: probing costs no wasted
   tokens), with a ``QuestionPrioritized`` each;
2. **top up** the questions the driver took from the top of its queue (ranked by earlier probes) with
   ``k - probe_k`` more samples each, so the informative questions get ``k`` solutions in all.

With ``probe_k = 0`` (the bench's random-order arm) nothing is probed: the questions given to top
up get all ``k`` samples.

The run returns one row per probed question (id, priority, signals, correct probes), which the
driver merges into its queue, and what it cost (solutions, generated tokens, seconds).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from pydantic import Field
from pydantic_settings import SettingsConfigDict

from prmloop.flows.sample import publish_task
from prmloop.models.backends.base import Generator
from prmloop.models.backends.registry import EngineSettings, build_backend
from prmloop.models.questions import Question
from prmloop.producers.events import question_registered
from prmloop.producers.prioritize import PRODUCER, Prioritized, PrioritizeSettings, SolutionScorer, prioritize_question
from prmloop.producers.sampler import SampledQuestion, SampleSettings, sample_question
from prmloop.store.events import Envelope, ModelRef

__all__ = ["FeedSettings", "feed", "run_feed"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")
_R = TypeVar("_R")


class FeedSettings(EngineSettings):
    """How the streaming loop samples (environment ``PRMLOOP_FEED_*``)."""

    model_config = SettingsConfigDict(env_prefix="PRMLOOP_FEED_", frozen=True, extra="ignore")

    k: int = Field(default=4, ge=1, description="solutions a queued question gets in all (its probes among them)")
    probe_k: int = Field(default=2, ge=0, description="probe samples of a new question (0: no probe, random order)")
    max_new_tokens: int = Field(default=192, ge=1, description="generation budget per solution, in tokens")
    temperature: float = Field(default=0.7, ge=0.0, description="sampling temperature")
    seed: int = Field(default=0, description="run seed (solution ids and sampling seeds derive from it)")
    concurrency: int = Field(
        default=8, ge=1, description="questions sampled at once (a server engine batches them; in process: 1)"
    )
    prm: Path | None = Field(default=None, description="the promoted PRM's artifact (adds its score spread)")

    def probe_settings(self) -> PrioritizeSettings:
        return PrioritizeSettings(
            backend=self.backend,
            model=self.model,
            base_url=self.base_url,
            threads=self.threads,
            k=max(1, self.probe_k),
            seed=self.seed,
            temperature=self.temperature,
            max_new_tokens=self.max_new_tokens,
            publish_probes=True,
            prefect=False,
        )

    def top_up_settings(self) -> SampleSettings:
        more = self.k - self.probe_k if self.probe_k else self.k
        return SampleSettings(
            backend=self.backend,
            model=self.model,
            base_url=self.base_url,
            threads=self.threads,
            k=max(1, more),
            m=self.k,
            n=self.k,
            seed=self.seed,
            temperature=self.temperature,
            max_new_tokens=self.max_new_tokens,
            publish_unselected=True,
            prefect=False,
        )


_PRMS: dict[str, SolutionScorer] = {}


class _OneAtATime:
    """A PRM that scores for one caller at a time: the probe's threads share one in-process model."""

    def __init__(self, prm: SolutionScorer) -> None:
        self.prm = prm
        self.lock = threading.Lock()

    def score_solutions(self, problems: Sequence[str], steps: Sequence[Sequence[str]]) -> list[list[float]]:
        with self.lock:
            return self.prm.score_solutions(problems, steps)


def _prm(path: Path | None, threads: int | None) -> SolutionScorer | None:
    """The PRM at ``path``, loaded once per process (the driver's feeds share it)."""
    if path is None:
        return None
    key = str(path)
    if key not in _PRMS:
        from prmloop.models.prm.load import load_prm
        from prmloop.store.settings import StateSettings

        _PRMS.clear()  # one PRM in force at a time: the newly promoted one replaces the old
        _PRMS[key] = _OneAtATime(load_prm(path, cache_dir=StateSettings().features_dir, threads=threads))
    return _PRMS[key]


def _each(items: Sequence[_T], function: Callable[[_T], _R], concurrency: int) -> list[_R]:
    if concurrency <= 1 or len(items) <= 1:
        return [function(item) for item in items]
    with ThreadPoolExecutor(max_workers=min(concurrency, len(items)), thread_name_prefix="feed") as pool:
        return list(pool.map(function, items))


@task(name="probe", cache_policy=NO_CACHE)
def probe_task(
    generator: Generator, model: ModelRef, questions: list[Question], settings: FeedSettings
) -> list[Prioritized]:
    """Probe ``questions`` (concurrently on a server engine) and compute their priorities."""
    prm = _prm(settings.prm, settings.threads)
    probe = settings.probe_settings()
    return _each(questions, lambda q: prioritize_question(generator, model, q, probe, prm=prm), _concurrency(settings))


@task(name="top-up", cache_policy=NO_CACHE)
def top_up_task(
    generator: Generator, model: ModelRef, questions: list[Question], settings: FeedSettings
) -> list[SampledQuestion]:
    """Sample ``k - probe_k`` more solutions of each question the driver took from its queue."""
    sampling = settings.top_up_settings()
    return _each(questions, lambda q: sample_question(generator, model, q, sampling), _concurrency(settings))


def _concurrency(settings: FeedSettings) -> int:
    return settings.concurrency if settings.backend in ("openai", "vllm") else 1


def _call(use_prefect: bool, t: Any, *args: Any) -> Any:
    return t(*args) if use_prefect else t.fn(*args)


def _pipeline(
    probe: list[Question], top_up: list[Question], settings: FeedSettings, bootstrap_servers: str, use_prefect: bool
) -> dict[str, Any]:
    logger = get_run_logger() if use_prefect else log
    started = time.perf_counter()
    config = settings.backend_config()
    generator = build_backend(config)
    model = ModelRef(backend=config.backend, name=generator.model_name)
    probed: list[Prioritized] = []
    if probe and settings.probe_k:
        probed = _call(use_prefect, probe_task, generator, model, probe, settings)
    topped: list[SampledQuestion] = []
    if top_up:
        topped = _call(use_prefect, top_up_task, generator, model, top_up, settings)
    events: list[Envelope] = [question_registered(q, producer=PRODUCER) for q in probe]
    for done in probed:
        events += [*done.solutions, done.event]
    for sampled in topped:
        events += [sampled.registered, *sampled.events]
    published = _call(use_prefect, publish_task, bootstrap_servers, events) if events else 0
    solutions = sum(len(p.solutions) for p in probed) + sum(len(s.events) for s in topped)
    tokens = sum(p.probe.tokens for p in probed) + sum(s.completion_tokens for s in topped)
    summary = {
        "probed": [
            {
                **p.row(),
                "correct": p.probe.n_correct,
                "graded": sum(c is not None for c in p.probe.correct),
                "tokens": p.probe.tokens,
            }
            for p in probed
        ],
        "topped_up": [{**s.row()} for s in topped],
        "solutions": solutions,
        "correct": sum(p.probe.n_correct for p in probed) + sum(c is True for s in topped for c in s.correct),
        "generated_tokens": tokens,
        "events_published": published,
        "prm": str(settings.prm) if settings.prm else None,
        "wall_s": round(time.perf_counter() - started, 3),
    }
    logger.info(
        "feed: probed %d new questions, topped up %d: %d solutions (%d correct), %d tokens in %.1fs",
        len(probed),
        len(topped),
        solutions,
        summary["correct"],
        tokens,
        summary["wall_s"],
    )
    return summary


@flow(name="feed")
def feed(
    probe: list[Question], top_up: list[Question], settings: FeedSettings, bootstrap_servers: str
) -> dict[str, Any]:
    """Probe new questions and top up the best queued ones (see the module docstring)."""
    return _pipeline(probe, top_up, settings, bootstrap_servers, use_prefect=True)


def run_feed(
    probe: list[Question],
    top_up: list[Question],
    settings: FeedSettings,
    *,
    bootstrap_servers: str,
    prefect: bool = True,
) -> dict[str, Any]:
    """One feed, as the Prefect flow ``feed`` (a flow run in the UI) or as a plain call."""
    if prefect:
        return feed(probe, top_up, settings, bootstrap_servers)
    return _pipeline(probe, top_up, settings, bootstrap_servers, use_prefect=False)
