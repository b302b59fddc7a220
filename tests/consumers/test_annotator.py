"""The annotator: scored simulated solutions in, StepsLabeled out with deterministic ids, on a real broker;
the uncertainty-driven strategy takes its Δu from the StepsScored event it consumes."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

from prmloop.consumers.annotator import Annotator
from prmloop.models.annotation.completer import Rollout
from prmloop.models.annotation.strategies import AdaptiveBinarySearch, UncertaintyDrivenSearch
from prmloop.models.simulator import SimulatedCompleter, SimulatedSolution, simulate_solutions
from prmloop.store.events import Envelope, ModelRef, SampleAsRollout, StepsLabeled, StepsScored, make_event
from prmloop.store.events.codec import encode_event
from prmloop.store.events.topics import TopicSpec, dlq_topic
from prmloop.store.kafka.poison import TransientError, is_transient
from prmloop.store.kafka.producer import EventProducer, ensure_topics
from prmloop.store.kafka.runtime import ConsumedEvent, ConsumerRuntime

SIM = ModelRef(backend="simulator", name="simulator")


def _sampled(
    solution: SimulatedSolution, i: int, correct: bool = False, deltas: tuple[float, ...] | None = None
) -> Envelope:
    """The ``StepsScored`` the step scorer would publish for a simulated solution."""
    payload = StepsScored(
        solution_id=f"sol-{solution.question}-{i}",
        question_id=solution.question,
        scorer=SIM,
        step_uncertainty=None,
        uncertainty_delta=deltas,
        step_order=None,
        problem=solution.question,
        steps=solution.steps,
        final_answer=solution.gold_answer if correct else "0",
        correct=correct,
        gold_answer=solution.gold_answer,
    )
    return make_event(payload, producer="test")


def _consumed(event: Envelope, offset: int) -> ConsumedEvent:
    return ConsumedEvent(event, StepsScored.TOPIC, 0, offset, 0)


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


def test_free_only_labels_the_correct_solutions_with_the_rollout_annotators_ids() -> None:
    """The demo's free pass: correct solutions labelled (no rollout), the rest passed over for the
    rollout annotator, whose label of a correct solution has the same id (stored once)."""
    solutions = simulate_solutions(4, seed=3)
    batch = [_consumed(_sampled(s, i, correct=i % 2 == 0), i) for i, s in enumerate(solutions)]
    free: list[list[Envelope]] = []
    everything: list[list[Envelope]] = []
    recording = _RecordingCompleter(solutions)
    handler = Annotator(AdaptiveBinarySearch(), [recording], [SIM], free.append, free_only=True)
    assert list(handler(batch)) == []
    assert recording.prefixes == []  # not one rollout
    (published,) = free
    assert [e.payload.solution_id for e in published] == [
        f"sol-{solutions[0].question}-0",
        f"sol-{solutions[2].question}-2",
    ]
    assert all(e.payload.method == "all_correct" for e in published)
    assert handler.stats.as_dict()["left_for_rollouts"] == 2
    Annotator(AdaptiveBinarySearch(), [SimulatedCompleter(solutions)], [SIM], everything.append)(batch)
    by_solution = {e.payload.solution_id: e.event_id for events in everything for e in events}
    assert len(by_solution) == 4
    assert all(by_solution[e.payload.solution_id] == e.event_id for e in published)


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


class _RecordingCompleter(SimulatedCompleter):
    """The simulator, remembering the length of every prefix it was asked to continue."""

    def __init__(self, solutions: list[SimulatedSolution]) -> None:
        super().__init__(solutions)
        self.prefixes: list[int] = []

    def complete(self, question: str, steps, n: int):  # type: ignore[no-untyped-def]
        self.prefixes.append(len(steps))
        return super().complete(question, steps, n)


def test_uncertainty_driven_visits_steps_in_the_order_of_the_events_delta_u() -> None:
    (solution,) = simulate_solutions(1, seed=21)
    n = solution.n_steps
    # Δu highest at step n - 2 (the last step of an incorrect solution is known wrong without rollouts).
    deltas = (*(float(t) for t in range(n - 1)), -1.0)
    completer = _RecordingCompleter([solution])
    handler = Annotator(UncertaintyDrivenSearch(), [completer], [SIM], lambda _: None)
    assert list(handler([_consumed(_sampled(solution, 0, deltas=deltas), 0)])) == []
    probed = [m for m in completer.prefixes if m > 0]
    # State s_t after step t holds t + 1 steps: the search tried the highest-Δu step (n - 2) first.
    assert probed[0] == n - 1


def test_uncertainty_driven_rejects_a_solution_whose_delta_u_is_unknown() -> None:
    (solution,) = simulate_solutions(1, seed=22)
    handler = Annotator(UncertaintyDrivenSearch(), [SimulatedCompleter([solution])], [SIM], lambda _: None)
    rejected = list(handler([_consumed(_sampled(solution, 0, deltas=None), 0)]))
    assert len(rejected) == 1 and "Δu" in rejected[0][1] and "prmloop score --model" in rejected[0][1]


class FailingCompleter:
    name = "broken"

    def __init__(self) -> None:
        self.calls = 0

    def complete(self, question: str, steps: Sequence[str], n: int) -> list[Rollout]:
        self.calls += 1
        raise RuntimeError("engine down")


def test_a_solution_that_keeps_aborting_is_dead_lettered_on_the_third_try() -> None:
    steps = ("Tom starts with 3 apples.", "He buys 4 more, so 3 + 4 = 8.")
    payload = StepsScored(
        solution_id="s-1",
        question_id="q-1",
        scorer=ModelRef(backend="test", name="test"),
        step_uncertainty=None,
        uncertainty_delta=None,
        step_order=None,
        problem="Tom has 3 apples and buys 4 more. How many apples does he have?",
        steps=steps,
        final_answer="8",
        correct=False,
        gold_answer="7",
    )
    batch = [_consumed(make_event(payload, producer="test"), 0)]
    published: list[list[Envelope]] = []
    completer = FailingCompleter()
    handler = Annotator(
        AdaptiveBinarySearch(), [completer], [ModelRef(backend="test", name="broken")], published.append
    )
    for attempt in range(2):
        try:
            handler(batch)
        except TransientError as error:  # the runtime retries the batch with backoff
            assert "aborted" in str(error) and "engine down" in str(error)
            assert is_transient(error)
        else:
            raise AssertionError(f"attempt {attempt} should have failed the batch")
    rejected = list(handler(batch))
    assert len(rejected) == 1 and "given up" in rejected[0][1]
    assert published == [] and completer.calls == 9  # 3 attempts of the first state, 3 batch tries
    assert handler.stats.as_dict()["aborted"] == 3


class PrefixRecorder:
    """A generator whose rollouts record the text they continue (and never reach the answer)."""

    model_name = "recorder"
    tokenizer = None

    def __init__(self) -> None:
        self.prefixes: list[str] = []

    def rollouts(self, prefix: str, n: int, params: object = None) -> list[object]:
        from prmloop.models.backends.base import Completion

        self.prefixes.append(prefix)
        return [Completion("The final answer is: 0", (1,), (-0.1,), "stop", 3)] * n


def test_each_solution_is_continued_in_the_prompt_format_it_was_sampled_with() -> None:
    from prmloop.models.annotation.completer import GeneratorCompleter
    from prmloop.models.annotation.estimate import Sampling

    engine = PrefixRecorder()
    completer = GeneratorCompleter(engine)
    strategy = AdaptiveBinarySearch(sampling=Sampling.fixed(1))
    handler = Annotator(strategy, [completer], [SIM], lambda _: None)
    [solution] = simulate_solutions(1, seed=2)
    for i, fmt in enumerate(("step_k_arith", "step_k")):
        event = _sampled(solution, i)
        event = event.model_copy(update={"payload": event.payload.model_copy(update={"prompt_format": fmt})})
        handler([_consumed(event, i)])
    arith, epic = engine.prefixes
    assert arith.startswith("Question: Ella has 5 cards.") and "Instruction:" not in arith
    assert "Instruction:" in epic and not epic.startswith("Question:")
    assert completer.style == "step_k"  # the shared completer is untouched


def test_correct_solutions_are_published_before_the_batchs_rollouts_begin() -> None:
    """A correct solution's label costs no rollout: it goes out at once, so consensus need not wait
    for the incorrect solutions of the same batch (the streaming loop's labels keep flowing)."""
    solutions = simulate_solutions(4, seed=3)
    batch = [_consumed(_sampled(s, i, correct=i in (1, 3)), i) for i, s in enumerate(solutions)]
    published: list[list[Envelope]] = []
    rollouts_seen_at_publish: list[int] = []
    completer = SimulatedCompleter(solutions)

    class Counting(SimulatedCompleter):
        calls = 0

        def complete(self, question: str, steps: Sequence[str], n: int) -> list[Rollout]:
            Counting.calls += 1
            return completer.complete(question, steps, n)

    def publish(events: list[Envelope]) -> None:
        published.append(events)
        rollouts_seen_at_publish.append(Counting.calls)

    handler = Annotator(AdaptiveBinarySearch(), [Counting(solutions)], [SIM], publish, max_in_flight=2)
    assert list(handler(batch)) == []
    first, *searched = published
    assert [e.payload.method for e in first] == ["all_correct", "all_correct"]
    assert rollouts_seen_at_publish[0] == 0  # published before any rollout of the batch
    # then each searched solution on its own, as its search ends
    assert sorted(e.payload.solution_id for events in searched for e in events) == sorted(
        "sol-" + solutions[i].question + f"-{i}" for i in (0, 2)
    )
    assert [len(events) for events in searched] == [1, 1]
    assert rollouts_seen_at_publish[1] > 0


def test_a_label_goes_out_when_its_search_ends_not_when_the_batchs_slowest_does() -> None:
    """Solutions in flight are published one by one as their searches end: a slow search does not hold
    back the labels of the rest of its batch (nor the consensus and retraining that wait for them)."""
    solutions = simulate_solutions(2, seed=3)
    slow, fast = (f"sol-{s.question}-{i}" for i, s in enumerate(solutions))
    batch = [_consumed(_sampled(s, i), i) for i, s in enumerate(solutions)]
    fast_out = threading.Event()
    inner = SimulatedCompleter(solutions)
    published: list[list[str]] = []

    class HeldBack(SimulatedCompleter):
        def complete(self, question: str, steps: Sequence[str], n: int) -> list[Rollout]:
            if question == solutions[0].question:
                fast_out.wait(timeout=20)  # the slow search goes on only once the fast one's label is out
            return inner.complete(question, steps, n)

    def publish(events: list[Envelope]) -> None:
        published.append([e.payload.solution_id for e in events])
        if any(e.payload.solution_id == fast for e in events):
            fast_out.set()

    handler = Annotator(AdaptiveBinarySearch(), [HeldBack(solutions)], [SIM], publish, max_in_flight=2)
    assert list(handler(batch)) == []
    assert fast_out.is_set()
    assert published == [[fast], [slow]]


def _sample_of(solution: SimulatedSolution, i: int, *, correct: bool | None, tokens: int = 6, **spec: Any) -> Envelope:
    """The ``StepsScored`` of one sample of ``solution``'s question, with what makes it a rollout from s_0."""
    event = _sampled(solution, i, correct=bool(correct))
    drawn = SampleAsRollout(
        generator=spec.get("generator", SIM),
        temperature=spec.get("temperature", 0.7),
        completion_tokens=tokens,
        sum_logprob=-0.5 * tokens,
    )
    update = {"as_rollout": drawn, "correct": correct, "prompt_format": spec.get("prompt_format", "step_k")}
    return event.model_copy(update={"payload": event.payload.model_copy(update=update)})


def test_a_questions_samples_are_the_rollouts_of_its_start_and_spare_the_engine_those() -> None:
    from prmloop.models.annotation.completer import GeneratorCompleter
    from prmloop.models.annotation.estimate import Sampling
    from prmloop.models.prompts import solution_prompt

    engine = PrefixRecorder()
    completer = GeneratorCompleter(engine)  # temperature 0.7, top-p 1, 384 tokens
    strategy = AdaptiveBinarySearch(sampling=Sampling(n0=2, n_min_correct=1, n_max=4, grow_by=2))
    handler = Annotator(strategy, [completer], [SIM], lambda _: None)
    [solution] = simulate_solutions(1, seed=2)
    start = solution_prompt(engine, solution.question, "step_k")
    assert completer.prefix(solution.question, []) == start  # s_0's rollouts continue the sampler's prompt
    # two samples of the question in one batch: one solved it, one did not (the one to label)
    handler([_consumed(_sample_of(solution, 0, correct=True), 0), _consumed(_sample_of(solution, 1, correct=False), 1)])
    assert start not in engine.prefixes and engine.prefixes  # s_0 drew nothing; later states did
    assert handler.stats.as_dict()["reused_rollouts"] == 2
    # A question whose samples came from another model or temperature, ran past the rollouts' budget or
    # stated no answer: only the fitting ones count, each too long or unanswered one as a wrong rollout.
    from prmloop.consumers.annotator_samples import QuestionSamples, RolloutSpec

    samples = QuestionSamples()
    other = ModelRef(backend="vllm", name="other")
    for i, (correct, tokens, spec) in enumerate(
        [
            (True, 6, {}),
            (True, 6, {"generator": other}),
            (True, 6, {"temperature": 1.0}),
            (True, 500, {}),
            (None, 6, {}),
            (True, 6, {"prompt_format": "double_newline"}),
        ]
    ):
        scored = _sample_of(solution, 10 + i, correct=correct, tokens=tokens, **spec).payload
        assert isinstance(scored, StepsScored)
        samples.add(scored)
    spec = RolloutSpec(SIM, 0.7, 1.0, 384)
    [graded] = samples.rollouts(solution.question, "step_k", [spec])
    assert [(r.tokens, r.finish_reason, ok) for r, ok in graded] == [
        (6, "stop", True),
        (384, "length", False),
        (6, "stop", False),
    ]
    # A sample in another prompt format is a draw from another start: it counts for that format only.
    [other_format] = samples.rollouts(solution.question, "double_newline", [spec])
    assert [(r.tokens, ok) for r, ok in other_format] == [(6, True)]
    assert samples.rollouts(solution.question, "step_k", [None]) == [[]]  # a simulator's: no samples count
    assert samples.rollouts("another question", "step_k", [spec]) == [[]]


class NeverSolves:
    name = "never"

    def complete(self, question: str, steps: Sequence[str], n: int) -> list[Rollout]:
        return [Rollout("0", 3, -1.5) for _ in range(n)]


def test_a_question_no_rollout_solves_publishes_nothing_and_the_log_says_why(caplog: Any) -> None:
    import logging

    solution = simulate_solutions(1, seed=3)[0]
    published: list[list[Envelope]] = []
    handler = Annotator(
        AdaptiveBinarySearch(), [NeverSolves()], [ModelRef(backend="test", name="never")], published.append
    )
    with caplog.at_level(logging.INFO, logger="prmloop.consumers.annotator"):
        assert list(handler([_consumed(_sampled(solution, 0), 0)])) == []
    assert published == [] and handler.stats.as_dict()["unresolved"] == 1
    assert "no rollout of 72 from the question reached the answer (MC(s_0) = 0)" in caplog.text
