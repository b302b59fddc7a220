"""The Prefect ``sample`` flow on the tiny random model against the real broker, read back."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from prmloop.producers.sampler import SampleSettings
from prmloop.store.events import Envelope, SolutionSampled
from prmloop.store.events.codec import decode_event

if TYPE_CHECKING:
    from prmloop.models.backends.registry import BackendConfig


def write_lines(path: Path, lines: Sequence[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------------------
# The flow against the real broker, with the tiny random model
# ------------------------------------------------------------------------------------------------


def read_events(servers: str, topics: Sequence[str], question_ids: set[str]) -> list[Envelope]:
    """Every record of ``topics`` about ``question_ids``, from the beginning (no consumer group)."""
    from kafka import KafkaConsumer, TopicPartition

    from prmloop.store.kafka.producer import consumer_config
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
    settings = SampleSettings(
        file=path,
        k=3,
        m=2,
        n=6,
        seed=11,
        max_new_tokens=12,
        prompt_format="double_newline",
        publish_unselected=True,  # the random model rarely states an answer: publish all to check them
        backend=tiny_backend_config.backend,
        model=tiny_backend_config.model,
    )
    first = run_sample(settings, bootstrap_servers=kafka_bootstrap)
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
        assert s.problem in {"What is 2+2?", "What is 3*3?"}
        assert s.gold_answer in {"4", "#### 9"}
    assert {getattr(e.payload, "question_id", None) for e in events} == qids

    second = run_sample(settings, bootstrap_servers=kafka_bootstrap)
    assert second["events_published"] == first["events_published"]
    replayed = read_events(kafka_bootstrap, ["questions.registered", "solutions.sampled"], qids)
    assert len(replayed) == 16
    assert {e.event_id for e in replayed} == {e.event_id for e in events}
    texts = {e.event_id: e.payload for e in replayed if isinstance(e.payload, SolutionSampled)}
    assert all(texts[e.event_id].text == e.payload.text for e in events if isinstance(e.payload, SolutionSampled))
