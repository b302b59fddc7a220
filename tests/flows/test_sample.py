"""The ``sample`` flow: question files with bad lines, one question end to end with a scripted
generator, and the Prefect flow on the tiny random model against the real broker, read back."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from prmloop.flows.sample import SampleConfig, read_question_file, sample_question
from prmloop.models.backends.base import Completion, SamplingParams
from prmloop.models.questions import Question
from prmloop.store.codec import decode_event
from prmloop.store.events import Envelope, ModelRef, SolutionSampled

if TYPE_CHECKING:
    from prmloop.models.backends.registry import BackendConfig


def write_lines(path: Path, lines: Sequence[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_question_file_reports_bad_lines_and_keeps_the_good_ones(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "q.jsonl",
        [
            json.dumps({"id": "a", "problem": "1+1?", "answer": "2"}),
            "{not json",
            json.dumps({"id": "b", "problem": "2+2?"}),
            json.dumps({"id": "a", "problem": "again", "answer": "3"}),
            "",
            json.dumps({"problem": "no id", "answer": "1"}),
            json.dumps({"id": "c", "question": "3+3?", "gold_answer": 6}),
        ],
    )
    questions, errors = read_question_file(path)
    assert [q.id for q in questions] == ["a", "c"]
    assert questions[1].gold_answer == "6" and questions[1].problem == "3+3?"
    assert [e.split(": ", 1)[0] for e in errors] == [f"{path}:{n}" for n in (2, 3, 4, 6)]
    assert "not valid JSON" in errors[0]
    assert "no 'gold_answer'" in errors[1]
    assert "duplicate id 'a' (first on line 1)" in errors[2]
    assert "missing 'id'" in errors[3]


class ScriptedGenerator:
    """Returns fixed texts with fixed log-probabilities (no tokenizer: no token offsets)."""

    model_name = "scripted"

    def __init__(self, samples: Sequence[tuple[str, Sequence[float]]]) -> None:
        self.samples = samples
        self.calls: list[SamplingParams] = []

    def generate(self, prompts: Sequence[str], params: SamplingParams | None = None) -> list[list[Completion]]:
        assert params is not None
        self.calls.append(params)
        completions = [Completion(text, tuple(range(len(lps))), tuple(lps), "stop", 10) for text, lps in self.samples]
        return [completions[: params.n] for _ in prompts]

    def rollouts(self, prefix: str, n: int, params: SamplingParams | None = None) -> list[Completion]:
        raise NotImplementedError


def test_sample_question_keeps_the_most_uncertain_and_builds_events() -> None:
    flat, peaked = [-1.0] * 4, [0.0, -9.0, -9.0, -9.0]
    generator = ScriptedGenerator(
        [
            ("Step 1: 2+2=4.\nStep 2: The final answer is: 4", peaked),  # correct, low u
            ("Step 1: 2+2=4.\nStep 2: The final answer is: 4", flat),  # correct, high u
            ("Step 1: 2+2=5.\nStep 2: The final answer is: 5", flat),  # incorrect
            ("Step 1: I am not sure.\nStep 2: Let me stop here.", flat),  # no answer: dropped
        ]
    )
    question = Question(id="q1", dataset="t", problem="What is 2+2?", gold_answer="4")
    model = ModelRef(backend="scripted", name="scripted")
    result = sample_question(generator, model, question, SampleConfig(k=4, m=1, n=1, seed=3))
    assert result.selection.correct == (1,) and result.selection.incorrect == (2,)
    assert result.selection.dropped == (3,)
    assert result.correct == [True, True, False, None]
    assert result.uncertainties[1] == pytest.approx(math.log(4))
    # answers {4, 4, 5}: H = -(2/3 ln 2/3 + 1/3 ln 1/3)
    assert result.answer_dispersion == pytest.approx(-(2 / 3 * math.log(2 / 3) + 1 / 3 * math.log(1 / 3)))
    payloads = [e.payload for e in result.events]
    assert all(isinstance(p, SolutionSampled) for p in payloads)
    sampled = [p for p in payloads if isinstance(p, SolutionSampled)]
    assert [p.final_answer for p in sampled] == ["4", "5"]
    assert sampled[0].steps == ("2+2=4.", "The final answer is: 4")
    assert sampled[0].selected_by == "uncertainty" and sampled[0].sampling.seed == 3
    assert all(e.causation_id == result.registered.event_id for e in result.events)
    again = sample_question(generator, model, question, SampleConfig(k=4, m=1, n=1, seed=3))
    assert [e.event_id for e in again.events] == [e.event_id for e in result.events]
    other_seed = sample_question(generator, model, question, SampleConfig(k=4, m=1, n=1, seed=4))
    assert {e.event_id for e in other_seed.events}.isdisjoint(e.event_id for e in result.events)
    assert generator.calls[0].seed == generator.calls[1].seed != generator.calls[2].seed


# ------------------------------------------------------------------------------------------------
# The flow against the real broker, with the tiny random model
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def prefect_api() -> Iterator[None]:
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


def read_events(servers: str, topics: Sequence[str], question_ids: set[str]) -> list[Envelope]:
    """Every record of ``topics`` about ``question_ids``, from the beginning (no consumer group)."""
    from kafka import KafkaConsumer, TopicPartition

    from prmloop.store.kafka import consumer_config
    from prmloop.store.settings import KafkaSettings

    consumer = KafkaConsumer(**consumer_config(KafkaSettings(), servers, group_id=None))
    try:
        parts = [TopicPartition(t, p) for t in topics for p in sorted(consumer.partitions_for_topic(t) or ())]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        events: list[Envelope] = []
        idle_since = time.monotonic()
        while time.monotonic() - idle_since < 2.0:
            batch = consumer.poll(timeout_ms=200)
            if any(batch.values()):
                idle_since = time.monotonic()
            for records in batch.values():
                events.extend(decode_event(r.value) for r in records)
        return [e for e in events if getattr(e.payload, "question_id", None) in question_ids]
    finally:
        consumer.close()


def test_flow_publishes_solutions_and_rerunning_publishes_the_same_ids(
    prefect_api: None,
    tiny_backend_config: BackendConfig,
    kafka_bootstrap: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from prmloop.flows.sample import run_sample

    monkeypatch.setenv("PRMLOOP_HOME", str(tmp_path / "home"))
    run_id = f"t{time.time_ns()}"
    path = write_lines(
        tmp_path / "q.jsonl",
        [
            json.dumps({"id": f"{run_id}-1", "problem": "What is 2+2?", "answer": "4"}),
            json.dumps({"id": f"{run_id}-2", "problem": "What is 3*3?", "answer": "#### 9"}),
            "oops",
        ],
    )
    options: dict[str, Any] = {
        "file": path,
        "k": 3,
        "m": 2,
        "n": 6,
        "seed": 11,
        "max_new_tokens": 12,
        "prompt_format": "double_newline",
        "publish_unselected": True,  # the random model rarely states an answer: publish all to check them
        "backend": tiny_backend_config,
        "bootstrap_servers": kafka_bootstrap,
        "progress": False,
    }
    first = run_sample(**options)
    assert first["questions"] == 2 and first["solutions"] == 6
    assert len(first["question_errors"]) == 1 and ":3: not valid JSON" in first["question_errors"][0]
    assert first["events_published"] == 2 + 6
    assert first["completion_tokens"] > 0
    assert [row["sampled"] for row in first["per_question"]] == [3, 3]

    qids = {f"{run_id}-1", f"{run_id}-2"}
    events = read_events(kafka_bootstrap, ["questions.registered", "solutions.sampled"], qids)
    solutions = [e.payload for e in events if isinstance(e.payload, SolutionSampled)]
    assert len(events) == 8 and len(solutions) == 6
    for s in solutions:
        assert s.generator.name == "tiny-random-llama" and s.sampling.seed == 11 and s.sampling.n == 3
        assert s.token_logprobs is not None and len(s.token_logprobs) == s.completion_tokens
        assert s.uncertainty is not None and s.uncertainty.entropy is not None
        assert s.step_token_offsets is not None and len(s.step_token_offsets) == len(s.steps)
        assert s.uncertainty.step_entropy is not None and len(s.uncertainty.step_entropy) == len(s.steps)
        assert s.gold_answer in {"4", "#### 9"}
    assert {getattr(e.payload, "question_id", None) for e in events} == qids

    second = run_sample(**options)
    assert second["events_published"] == first["events_published"]
    replayed = read_events(kafka_bootstrap, ["questions.registered", "solutions.sampled"], qids)
    assert len(replayed) == 16
    assert {e.event_id for e in replayed} == {e.event_id for e in events}
    texts = {e.event_id: e.payload for e in replayed if isinstance(e.payload, SolutionSampled)}
    assert all(texts[e.event_id].text == e.payload.text for e in events if isinstance(e.payload, SolutionSampled))
