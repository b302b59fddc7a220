"""The selector: ``steps.scored`` -> ``steps.selected``, spending labels where the PRM is unsure.

ActPRM (Duan et al., 2025, Algorithm 1): the promoted ensemble PRM scores each solution's steps (mean
and standard deviation over its heads, :mod:`prmloop.models.prm.ensemble_prm`); a solution whose every
step through the first predicted error is confident (the heads agree, ``σ < σ_max``, and the mean is
extreme, ``μ ≥ δ`` or ``μ ≤ 1 - δ``) is *skipped*: its rollouts and judging would teach the PRM little.
The others are sent on to be labelled, most uncertain first. With no promoted ensemble yet, every
solution is labelled, and so is every correct solution (``label_correct``, the default): MC labels it
without a rollout, so skipping it would save nothing.

Each decision is a ``SolutionSelected`` event with the PRM, the thresholds, the per-step means and
standard deviations and the verdict in words, so SQL answers "what did the PRM skip, and why"
(the ``selections`` view). It carries the scored solution whole; the annotator and the judge read
``steps.selected`` and work on ``decision = 'label'`` only. Its id is derived from (solution, PRM,
rule, thresholds): a restarted selector publishes the same ids, and a newer PRM deciding again on a
solution an older one skipped publishes a new event (``prmloop select --revisit``).

The promoted ensemble is looked up in the store's registry (``ModelRegistered`` of kind
``prm_ensemble``) every ``refresh_s`` seconds, so a retrain takes effect without a restart.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from prmloop.models.prm.active import Decision, Thresholds, decide
from prmloop.models.prm.ensemble import StepStats
from prmloop.models.prm.ensemble_prm import EnsemblePRM
from prmloop.store.events import (
    Envelope,
    ModelRef,
    SolutionSelected,
    StepsScored,
    deterministic_event_id,
    make_event,
)
from prmloop.store.kafka.producer import EventProducer
from prmloop.store.kafka.runtime import ConsumedEvent
from prmloop.store.kafka.service import run_service
from prmloop.store.settings import KafkaSettings, StateSettings

__all__ = ["SELECTOR_GROUP", "Selector", "SelectorSettings", "run_selector", "selection_event"]

log = logging.getLogger(__name__)

PRODUCER = "prmloop.selector/1"
SELECTOR_GROUP = "prmloop-selector"
ENSEMBLE_KIND = "prm_ensemble"


class SelectorSettings(BaseSettings):
    """Options of the selector service (``prmloop select``; environment ``PRMLOOP_SELECTOR_*``)."""

    model_config = SettingsConfigDict(env_prefix="PRMLOOP_SELECTOR_", frozen=True, extra="ignore")

    prm: Path | None = Field(
        default=None, description="an ensemble PRM folder; default: the promoted ensemble in the store's registry"
    )
    db: str | None = Field(default=None, description="the store whose registry names the PRM (default PRMLOOP_STORE)")
    rule: Literal["actprm", "epistemic", "aleatoric"] = Field(
        default="actprm", description="actprm (both uncertainties, ActPRM), epistemic or aleatoric"
    )
    delta: float = Field(default=0.95, gt=0.5, lt=1.0, description="a mean >= delta or <= 1-delta is confident")
    std_max: float = Field(default=0.05, gt=0.0, description="heads whose std is below this agree")
    refresh_s: float = Field(default=30.0, gt=0, description="seconds between looks for a newly promoted PRM")
    threads: int | None = Field(default=None, ge=1, description="torch CPU threads for the PRM's backbone")
    label_correct: bool = Field(
        default=True,
        description="label every correct solution without asking the PRM: MC labels it with no rollout",
    )
    group: str = Field(default=SELECTOR_GROUP, description="consumer group; processes in one group share partitions")
    topic: str = Field(default=StepsScored.TOPIC, description="read scored solutions from this topic")
    max_batch: int = Field(default=32, ge=1, description="solutions per batch")
    until_idle: float | None = Field(default=None, gt=0, description="exit after this many seconds without input")
    revisit: bool = Field(
        default=False,
        description="instead of reading the topic: decide again, with the promoted PRM, on every solution an "
        "older PRM skipped, publish the new decisions and exit",
    )

    def thresholds(self, tau: float = 0.5) -> Thresholds:
        return Thresholds(delta=self.delta, std_max=self.std_max, tau=min(0.99, max(0.01, tau)), rule=self.rule)


def selection_event(
    scored: StepsScored,
    decision: Decision,
    stats: StepStats | None,
    *,
    prm: ModelRef | None,
    thresholds: Thresholds | None,
    causation_id: Any = None,
) -> Envelope:
    """The ``SolutionSelected`` event of one decision, with its deterministic id."""
    limits = {"delta": thresholds.delta, "std_max": thresholds.std_max, "tau": thresholds.tau} if thresholds else {}
    rule = thresholds.rule if thresholds else "none"
    payload = SolutionSelected(
        solution_id=scored.solution_id,
        question_id=scored.question_id,
        decision="label" if decision.label else "skip",
        reason=decision.reason,
        prm=prm,
        rule=rule,
        thresholds=limits,
        score=decision.score if math.isfinite(decision.score) else None,
        checked_steps=decision.checked,
        step_mean=tuple(round(v, 5) for v in stats.mean) if stats else (),
        step_std=tuple(round(v, 5) for v in stats.std) if stats else (),
        scored=scored,
    )
    event_id = deterministic_event_id(
        "SolutionSelected", scored.solution_id, prm.model_dump() if prm else None, rule, limits
    )
    return make_event(payload, producer=PRODUCER, event_id=event_id, causation_id=causation_id)


class PromotedEnsemble:
    """The ensemble PRM to decide with: a fixed folder, or the store's promoted one (looked up again
    every ``refresh_s`` seconds; loaded once per model id)."""

    def __init__(
        self, settings: SelectorSettings, *, cache_dir: Path, loader: Callable[..., EnsemblePRM] | None = None
    ):
        self.settings = settings
        self.cache_dir = cache_dir
        self.loader = loader or EnsemblePRM.load
        self._checked = -math.inf
        self._current: tuple[ModelRef, EnsemblePRM] | None = None

    def get(self) -> tuple[ModelRef, EnsemblePRM] | None:
        if self.settings.prm is not None:
            if self._current is None:
                prm = self.loader(self.settings.prm, cache_dir=self.cache_dir, threads=self.settings.threads)
                self._current = (ModelRef(backend="ensemble", name=str(self.settings.prm)), prm)
            return self._current
        if time.monotonic() - self._checked < self.settings.refresh_s:
            return self._current
        self._checked = time.monotonic()
        from prmloop.store.tables.registry import current_model

        db = self.settings.db or str(StateSettings().store_location)
        try:
            promoted = current_model(db, kind=ENSEMBLE_KIND)
        except Exception as error:  # noqa: BLE001 - a store being written or missing: keep the PRM we have
            log.warning("selector: could not read the registry in %s (%s); keeping the current PRM", db, error)
            return self._current
        if promoted is None:
            return self._current
        model_id = str(promoted["model_id"])
        if self._current is None or self._current[0].name != model_id:
            prm = self.loader(Path(promoted["artifact_uri"]), cache_dir=self.cache_dir, threads=self.settings.threads)
            digest = (promoted.get("parameters") or {}).get("digest")
            self._current = (ModelRef(backend="ensemble", name=model_id, revision=digest), prm)
            log.info("selector: deciding with the promoted ensemble PRM %s", model_id)
        return self._current


class Selector:
    """Batch handler: decide on every ``StepsScored`` of a batch, publish the decisions (most uncertain
    first) before returning."""

    def __init__(
        self, settings: SelectorSettings, publish: Callable[[list[Envelope]], object], ensemble: PromotedEnsemble
    ):
        self.settings = settings
        self.publish = publish
        self.ensemble = ensemble
        self.counts: Counter[str] = Counter()

    def __call__(self, batch: list[ConsumedEvent]) -> Iterable[tuple[ConsumedEvent, str]]:
        todo = [(c.event.payload, c.event.event_id) for c in batch if isinstance(c.event.payload, StepsScored)]
        if not todo:
            return []
        events = decide_all([s for s, _ in todo], self.ensemble.get(), self.settings, [cause for _, cause in todo])
        events.sort(key=lambda e: -_score(e))
        self.publish(events)
        for event in events:
            assert isinstance(event.payload, SolutionSelected)
            self.counts[event.payload.decision] += 1
        return []


def _score(event: Envelope) -> float:
    payload = event.payload
    assert isinstance(payload, SolutionSelected)
    return math.inf if payload.score is None else payload.score


def decide_all(
    scored: Sequence[StepsScored],
    current: tuple[ModelRef, EnsemblePRM] | None,
    settings: SelectorSettings,
    causes: Sequence[Any] | None = None,
) -> list[Envelope]:
    """One ``SolutionSelected`` per scored solution: by ``current`` (model ref and PRM), or "label" when none.

    Whatever the PRM: a solution without a grade is skipped (no answer stated: no rollout can be judged
    against it, the annotator would only refuse it), a correct one is labelled (``label_correct``)."""
    causes = causes or [None] * len(scored)
    ref, prm = current if current is not None else (None, None)
    thresholds = settings.thresholds(prm.threshold) if prm is not None else None
    fixed: list[Decision | None] = []
    for s in scored:
        if s.correct is None:
            fixed.append(Decision(False, math.inf, 0, None, "not graded (it states no final answer): nothing to label"))
        elif prm is None:
            fixed.append(Decision(True, math.inf, 0, None, "no promoted ensemble PRM yet: every solution is labelled"))
        elif settings.label_correct and s.correct:
            fixed.append(Decision(True, math.inf, 0, None, "correct: labelled without rollouts, whatever the PRM says"))
        else:
            fixed.append(None)
    asked = [s for s, f in zip(scored, fixed, strict=True) if f is None]
    stats = iter(
        prm.step_stats([s.problem or "" for s in asked], [list(s.steps) for s in asked]) if asked and prm else []
    )
    events = []
    for s, f, c in zip(scored, fixed, causes, strict=True):
        if f is not None:
            events.append(selection_event(s, f, None, prm=ref, thresholds=thresholds, causation_id=c))
        else:
            assert prm is not None and thresholds is not None
            st = next(stats)
            events.append(
                selection_event(s, decide(st, thresholds), st, prm=ref, thresholds=thresholds, causation_id=c)
            )
    return events


def run_selector(
    settings: SelectorSettings,
    *,
    bootstrap_servers: str,
    kafka: KafkaSettings | None = None,
    until: Callable[[], bool] | None = None,
    install_signal_handlers: bool = True,
    ensemble: PromotedEnsemble | None = None,
) -> dict[str, int]:
    """Run the selector until SIGTERM/SIGINT, ``until()``, or ``settings.until_idle`` seconds without input."""
    kafka = kafka or KafkaSettings()
    producer = EventProducer(bootstrap_servers, kafka=kafka)
    ensemble = ensemble or PromotedEnsemble(settings, cache_dir=StateSettings().home / "features")
    handler = Selector(settings, producer.publish, ensemble)
    return run_service(
        "selector",
        handler,
        topics=[settings.topic],
        group_id=settings.group,
        bootstrap_servers=bootstrap_servers,
        counters=lambda: {"label": handler.counts["label"], "skip": handler.counts["skip"]},
        kafka=kafka,
        max_batch=settings.max_batch,
        until=until,
        idle_timeout_s=settings.until_idle,
        install_signal_handlers=install_signal_handlers,
        close=[producer.close],
    ).as_dict()
