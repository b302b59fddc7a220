"""The streaming loop's sampler: one `feed` flow run probes new questions and tops up queued ones, on
the real broker, a real Prefect API and a tiny real model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from prmloop.flows.feed import FeedSettings, run_feed
from prmloop.models.arith import generate_question
from prmloop.models.backends.registry import BackendConfig
from prmloop.producers.arith import arith_question
from prmloop.store.events import QuestionPrioritized, QuestionRegistered, SolutionSampled


def _questions(seed: int, n: int) -> list[Any]:
    return [arith_question(generate_question(1, seed, i)) for i in range(n)]


@pytest.mark.usefixtures("prefect_api")
def test_a_feed_probes_new_questions_and_tops_up_queued_ones(
    tiny_backend_config: BackendConfig,
    kafka_bootstrap: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    topic_reader: Any,
) -> None:
    monkeypatch.setenv("PRMLOOP_HOME", str(tmp_path / "home"))
    seed = 900 + tmp_path.stat().st_ino % 1000  # questions of their own on the session's shared broker
    probe, queued = _questions(seed, 2), _questions(seed + 1, 1)
    settings = FeedSettings(
        backend=tiny_backend_config.backend, model=tiny_backend_config.model, k=4, probe_k=2, max_new_tokens=6
    )
    out = run_feed(probe, queued, settings, bootstrap_servers=kafka_bootstrap)  # the Prefect flow `feed`
    assert [row["question_id"] for row in out["probed"]] == [q.id for q in probe]
    assert all(0.0 <= row["priority"] <= 1.0 and row["tokens"] > 0 for row in out["probed"])
    assert out["topped_up"][0]["question_id"] == queued[0].id and out["topped_up"][0]["sampled"] == 2  # k - probe_k
    assert out["generated_tokens"] > 0

    ids = {q.id for q in probe + queued}
    topics = ["questions.registered", "questions.prioritized", "solutions.sampled"]
    events = [e for e in topic_reader(kafka_bootstrap, topics) if getattr(e.payload, "question_id", None) in ids]
    registered = {e.payload.question_id for e in events if isinstance(e.payload, QuestionRegistered)}
    prioritized = {e.payload.question_id for e in events if isinstance(e.payload, QuestionPrioritized)}
    sampled = [e.payload for e in events if isinstance(e.payload, SolutionSampled)]
    assert registered == ids and prioritized == {q.id for q in probe}
    # The top-up publishes every sample (the probe only its graded ones: a random tiny model grades none).
    assert sum(s.question_id == queued[0].id for s in sampled) == 2
    assert out["solutions"] == len({s.solution_id for s in sampled})


@pytest.mark.usefixtures("prefect_api")
def test_in_random_order_a_feed_samples_every_question_k_times_without_a_probe(
    tiny_backend_config: BackendConfig, kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PRMLOOP_HOME", str(tmp_path / "home"))
    questions = _questions(2000 + tmp_path.stat().st_ino % 1000, 2)
    settings = FeedSettings(
        backend=tiny_backend_config.backend, model=tiny_backend_config.model, k=3, probe_k=0, max_new_tokens=6
    )
    out = run_feed([], questions, settings, bootstrap_servers=kafka_bootstrap, prefect=False)
    assert out["probed"] == [] and [row["sampled"] for row in out["topped_up"]] == [3, 3]
    assert out["solutions"] == 6
