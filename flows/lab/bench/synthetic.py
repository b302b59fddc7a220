"""Realistic synthetic event streams for the demo, tests and the sink benchmark.

The shapes follow what the pipeline emits for real: per question one registration, k sampled
solutions (steps, ~40 token log-probs per step, uncertainty), their step scores and MC labels, and a
consensus decision. Content is random but deterministic in ``seed``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

from prmloop.consumers.annotator import labeled_event
from prmloop.consumers.scorer import scored_event
from prmloop.models.annotation.estimate import CostTally, StateEstimate
from prmloop.models.annotation.strategies import Annotation
from prmloop.models.questions import Question
from prmloop.producers.events import question_registered, solution_sampled
from prmloop.store.events import (
    Envelope,
    LabelsAccepted,
    ModelRef,
    SamplingSpec,
    SolutionSampled,
    SolutionUncertainty,
    StepsScored,
    deterministic_event_id,
    make_event,
)

PRODUCER = "prmloop-synthetic/0.1.0"
GENERATOR = ModelRef(backend="transformers", name="SmolLM2-135M-Instruct")
LABEL_PARAMETERS = {"alpha": 0.5, "n0": 16, "n_min": 10, "n_max": 72}


def _at(event: Envelope, when: datetime) -> Envelope:
    """The event as if it had happened at ``when`` (a stream spread over time, like a real one)."""
    return event.model_copy(update={"occurred_at": when})


def question_events(q: int, k: int, rng: random.Random, t0: datetime, seed: int = 0) -> Iterator[Envelope]:
    """One question's events, built by the same builders the pipeline uses."""
    qid = f"synthetic-{seed}-{q:06d}"
    gold = str(rng.randint(1, 500))
    when = t0 + timedelta(seconds=q)
    question = Question(id=qid, dataset="synthetic", problem=f"What is {gold} + 0?", gold_answer=gold)
    reg_event = _at(question_registered(question, producer=PRODUCER), when)
    yield reg_event
    for j in range(k):
        sid = f"{qid}-s{j}"
        n_steps = rng.randint(4, 10)
        steps = tuple(f"Step {i + 1}: compute {rng.randint(1, 99)} * {rng.randint(1, 9)}." for i in range(n_steps))
        logprobs = tuple(round(-rng.expovariate(3.0), 4) for _ in range(40 * n_steps))
        correct = rng.random() < 0.4
        answer = gold if correct else str(int(gold) + rng.randint(1, 9))
        step_u = tuple(round(rng.uniform(0.1, 3.0), 4) for _ in range(n_steps))
        sol_event = _at(
            solution_sampled(
                question,
                solution_id=sid,
                generator=GENERATOR,
                sampling=SamplingSpec(temperature=0.7, top_p=0.95, max_new_tokens=512, seed=j, n=k),
                prompt_format="step_k",
                text="\n".join(steps),
                steps=steps,
                step_token_offsets=tuple(40 * i for i in range(n_steps)),
                token_logprobs=logprobs,
                final_answer=answer,
                correct=correct,
                uncertainty=SolutionUncertainty(
                    entropy=sum(step_u),
                    mean_nll=-sum(logprobs) / len(logprobs),
                    perplexity=math.exp(-sum(logprobs) / len(logprobs)),
                ),
                completion_tokens=len(logprobs),
                identity=(qid, j),
                producer=PRODUCER,
                causation_id=reg_event.event_id,
            ),
            when + timedelta(milliseconds=10 + j),
        )
        yield sol_event
        assert isinstance(sol_event.payload, SolutionSampled)
        scored = _at(
            scored_event(
                sol_event.payload, step_u, GENERATOR, temperature=1.0, source="sampled", causation_id=sol_event.event_id
            ),
            when + timedelta(milliseconds=50 + j),
        )
        yield scored
        assert isinstance(scored.payload, StepsScored)
        first_error = None if correct else rng.randrange(n_steps)
        labels = tuple(first_error is None or i < first_error for i in range(n_steps))
        estimates = tuple(
            StateEstimate(
                step_index=i,
                value=round(rng.random(), 4),
                rollouts=16,
                correct_rollouts=rng.randint(0, 16),
                weighted=True,
            )
            for i in range(-1, n_steps, 3)
        )
        annotation = Annotation(
            method="adaptive_binary",
            parameters=LABEL_PARAMETERS,
            status="labelled",
            labels=labels,
            first_error_step=first_error,
            soft_labels=(),
            estimates=estimates,
            cost=CostTally(
                verified_steps=len(estimates),
                rollouts=16 * len(estimates),
                generated_tokens=16 * len(estimates) * 120,
                wall_time_s=1.5,
            ),
        )
        labeled = _at(
            labeled_event(scored.payload, annotation, (GENERATOR,), causation_id=scored.event_id),
            when + timedelta(milliseconds=100 + j),
        )
        yield labeled
        if j % 2 == 0:
            # No consensus service exists yet to own LabelsAccepted's builder; this is its only maker.
            yield make_event(
                LabelsAccepted(
                    solution_id=sid,
                    question_id=qid,
                    labels=labels,
                    first_error_step=first_error,
                    source_event_ids=(labeled.event_id,),
                    rule="single_source",
                ),
                producer=PRODUCER,
                occurred_at=when + timedelta(milliseconds=150 + j),
                causation_id=labeled.event_id,
                event_id=deterministic_event_id("LabelsAccepted", sid),
            )


def synthetic_events(n: int, *, k: int = 8, seed: int = 0) -> list[Envelope]:
    """At least ``n`` events (whole questions), deterministic in ``seed``; returns exactly ``n``."""
    rng = random.Random(seed)
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    out: list[Envelope] = []
    q = 0
    while len(out) < n:
        out.extend(question_events(q, k, rng, t0, seed))
        q += 1
    return out[:n]
