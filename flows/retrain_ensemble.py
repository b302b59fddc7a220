"""The ensemble PRM's turn of the ``retrain`` flow: every round, in seconds (ActPRM's heads on cached
features, :mod:`prmloop.models.prm.ensemble_prm`).

Trained on the snapshot's labels, scored on a held-out set the loop never labels, registered as a
``ModelRegistered`` of kind ``prm_ensemble`` and promoted only if its held-out F1 is not worse than the
promoted ensemble's (the selector then decides with it). Held-out sets (``eval_set``):

- ``arith``: the embedded model's own solutions to curriculum questions of another seed than the
  loop's (:data:`EVAL_SEED`), kept where the exact checker decides; F1 by the ProcessBench protocol
  against the exact first errors;
- ``arith-reference``: the curriculum's reference solutions of questions of that seed (levels 1-3),
  each with a copy whose one equation's result was changed (:mod:`prmloop.models.arith.corrupt`): true
  first errors at no cost (the demo's, where sampling the model would spend minutes of its budget);
- ``processbench``: ProcessBench GSM8K and MATH (``eval_limit`` per subset, half erroneous), F1 per
  subset, averaged.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from prmloop.flows.pools.build import build_pool
from prmloop.models.prm.data import PRMExample
from prmloop.models.prm.ensemble import EnsembleConfig
from prmloop.models.prm.ensemble_prm import train_ensemble_prm
from prmloop.models.prm.features import FeatureSpec
from prmloop.models.prm.pool_items import PoolItem, held_out_f1, split_pool
from prmloop.store.events import Envelope, ModelRef
from prmloop.store.settings import StateSettings
from prmloop.store.tables.registry import PROMOTION_METRIC, current_model, model_registered, should_promote

__all__ = ["ENSEMBLE_METRIC", "EVAL_SEED", "EVAL_SETS", "eval_items", "train_register_ensemble"]

log = logging.getLogger(__name__)

#: The curriculum seed of the ``arith`` held-out set: the loop's own questions use seed 0 by default.
EVAL_SEED = 1000
#: The held-out sets :func:`eval_items` knows.
EVAL_SETS = ("arith", "arith-reference", "processbench")
#: The promotion metric of ensemble PRMs.
ENSEMBLE_METRIC = PROMOTION_METRIC["prm_ensemble"]


def eval_items(eval_set: str, *, limit: int, threads: int | None = None, say: Any = log.info) -> list[PoolItem]:
    """The held-out solutions of ``eval_set`` (``arith``: ``limit`` questions per level 1-2;
    ``arith-reference``: per level 1-3)."""
    state = StateSettings()
    if eval_set == "arith":
        items = build_pool(
            "arith",
            root=state.home / "bench" / "active",
            arith_questions=limit,
            arith_seed=EVAL_SEED,
            arith_levels=(1, 2),
            threads=threads,
            say=say,
        )
        return items
    if eval_set == "processbench":
        items = split_pool(build_pool("processbench", root=state.home / "bench" / "active"))[1]
        chosen: list[PoolItem] = []
        for subset in ("gsm8k", "math"):
            wrong = [i for i in items if i.subset == subset and i.first_error >= 0][: limit - limit // 2]
            right = [i for i in items if i.subset == subset and i.first_error < 0][: limit // 2]
            chosen += wrong + right
        return chosen
    if eval_set == "arith-reference":
        return _reference_items(limit)
    raise ValueError(f"unknown eval set {eval_set!r}; choose {', '.join(EVAL_SETS)}")


def _reference_items(per_level: int) -> list[PoolItem]:
    import random

    from prmloop.models.arith import arith_question_id, generate_question
    from prmloop.models.arith.corrupt import corrupted_solution

    rng = random.Random(EVAL_SEED)
    items: list[PoolItem] = []
    for level in (1, 2, 3):
        for index in range(per_level):
            question = generate_question(level, EVAL_SEED, index)
            question_id = arith_question_id(level, EVAL_SEED, index)
            corrupted = corrupted_solution(question, rng)
            versions = [(list(question.reference_steps), -1)] + ([corrupted] if corrupted else [])
            for tag, (steps, first_error) in zip(("right", "wrong"), versions, strict=False):
                items.append(
                    PoolItem(
                        key=f"{question_id}/{tag}",
                        question=question_id,
                        subset=f"L{level}",
                        problem=question.problem,
                        steps=tuple(steps),
                        first_error=first_error,
                        label_first_error=first_error,
                        cost=0.0,
                        correct=first_error < 0,
                    )
                )
    return items


def train_register_ensemble(
    examples: list[PRMExample],
    *,
    db: str,
    snapshot_id: str,
    out_dir: Path,
    config: EnsembleConfig,
    spec: FeatureSpec,
    eval_set: str,
    eval_limit: int,
    threads: int | None,
    logger: Any = log,
) -> tuple[dict[str, Any], Envelope]:
    """Train, evaluate on the held-out set, save and build the ``ModelRegistered`` event."""
    state = StateSettings()
    prm, metrics = train_ensemble_prm(examples, spec=spec, config=config, cache_dir=state.features_dir, threads=threads)
    held = eval_items(eval_set, limit=eval_limit, threads=threads, say=logger.info)
    features = dict(
        zip([i.key for i in held], prm.features([i.problem for i in held], [list(i.steps) for i in held]), strict=True)
    )
    metrics[ENSEMBLE_METRIC] = round(held_out_f1(prm, held, features), 4)
    metrics["heldout_solutions"] = float(len(held))
    artifact = prm.save(out_dir / "ensembles" / f"{snapshot_id}-seed{config.seed}")
    current = current_model(db, kind="prm_ensemble")
    promote, decision = should_promote(metrics, current, ENSEMBLE_METRIC)
    logger.info(
        "ensemble PRM on %d solutions in %.1fs: held-out F1 %.3f on %d %s solutions; %s",
        len(examples),
        metrics["train_seconds"],
        metrics[ENSEMBLE_METRIC],
        len(held),
        eval_set,
        decision,
    )
    event = model_registered(
        artifact=artifact,
        base_model=ModelRef(backend="transformers", name=spec.backbone),
        snapshot_id=snapshot_id,
        train_examples=len(examples),
        config={
            "kind": "ensemble",
            "ensemble": config.model_dump(mode="json"),
            "features": spec.model_dump(mode="json"),
            "eval_set": eval_set,
            "eval_limit": eval_limit,
        },
        metrics=metrics,
        promoted=promote,
        decision=decision,
        parent=current.get("model_id") if current else None,
        kind="prm_ensemble",
    )
    summary = {
        "trained": True,
        "kind": "prm_ensemble",
        "model_id": event.payload.model_id,
        "artifact": str(artifact),
        "promoted": promote,
        "decision": decision,
        "metrics": metrics,
        "snapshot": snapshot_id,
    }
    return summary, event
