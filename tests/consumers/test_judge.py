"""The judge service on a real broker: scored solutions in, StepsJudged out with deterministic ids."""

from __future__ import annotations

import uuid
from typing import Any

from prmloop.consumers.judge import JudgeSettings, run_judge
from prmloop.models.backends.transformers_backend import TransformersBackend
from prmloop.models.judge.judges import StepwiseJudge
from prmloop.store.events import Envelope, ModelRef, StepsJudged, StepsScored, make_event
from prmloop.store.events.codec import encode_event
from prmloop.store.events.topics import TopicSpec, dlq_topic
from prmloop.store.kafka.producer import EventProducer, ensure_topics

PROBLEM = "What is 3*4+1?"
STEPS = ("3*4 = 12.", "12 + 1 = 14.", "The answer is 14.")
FINE = 'Correct arithmetic.", "has_error": "no"}'
WRONG = '12 + 1 is 13.", "has_error": "yes"}'
REF = ModelRef(backend="scripted", name="scripted-judge")


def _scored(sid: str, *, problem: str | None = PROBLEM) -> Envelope:
    payload = StepsScored(
        solution_id=sid,
        question_id="q",
        scorer=REF,
        step_uncertainty=None,
        uncertainty_delta=None,
        step_order=None,
        problem=problem,
        steps=STEPS,
        correct=False,
        gold_answer="13",
    )
    return make_event(payload, producer="test")


def test_the_judge_service_publishes_one_verdict_per_solution(
    kafka_bootstrap: str, tiny_backend: TransformersBackend, scripted_judge: Any, topic_reader: Any
) -> None:
    run = uuid.uuid4().hex[:8]
    topic = f"test-judge-{run}"
    ensure_topics(kafka_bootstrap, [TopicSpec(topic, 2), TopicSpec(dlq_topic(topic), 1)])
    ensure_topics(kafka_bootstrap)
    ids = {f"j-{run}-{i}" for i in range(3)}
    with EventProducer(kafka_bootstrap) as producer:
        for sid in sorted(ids):
            e = _scored(sid)
            producer.send_raw(topic, e.correlation_id.encode(), encode_event(e), [])
        lost = _scored(f"j-{run}-lost", problem=None)
        producer.send_raw(topic, lost.correlation_id.encode(), encode_event(lost), [])
    script = {STEPS[0]: [FINE] * 3, STEPS[1]: [WRONG, WRONG, FINE], STEPS[2]: [FINE] * 3}
    settings = JudgeSettings(group=f"judge-{run}", topic=topic, until_idle=3, samples=2)
    results = []
    for attempt in range(2):
        judge = StepwiseJudge(scripted_judge(tiny_backend, script), samples=2)  # type: ignore[arg-type]
        results.append(
            run_judge(
                settings.model_copy(update={"group": f"judge-{run}-{attempt}"}),
                bootstrap_servers=kafka_bootstrap,
                install_signal_handlers=False,
                components=(judge, REF),
            )
        )
    assert results[0]["judged"] == 3 and results[0]["dead_lettered"] == 1
    judged = [
        e for e in topic_reader(kafka_bootstrap, [StepsJudged.TOPIC]) if getattr(e.payload, "solution_id", "") in ids
    ]
    assert len(judged) == 6 and len({e.event_id for e in judged}) == 3  # the re-run published the same ids
    for event in judged:
        payload = event.payload
        assert isinstance(payload, StepsJudged) and payload.method == "stepwise"
        assert payload.first_error_step == 1 and payload.verdicts == (True, False, None)
        assert [j.step_index for j in payload.judgments] == [0, 1]
        assert payload.step_entropy is not None and payload.step_entropy[2] is None
        assert payload.cost.verified_steps == 2 and payload.judge == REF


def test_a_step_too_long_to_check_leaves_the_exact_judge_undecided_at_once(
    kafka_bootstrap: str, topic_reader: Any
) -> None:
    # Issue 25: a 0.9 MB step of "9999 * " held the exact judge for minutes (a product of 512,000
    # digits, built one multiplication at a time), then was dead-lettered with a ValueError.
    from prmloop.models.arith import arith_question_id, generate_question

    run = uuid.uuid4().hex[:8]
    topic = f"test-judge-exact-{run}"
    ensure_topics(kafka_bootstrap, [TopicSpec(topic, 1), TopicSpec(dlq_topic(topic), 1)])
    ensure_topics(kafka_bootstrap)
    question = generate_question(1, 0, 0)

    def scored(sid: str, steps: tuple[str, ...]) -> Envelope:
        payload = StepsScored(
            solution_id=sid,
            question_id=arith_question_id(1, 0, 0),
            scorer=REF,
            step_uncertainty=None,
            uncertainty_delta=None,
            step_order=None,
            problem=question.problem,
            steps=steps,
            correct=False,
            gold_answer=str(question.answer),
        )
        return make_event(payload, producer="test")

    hostile = scored(f"x-{run}-hostile", ("9999 * " * 128_000 + "= 1",))
    fine = scored(f"x-{run}-fine", tuple(question.reference_steps))
    with EventProducer(kafka_bootstrap) as producer:
        for event in (hostile, fine):  # one partition: the good solution waits behind the hostile one
            producer.send_raw(topic, event.correlation_id.encode(), encode_event(event), [])
    stats = run_judge(
        JudgeSettings(method="exact", group=f"judge-{run}", topic=topic, until_idle=3),
        bootstrap_servers=kafka_bootstrap,
        install_signal_handlers=False,
    )
    assert stats["judged"] == 2 and stats["dead_lettered"] == 0 and stats["beyond_limits"] == 1
    assert stats["wall_s"] < 60  # broker start-up and the idle wait; the check itself is milliseconds
    verdicts = {
        e.payload.solution_id: e.payload
        for e in topic_reader(kafka_bootstrap, [StepsJudged.TOPIC])
        if isinstance(e.payload, StepsJudged) and e.payload.solution_id.startswith(f"x-{run}")
    }
    assert verdicts[hostile.payload.solution_id].verdicts == (None,)  # undecided, not an error
    assert verdicts[fine.payload.solution_id].first_error_step is None
    assert all(v is True for v in verdicts[fine.payload.solution_id].verdicts)
