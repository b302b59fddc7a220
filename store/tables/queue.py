"""The question queue: the latest priority of each question that has not been sampled since.

Read-only over the projections (``question_priorities`` joined with ``questions``), so it works while
the sink writes. A question leaves the queue once a solution of it was stored after its latest
``QuestionPrioritized``; a later prioritization round puts it back with its new priority.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from prmloop.store.tables.duck import StoreLocation, query, store_exists

__all__ = ["QueuedQuestion", "queued_questions"]

_QUEUE_SQL = """
SELECT q.question_id, q.dataset, q.problem, q.gold_answer, q.metadata, p.priority, p.round
FROM question_priorities p
JOIN questions q USING (question_id)
WHERE NOT EXISTS (
    SELECT 1 FROM solutions s WHERE s.question_id = p.question_id AND s.sampled_at >= p.prioritized_at
)
ORDER BY p.priority DESC, p.question_id
LIMIT ?
"""


@dataclass(frozen=True)
class QueuedQuestion:
    question_id: str
    dataset: str
    problem: str
    gold_answer: str | None
    metadata: dict[str, Any]
    priority: float
    round: int


def queued_questions(db: StoreLocation, limit: int, *, timeout_s: float = 30.0) -> list[QueuedQuestion]:
    """The ``limit`` highest-priority questions not sampled since they were prioritized, highest first.

    Raises:
        FileNotFoundError: the store does not exist yet (nothing was prioritized).
    """
    if not store_exists(db):
        raise FileNotFoundError(f"store {db} does not exist: run `prmloop prioritize` (and the sink) first")
    rows = query(db, _QUEUE_SQL, [int(limit)], timeout_s=timeout_s).rows
    queued = []
    for qid, dataset, problem, gold, metadata, prio, rnd in rows:
        meta = json.loads(metadata) if isinstance(metadata, str) else (metadata or {})
        queued.append(QueuedQuestion(qid, dataset, problem, gold, meta if isinstance(meta, dict) else {}, prio, rnd))
    return queued
