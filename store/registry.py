"""The model registry: every trained model is a ``ModelRegistered`` event; the store's
``model_versions`` view lists them. A candidate is promoted (``parameters.promoted``) only if its
metric is not worse than the current promoted model's of the same kind."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

from prmloop.store.duck import StoreLocation, query, store_exists
from prmloop.store.events import Envelope, ModelRef, ModelRegistered, make_event

__all__ = ["PROMOTION_METRIC", "artifact_digest", "current_model", "model_registered", "should_promote"]

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


def current_model(db: StoreLocation, kind: str = "prm") -> dict[str, Any] | None:
    """The model of ``kind`` in force: the newest promoted one, as the ``model_versions`` view marks it
    (``None``: none yet, or no store)."""
    if not store_exists(db):
        return None
    rows = query(
        db,
        "SELECT e.payload FROM model_versions m JOIN events e USING (event_id) WHERE m.kind = ? AND m.in_force",
        [kind],
    ).rows
    if not rows:
        return None
    payload = rows[0][0]
    return dict(json.loads(payload) if isinstance(payload, str) else payload)


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
    return make_event(payload, producer=PRODUCER)
