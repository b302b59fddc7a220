"""Prioritize -> store -> queue -> `sample --from-queue`, on the real broker, a real DuckDB file, real
Prefect flow runs and a tiny real model."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from prmloop.consumers.sink import events_to_arrow
from prmloop.models.backends.registry import BackendConfig
from prmloop.models.questions import Question
from prmloop.producers.events import solution_sampled
from prmloop.producers.prioritize import PrioritizeSettings, probe_seed
from prmloop.producers.sampler import SampleSettings
from prmloop.producers.sources import QuestionFileError, load_source
from prmloop.store.events import Envelope, ModelRef, QuestionPrioritized
from prmloop.store.kafka.runtime import ConsumedEvent
from prmloop.store.tables.duck import DuckEventStore
from prmloop.store.tables.queue import queued_questions


def _store(store: DuckEventStore, events: list[Envelope], topic: str) -> None:
    rows = events_to_arrow([ConsumedEvent(e, topic, 0, i, 0) for i, e in enumerate(events)])
    store.write_batch(rows, [(topic, 0, len(events))])


def test_probe_seed_differs_from_the_run_seed_and_by_round() -> None:
    assert probe_seed(0, 0) != 0 and probe_seed(0, 0) != probe_seed(0, 1) == probe_seed(0, 1)


@pytest.mark.usefixtures("prefect_api")
def test_prioritized_questions_are_sampled_highest_first(
    tiny_backend_config: BackendConfig,
    kafka_bootstrap: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    topic_reader: Any,
) -> None:
    from prmloop.flows.prioritize import run_prioritize
    from prmloop.flows.sample import run_sample

    monkeypatch.setenv("PRMLOOP_HOME", str(tmp_path / "home"))
    run_id = f"p{time.time_ns()}"
    ids = [f"{run_id}-{i}" for i in range(3)]
    questions = tmp_path / "q.jsonl"
    questions.write_text(
        "".join(
            json.dumps({"id": qid, "problem": f"What is {i}+{i}?", "answer": str(2 * i)}) + "\n"
            for i, qid in enumerate(ids)
        )
    )
    engine = {"backend": tiny_backend_config.backend, "model": tiny_backend_config.model}
    settings = PrioritizeSettings(file=questions, k=3, max_new_tokens=8, prompt_format="double_newline", **engine)
    summary = run_prioritize(settings, bootstrap_servers=kafka_bootstrap)  # the Prefect flow `prioritize`
    assert summary["questions"] == 3 and summary["probe_tokens"] > 0
    assert [row["priority"] for row in summary["queue"]] == sorted(
        (r["priority"] for r in summary["queue"]), reverse=True
    )

    events = [
        e
        for e in topic_reader(kafka_bootstrap, ["questions.registered", "questions.prioritized"])
        if e.correlation_id in ids
    ]
    prioritized = [e for e in events if isinstance(e.payload, QuestionPrioritized)]
    assert sorted(e.payload.question_id for e in prioritized) == ids
    for e in prioritized:
        assert 0.0 <= e.payload.priority <= 1.0 and e.payload.signals["samples"] == 3.0

    # The same round again (plain functions this time) decides the same: same event ids, same priorities.
    again = run_prioritize(settings.model_copy(update={"prefect": False}), bootstrap_servers=kafka_bootstrap)
    assert again["queue"] == summary["queue"]
    repeated = [e for e in topic_reader(kafka_bootstrap, ["questions.prioritized"]) if e.correlation_id in ids]
    assert {e.event_id for e in repeated} == {e.event_id for e in prioritized}

    store = DuckEventStore(tmp_path / "prmloop.duckdb")
    _store(store, events, "questions")
    queue = queued_questions(store.path, 10)
    by_priority = sorted(prioritized, key=lambda e: (-e.payload.priority, e.payload.question_id))
    assert [q.question_id for q in queue] == [e.payload.question_id for e in by_priority]
    assert queue[0].problem.startswith("What is") and queue[0].gold_answer is not None

    sampled = run_sample(
        SampleSettings(
            from_queue=True, db=store.path, limit=2, k=2, m=1, n=1, max_new_tokens=8, prefect=False, **engine
        ),
        bootstrap_servers=kafka_bootstrap,
        prefect=False,
    )
    taken = [row["question_id"] for row in sampled["per_question"]]
    assert taken == [q.question_id for q in queue[:2]]
    # The random model states no answer, so its solutions are dropped: store one graded solution by hand.
    question = Question(id=taken[0], dataset="file", problem=queue[0].problem, gold_answer=queue[0].gold_answer)
    solutions = [
        solution_sampled(
            question,
            solution_id=f"{taken[0]}-s",
            generator=ModelRef(backend="test", name="hand"),
            prompt_format="step_k",
            text="Step 1: 0. The answer is 0",
            steps=("Step 1: 0. The answer is 0",),
            correct=True,
            final_answer="0",
            identity=(taken[0], "hand"),
            producer="test",
        )
    ]
    _store(store, solutions, "solutions")
    assert [q.question_id for q in queued_questions(store.path, 10)] == [q.question_id for q in queue[1:]]


def test_an_empty_queue_and_a_missing_store_say_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="prmloop prioritize"):
        load_source(queue=tmp_path / "none.duckdb")
    store = DuckEventStore(tmp_path / "prmloop.duckdb")
    _store(store, [], "x")
    with pytest.raises(QuestionFileError, match=r"queue .* is empty"):
        load_source(queue=store.path)
    with pytest.raises(QuestionFileError, match="exactly one question source"):
        load_source(dataset="arith", queue=store.path)


def test_the_embedded_model_defaults_to_the_arithmetic_curriculum() -> None:
    from prmloop.producers.sources import default_dataset

    assert default_dataset("transformers", "smollm2") == "arith"
    assert default_dataset("openai", "smollm2") == "arith"  # the embedded model behind `prmloop engine`
    assert default_dataset("vllm", "Qwen/Qwen2.5-Math-7B-Instruct") == "gsm8k"
    assert default_dataset("transformers", "/models/qwen") == "gsm8k"


def test_two_sources_are_a_usage_error(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from prmloop.flows.cli import app

    for command in (["sample", "--from-queue"], ["prioritize"]):
        out = CliRunner().invoke(app, [*command, "--dataset", "gsm8k", "--file", str(tmp_path / "q.jsonl")])
        assert out.exit_code == 2 and "at most one" in out.output
