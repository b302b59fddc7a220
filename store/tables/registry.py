"""The model registry: every trained model is a ``ModelRegistered`` event; the store's
``model_versions`` view lists them. A candidate is promoted (``parameters.promoted``) only if its
metric is not worse than the current promoted model's of the same kind. The model in force is the
newest promoted one whose signature verifies (:mod:`prmloop.store.auth.signing`): anyone who can publish to
the broker can register a model, only prmloop's flows can put one in force."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

from prmloop.store.auth.signing import sign, signature_status
from prmloop.store.events import Envelope, ModelRef, ModelRegistered, make_event
from prmloop.store.tables.duck import StoreLocation, query, store_exists

__all__ = [
    "PROMOTED_SQL",
    "PROMOTION_METRIC",
    "artifact_digest",
    "current_model",
    "model_registered",
    "models_in_force",
    "should_promote",
]

PRODUCER = "prmloop-registry/0.1.0"

#: The metric each PRM kind is promoted by: the LoRA PRM's ProcessBench GSM8K F1, the ensemble's
#: held-out F1 (higher is better for both).
PROMOTION_METRIC: dict[str, str] = {"prm": "processbench_gsm8k_f1", "prm_ensemble": "heldout_f1"}


def artifact_digest(path: Path) -> str:
    """SHA-256 over the artifact folder's files (relative names and contents, in name order)."""
    digest = hashlib.sha256()
    root = Path(path)
    for file in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(str(file.relative_to(root)).encode() + b"\0")
        digest.update(file.read_bytes())
    return digest.hexdigest()


#: Every promoted model with its payload, newest first (what :func:`models_in_force` reads).
PROMOTED_SQL = (
    "SELECT m.kind, m.event_id, e.payload FROM model_versions m JOIN events e USING (event_id) "
    "WHERE m.promoted ORDER BY m.registered_at DESC, m.event_id DESC"
)


def models_in_force(
    rows: list[tuple[Any, ...]], key: bytes | None = None
) -> tuple[dict[str, tuple[Any, dict[str, Any]]], list[dict[str, Any]]]:
    """From :data:`PROMOTED_SQL`'s rows: per kind, the ``(event_id, payload)`` of the model in force
    (the newest promoted one that verifies), and every promoted one that does not (``model_id``,
    ``kind``, ``why``: unsigned or bad signature), newest first."""
    in_force: dict[str, tuple[Any, dict[str, Any]]] = {}
    refused: list[dict[str, Any]] = []
    for kind, event_id, payload in rows:
        body = dict(json.loads(payload) if isinstance(payload, str) else payload)
        status = signature_status("ModelRegistered", body, key)
        if status != "verified":
            refused.append({"model_id": body.get("model_id"), "kind": kind, "why": status})
        elif kind not in in_force:
            in_force[kind] = (event_id, body)
    return in_force, refused


def current_model(db: StoreLocation, kind: str = "prm") -> dict[str, Any] | None:
    """The model of ``kind`` in force: the newest promoted one whose signature verifies (``None``: none
    yet, or no store)."""
    if not store_exists(db):
        return None
    in_force, _ = models_in_force([r for r in query(db, PROMOTED_SQL).rows if r[0] == kind])
    return in_force[kind][1] if kind in in_force else None


def should_promote(candidate: dict[str, float], current: dict[str, Any] | None, metric: str) -> tuple[bool, str]:
    """``(promote, why)``: promote when there is no current model or the metric is not worse.

    ``why`` starts with ``promoted:`` or ``not promoted:``, so it reads right wherever it is printed alone."""
    value = candidate.get(metric)
    if value is None:
        return False, f"not promoted: the candidate has no {metric}"
    if current is None:
        return True, "promoted: the first of its kind (no model was in force)"
    previous = (current.get("metrics") or {}).get(metric)
    model = current.get("model_id")
    if previous is None:
        return True, f"promoted: the model in force ({model}) has no {metric}"
    if value >= previous:
        return True, f"promoted: {metric} {value:.4g} >= {previous:.4g} of the model in force ({model})"
    return False, f"not promoted: {metric} {value:.4g} < {previous:.4g} of the model in force ({model})"


def model_registered(
    *,
    artifact: Path,
    base_model: ModelRef,
    snapshot_id: str,
    train_examples: int,
    config: dict[str, Any],
    metrics: dict[str, float],
    promoted: bool,
    decision: str,
    parent: str | None = None,
    kind: Literal["prm", "prm_ensemble", "generator", "judge"] = "prm",
) -> Envelope:
    """The ``ModelRegistered`` event of a trained artifact; its id is the artifact's digest."""
    digest = artifact_digest(artifact)
    payload = ModelRegistered(
        model_id=f"{kind}-{digest[:12]}",
        kind=kind,
        base_model=base_model,
        artifact_uri=str(Path(artifact).resolve()),
        dataset_snapshot=snapshot_id,
        train_examples=train_examples,
        parameters={"config": config, "digest": digest, "parent": parent, "promoted": promoted, "decision": decision},
        metrics=metrics,
    )
    return make_event(sign(payload), producer=PRODUCER)
