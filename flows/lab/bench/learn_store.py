"""What a loop's store says for ``prmloop bench learn``: every curriculum solution the loop sampled, with
its accepted label (if any), the checker's exact one, and the tokens spent on it and by then
(:func:`read_loop_store`); and where the accepted labels fell (:func:`label_spread`)."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

__all__ = ["LearnRow", "accepted_labels", "first_error", "label_spread", "read_loop_store"]


@dataclass(frozen=True)
class LearnRow:
    """One solution the loop sampled, with what the loop and the checker say of it."""

    solution_id: str
    question_id: str
    problem: str
    steps: tuple[str, ...]
    correct: bool | None
    sampled_at: float
    #: cumulative generated tokens of the loop when this solution's label was accepted (or sampled)
    tokens_by_then: int
    #: the accepted label's first error (-1: none), None: not accepted
    accepted_first_error: int | None
    accepted_at: float | None
    rejected: bool
    #: the checker's first error (-1: none), None: it does not decide
    exact_first_error: int | None
    #: the tokens generated for this solution itself (its completion)
    own_tokens: int = 0
    #: the tokens generated labelling it (MC rollouts, the judge), where the loop labelled it
    label_tokens: int = 0
    #: whether the loop's annotator labelled it (a StepsLabeled event: MC rollouts, or none for a right answer)
    mc_labelled: bool = False


_EVENTS = """
SELECT event_type, epoch(occurred_at) AS at, payload
FROM events
WHERE event_type IN ('SolutionSampled', 'LabelsAccepted', 'LabelsRejected', 'StepsLabeled', 'StepsJudged')
ORDER BY occurred_at, event_id
"""


def read_loop_store(db: Any) -> list[LearnRow]:
    """Every sampled curriculum solution of the store with its accepted label, if any, and its exact one."""
    from prmloop.flows.pools.build import decided
    from prmloop.store.tables.duck import query

    solutions: dict[str, dict[str, Any]] = {}
    accepted: dict[str, tuple[int, float, int]] = {}
    rejected: set[str] = set()
    label_tokens: dict[str, int] = {}
    mc_labelled: set[str] = set()
    tokens = 0
    for event_type, at, payload in query(db, _EVENTS).rows:
        p = json.loads(payload) if isinstance(payload, str) else payload
        if event_type == "SolutionSampled":
            tokens += int(p.get("completion_tokens") or 0)
            solutions.setdefault(p["solution_id"], {**p, "at": float(at), "tokens": tokens})
        elif event_type in ("StepsLabeled", "StepsJudged"):
            spent = int(((p.get("cost") or {}).get("generated_tokens")) or 0)
            tokens += spent
            label_tokens[p["solution_id"]] = label_tokens.get(p["solution_id"], 0) + spent
            if event_type == "StepsLabeled":
                mc_labelled.add(p["solution_id"])
        elif event_type == "LabelsAccepted" and p["solution_id"] not in accepted:
            first = p.get("first_error_step")
            accepted[p["solution_id"]] = (-1 if first is None else int(first), float(at), tokens)
        elif event_type == "LabelsRejected":
            rejected.add(p["solution_id"])
    rows = []
    for sid, p in solutions.items():
        if not str(p["question_id"]).startswith("arith/") or not p.get("problem") or not p.get("steps"):
            continue
        truth = decided({"question_id": p["question_id"], "steps": list(p["steps"]), "correct": p.get("correct")})
        label = accepted.get(sid)
        rows.append(
            LearnRow(
                solution_id=sid,
                question_id=p["question_id"],
                problem=p["problem"],
                steps=tuple(p["steps"]),
                correct=p.get("correct"),
                sampled_at=p["at"],
                tokens_by_then=label[2] if label else p["tokens"],
                accepted_first_error=label[0] if label else None,
                accepted_at=label[1] if label else None,
                rejected=sid in rejected and label is None,
                exact_first_error=truth,
                own_tokens=int(p.get("completion_tokens") or 0),
                label_tokens=label_tokens.get(sid, 0),
                mc_labelled=sid in mc_labelled,
            )
        )
    return rows


def first_error(first: int | None) -> int:
    """A first error as a number: -1 for none (``None`` too, where the caller kept only labelled rows)."""
    return -1 if first is None else int(first)


def _level(question_id: str) -> str:
    parts = question_id.split("/")
    return parts[1] if len(parts) == 4 else "other"


def _position(first: int) -> str:
    return "none" if first < 0 else (str(first + 1) if first < 3 else "4+")


def label_spread(rows: list[LearnRow]) -> dict[str, Any]:
    """Where the loop's accepted labels fell, and consensus against the checker."""
    kept = sorted((r for r in rows if r.accepted_first_error is not None), key=lambda r: r.accepted_at or 0.0)
    checked = [r for r in kept if r.exact_first_error is not None]
    agree = sum(r.accepted_first_error == r.exact_first_error for r in checked)
    rejected = [r for r in rows if r.rejected]
    rejected_checked = [r for r in rejected if r.exact_first_error is not None]
    return {
        "sampled": len(rows),
        "sampled_by_level": dict(sorted(Counter(_level(r.question_id) for r in rows).items())),
        "accepted": len(kept),
        "accepted_by_level": dict(sorted(Counter(_level(r.question_id) for r in kept).items())),
        "accepted_questions": len({r.question_id for r in kept}),
        "sampled_questions": len({r.question_id for r in rows}),
        "accepted_first_error_position": dict(
            sorted(Counter(_position(first_error(r.accepted_first_error)) for r in kept).items())
        ),
        "exact_first_error_position_all_sampled": dict(
            sorted(Counter(_position(r.exact_first_error) for r in rows if r.exact_first_error is not None).items())
        ),
        "accepted_checked_by_exact": len(checked),
        "accepted_agree_with_exact": round(agree / len(checked), 4) if checked else None,
        "accepted_with_error_share": round(sum(first_error(r.accepted_first_error) >= 0 for r in kept) / len(kept), 4)
        if kept
        else None,
        "rejected": len(rejected),
        "rejected_exact_with_error_share": round(
            sum(first_error(r.exact_first_error) >= 0 for r in rejected_checked) / len(rejected_checked), 4
        )
        if rejected_checked
        else None,
        "unlabelled": len(rows) - len(kept) - len(rejected),
    }


def accepted_labels(db: Any) -> int:
    """How many labels the loop behind ``db`` accepted (what ``bench learn`` can train its loop arm on)."""
    return sum(r.accepted_first_error is not None for r in read_loop_store(db))
