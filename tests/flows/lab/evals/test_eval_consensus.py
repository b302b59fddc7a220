"""``prmloop eval consensus`` on a hand-made store: retention per CoT-entropy threshold."""

from __future__ import annotations

from pathlib import Path

import pytest

from prmloop.consumers.sink import events_to_arrow
from prmloop.flows.lab.evals.consensus import consensus_retention
from prmloop.store.events import Envelope, ModelRef, StepJudgment, StepsJudged, StepsLabeled, make_event
from prmloop.store.kafka.runtime import ConsumedEvent
from prmloop.store.tables.duck import DuckEventStore

REF = ModelRef(backend="test", name="test")


def _labeled(sid: str, n: int, first: int | None) -> Envelope:
    labels = tuple(first is None or t < first for t in range(n))
    return make_event(
        StepsLabeled(solution_id=sid, question_id="q", method="adaptive_binary", labels=labels, first_error_step=first),
        producer="test",
    )


def _judged(sid: str, n: int, first: int | None, entropy: list[float]) -> Envelope:
    verdicts = tuple(None if first is not None and t > first else (first is None or t < first) for t in range(n))
    judgments = tuple(
        StepJudgment(step_index=t, has_error=t == first, cot_entropy=entropy[t])
        for t in range(n)
        if first is None or t <= first
    )
    return make_event(
        StepsJudged(
            solution_id=sid, question_id="q", judge=REF, verdicts=verdicts, first_error_step=first, judgments=judgments
        ),
        producer="test",
    )


@pytest.fixture
def db(tmp_path: Path) -> Path:
    events = [
        _labeled("s1", 3, 1),
        _judged("s1", 3, 1, [0.1, 0.3, 0.0]),  # agree; entropy 0.3 at the first error
        _labeled("s2", 3, 2),
        _judged("s2", 3, 0, [0.2, 0.0, 0.0]),  # disagree
        _labeled("s3", 3, None),
        _judged("s3", 3, None, [0.1, 0.5, 0.2]),  # both "no error"; largest entropy 0.5
        _labeled("s4", 3, 0),  # never judged: not counted
    ]
    store = DuckEventStore(tmp_path / "prmloop.duckdb")
    store.write_batch(events_to_arrow([ConsumedEvent(e, "t", 0, i, 0) for i, e in enumerate(events)]), [("t", 0, 7)])
    return store.path


def test_retention_falls_as_the_threshold_tightens(db: Path) -> None:
    result = consensus_retention(db, [None, 0.4, 0.2])
    assert (result["labelled"], result["judged"], result["both"], result["incorrect_with_both"]) == (4, 3, 3, 2)
    retention = [row["accepted"] for row in result["per_threshold"]]
    assert retention == [2, 1, 0]  # s1 and s3; then s3 abstains (0.5 > 0.4); then s1 too (0.3 > 0.2)
    assert result["per_threshold"][0]["rejections"] == {"first errors disagree": 1}
    assert result["per_threshold"][2]["rejections"] == {"first errors disagree": 1, "judge uncertain": 2}


def test_step_judgments_are_queryable_with_sql(db: Path) -> None:
    from prmloop.store.tables.duck import query

    rows = query(db, "SELECT solution_id, step_index, has_error, cot_entropy FROM step_judgments ORDER BY 1, 2").rows
    assert rows[:2] == [("s1", 0, False, 0.1), ("s1", 1, True, 0.3)]
    assert len(rows) == 2 + 1 + 3  # s1 up to its first error, s2 its first step, s3 every step
