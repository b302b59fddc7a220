"""The step-uncertainty scorer: ``solutions.sampled`` -> ``steps.scored`` (UnPRM Algorithm 1, lines 8-12).

For every ``SolutionSampled`` it publishes one ``StepsScored`` with the uncertainty ``u(s_t)`` of each
step, the deltas ``Δu(s_t)`` and the steps ordered by descending ``Δu``, which the annotator's
uncertainty-driven search visits in that order.

UnPRM (Sec. 3) scores a token sequence with log-probabilities ``p_1..p_n`` by a softmax over the
*sequence*, ``z = softmax(p / T)``, and its entropy

    u = -sum_{i=1}^{n} z_i log z_i

applied to the tokens of one step: ``u(s_t)``; then ``Δu(s_t) = u(s_t) - u(s_{t-1})``. The paper uses
``T = 1`` (:data:`~prmloop.models.uncertainty.PAPER_TEMPERATURE`, the default); UnPRM's public code
divides the log-probabilities by ``T = 5`` (``UNPRM_CODE_TEMPERATURE``), which flattens ``z``. The
temperature is part of the event id, so both can be published side by side.

Where the log-probabilities come from (the ``source`` in the event id):

- ``sampled``: the solution carries ``token_logprobs`` and ``step_token_offsets`` (the sampling flow
  records them): the generator's own log-probabilities, so the event's ``scorer`` is the solution's
  ``generator``. No model is needed.
- ``teacher_forced``: otherwise (imported data, an API without log-probabilities) a :class:`Scorer`
  recomputes them with teacher forcing: the prompt is :func:`~prmloop.models.prompts.solution_prompt`
  of the question in the solution's step format and the continuation its steps as
  :func:`~prmloop.models.prompts.format_steps` writes them. With a backend that exposes ``tokenizer``
  and ``score_ids`` (transformers) the prompt and each step are tokenised separately and scored in
  one forward pass, the step offsets being the cumulative token counts; any other scorer gets one
  ``score`` pair per step (the prompt plus the steps before it, then the step). The two agree
  wherever the steps tokenise the same alone as after their predecessors (true of ``Step k:`` lines).

Step ranking: the paper's list ``U`` holds the steps ``t > 1`` only (the first step has no
predecessor). Here ``u(s_0) = 0`` (the empty prefix), so ``Δu(s_1) = u(s_1)`` and ``step_order`` ranks
*every* step, step 0 included, because the annotator's uncertainty-driven search must be able to
place the first error at step 0 too (``rank_steps_by_delta(..., include_first=True)``).

A solution without steps, one whose question is not registered, and one that carries no
log-probabilities while the scorer runs without a model are rejected to ``solutions.sampled.dlq``
with the reason; a model failure raises, so the runtime retries the batch with backoff.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal

from prmloop.models.backends.base import Scorer
from prmloop.models.backends.registry import BackendConfig, build_backend
from prmloop.models.prompts import StepFormat, format_steps, solution_prompt
from prmloop.models.uncertainty import (
    PAPER_TEMPERATURE,
    rank_steps_by_delta,
    step_uncertainty,
    uncertainty_deltas,
)
from prmloop.store.consumer import ConsumedEvent, ConsumerRuntime
from prmloop.store.events import Envelope, ModelRef, SolutionSampled, StepsScored, deterministic_event_id, make_event
from prmloop.store.index import MissingKey, question_index
from prmloop.store.kafka import EventProducer
from prmloop.store.settings import KafkaSettings

__all__ = [
    "PRODUCER",
    "StepScorer",
    "run_scorer",
    "scored_event",
    "step_format",
    "teacher_forced_logprobs",
]

log = logging.getLogger(__name__)

PRODUCER = "prmloop.scorer/1"

Source = Literal["sampled", "teacher_forced"]


def step_format(prompt_format: str) -> StepFormat:
    """The step format of a solution's ``prompt_format`` (anything but ``double_newline`` is ``step_k``)."""
    return "double_newline" if prompt_format == "double_newline" else "step_k"


def teacher_forced_logprobs(
    scorer: Scorer, prompt: str, steps: Sequence[str], style: StepFormat
) -> tuple[tuple[float, ...], tuple[int, ...]]:
    """Teacher-forced log-probabilities of ``steps`` after ``prompt`` and the token offset of each step.

    Step ``t`` is written as ``format_steps([steps[t]], style, start=t + 1)``. With ``tokenizer`` and
    ``score_ids`` on the scorer: the prompt (the backend's own prompt encoding) and each step are
    tokenised separately and concatenated, one ``score_ids`` call. Otherwise one ``score`` call with a
    pair per step: ``(prompt + steps[:t], step t)``.

    Raises:
        ValueError: from the scorer (an empty prompt, for instance).
    """
    pieces = [format_steps([step], style, start=t + 1) for t, step in enumerate(steps)]
    tokenizer = getattr(scorer, "tokenizer", None)
    score_ids = getattr(scorer, "score_ids", None)
    if tokenizer is not None and callable(score_ids):
        encode_prompt = getattr(scorer, "encode_prompt", None)
        if callable(encode_prompt):
            prompt_ids = list(encode_prompt(prompt))
        else:
            special = bool(getattr(scorer, "add_special_tokens", False))
            prompt_ids = list(tokenizer.encode(prompt, add_special_tokens=special))
        piece_ids = [list(tokenizer.encode(piece, add_special_tokens=False)) for piece in pieces]
        [scored] = score_ids([(prompt_ids, [i for ids in piece_ids for i in ids])])
        offsets = tuple(itertools.accumulate((len(ids) for ids in piece_ids[:-1]), initial=0))
        return tuple(scored.logprobs), offsets
    pairs = [(prompt + "".join(pieces[:t]), piece) for t, piece in enumerate(pieces)]
    results = scorer.score(pairs)
    logprobs = tuple(p for r in results for p in r.logprobs)
    offsets = tuple(itertools.accumulate((len(r.logprobs) for r in results[:-1]), initial=0))
    return logprobs, offsets


def scored_event(
    sampled: SolutionSampled,
    step_u: Sequence[float],
    scorer_ref: ModelRef,
    *,
    temperature: float,
    source: Source,
    causation_id: Any = None,
) -> Envelope:
    """The ``StepsScored`` of one solution with its deterministic id (solution, scorer, T, source)."""
    deltas = uncertainty_deltas(step_u)
    payload = StepsScored(
        solution_id=sampled.solution_id,
        question_id=sampled.question_id,
        scorer=scorer_ref,
        step_uncertainty=tuple(step_u),
        uncertainty_delta=deltas,
        # Every step, step 0 included (the paper ranks t > 1 only; see the module docstring).
        step_order=rank_steps_by_delta(deltas, include_first=True),
    )
    event_id = deterministic_event_id("StepsScored", sampled.solution_id, scorer_ref.model_dump(), temperature, source)
    return make_event(payload, producer=PRODUCER, event_id=event_id, causation_id=causation_id)


class StepScorer:
    """Batch handler: score every ``SolutionSampled`` of a batch and publish the ``StepsScored`` at once.

    Args:
        publish: acknowledged publication of a list of events (``EventProducer.publish``); called once
            per batch, before the handler returns (the runtime commits the offsets afterwards).
        scorer: the model that teacher-forces solutions without log-probabilities (``None``: such
            solutions are rejected).
        scorer_ref: the provenance of ``scorer`` (default: its class and ``model_name``).
        question_text: problem text by question id (``question_index(...).get(qid).problem``); it
            may raise :class:`~prmloop.store.index.MissingKey`. Required with a scorer.
        temperature: ``T`` of the softmax (1 = paper, 5 = UnPRM's code).
    """

    def __init__(
        self,
        publish: Callable[[list[Envelope]], object],
        *,
        scorer: Scorer | None = None,
        scorer_ref: ModelRef | None = None,
        question_text: Callable[[str], str] | None = None,
        temperature: float = PAPER_TEMPERATURE,
    ) -> None:
        if not temperature > 0:
            raise ValueError(f"temperature must be positive, got {temperature}")
        if scorer is not None and question_text is None:
            raise ValueError("a scorer needs question_text: the teacher-forcing prompt contains the problem")
        self.publish = publish
        self.scorer = scorer
        self.scorer_ref = scorer_ref
        if scorer is not None and scorer_ref is None:
            self.scorer_ref = ModelRef(backend=type(scorer).__name__, name=scorer.model_name)
        self.question_text = question_text
        self.temperature = temperature
        self.scored_from_logprobs = 0
        self.teacher_forced = 0
        self.rejected = 0
        self.published = 0

    def counters(self) -> dict[str, int]:
        return {
            "scored_from_logprobs": self.scored_from_logprobs,
            "teacher_forced": self.teacher_forced,
            "rejected": self.rejected,
            "published": self.published,
        }

    def __call__(self, batch: list[ConsumedEvent]) -> Iterable[tuple[ConsumedEvent, str]]:
        out: list[Envelope] = []
        sources: list[Source] = []
        rejected: list[tuple[ConsumedEvent, str]] = []
        for consumed in batch:
            payload = consumed.event.payload
            if not isinstance(payload, SolutionSampled):
                continue
            try:
                event, source = self._score(payload, consumed.event.event_id)
            except _Reject as reason:
                rejected.append((consumed, str(reason)))
                continue
            out.append(event)
            sources.append(source)
        if out:
            self.publish(out)
        # Counted once the batch's effect is done (a failed publish retries the whole batch).
        self.published += len(out)
        self.scored_from_logprobs += sources.count("sampled")
        self.teacher_forced += sources.count("teacher_forced")
        self.rejected += len(rejected)
        return rejected

    def _score(self, sampled: SolutionSampled, causation_id: Any) -> tuple[Envelope, Source]:
        sid = sampled.solution_id
        if not sampled.steps:
            raise _Reject(f"{sid} has no steps to score")
        offsets = sampled.step_token_offsets
        if sampled.token_logprobs is not None and offsets is not None:
            if len(offsets) != len(sampled.steps):
                raise _Reject(f"{sid} has {len(sampled.steps)} steps but {len(offsets)} step_token_offsets")
            step_u = self._uncertainty(sid, sampled.token_logprobs, offsets)
            return self._event(sampled, step_u, sampled.generator, "sampled", causation_id), "sampled"
        if self.scorer is None or self.question_text is None or self.scorer_ref is None:
            raise _Reject(
                f"{sid} carries no token log-probs (with step offsets); start the scorer with a model "
                "(`--model`) to teacher-force it"
            )
        try:
            problem = self.question_text(sampled.question_id)
        except MissingKey as error:
            raise _Reject(
                f"{sid}: question {sampled.question_id!r} is not registered ({error}); register the "
                "question (publish QuestionRegistered) before its solutions"
            ) from error
        style = step_format(sampled.prompt_format)
        prompt = solution_prompt(self.scorer, problem, style)
        try:
            logprobs, forced_offsets = teacher_forced_logprobs(self.scorer, prompt, sampled.steps, style)
        except ValueError as error:
            raise _Reject(f"{sid}: teacher forcing failed: {error}") from error
        step_u = self._uncertainty(sid, logprobs, forced_offsets)
        return self._event(sampled, step_u, self.scorer_ref, "teacher_forced", causation_id), "teacher_forced"

    def _uncertainty(self, sid: str, logprobs: Sequence[float], offsets: Sequence[int]) -> tuple[float, ...]:
        try:
            return step_uncertainty(logprobs, offsets, temperature=self.temperature)
        except ValueError as error:
            raise _Reject(f"{sid}: {error}") from error

    def _event(
        self, sampled: SolutionSampled, step_u: Sequence[float], ref: ModelRef, source: Source, causation_id: Any
    ) -> Envelope:
        return scored_event(
            sampled, step_u, ref, temperature=self.temperature, source=source, causation_id=causation_id
        )


class _Reject(Exception):
    """A solution that can never be scored; the message is the dead-letter reason."""


def run_scorer(
    *,
    bootstrap_servers: str,
    backend: BackendConfig | None = None,
    group_id: str = "prmloop-scorer",
    topics: Sequence[str] = (SolutionSampled.TOPIC,),
    temperature: float = PAPER_TEMPERATURE,
    kafka: KafkaSettings | None = None,
    max_batch: int = 64,
    question_timeout_s: float = 10.0,
    until: Callable[[], bool] | None = None,
    until_idle_s: float | None = None,
    install_signal_handlers: bool = True,
) -> dict[str, int]:
    """Run the scorer until SIGTERM/SIGINT, ``until()``, or ``until_idle_s`` seconds without new events.

    Args:
        backend: the model that teacher-forces solutions without log-probabilities (``None``: only
            solutions that carry their generator's log-probabilities are scored, the rest rejected).
        topics: what to read (``solutions.sampled``; tests use a private topic).
        question_timeout_s: how long a question lookup waits for ``questions.registered``.
        until_idle_s: stop after this many seconds in which no event arrived (counted from when
            the consumer got its partitions).

    Returns:
        The handler's counters (``scored_from_logprobs``, ``teacher_forced``, ``rejected``,
        ``published``) and the runtime's ``batches`` and ``dead_lettered``.
    """
    scorer: Scorer | None = None
    scorer_ref: ModelRef | None = None
    if backend is not None:
        scorer = build_backend(backend)
        scorer_ref = ModelRef(backend=backend.backend, name=scorer.model_name)
    kafka = kafka or KafkaSettings()
    index = question_index(bootstrap_servers, kafka=kafka) if scorer is not None else None
    producer = EventProducer(bootstrap_servers, kafka=kafka)
    try:
        handler = StepScorer(
            producer.publish,
            scorer=scorer,
            scorer_ref=scorer_ref,
            question_text=(
                (lambda qid: index.get(qid, timeout_s=question_timeout_s).problem) if index is not None else None
            ),
            temperature=temperature,
        )
        runtime = ConsumerRuntime(
            topics=topics,
            group_id=group_id,
            bootstrap_servers=bootstrap_servers,
            handler=handler,
            kafka=kafka,
            max_batch=max_batch,
            name="scorer",
        )
        stats = runtime.run(until=until, idle_timeout_s=until_idle_s, install_signal_handlers=install_signal_handlers)
    finally:
        producer.close()
        if index is not None:
            index.close()
    counters = handler.counters()
    log.info("scorer stopped: %s", counters)
    return {**counters, "batches": stats.batches, "dead_lettered": stats.dead_lettered}
