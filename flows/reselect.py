"""Take up what an older PRM skipped: the selector's decisions made again with the promoted ensemble.

The selector (:mod:`prmloop.consumers.selector`) decides once per scored solution, with the PRM it has
at the time. After a retrain promotes a better ensemble, the solutions an older one skipped deserve a
second look: :func:`revisit_skipped` reads their newest decisions from the store (each carries its
scored solution), decides again with the promoted ensemble and publishes the new decisions, which the
annotator and the judge then act on. A solution the promoted PRM already decided on is left alone.
"""

from __future__ import annotations

from typing import Any

from prmloop.consumers.selector import PromotedEnsemble, SelectorSettings, decide_all
from prmloop.store.events import SolutionSelected
from prmloop.store.kafka.producer import EventProducer
from prmloop.store.settings import StateSettings
from prmloop.store.tables.duck import query, store_exists

__all__ = ["revisit_skipped"]

_SKIPPED = (
    "SELECT e.payload FROM events e JOIN selections s ON s.event_id = e.event_id "
    "WHERE s.is_latest AND s.decision = 'skip' AND coalesce(s.prm, '') <> ? ORDER BY s.score DESC NULLS FIRST"
)


def revisit_skipped(
    settings: SelectorSettings,
    *,
    bootstrap_servers: str,
    limit: int | None = None,
    ensemble: PromotedEnsemble | None = None,
) -> dict[str, Any]:
    """Decide again on the solutions skipped by a PRM other than the promoted one; returns the counts."""
    db = settings.db or str(StateSettings().store_location)
    current = (ensemble or PromotedEnsemble(settings, cache_dir=StateSettings().features_dir)).get()
    if current is None:
        return {"revisited": 0, "label": 0, "skip": 0, "reason": "no promoted ensemble PRM to decide with"}
    if not store_exists(db):
        return {"revisited": 0, "label": 0, "skip": 0, "reason": f"no store at {db}"}
    rows = query(db, _SKIPPED + (f" LIMIT {int(limit)}" if limit else ""), [current[0].name]).rows
    skipped = [SolutionSelected.model_validate_json(r[0] if isinstance(r[0], str) else str(r[0])) for r in rows]
    events = decide_all([s.scored for s in skipped], current, settings)
    if events:
        with EventProducer(bootstrap_servers) as producer:
            producer.publish(events)
    decisions = [e.payload.decision for e in events if isinstance(e.payload, SolutionSelected)]
    return {
        "revisited": len(events),
        "label": decisions.count("label"),
        "skip": decisions.count("skip"),
        "prm": current[0].name,
    }
