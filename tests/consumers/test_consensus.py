"""The consensus filter (Qwen "Lessons", Sec. 3.1/4.1): the rule on hand-made cases and as a property,
the join in any arrival order with re-deliveries, supersession and timeouts on a real SQLite state
file, a crash between recording and publishing, and the service on a real broker."""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka import KafkaConsumer, TopicPartition

from prmloop.consumers.consensus import (
    Consensus,
    ConsensusSettings,
    JoinState,
    TopicLayoutError,
    labels_decision,
    run_consensus,
)
from prmloop.store.events import (
    Envelope,
    LabelsAccepted,
    LabelsRejected,
    ModelRef,
    QuestionRegistered,
    StepJudgment,
    StepsJudged,
    StepsLabeled,
    make_event,
)
from prmloop.store.events.codec import decode_stored_form, encode_event
from prmloop.store.events.topics import TopicSpec, dlq_topic
from prmloop.store.kafka.producer import EventProducer, ensure_topics
from prmloop.store.kafka.runtime import ConsumedEvent

T0 = datetime(2026, 1, 1, tzinfo=UTC)
JUDGE = ModelRef(backend="openai", name="judge")


def labeled(first: int | None, n: int = 5, **parameters: object) -> StepsLabeled:
    """MC labels of a solution whose first error is ``first`` (True before it, False from it on)."""
    labels = tuple(first is None or i < first for i in range(n))
    method = "all_correct" if first is None else "adaptive_binary"
    return StepsLabeled(
        solution_id="s",
        question_id="q",
        method=method,
        parameters=dict(parameters),
        labels=labels,
        first_error_step=first,
    )


def judged(
    first: int | None,
    n: int = 5,
    *,
    verdicts: Sequence[bool | None] | None = None,
    entropy: dict[int, float] | None = None,
    step_entropy: Sequence[float | None] | None = None,
) -> StepsJudged:
    """A stepwise judge that stops at its first error (later steps not judged: verdict None)."""
    if verdicts is None:
        verdicts = [None if first is not None and i > first else (first is None or i < first) for i in range(n)]
    judgments = tuple(
        StepJudgment(step_index=i, has_error=not v, cot_entropy=(entropy or {}).get(i), samples=8)
        for i, v in enumerate(verdicts)
        if v is not None
    )
    return StepsJudged(
        solution_id="s",
        question_id="q",
        judge=JUDGE,
        verdicts=tuple(verdicts),
        first_error_step=first,
        judgments=judgments,
        step_entropy=tuple(step_entropy) if step_entropy is not None else None,
    )


# ------------------------------------------------------------------------------------------------ the rule


@pytest.mark.parametrize(
    ("mc", "judge", "threshold", "reason"),
    [
        (labeled(2), judged(2), None, None),
        (labeled(None), judged(None), None, None),
        (labeled(0), judged(0), None, None),
        (labeled(2, n=6), judged(4, n=6), None, "first errors disagree: MC 2, judge 4"),
        (labeled(None), judged(1), None, "first errors disagree: MC none, judge 1"),
        (labeled(3), judged(None), None, "first errors disagree: MC 3, judge none"),
        (labeled(None), judged(None, verdicts=[True, True, None, True, True]), None, "judge gave no verdict on step 2"),
        (labeled(3), judged(3, verdicts=[True, None, True, False, None]), None, "judge gave no verdict on step 1"),
        (labeled(2), judged(2, verdicts=[True, False, False, None, None]), None, "contradict its first error 2"),
        (labeled(2, n=5), judged(2, n=4), None, "step counts differ: MC 5, judge 4"),
        (labeled(2), judged(7), None, "judge's first error, step 7, is outside its 5 verdicts"),
        # Abstention: the CoT entropy at the judge's first error, or the largest when it found none.
        (labeled(2), judged(2, entropy={2: 0.9}), 0.5, "judge uncertain: CoT entropy 0.9 > 0.5 (at its first error"),
        (labeled(2), judged(2, entropy={0: 2.0, 2: 0.3}), 0.5, None),
        (labeled(2), judged(2, entropy={2: 0.9}), None, None),
        (labeled(None), judged(None, entropy={0: 0.1, 3: 0.7}), 0.5, "CoT entropy 0.7 > 0.5 (the largest over its 2"),
        (labeled(None), judged(None, entropy={0: 0.1, 3: 0.4}), 0.5, None),
        (labeled(None), judged(None, step_entropy=[0.1, 0.2, 0.9, None, 0.1]), 0.5, "CoT entropy 0.9 > 0.5"),
        (labeled(2), judged(2), 0.5, "judge uncertainty unknown: no CoT entropy at its first error, step 2"),
        # Disagreement is the reason even when the judge is also unsure.
        (labeled(1), judged(2, entropy={2: 3.0}), 0.5, "first errors disagree: MC 1, judge 2"),
    ],
)
def test_the_rule_on_hand_made_cases(
    mc: StepsLabeled, judge: StepsJudged, threshold: float | None, reason: str | None
) -> None:
    decision = labels_decision(mc, judge, entropy_threshold=threshold)
    if reason is None:
        assert decision.accept and decision.reason is None, decision
    else:
        assert not decision.accept and decision.reason is not None and reason in decision.reason, decision


@st.composite
def pairs(draw: st.DrawFn) -> tuple[StepsLabeled, StepsJudged]:
    n = draw(st.integers(1, 6))
    mc_first = draw(st.none() | st.integers(0, n - 1))
    judge_first = draw(st.sampled_from([mc_first, None, *range(n)]))
    verdicts = [
        None if judge_first is not None and i > judge_first else (judge_first is None or i < judge_first)
        for i in range(n)
    ]
    holes = draw(st.sets(st.integers(0, n - 1), max_size=2)) if draw(st.booleans()) else set()
    verdicts = [None if i in holes else v for i, v in enumerate(verdicts)]
    entropy = {i: draw(st.floats(0, 3)) for i in range(n) if verdicts[i] is not None and draw(st.booleans())}
    m = n if draw(st.integers(0, 9)) else draw(st.integers(1, 6))
    verdicts = (verdicts + [True] * m)[:m]
    return labeled(mc_first, n), judged(judge_first, m, verdicts=verdicts, entropy=entropy)


def test_a_judge_that_gives_no_verdict_is_quoted_with_its_reason() -> None:
    undecided = judged(None, verdicts=[True, None, None, None, None]).model_copy(
        update={"reason": "step 1: restates numbers in words the checker cannot match to the question's"}
    )
    decision = labels_decision(labeled(3), undecided)
    assert not decision.accept
    assert decision.reason == (
        "judge gave no verdict on step 1 (step 1: restates numbers in words the checker cannot match to the question's)"
    )


@settings(max_examples=300, deadline=None)
@given(pairs(), st.floats(0, 3))
def test_an_acceptance_means_agreement_and_the_threshold_only_removes(
    pair: tuple[StepsLabeled, StepsJudged], threshold: float
) -> None:
    mc, judge = pair
    plain = labels_decision(mc, judge)
    strict = labels_decision(mc, judge, entropy_threshold=threshold)
    stricter = labels_decision(mc, judge, entropy_threshold=threshold / 2)
    for decision in (plain, strict, stricter):
        assert decision.accept == (decision.reason is None)
    if plain.accept:
        first = judge.first_error_step
        assert mc.first_error_step == first and len(mc.labels) == len(judge.verdicts)
        assert all(v is True for v in judge.verdicts[: len(judge.verdicts) if first is None else first])
    else:
        expected = len(mc.labels) != len(judge.verdicts) or None in judge.verdicts[: judge.first_error_step]
        expected = expected or mc.first_error_step != judge.first_error_step
        assert expected, plain.reason  # nothing else rejects a pair without a threshold
    assert not strict.accept or plain.accept  # abstention only turns acceptances into rejections
    assert not stricter.accept or strict.accept  # and a lower threshold keeps fewer


# ------------------------------------------------------------------------------------------------ the join


def envelope(payload: StepsLabeled | StepsJudged, sid: str, minutes: float = 0) -> Envelope:
    payload = payload.model_copy(update={"solution_id": sid, "question_id": f"q-{sid}"})
    return make_event(payload, producer="test", occurred_at=T0 + timedelta(minutes=minutes))


def consumed(events: Sequence[Envelope]) -> list[ConsumedEvent]:
    return [ConsumedEvent(e, e.topic, 0, i, 0, encode_event(e)) for i, e in enumerate(events)]


class Published(list[Envelope]):
    """What the handler published (every call, duplicates kept)."""

    def __call__(self, events: list[Envelope]) -> None:
        self.extend(events)

    def by_solution(self) -> dict[str, set[uuid.UUID]]:
        out: dict[str, set[uuid.UUID]] = {}
        for e in self:
            out.setdefault(e.correlation_id, set()).add(e.event_id)
        return out


@pytest.fixture
def state(tmp_path: Path) -> Iterator[JoinState]:
    s = JoinState(tmp_path / "consensus.sqlite3")
    yield s
    s.close()


def world(n: int, seed: int, prefix: str = "s") -> tuple[list[Envelope], list[Envelope]]:
    """``n`` solutions' MC and judge events (``<prefix><i>``): about half agree on the first error."""
    rng = random.Random(seed)
    mcs, judges = [], []
    for i in range(n):
        steps = rng.randint(1, 6)
        first = rng.choice([None, *range(steps)])
        judge_first = first if rng.random() < 0.5 else rng.choice([None, *range(steps)])
        mcs.append(envelope(labeled(first, steps), f"{prefix}{i}", minutes=rng.random()))
        judges.append(envelope(judged(judge_first, steps), f"{prefix}{i}", minutes=rng.random()))
    return mcs, judges


def run_order(path: Path, events: Sequence[Envelope], batch: int) -> Published:
    state = JoinState(path)
    published = Published()
    handler = Consensus(state, published)
    for i in range(0, len(events), batch):
        assert handler(consumed(events[i : i + batch])) == []
    state.close()
    return published


def test_any_arrival_order_and_redelivery_give_the_same_single_decision(tmp_path: Path) -> None:
    mcs, judges = world(40, seed=3)
    rng = random.Random(4)
    interleaved = [e for pair in zip(mcs, judges, strict=True) for e in pair]
    shuffled = [*mcs, *judges, *rng.sample(mcs, 10), *rng.sample(judges, 10)]  # re-deliveries
    rng.shuffle(shuffled)
    orders = {
        "judge first": ([*judges, *mcs], 7),
        "mc first": ([*mcs, *judges], 40),
        "interleaved": (interleaved, 1),
        "shuffled with re-deliveries": (shuffled, 13),
        "all twice in one batch": ([*interleaved, *interleaved], 500),
    }
    results = {
        name: run_order(tmp_path / f"{i}.sqlite3", events, b) for i, (name, (events, b)) in enumerate(orders.items())
    }
    reference = results["judge first"].by_solution()
    assert set(reference) == {f"s{i}" for i in range(40)}
    for name, published in results.items():
        assert len(published) == 40, name  # one decision per solution, each published once
        assert published.by_solution() == reference, name  # the same ids whatever the order
    kinds = {type(e.payload) for e in results["mc first"]}
    assert kinds == {LabelsAccepted, LabelsRejected}


def test_decisions_carry_the_mc_labels_both_sources_and_the_rule(state: JoinState) -> None:
    published = Published()
    handler = Consensus(state, published, entropy_threshold=0.5)
    mc, judge = envelope(labeled(2), "a"), envelope(judged(2, entropy={2: 0.2}), "a")
    handler(consumed([judge, mc]))
    (decision,) = published
    assert isinstance(decision.payload, LabelsAccepted)
    assert decision.payload.labels == (True, True, False, False, False) and decision.payload.first_error_step == 2
    assert decision.payload.source_event_ids == (mc.event_id, judge.event_id)
    assert decision.payload.rule == "first_error_agreement(entropy_threshold=0.5, max_wait_s=None)"
    assert decision.causation_id == mc.event_id and decision.correlation_id == "a"
    assert handler.counters()["accepted"] == 1 and handler.counters()["waiting"] == 0


def test_the_first_pair_decides_newest_waiting_wins_later_events_are_only_counted(state: JoinState) -> None:
    published = Published()
    handler = Consensus(state, published)
    old = envelope(labeled(1, method="old"), "x", minutes=1)
    new = envelope(labeled(3, method="new"), "x", minutes=2)
    handler(consumed([new]))
    handler(consumed([old]))  # arrives later but is older: superseded by `new`
    assert published == []
    judge = envelope(judged(3), "x", minutes=3)
    handler(consumed([judge]))
    (decision,) = published
    assert isinstance(decision.payload, LabelsAccepted)
    assert decision.payload.source_event_ids == (new.event_id, judge.event_id)
    newer = envelope(labeled(0, method="newest"), "x", minutes=9)
    handler(consumed([newer, judge, new]))  # a re-label after the decision, and re-deliveries
    assert len(published) == 1
    counts = handler.counters()
    assert (counts["received"], counts["late"], counts["duplicates"]) == (4, 1, 2)


def test_a_crash_after_recording_republishes_the_same_decision_and_nothing_more(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite3"
    mc, judge = envelope(labeled(1), "c"), envelope(judged(4), "c")

    def broker_down(events: list[Envelope]) -> None:
        raise ConnectionError("broker down")

    first = JoinState(path)
    with pytest.raises(ConnectionError):
        Consensus(first, broker_down)(consumed([mc, judge]))  # recorded, never acknowledged
    first.close()  # the process dies here; the runtime never committed the offsets

    second = JoinState(path)
    published = Published()
    handler = Consensus(second, published)
    assert handler.flush() == 1  # what run_consensus does before it consumes
    handler(consumed([mc, judge]))  # the uncommitted records come again: no-ops
    assert handler.flush() == 0
    second.close()
    (decision,) = published
    assert isinstance(decision.payload, LabelsRejected)
    assert decision.payload.reason == "first errors disagree: MC 1, judge 4"


def test_a_lone_half_is_rejected_after_max_wait_and_its_partner_comes_late(state: JoinState) -> None:
    published = Published()
    handler = Consensus(state, published, max_wait_s=30)
    mc, judge = envelope(labeled(2), "m"), envelope(judged(None), "j")
    handler(consumed([mc, judge]))
    start = time.time()
    assert handler.expire(now=start + 10) == 0
    assert handler.expire(now=start + 31) == 2
    reasons = {e.correlation_id: e.payload for e in published}
    mc_side, judge_side = reasons["m"], reasons["j"]
    assert isinstance(mc_side, LabelsRejected) and mc_side.reason == "no judge verdict within 30 s"
    assert mc_side.labels == (True, True, False, False, False) and mc_side.source_event_ids == (mc.event_id,)
    assert isinstance(judge_side, LabelsRejected) and judge_side.reason == "no MC label within 30 s"
    assert judge_side.labels == () and judge_side.first_error_step is None
    handler(consumed([envelope(judged(2), "m")]))  # the partner, too late
    assert len(published) == 2 and handler.counters()["late"] == 1
    assert handler.expire(now=start + 1000) == 0


def test_a_restart_gives_waiting_halves_a_fresh_max_wait(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite3"
    first = JoinState(path)
    Consensus(first, Published(), max_wait_s=30)(consumed([envelope(labeled(1), "r")]))
    first.close()
    time.sleep(0.05)
    second = JoinState(path)  # "restarted" later: the backlog may still hold the partner
    handler = Consensus(second, Published(), max_wait_s=30)
    assert handler.expire(now=second.opened_at + 29) == 0
    assert handler.expire(now=second.opened_at + 30) == 1
    second.close()


def test_events_of_another_type_are_dead_lettered_with_the_reason(state: JoinState) -> None:
    other = make_event(QuestionRegistered(question_id="q", dataset="d", problem="p"), producer="test")
    batch = consumed([other, envelope(labeled(1), "w")])
    ((bad, reason),) = Consensus(state, Published())(batch)
    assert bad is batch[0] and "not QuestionRegistered" in reason


# ---------------------------------------------------------------------------------------------- the service


def private_topics(servers: str, partitions: tuple[int, int] = (4, 4)) -> tuple[str, str]:
    tag = uuid.uuid4().hex[:8]
    names = (f"test-labeled-{tag}", f"test-judged-{tag}")
    ensure_topics(servers)
    specs = [TopicSpec(t, p) for t, p in zip(names, partitions, strict=True)]
    ensure_topics(servers, [*specs, *(TopicSpec(dlq_topic(t), 1) for t in names)])
    return names


def send(servers: str, topic_of: dict[str, str], events: Sequence[Envelope]) -> None:
    with EventProducer(servers) as producer:
        for e in events:
            producer.send_raw(topic_of[e.event_type], e.correlation_id.encode(), encode_event(e), [])


def decisions_on_the_wire(servers: str, solution_ids: set[str]) -> dict[str, list[Envelope]]:
    """Every decision on ``labels.accepted``/``labels.rejected`` for ``solution_ids`` (duplicates kept)."""
    consumer = KafkaConsumer(bootstrap_servers=servers, enable_auto_commit=False)
    try:
        parts = [
            TopicPartition(topic, p)
            for topic in (LabelsAccepted.TOPIC, LabelsRejected.TOPIC)
            for p in sorted(consumer.partitions_for_topic(topic) or ())
        ]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        out: dict[str, list[Envelope]] = {}
        idle_since = time.monotonic()
        while time.monotonic() - idle_since < 1.0:
            polled = consumer.poll(timeout_ms=200)
            if any(polled.values()):
                idle_since = time.monotonic()
            for records in polled.values():
                for record in records:
                    event, _ = decode_stored_form(record.value)
                    if event.correlation_id in solution_ids:
                        out.setdefault(event.correlation_id, []).append(event)
        return out
    finally:
        consumer.close()


def test_the_service_decides_each_solution_once_on_a_real_broker(kafka_bootstrap: str, tmp_path: Path) -> None:
    labeled_topic, judged_topic = private_topics(kafka_bootstrap)
    topic_of = {"StepsLabeled": labeled_topic, "StepsJudged": judged_topic}
    tag = uuid.uuid4().hex[:6]
    mcs, judges = world(30, seed=11, prefix=f"{tag}-")
    lone = envelope(labeled(1), f"{tag}-lone")
    send(kafka_bootstrap, topic_of, [*judges[:15], *mcs, lone, *mcs[:5]])  # judges split, re-deliveries
    settings_ = ConsensusSettings(
        labeled_topic=labeled_topic,
        judged_topic=judged_topic,
        group=f"consensus-{tag}",
        state_dir=tmp_path,
        max_wait=3,
        until_idle=5,
        session_timeout=3,
    )
    stop = threading.Event()
    result: list[dict[str, int]] = []
    thread = threading.Thread(
        target=lambda: result.append(
            run_consensus(
                settings_, bootstrap_servers=kafka_bootstrap, until=stop.is_set, install_signal_handlers=False
            )
        )
    )
    thread.start()
    time.sleep(1.0)
    send(kafka_bootstrap, topic_of, judges[15:])  # the other half arrives while it runs
    thread.join(120)
    assert not thread.is_alive()
    ids = {e.correlation_id for e in [*mcs, lone]}
    wire = decisions_on_the_wire(kafka_bootstrap, ids)
    assert set(wire) == ids
    assert all(len({e.event_id for e in events}) == 1 for events in wire.values())
    (lone_decision,) = wire[lone.correlation_id]
    assert isinstance(lone_decision.payload, LabelsRejected)
    assert lone_decision.payload.reason == "no judge verdict within 3 s"
    (summary,) = result
    assert summary["accepted"] + summary["rejected"] == 31 and summary["timed_out"] == 1
    assert summary["duplicates"] == 5 and summary["waiting"] == 0 and summary["dead_lettered"] == 0


def test_the_service_refuses_topics_partitioned_differently(kafka_bootstrap: str, tmp_path: Path) -> None:
    labeled_topic, judged_topic = private_topics(kafka_bootstrap, partitions=(4, 2))
    settings_ = ConsensusSettings(labeled_topic=labeled_topic, judged_topic=judged_topic, state_dir=tmp_path)
    with pytest.raises(TopicLayoutError, match=r"partitioned alike .*has 4, .*has 2 partitions"):
        run_consensus(settings_, bootstrap_servers=kafka_bootstrap, install_signal_handlers=False)
    missing = ConsensusSettings(labeled_topic=labeled_topic, judged_topic=f"absent-{uuid.uuid4().hex[:6]}")
    with pytest.raises(TopicLayoutError, match="does not exist"):
        run_consensus(missing, bootstrap_servers=kafka_bootstrap, install_signal_handlers=False)
