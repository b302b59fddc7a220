"""The step-uncertainty scorer: hand-computed u / Δu / order, teacher forcing on a tiny random model
(fast and generic paths agree), rejections, and the service end to end on a real broker."""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pytest

from prmloop.consumers.scorer import ScorerSettings, StepScorer, run_scorer
from prmloop.models.backends.base import ScoredText
from prmloop.models.prompts import format_steps, solution_prompt
from prmloop.models.scoring import teacher_forced_logprobs
from prmloop.store.events import (
    Envelope,
    ModelRef,
    QuestionRegistered,
    SamplingSpec,
    SolutionSampled,
    StepsScored,
    deterministic_event_id,
    make_event,
)
from prmloop.store.events.codec import decode_event, encode_event
from prmloop.store.events.topics import TopicSpec, dlq_topic
from prmloop.store.kafka.producer import EventProducer, ensure_topics
from prmloop.store.kafka.runtime import ConsumedEvent

if TYPE_CHECKING:
    from prmloop.models.backends.registry import BackendConfig
    from prmloop.models.backends.transformers_backend import TransformersBackend

GEN = ModelRef(backend="transformers", name="generator")
TINY_REF = ModelRef(backend="transformers", name="tiny-random-llama")
TINY_BACKEND = "tiny-random"  # registered by tests/conftest.py:tiny_backend_config
QUESTIONS = {"q-add": "What is 2+2?"}
STEPS = ("2 plus 2 is 4.", "So the sum is 4.", "The final answer is: 4")


def _sampled(sid: str, *, steps: Sequence[str] = STEPS, qid: str = "q-add", **fields: Any) -> Envelope:
    fields.setdefault("problem", QUESTIONS.get(qid, "What is 2+2?"))
    payload = SolutionSampled(
        solution_id=sid,
        question_id=qid,
        generator=GEN,
        sampling=SamplingSpec(),
        prompt_format="step_k",
        text=format_steps(steps, "step_k"),
        steps=tuple(steps),
        **fields,
    )
    return make_event(payload, producer="test")


def _consumed(event: Envelope, offset: int = 0) -> ConsumedEvent:
    return ConsumedEvent(event, "solutions.sampled", 0, offset, 0)


def _score(handler: StepScorer, *events: Envelope) -> tuple[list[Envelope], list[tuple[ConsumedEvent, str]]]:
    published: list[Envelope] = []
    handler.publish = published.extend
    rejected = list(handler([_consumed(e, i) for i, e in enumerate(events)]))
    return published, rejected


def _entropy(p: float) -> float:
    return -(p * math.log(p) + (1 - p) * math.log(1 - p))


def test_step_uncertainty_from_the_solutions_own_logprobs_by_hand() -> None:
    # One preamble token (no step), then two tokens per step.
    # softmax([0, -ln 3]) = (3/4, 1/4); softmax([0, -ln 7]) = (7/8, 1/8); softmax([-1, -1]) = (1/2, 1/2).
    logprobs = (-5.0, 0.0, -math.log(3), 0.0, -math.log(7), -1.0, -1.0)
    event = _sampled("s-hand", token_logprobs=logprobs, step_token_offsets=(1, 3, 5))
    handler = StepScorer(lambda _: None)
    [out], rejected = _score(handler, event)
    assert rejected == [] and handler.counters()["scored_from_logprobs"] == 1
    assert handler.counters()["teacher_forced"] == 0
    scored = out.payload
    assert isinstance(scored, StepsScored)
    # The event carries the solution as the annotator needs it, and how u was computed.
    assert (scored.problem, scored.steps, scored.temperature, scored.source) == (
        QUESTIONS["q-add"],
        STEPS,
        1.0,
        "sampled",
    )
    u = (_entropy(3 / 4), _entropy(7 / 8), math.log(2))  # 0.5623, 0.3768, 0.6931
    assert scored.step_uncertainty == pytest.approx(u, abs=1e-9)
    assert scored.uncertainty_delta == pytest.approx((u[0], u[1] - u[0], u[2] - u[1]), abs=1e-9)
    assert scored.step_order == (0, 2, 1)  # Δu = 0.562, -0.186, 0.316
    assert scored.scorer == GEN and out.causation_id == event.event_id
    assert out.event_id == deterministic_event_id("StepsScored", "s-hand", GEN.model_dump(), 1.0, "sampled")
    assert out.correlation_id == "s-hand" and out.topic == "steps.scored"
    # ... and the solution as a rollout from its question, for the annotator's MC(s_0)
    assert scored.as_rollout is not None
    assert (scored.as_rollout.generator, scored.as_rollout.temperature, scored.as_rollout.completion_tokens) == (
        GEN,
        SamplingSpec().temperature,
        7,
    )
    assert scored.as_rollout.sum_logprob == pytest.approx(-5.0 - math.log(3) - math.log(7) - 2.0)


def test_a_sample_without_steps_is_passed_over_and_unscorable_solutions_pass_with_unknown_uncertainty() -> None:
    logprobs: dict[str, Any] = {"token_logprobs": (-1.0,), "step_token_offsets": (0,)}
    handler = StepScorer(lambda _: None)
    published, rejected = _score(handler, _sampled("s-empty", steps=(), **logprobs), _sampled("s-bare"))
    assert rejected == [] and handler.counters()["no_steps"] == 1  # valid, nothing to score: no dead letter
    [bare] = published
    assert isinstance(bare.payload, StepsScored) and bare.payload.source == "none"
    assert bare.payload.step_uncertainty is None and bare.payload.uncertainty_delta is None
    assert bare.payload.steps == STEPS and handler.counters()["unknown_uncertainty"] == 1
    assert bare.payload.as_rollout is None  # no log-probs: not a rollout the annotator can weigh


def test_teacher_forcing_without_the_problem_text_is_rejected(tiny_backend: TransformersBackend) -> None:
    handler = StepScorer(lambda _: None, scorer=tiny_backend, scorer_ref=TINY_REF)
    published, [(_, reason)] = _score(handler, _sampled("s-lost", problem=None))
    assert published == [] and handler.rejected == 1
    assert "no problem text" in reason and "re-publish" in reason


class GenericScorer:
    """Only the ``Scorer`` protocol (no ``score_ids``), with the backend's tokenizer for the chat prompt."""

    def __init__(self, backend: TransformersBackend) -> None:
        self.model_name = backend.model_name
        self.tokenizer = backend.tokenizer
        self._backend = backend

    def score(self, pairs: Sequence[tuple[str, str]]) -> list[ScoredText]:
        return self._backend.score(pairs)


def test_teacher_forcing_fast_and_generic_paths_agree(tiny_backend: TransformersBackend) -> None:
    tokenizer = tiny_backend.tokenizer
    prompt = solution_prompt(tiny_backend, QUESTIONS["q-add"], "step_k")
    pieces = [format_steps([s], "step_k", start=t + 1) for t, s in enumerate(STEPS)]
    # The premise of the comparison: each step tokenises the same alone as after its predecessors.
    for t in range(len(pieces)):
        alone = tiny_backend.encode_prompt(prompt) + [i for p in pieces[: t + 1] for i in tokenizer.encode(p)]
        assert tiny_backend.encode_prompt(prompt + "".join(pieces[:t])) + tokenizer.encode(pieces[t]) == alone

    fast_lp, fast_offsets = teacher_forced_logprobs(tiny_backend, prompt, STEPS, "step_k")
    generic_lp, generic_offsets = teacher_forced_logprobs(GenericScorer(tiny_backend), prompt, STEPS, "step_k")
    assert fast_offsets == generic_offsets and fast_offsets[0] == 0 and len(fast_lp) == len(generic_lp)
    assert fast_lp == pytest.approx(generic_lp, abs=1e-4)

    event = _sampled("s-forced")
    runs = {}
    for name, scorer, temperature in [
        ("fast", tiny_backend, 1.0),
        ("again", tiny_backend, 1.0),
        ("generic", GenericScorer(tiny_backend), 1.0),
        ("T5", tiny_backend, 5.0),
    ]:
        handler = StepScorer(lambda _: None, scorer=scorer, scorer_ref=TINY_REF, temperature=temperature)
        [out], rejected = _score(handler, event)
        assert rejected == [] and handler.counters()["teacher_forced"] == 1 and isinstance(out.payload, StepsScored)
        runs[name] = out
    payloads = {k: v.payload for k, v in runs.items()}
    fast, generic = payloads["fast"], payloads["generic"]
    assert isinstance(fast, StepsScored) and isinstance(generic, StepsScored)
    assert len(fast.step_uncertainty) == 3 and all(u > 0 for u in fast.step_uncertainty)
    assert fast.step_uncertainty == pytest.approx(generic.step_uncertainty, abs=1e-4)
    assert fast.scorer == TINY_REF and sorted(fast.step_order) == [0, 1, 2]
    assert runs["fast"].event_id == runs["again"].event_id == runs["generic"].event_id
    assert runs["T5"].event_id != runs["fast"].event_id
    assert runs["fast"].event_id == deterministic_event_id(
        "StepsScored", "s-forced", TINY_REF.model_dump(), 1.0, "teacher_forced"
    )


def _read_scored(servers: str, solution_ids: set[str], timeout_s: float = 30.0) -> list[Envelope]:
    """Every ``StepsScored`` of ``solution_ids`` on ``steps.scored`` (read from the beginning)."""
    from kafka import KafkaConsumer, TopicPartition

    from prmloop.store.kafka.producer import consumer_config
    from prmloop.store.settings import KafkaSettings

    consumer = KafkaConsumer(**consumer_config(KafkaSettings(), servers, group_id=None))
    try:
        parts = [TopicPartition("steps.scored", p) for p in sorted(consumer.partitions_for_topic("steps.scored"))]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        found: list[Envelope] = []
        deadline, idle_since = time.monotonic() + timeout_s, time.monotonic()
        while time.monotonic() < deadline and time.monotonic() - idle_since < 2.0:
            polled = consumer.poll(timeout_ms=200)
            if any(polled.values()):
                idle_since = time.monotonic()
            for records in polled.values():
                events = (decode_event(r.value) for r in records)
                found.extend(e for e in events if getattr(e.payload, "solution_id", None) in solution_ids)
        return found
    finally:
        consumer.close()


def test_the_scorer_service_scores_both_kinds_from_a_real_broker(
    kafka_bootstrap: str, tiny_backend_config: BackendConfig
) -> None:
    run = uuid.uuid4().hex[:8]
    topic = f"test-scorer-{run}"
    ensure_topics(kafka_bootstrap, [TopicSpec(topic, 2), TopicSpec(dlq_topic(topic), 1)])
    qid = f"q-{run}"
    question = QuestionRegistered(question_id=qid, dataset="test", problem="What is 2+2?")
    with_lp = _sampled(f"s-lp-{run}", qid=qid, token_logprobs=(-0.1,) * 6, step_token_offsets=(0, 2, 4))
    without = _sampled(f"s-tf-{run}", qid=qid)
    with EventProducer(kafka_bootstrap) as producer:
        producer.publish([make_event(question, producer="test")])
        for e in (with_lp, without):
            producer.send_raw(topic, e.correlation_id.encode(), encode_event(e), [])
    deadline = time.monotonic() + 120
    settings = ScorerSettings(
        backend=tiny_backend_config.backend,
        model=tiny_backend_config.model,
        group=f"scorer-{run}",
        topic=topic,
        until_idle=3.0,
    )
    counters = run_scorer(
        settings,
        bootstrap_servers=kafka_bootstrap,
        until=lambda: time.monotonic() > deadline,
        install_signal_handlers=False,
    )
    assert counters["scored_from_logprobs"] == 1 and counters["teacher_forced"] == 1
    assert counters["rejected"] == counters["dead_lettered"] == 0
    scored = _read_scored(kafka_bootstrap, {f"s-lp-{run}", f"s-tf-{run}"})
    by_solution = {e.payload.solution_id: e for e in scored}
    assert len(scored) == 2 and len(by_solution) == 2
    lp, tf = by_solution[f"s-lp-{run}"], by_solution[f"s-tf-{run}"]
    assert isinstance(lp.payload, StepsScored) and isinstance(tf.payload, StepsScored)
    assert lp.payload.scorer == GEN and lp.payload.step_uncertainty == pytest.approx((math.log(2),) * 3)
    assert lp.event_id == deterministic_event_id("StepsScored", f"s-lp-{run}", GEN.model_dump(), 1.0, "sampled")
    assert tf.payload.scorer == ModelRef(backend=TINY_BACKEND, name="tiny-random-llama")
    assert len(tf.payload.step_uncertainty) == 3 and tf.causation_id == without.event_id
