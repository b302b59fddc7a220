"""The selector: ActPRM's rule in the loop, on a real broker, a real store and a tiny real backbone.

Two rounds: with no promoted ensemble every solution is labelled; once an ensemble is registered and
promoted in the store, its decisions carry the PRM, the thresholds and the per-step mean and std, and
follow the rule; a newer PRM takes up what an older one skipped; the annotator works only on what is
sent on."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from prmloop.consumers.annotator import Annotator
from prmloop.consumers.selector import PromotedEnsemble, SelectorSettings, decide_all, run_selector
from prmloop.consumers.sink import events_to_arrow
from prmloop.models.prm.active import Thresholds, decide
from prmloop.models.prm.data import PRMExample
from prmloop.models.prm.ensemble import EnsembleConfig, StepStats
from prmloop.models.prm.ensemble_prm import EnsemblePRM, train_ensemble_prm
from prmloop.models.prm.features import FeatureExtractor, FeatureSpec
from prmloop.store.events import Envelope, ModelRef, SolutionSelected, StepsScored, make_event
from prmloop.store.events.codec import encode_event
from prmloop.store.events.topics import TopicSpec, dlq_topic
from prmloop.store.kafka.producer import EventProducer, ensure_topics
from prmloop.store.kafka.runtime import ConsumedEvent
from prmloop.store.tables.duck import DuckEventStore
from prmloop.store.tables.registry import model_registered

FAST = EnsembleConfig(heads=8, hidden=8, pca_dims=0, epochs=60, learning_rate=2e-2, threads=1)


def _scored(run: str, i: int, *, correct: bool = False) -> StepsScored:
    a, b = i % 7 + 1, i % 5 + 2
    return StepsScored(
        solution_id=f"s-{run}-{i}",
        question_id=f"q-{run}-{i}",
        scorer=ModelRef(backend="test", name="test"),
        step_uncertainty=None,
        uncertainty_delta=None,
        step_order=None,
        problem=f"Tom has {a} apples and buys {b} more. How many apples does he have?",
        steps=(f"{a} + {b} = {a + b + (0 if correct else 1)}", f"The answer is {a + b + (0 if correct else 1)}."),
        prompt_format="step_k_arith",
        correct=correct,
        final_answer=str(a + b),
        gold_answer=str(a + b),
    )


def _consumed(events: list[Envelope]) -> list[ConsumedEvent]:
    return [ConsumedEvent(e, "t", 0, i, 0) for i, e in enumerate(events)]


@pytest.fixture
def extractor(tiny_backend: Any) -> FeatureExtractor:
    return FeatureExtractor(FeatureSpec(layers=(1.0,)), model=tiny_backend.model, tokenizer=tiny_backend.tokenizer)


def _ensemble(extractor: FeatureExtractor, tmp_path: Path, name: str, seed: int = 0) -> Path:
    """A trained ensemble saved as ``name``. Its id is its files' digest: two trained with one seed are
    the same model whenever their ``train_seconds`` agree to the millisecond (a CI run saw it), so a
    different model takes a different ``seed``."""
    examples = [
        PRMExample(s.problem or "", s.steps, (True, True) if s.correct else (False, False))
        for s in (_scored("train", i, correct=i % 2 == 0) for i in range(16))
    ]
    config = FAST.model_copy(update={"seed": seed})
    prm, _ = train_ensemble_prm(examples, config=config, extractor=extractor, spec=extractor.spec)
    return prm.save(tmp_path / name)


def _register(store: DuckEventStore, artifact: Path, offset: int) -> str:
    event = model_registered(
        artifact=artifact,
        base_model=ModelRef(backend="transformers", name="tiny"),
        snapshot_id=artifact.name,
        train_examples=16,
        config={"kind": "ensemble"},
        metrics={"heldout_f1": 0.5 + offset / 100},
        promoted=True,
        decision="test",
        kind="prm_ensemble",
    )
    store.write_batch(events_to_arrow(_consumed([event])), [("models.registered", 0, offset + 1)])
    return str(event.payload.model_id)  # type: ignore[union-attr]


def test_a_solution_without_a_grade_is_skipped_whatever_the_prm() -> None:
    scored = [_scored("ungraded", i) for i in range(2)]
    scored[1] = scored[1].model_copy(update={"correct": None, "final_answer": None})
    events = decide_all(scored, None, SelectorSettings())
    assert [e.payload.decision for e in events] == ["label", "skip"]  # type: ignore[union-attr]
    assert "not graded" in events[1].payload.reason  # type: ignore[union-attr]


def test_without_a_promoted_ensemble_every_solution_is_labelled() -> None:
    scored = [_scored("none", i) for i in range(3)]
    events = decide_all(scored, None, SelectorSettings())
    assert [e.payload.decision for e in events] == ["label"] * 3  # type: ignore[union-attr]
    first = events[0].payload
    assert isinstance(first, SolutionSelected)
    assert first.prm is None and first.rule == "none" and first.score is None
    assert "no promoted ensemble" in first.reason and first.scored == scored[0]


def test_the_annotator_labels_what_is_sent_on_and_counts_what_was_skipped() -> None:
    published: list[list[Envelope]] = []
    annotator = Annotator(strategy_stub(), [], [ModelRef(backend="test", name="t")], published.append)
    label, skip = _scored("a", 1, correct=True), _scored("a", 2, correct=True)
    decisions = [
        make_event(
            SolutionSelected(solution_id=s.solution_id, question_id=s.question_id, decision=d, reason="r", scored=s),
            producer="test",
        )
        for s, d in ((label, "label"), (skip, "skip"))
    ]
    annotator(_consumed(decisions))
    [[labelled]] = published
    assert labelled.payload.solution_id == label.solution_id  # type: ignore[union-attr]
    assert annotator.stats.as_dict()["skipped_by_selection"] == 1


def strategy_stub() -> Any:
    from prmloop.models.annotation.strategies import make_strategy

    return make_strategy("adaptive_binary")


@pytest.mark.integration
def test_two_rounds_of_selection_on_a_real_broker_and_store(
    kafka_bootstrap: str, extractor: FeatureExtractor, tmp_path: Path, topic_reader: Callable[..., list[Envelope]]
) -> None:
    run = uuid.uuid4().hex[:8]
    store = DuckEventStore(tmp_path / "prmloop.duckdb")
    store.write_batch(events_to_arrow([]), [])

    def loader(path: Path, **kwargs: Any) -> EnsemblePRM:
        return EnsemblePRM.load(path, cache_dir=kwargs.get("cache_dir"), extractor=extractor)

    def round_(first: int, group: str, settings: SelectorSettings) -> list[SolutionSelected]:
        scored = [_scored(run, i, correct=i % 3 == 0) for i in range(first, first + 6)]
        topic = f"test-selector-{run}-{first}"
        ensure_topics(kafka_bootstrap, [TopicSpec(topic, 2), TopicSpec(dlq_topic(topic), 1)])
        with EventProducer(kafka_bootstrap) as producer:
            for s in scored:
                event = make_event(s, producer="test")
                producer.send_raw(topic, event.correlation_id.encode(), encode_event(event), [])
        deadline = time.monotonic() + 120
        counts = run_selector(
            settings.model_copy(update={"topic": topic, "group": group, "until_idle": 3.0}),
            bootstrap_servers=kafka_bootstrap,
            until=lambda: time.monotonic() > deadline,
            install_signal_handlers=False,
            ensemble=PromotedEnsemble(settings, cache_dir=tmp_path / "features", loader=loader),
        )
        assert counts["label"] + counts["skip"] == 6 and counts["dead_lettered"] == 0
        ids = {s.solution_id for s in scored}
        found = [e.payload for e in topic_reader(kafka_bootstrap, ["steps.selected"])]
        return [p for p in found if isinstance(p, SolutionSelected) and p.solution_id in ids]

    # Round 1: nothing promoted in the store yet.
    settings = SelectorSettings(db=str(store.location), refresh_s=0.01)
    first = round_(0, f"sel-{run}-1", settings)
    assert len(first) == 6 and all(p.decision == "label" and p.prm is None for p in first)

    # Round 2: an ensemble is promoted; lenient thresholds make it confident about nearly everything.
    model_id = _register(store, _ensemble(extractor, tmp_path, "prm-a"), 1)
    lenient = settings.model_copy(update={"delta": 0.51, "std_max": 1.0})
    second = round_(6, f"sel-{run}-2", lenient)
    assert len(second) == 6 and {p.prm.name for p in second if p.prm} == {model_id}
    # A correct solution is labelled whatever the PRM says: MC labels it with no rollout.
    for p in second:
        if p.scored.correct:
            assert p.decision == "label" and p.step_std == () and "without rollouts" in p.reason
    for p in [p for p in second if not p.scored.correct]:
        assert len(p.step_mean) == len(p.step_std) == 2
        assert p.thresholds["delta"] == 0.51 and p.thresholds["std_max"] == 1.0
        rule = Thresholds(delta=0.51, std_max=1.0, tau=p.thresholds["tau"])
        assert p.decision == ("label" if decide(StepStats(p.step_mean, p.step_std), rule).label else "skip")
    skipped = [p for p in second if p.decision == "skip"]
    assert skipped, "lenient thresholds skip the solutions whose every step mean is outside (0.49, 0.51)"

    # The sink's view of them: what was skipped, and why.
    store.write_batch(
        events_to_arrow(_consumed([make_event(p, producer="test") for p in second])),
        [("steps.selected", 0, 100)],
    )
    from prmloop.store.tables.duck import query

    rows = query(store.location, "SELECT decision, prm, reason FROM selections WHERE is_latest AND decision = 'skip'")
    assert len(rows.rows) == len(skipped) and all(r[1] == model_id and "confident" in r[2] for r in rows.rows)

    # A newer PRM, strict thresholds: it takes up everything the older one skipped.
    newer = _register(store, _ensemble(extractor, tmp_path, "prm-b", seed=1), 2)
    from prmloop.flows.reselect import revisit_skipped

    strict = settings.model_copy(update={"std_max": 1e-9})
    ensemble = PromotedEnsemble(strict, cache_dir=tmp_path / "features", loader=loader)
    again = revisit_skipped(strict, bootstrap_servers=kafka_bootstrap, ensemble=ensemble)
    assert again == {"revisited": len(skipped), "label": len(skipped), "skip": 0, "prm": newer}


def test_the_annotator_takes_free_labels_first_then_the_most_uncertain() -> None:
    from prmloop.consumers.annotator import labelling_order

    def selected(i: int, *, correct: bool, score: float | None) -> Envelope:
        s = _scored("order", i, correct=correct)
        payload = SolutionSelected(
            solution_id=s.solution_id, question_id=s.question_id, decision="label", reason="r", score=score, scored=s
        )
        return make_event(payload, producer="test")

    events = [
        selected(0, correct=False, score=1.5),
        selected(1, correct=True, score=0.2),
        selected(2, correct=False, score=9.0),
        selected(3, correct=False, score=None),  # decided without a PRM: as uncertain as can be
    ]
    order = [c.event.payload.solution_id for c in labelling_order(_consumed(events))]  # type: ignore[union-attr]
    assert order == ["s-order-1", "s-order-3", "s-order-2", "s-order-0"]
