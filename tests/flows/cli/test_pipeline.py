"""The pipeline reads left to right on a real broker: simulate -> score -> select -> annotate, each service
consuming only the topic before it, and the labels are the ones the world's own Δu gives."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from prmloop.consumers.annotator import AnnotatorSettings, build_annotator, run_annotator
from prmloop.consumers.scorer import ScorerSettings, run_scorer
from prmloop.consumers.selector import SelectorSettings, run_selector
from prmloop.flows.ops.broker import EmbeddedBroker
from prmloop.models.annotation.completer import exact_match
from prmloop.models.annotation.strategies import annotate
from prmloop.models.simulator import SimulatedCompleter, SimulatorOptions
from prmloop.producers.simulated import simulated_events, simulated_solution_id
from prmloop.store.events import StepsLabeled, StepsScored
from prmloop.store.kafka.producer import EventProducer, ensure_topics


@pytest.fixture
def fresh_broker() -> Iterator[str]:
    """A broker of its own: the default topics hold only this test's events."""
    with EmbeddedBroker() as broker:
        ensure_topics(broker.bootstrap_servers)
        yield broker.bootstrap_servers


def test_simulated_solutions_flow_through_scorer_selector_and_annotator(
    fresh_broker: str, topic_reader: Any, tmp_path: Path
) -> None:
    world_options = SimulatorOptions(sim_n=10, sim_seed=31, correlation=0.7)
    config, world = world_options.world()
    with EventProducer(fresh_broker) as producer:
        producer.publish(simulated_events(world, world_options.sim_seed))

    world_fields = world_options.model_dump()
    scored = run_scorer(
        ScorerSettings(simulator=True, until_idle=3, **world_fields),
        bootstrap_servers=fresh_broker,
        install_signal_handlers=False,
    )
    assert scored["simulated"] == 10 and scored["dead_lettered"] == 0
    scores = {e.payload.solution_id: e.payload for e in topic_reader(fresh_broker, [StepsScored.TOPIC])}
    assert len(scores) == 10
    for i, solution in enumerate(world):
        payload = scores[simulated_solution_id(31, i)]
        assert isinstance(payload, StepsScored) and payload.source == "simulator"
        assert payload.uncertainty_delta == pytest.approx(solution.uncertainty_delta)
        assert payload.problem == solution.question and payload.steps == solution.steps

    # No ensemble PRM promoted in this (empty) store: the selector sends every solution on to be labelled.
    selected = run_selector(
        SelectorSettings(db=str(tmp_path / "none.duckdb"), until_idle=3),
        bootstrap_servers=fresh_broker,
        install_signal_handlers=False,
    )
    assert selected["label"] == 10 and selected["skip"] == 0

    settings = AnnotatorSettings(strategy="uncertainty_driven", completer="simulator", until_idle=3, **world_fields)
    summary = run_annotator(settings, bootstrap_servers=fresh_broker, install_signal_handlers=False)
    assert summary["dead_lettered"] == 0 and summary["labelled"] + summary["unresolved"] == 10
    labels = {e.payload.solution_id: e.payload for e in topic_reader(fresh_broker, [StepsLabeled.TOPIC])}
    assert len(labels) == summary["labelled"] > 0

    # The same search on the world's own Δu, in process, gives the same first errors.
    strategy = build_annotator(settings)[0]
    for i, solution in enumerate(world):
        direct = annotate(
            solution.to_label(), strategy, [SimulatedCompleter(world, config, seed=31)], checker=exact_match
        )
        label = labels.get(simulated_solution_id(31, i))
        if direct.status == "labelled":
            assert isinstance(label, StepsLabeled) and label.first_error_step == direct.first_error_step
