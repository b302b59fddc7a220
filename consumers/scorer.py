"""The step scorer: ``solutions.sampled`` -> ``steps.scored`` (UnPRM Algorithm 1, lines 8-12).

The scorer is the one owner of step uncertainty. For every ``SolutionSampled`` it publishes one
``StepsScored`` with the uncertainty ``u(s_t)`` of each step, the deltas ``Δu(s_t)``, the steps ordered
by descending ``Δu`` (the order the annotator's uncertainty-driven search visits), the temperature and
where the log-probabilities came from, and the solution as later stages need it (problem, steps,
grade, gold answer): the annotator and the judge consume ``steps.scored`` and nothing else.

UnPRM (Sec. 3) scores a token sequence with log-probabilities ``p_1..p_n`` by a softmax over the
*sequence*, ``z = softmax(p / T)``, and its entropy ``u = -sum_i z_i log z_i``, applied to the tokens
of one step: ``u(s_t)``; then ``Δu(s_t) = u(s_t) - u(s_{t-1})``. The paper uses ``T = 1``; UnPRM's
public code divides the log-probabilities by ``T = 5``. The temperature is part of the event id, so
both can be published side by side.

Where ``u`` comes from (``source``, also part of the event id):

- ``sampled``: the solution carries ``token_logprobs`` and ``step_token_offsets``: the generator's own
  log-probabilities, so the event's ``scorer`` is the solution's ``generator``. No model is needed.
- ``teacher_forced``: otherwise, with a model configured (``--model``), recomputed by teacher forcing
  (:func:`~prmloop.models.scoring.teacher_forced_logprobs`).
- ``simulator``: ``--simulator`` gives simulated solutions their world's Δu.
- ``none``: no log-probabilities and no model: the event is still published, with ``u`` unknown
  (``None``), so strategies that need no Δu can label the solution.

Step ranking: the paper's list ``U`` holds the steps ``t > 1`` only. Here ``u(s_0) = 0`` (the empty
prefix), so ``Δu(s_1) = u(s_1)`` and ``step_order`` ranks *every* step, step 0 included, because the
uncertainty-driven search must be able to place the first error at step 0 too.

A solution without steps, with step offsets that do not match its steps, or that needs teacher
forcing but carries no problem text is rejected to ``solutions.sampled.dlq`` with the reason; a model
server that cannot be reached is retried with backoff, any other failure dead-letters the solution it
happened on (``prmloop.store.kafka.poison``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from prmloop.models.backends.base import Scorer
from prmloop.models.backends.registry import EngineSettings, build_backend
from prmloop.models.prompts import prompt_format_of, solution_prompt, step_format
from prmloop.models.scoring import teacher_forced_logprobs
from prmloop.models.simulator import SIMULATOR_NAME, SimulatedStepUncertainty, SimulatorOptions
from prmloop.models.uncertainty import PAPER_TEMPERATURE, rank_steps_by_delta, step_uncertainty, uncertainty_deltas
from prmloop.store.events import (
    Envelope,
    ModelRef,
    SampleAsRollout,
    SolutionSampled,
    StepsScored,
    deterministic_event_id,
    make_event,
)
from prmloop.store.kafka.producer import EventProducer
from prmloop.store.kafka.runtime import ConsumedEvent
from prmloop.store.kafka.service import run_service
from prmloop.store.settings import KafkaSettings

__all__ = ["PRODUCER", "SCORER_GROUP", "ScorerSettings", "StepScorer", "build_scorer", "run_scorer", "scored_event"]

log = logging.getLogger(__name__)

PRODUCER = "prmloop.scorer/1"
SCORER_GROUP = "prmloop-scorer"
SIMULATOR_REF = ModelRef(backend=SIMULATOR_NAME, name=SIMULATOR_NAME)


class ScorerSettings(EngineSettings, SimulatorOptions):
    """Options of the step scorer service (``prmloop score``; environment ``PRMLOOP_SCORER_*``)."""

    model_config = SettingsConfigDict(env_prefix="PRMLOOP_SCORER_", frozen=True, extra="ignore")

    model: str | None = Field(
        default=None,
        description="teacher-force solutions that carry no log-probs with this model ('smollm2', ...); "
        "without one their u(s_t) is published as unknown",
    )
    simulator: bool = Field(default=False, description="give simulated solutions their world's Δu (see --sim-*)")
    temperature: float = Field(default=PAPER_TEMPERATURE, gt=0.0, description="T of UnPRM's softmax (1 paper, 5 code)")
    group: str = Field(default=SCORER_GROUP, description="consumer group; processes in one group share partitions")
    topic: str = Field(default=SolutionSampled.TOPIC, description="read solutions from this topic")
    max_batch: int = Field(default=64, ge=1, description="solutions per batch")
    until_idle: float | None = Field(default=None, gt=0, description="exit after this many seconds without input")


def as_rollout(sampled: SolutionSampled) -> SampleAsRollout | None:
    """The solution as one rollout from its question, where the generator's log-probs came with it."""
    logprobs = sampled.token_logprobs
    if not logprobs:
        return None
    return SampleAsRollout(
        generator=sampled.generator,
        temperature=sampled.sampling.temperature,
        top_p=sampled.sampling.top_p,
        completion_tokens=len(logprobs),
        sum_logprob=math.fsum(logprobs),
    )


def scored_event(
    sampled: SolutionSampled,
    step_u: Sequence[float] | None,
    scorer_ref: ModelRef,
    *,
    temperature: float,
    source: str,
    causation_id: Any = None,
) -> Envelope:
    """The ``StepsScored`` of one solution with its deterministic id (solution, scorer, T, source)."""
    deltas = uncertainty_deltas(step_u) if step_u is not None else None
    payload = StepsScored(
        solution_id=sampled.solution_id,
        question_id=sampled.question_id,
        scorer=scorer_ref,
        step_uncertainty=tuple(step_u) if step_u is not None else None,
        uncertainty_delta=deltas,
        # Every step, step 0 included (the paper ranks t > 1 only; see the module docstring).
        step_order=rank_steps_by_delta(deltas, include_first=True) if deltas is not None else None,
        temperature=temperature,
        source=source,
        problem=sampled.problem,
        steps=sampled.steps,
        prompt_format=sampled.prompt_format,
        correct=sampled.correct,
        final_answer=sampled.final_answer,
        gold_answer=sampled.gold_answer,
        as_rollout=as_rollout(sampled),
    )
    event_id = deterministic_event_id("StepsScored", sampled.solution_id, scorer_ref.model_dump(), temperature, source)
    return make_event(payload, producer=PRODUCER, event_id=event_id, causation_id=causation_id)


class _Reject(Exception):
    """A solution that can never be scored; the message is the dead-letter reason."""


class StepScorer:
    """Batch handler: score every ``SolutionSampled`` of a batch and publish the ``StepsScored`` at once.

    Args:
        publish: acknowledged publication of a list of events (``EventProducer.publish``); called once
            per batch, before the handler returns (the runtime commits the offsets afterwards).
        scorer: the model that teacher-forces solutions without log-probabilities (``None``: their
            ``u`` is published as unknown).
        scorer_ref: the provenance of ``scorer`` (default: its class and ``model_name``).
        simulated: ``u(s_t)`` of simulated solutions by problem text (checked before anything else).
        temperature: ``T`` of the softmax (1 = paper, 5 = UnPRM's code).
    """

    def __init__(
        self,
        publish: Callable[[list[Envelope]], object],
        *,
        scorer: Scorer | None = None,
        scorer_ref: ModelRef | None = None,
        simulated: Callable[[str], tuple[float, ...] | None] | None = None,
        temperature: float = PAPER_TEMPERATURE,
    ) -> None:
        if not temperature > 0:
            raise ValueError(f"temperature must be positive, got {temperature}")
        self.publish = publish
        self.scorer = scorer
        self.scorer_ref = scorer_ref
        if scorer is not None and scorer_ref is None:
            self.scorer_ref = ModelRef(backend=type(scorer).__name__, name=scorer.model_name)
        self.simulated = simulated
        self.temperature = temperature
        self.counts: dict[str, int] = {"sampled": 0, "teacher_forced": 0, "simulator": 0, "none": 0}
        self.rejected = 0
        self.published = 0
        self.no_steps = 0

    def counters(self) -> dict[str, int]:
        return {
            "scored_from_logprobs": self.counts["sampled"],
            "teacher_forced": self.counts["teacher_forced"],
            "simulated": self.counts["simulator"],
            "unknown_uncertainty": self.counts["none"],
            "rejected": self.rejected,
            "published": self.published,
            "no_steps": self.no_steps,
        }

    def __call__(self, batch: list[ConsumedEvent]) -> Iterable[tuple[ConsumedEvent, str]]:
        out: list[Envelope] = []
        sources: list[str] = []
        rejected: list[tuple[ConsumedEvent, str]] = []
        no_steps = 0
        for consumed in batch:
            payload = consumed.event.payload
            if not isinstance(payload, SolutionSampled):
                continue
            if not payload.steps:
                # The sampler's own record of a sample it could not split (no parseable answer, seen about
                # once in 300 of SmolLM2's): a valid event with nothing to score, passed over, not poison.
                no_steps += 1
                continue
            try:
                step_u, ref, source = self._uncertainty(payload)
            except _Reject as reason:
                rejected.append((consumed, str(reason)))
                continue
            out.append(
                scored_event(
                    payload,
                    step_u,
                    ref,
                    temperature=self.temperature,
                    source=source,
                    causation_id=consumed.event.event_id,
                )
            )
            sources.append(source)
        if out:
            self.publish(out)
        # Counted once the batch's effect is done (a failed publish retries the whole batch).
        self.published += len(out)
        for source in sources:
            self.counts[source] += 1
        self.rejected += len(rejected)
        self.no_steps += no_steps
        return rejected

    def _uncertainty(self, sampled: SolutionSampled) -> tuple[tuple[float, ...] | None, ModelRef, str]:
        sid = sampled.solution_id
        if self.simulated is not None and sampled.problem is not None:
            found = self.simulated(sampled.problem)
            if found is not None:
                if len(found) != len(sampled.steps):
                    raise _Reject(
                        f"{sid}: the simulated world has {len(found)} steps, the solution {len(sampled.steps)}"
                    )
                return found, SIMULATOR_REF, "simulator"
        offsets = sampled.step_token_offsets
        if sampled.token_logprobs is not None and offsets is not None:
            if len(offsets) != len(sampled.steps):
                raise _Reject(f"{sid} has {len(sampled.steps)} steps but {len(offsets)} step_token_offsets")
            return self._entropy(sid, sampled.token_logprobs, offsets), sampled.generator, "sampled"
        if self.scorer is None or self.scorer_ref is None:
            return None, ModelRef(backend="none", name="none"), "none"
        if not sampled.problem:
            raise _Reject(
                f"{sid} carries no problem text (an older producer published it); re-publish it with "
                "`prmloop sample` or `prmloop import` to teacher-force it"
            )
        prompt = solution_prompt(self.scorer, sampled.problem, prompt_format_of(sampled.prompt_format))
        try:
            logprobs, forced_offsets = teacher_forced_logprobs(
                self.scorer, prompt, sampled.steps, step_format(sampled.prompt_format)
            )
        except ValueError as error:
            raise _Reject(f"{sid}: teacher forcing failed: {error}") from error
        return self._entropy(sid, logprobs, forced_offsets), self.scorer_ref, "teacher_forced"

    def _entropy(self, sid: str, logprobs: Sequence[float], offsets: Sequence[int]) -> tuple[float, ...]:
        try:
            return step_uncertainty(logprobs, offsets, temperature=self.temperature)
        except ValueError as error:
            raise _Reject(f"{sid}: {error}") from error


def build_scorer(settings: ScorerSettings, publish: Callable[[list[Envelope]], object]) -> StepScorer:
    """The scorer handler ``settings`` describe (loads the teacher-forcing model, rebuilds a simulated world)."""
    scorer: Scorer | None = None
    scorer_ref: ModelRef | None = None
    if settings.model is not None:
        scorer = build_backend(settings.backend_config())
        scorer_ref = ModelRef(backend=settings.backend, name=scorer.model_name)
    simulated = SimulatedStepUncertainty(settings.world()[1]) if settings.simulator else None
    return StepScorer(
        publish, scorer=scorer, scorer_ref=scorer_ref, simulated=simulated, temperature=settings.temperature
    )


def run_scorer(
    settings: ScorerSettings,
    *,
    bootstrap_servers: str,
    kafka: KafkaSettings | None = None,
    until: Callable[[], bool] | None = None,
    install_signal_handlers: bool = True,
) -> dict[str, int]:
    """Run the scorer until SIGTERM/SIGINT, ``until()``, or ``settings.until_idle`` seconds without input.

    Returns:
        The handler's counters and the runtime's ``batches`` and ``dead_lettered``.
    """
    kafka = kafka or KafkaSettings()
    producer = EventProducer(bootstrap_servers, kafka=kafka)
    try:
        handler = build_scorer(settings, producer.publish)
    except BaseException:
        producer.close()
        raise
    return run_service(
        "scorer",
        handler,
        topics=[settings.topic],
        group_id=settings.group,
        bootstrap_servers=bootstrap_servers,
        counters=handler.counters,
        kafka=kafka,
        max_batch=settings.max_batch,
        until=until,
        idle_timeout_s=settings.until_idle,
        install_signal_handlers=install_signal_handlers,
        close=[producer.close],
    ).as_dict()
