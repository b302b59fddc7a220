"""The annotator: simulated solutions in, StepsLabeled out with deterministic ids, on a real broker."""

from __future__ import annotations

import time
import uuid

from prmloop.consumers.annotator import Annotator
from prmloop.models.annotation.strategies import AdaptiveBinarySearch
from prmloop.models.simulator import SimulatedCompleter, SimulatedSolution, simulate_solutions
from prmloop.store.codec import encode_event
from prmloop.store.consumer import ConsumedEvent, ConsumerRuntime
from prmloop.store.events import Envelope, ModelRef, SamplingSpec, SolutionSampled, StepsLabeled, make_event
from prmloop.store.kafka import EventProducer, ensure_topics
from prmloop.store.topics import TopicSpec, dlq_topic

SIM = ModelRef(backend="simulator", name="simulator")


def _sampled(solution: SimulatedSolution, i: int, correct: bool = False) -> Envelope:
    payload = SolutionSampled(
        solution_id=f"sol-{solution.question}-{i}",
        question_id=solution.question,
        generator=SIM,
        sampling=SamplingSpec(),
        prompt_format="step_k",
        text="\n".join(solution.steps),
        steps=solution.steps,
        final_answer=solution.gold_answer if correct else "0",
        correct=correct,
        gold_answer=solution.gold_answer,
    )
    return make_event(payload, producer="test")


def _consumed(event: Envelope, offset: int) -> ConsumedEvent:
    return ConsumedEvent(event, "solutions.sampled", 0, offset, 0)


def test_a_rerun_publishes_the_same_label_ids() -> None:
    solutions = simulate_solutions(3, seed=5)
    batch = [_consumed(_sampled(s, i), i) for i, s in enumerate(solutions)]
    published: list[list[Envelope]] = []
    for _ in range(2):
        handler = Annotator(AdaptiveBinarySearch(), [SimulatedCompleter(solutions)], [SIM], published.append)
        assert list(handler(batch)) == []
    first, second = published
    assert [e.event_id for e in first] == [e.event_id for e in second]
    labels = [e.payload for e in first]
    assert all(isinstance(p, StepsLabeled) and p.cost.rollouts > 0 and p.mc_estimates for p in labels)


def test_correct_solutions_get_all_true_labels_and_ungraded_ones_are_rejected() -> None:
    solution = simulate_solutions(1)[0]
    ungraded = _sampled(solution, 1)
    ungraded = ungraded.model_copy(update={"payload": ungraded.payload.model_copy(update={"correct": None})})
    published: list[list[Envelope]] = []
    handler = Annotator(AdaptiveBinarySearch(), [SimulatedCompleter([solution])], [SIM], published.append)
    rejected = list(handler([_consumed(_sampled(solution, 0, correct=True), 0), _consumed(ungraded, 1)]))
    assert len(rejected) == 1 and "not graded" in rejected[0][1]
    (event,) = published[0]
    assert isinstance(event.payload, StepsLabeled)
    assert (event.payload.method, event.payload.labels) == ("all_correct", (True,) * solution.n_steps)


def test_the_annotator_labels_every_solution_from_a_real_broker(kafka_bootstrap: str) -> None:
    topic = f"test-sampled-{uuid.uuid4().hex[:8]}"
    ensure_topics(kafka_bootstrap, [TopicSpec(topic, 2), TopicSpec(dlq_topic(topic), 1)])
    solutions = simulate_solutions(6, seed=11)
    events = [_sampled(s, i) for i, s in enumerate(solutions)]
    with EventProducer(kafka_bootstrap) as producer:
        for e in events:
            producer.send_raw(topic, e.correlation_id.encode(), encode_event(e), [])
    labelled: dict[str, StepsLabeled] = {}

    def publish(out: list[Envelope]) -> None:
        for e in out:
            assert isinstance(e.payload, StepsLabeled)
            labelled[e.payload.solution_id] = e.payload

    handler = Annotator(AdaptiveBinarySearch(), [SimulatedCompleter(solutions)], [SIM], publish)
    runtime = ConsumerRuntime(
        topics=[topic], group_id=f"annotator-{topic}", bootstrap_servers=kafka_bootstrap, handler=handler
    )
    deadline = time.monotonic() + 60
    runtime.run(until=lambda: len(labelled) == 6 or time.monotonic() > deadline, install_signal_handlers=False)
    assert set(labelled) == {e.payload.solution_id for e in events}  # type: ignore[attr-defined]
    truth = {f"sol-{s.question}-{i}": s.first_error_step for i, s in enumerate(solutions)}
    hits = sum(labelled[k].first_error_step == v for k, v in truth.items())
    assert hits >= 4  # adaptive binary search is ~97% accurate on the default simulator
