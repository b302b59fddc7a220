"""How the loop is doing, from the store alone: what ``prmloop status`` shows and the monitor flow
publishes as Prefect artifacts. Read-only over the projections, so it works while the sink writes."""

from __future__ import annotations

import json
from typing import Any

import duckdb

from prmloop.store.auth.signing import signature_status
from prmloop.store.tables.duck import StoreLocation, open_reader
from prmloop.store.tables.registry import PROMOTED_SQL, models_in_force

__all__ = ["label_quality", "loop_metrics"]

_PER_HOUR = """
SELECT date_trunc('hour', occurred_at) AS hour,
       count(*) FILTER (WHERE event_type = 'SolutionSampled') AS solutions,
       count(*) FILTER (WHERE event_type = 'StepsLabeled') AS labels,
       count(*) FILTER (WHERE event_type = 'StepsJudged') AS judged,
       count(*) FILTER (WHERE event_type = 'LabelsAccepted') AS accepted,
       count(*) FILTER (WHERE event_type = 'LabelsRejected') AS rejected,
       count(*) AS events
FROM events
WHERE occurred_at >= (SELECT max(occurred_at) FROM events) - INTERVAL 24 HOUR
GROUP BY 1 ORDER BY 1
"""

_COST = """
SELECT source, coalesce(sum(generated_tokens), 0), coalesce(sum(rollouts), 0), count(*)
FROM cost_ledger GROUP BY 1
"""


#: The loop's learning curve: each registered ensemble PRM (one per retrain round) with its validation
#: F1 (``heldout_f1``, what promotion used), its test F1 with the bootstrap 95 % interval, the labels it
#: trained on, and what the loop had spent and skipped by the time it was registered.
_LEARNING = """
SELECT m.model_id,
       m.registered_at,
       m.train_examples,
       TRY_CAST(m.metrics->>'heldout_f1' AS DOUBLE) AS heldout_f1,
       TRY_CAST(m.metrics->>'test_f1' AS DOUBLE) AS test_f1,
       TRY_CAST(m.metrics->>'test_f1_lo' AS DOUBLE) AS test_f1_lo,
       TRY_CAST(m.metrics->>'test_f1_hi' AS DOUBLE) AS test_f1_hi,
       m.promoted,
       (SELECT coalesce(sum(completion_tokens), 0) FROM solutions s WHERE s.sampled_at <= m.registered_at)
         + (SELECT coalesce(sum(generated_tokens), 0) FROM cost_ledger c WHERE c.occurred_at <= m.registered_at)
         AS generated_tokens,
       (SELECT count(*) FROM consensus d WHERE d.decision = 'accepted' AND d.occurred_at <= m.registered_at)
         AS accepted_labels,
       (SELECT count(*) FROM selections x WHERE x.decision = 'skip' AND x.occurred_at <= m.registered_at)
         AS skipped
FROM model_versions m
WHERE m.kind = 'prm_ensemble'
ORDER BY m.registered_at
"""

_MODEL_FIELDS = ("model_id", "base_model", "artifact_uri", "metrics", "registered_at")

#: MC first errors against each judge's (the ``label_agreement`` view of projections.sql).
_AGREEMENT = """
SELECT judge_method, count(*), count(*) FILTER (WHERE judge_decided), count(*) FILTER (WHERE agree)
FROM label_agreement GROUP BY 1 ORDER BY 1
"""

#: Rejections by reason, step numbers folded ("judge gave no verdict on step k"), the judge's own
#: reasons in parentheses left out.
_REJECTIONS = """
SELECT regexp_replace(split_part(reason, ' (', 1), '[0-9]+', 'k', 'g') AS why, count(*)
FROM consensus WHERE decision = 'rejected' GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT 8
"""


def _rows(con: Any, sql: str) -> list[tuple[Any, ...]]:
    return list(con.execute(sql).fetchall())


def label_quality(db: StoreLocation, *, timeout_s: float = 30.0) -> dict[str, Any]:
    """How many labels consensus keeps and how often MC annotation and a judge agree: what the demo's
    summary and ``prmloop status`` show.

    ``acceptance_rate``: accepted / decided solutions. ``agreement``: per judge method, ``solutions``
    with both an MC label and a verdict (the newest of each), ``decided`` (the judge gave a verdict
    on every step before its first error), ``agree`` (of those, the same first error, or none on
    both sides) and ``rate`` = agree / decided. ``mc_exact_agreement``: that rate for the exact
    checker (``prmloop judge --method exact``), ``None`` until it has decided one. ``rejections``:
    the most common reasons, step numbers written ``k``."""
    with open_reader(db, timeout_s=timeout_s) as (con, _):
        return _label_quality(con)


def _label_quality(con: Any) -> dict[str, Any]:
    decisions = dict(_rows(con, "SELECT decision, count(*) FROM consensus GROUP BY 1"))
    accepted, rejected = int(decisions.get("accepted", 0)), int(decisions.get("rejected", 0))
    agreement: dict[str, dict[str, Any]] = {}
    try:
        rows = _rows(con, _AGREEMENT)
    except duckdb.CatalogException:
        rows = []  # a store the sink has not opened since the view was added: no figures yet
    for method, both, decided, agree in rows:
        agreement[str(method)] = {
            "solutions": int(both),
            "decided": int(decided),
            "agree": int(agree),
            "rate": agree / decided if decided else None,
        }
    return {
        "accepted": accepted,
        "rejected": rejected,
        "acceptance_rate": accepted / (accepted + rejected) if accepted + rejected else None,
        "agreement": agreement,
        "mc_exact_agreement": agreement.get("exact", {}).get("rate"),
        "rejections": {str(why): int(n) for why, n in _rows(con, _REJECTIONS)},
    }


def loop_metrics(db: StoreLocation, *, timeout_s: float = 30.0) -> dict[str, Any]:
    """Events and labels per hour (the last 24 hours with events), the acceptance rate, generated
    tokens per accepted label (annotation plus judging, sampling excluded), MC-vs-judge agreement and
    the commonest rejections (:func:`label_quality`), the learning curve (each ensemble PRM's held-out
    F1 next to the labels and tokens spent by then), the PRM and the ensemble PRM in force (the newest
    promoted of each kind) and the latest calibration."""
    with open_reader(db, timeout_s=timeout_s) as (con, _):
        per_hour = [
            {"hour": str(h), "solutions": s, "labels": lab, "judged": j, "accepted": a, "rejected": r, "events": e}
            for h, s, lab, j, a, r, e in _rows(con, _PER_HOUR)
        ]
        quality = _label_quality(con)
        cost = {
            source: {"tokens": int(t), "rollouts": int(r), "events": int(n)} for source, t, r, n in _rows(con, _COST)
        }
        sampled = _rows(con, "SELECT coalesce(sum(completion_tokens), 0), count(*) FROM solutions")[0]
        # The PRMs in force (newest promoted of each kind whose signature verifies), not merely the
        # newest registered; a promoted one that does not verify is named, never used.
        in_force, refused_models = models_in_force(_rows(con, PROMOTED_SQL))
        chosen = (
            "SELECT model_id, base_model, artifact_uri, metrics, registered_at FROM model_versions WHERE event_id = ?"
        )
        prm, ensemble = (
            list(con.execute(chosen, [in_force[kind][0]]).fetchall()) if kind in in_force else []
            for kind in ("prm", "prm_ensemble")
        )
        learning = [
            {
                "round": i + 1,  # as the demo counts its rounds
                "model_id": model,
                "registered_at": str(at),
                "train_solutions": int(n or 0),
                "heldout_f1": f1,
                "test_f1": test,
                "test_f1_lo": lo,
                "test_f1_hi": hi,
                "promoted": bool(promoted),
                "generated_tokens": int(tokens),
                "accepted_labels": int(accepted),
                "skipped": int(skipped),
            }
            for i, (model, at, n, f1, test, lo, hi, promoted, tokens, accepted, skipped) in enumerate(
                _rows(con, _LEARNING)
            )
        ]
        # The latest calibration whose signature verifies; later ones that do not are named.
        fitted = _rows(
            con,
            "SELECT c.calibration_id, c.prm, c.score_rule, c.method, c.metrics, c.fitted_at, e.payload "
            "FROM calibrations c JOIN events e USING (event_id) ORDER BY c.fitted_at DESC, c.event_id DESC",
        )
        calibration: list[tuple[Any, ...]] = []
        refused_calibrations: list[dict[str, Any]] = []
        for row in fitted:
            status = signature_status("CalibrationFitted", row[-1])
            if status == "verified":
                calibration = [row[:-1]]
                break
            refused_calibrations.append({"calibration_id": row[0], "why": status})
    accepted = quality["accepted"]
    label_tokens = sum(c["tokens"] for c in cost.values())
    return {
        "per_hour": per_hour,
        **quality,
        "label_tokens": label_tokens,
        "sampling_tokens": int(sampled[0]),
        "solutions": int(sampled[1]),
        "tokens_per_accepted_label": label_tokens / accepted if accepted else None,
        "cost_by_source": cost,
        "learning": learning,
        "current_prm": _record(prm, _MODEL_FIELDS),
        "current_prm_ensemble": _record(ensemble, _MODEL_FIELDS),
        "calibration": _record(calibration, ("calibration_id", "prm", "score_rule", "method", "metrics", "fitted_at")),
        # Registered or fitted by something other than prmloop's flows (or an older prmloop): stored, never used.
        "not_in_force": {
            "models": [{**m, "why": f"{m['why']}: never in force"} for m in refused_models],
            "calibrations": [{**c, "why": f"{c['why']}: never in force"} for c in refused_calibrations],
        },
    }


def _record(rows: list[tuple[Any, ...]], names: tuple[str, ...]) -> dict[str, Any] | None:
    if not rows:
        return None
    record = dict(zip(names, rows[0], strict=True))
    for key, value in record.items():
        if isinstance(value, str) and value.startswith("{"):
            record[key] = json.loads(value)
        elif value is not None and not isinstance(value, str | int | float | dict):
            record[key] = str(value)
    return record
