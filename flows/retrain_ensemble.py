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

These are *validation* sets: promotion is decided on them, so their F1 is no figure to report. Every
retrain is also scored on the test set (:mod:`prmloop.flows.pools.testset`; ``test_f1`` with its
bootstrap 95 % interval ``test_f1_lo``/``test_f1_hi`` and per level ``test_f1_L1`` ...), which nothing
trains or promotes on: that is the figure the curve, ``prmloop status`` and the benches show.
Promotion (``arith`` sets): the candidate and the model in force are scored on the same validation
solutions and the candidate is put in force unless the whole 95 % paired-bootstrap interval of the
difference lies below zero (:func:`prmloop.models.prm.scoreboard.paired_f1_diff`): the newest model
not worse beyond noise, so the model follows the data, not the luckiest draw.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from prmloop.flows.pools.build import build_pool
from prmloop.models.prm.data import PRMExample
from prmloop.models.prm.ensemble import EnsembleConfig
from prmloop.models.prm.ensemble_prm import EnsemblePRM, train_ensemble_prm
from prmloop.models.prm.features import FeatureSpec
from prmloop.models.prm.pool_items import PoolItem, held_out_f1, items_f1_report, predict_first_errors, split_pool
from prmloop.models.prm.scoreboard import paired_f1_diff
from prmloop.store.events import Envelope, ModelRef
from prmloop.store.settings import StateSettings
from prmloop.store.tables.registry import PROMOTION_METRIC, current_model, model_registered, should_promote

__all__ = [
    "ENSEMBLE_METRIC",
    "EVAL_LEVELS",
    "EVAL_SEED",
    "EVAL_SETS",
    "eval_items",
    "score_on_test",
    "train_register_ensemble",
]

log = logging.getLogger(__name__)

#: The curriculum seed of the ``arith`` held-out set: the loop's own questions use seed 0 by default.
EVAL_SEED = 1000
#: The curriculum levels of the ``arith`` validation set (the loop samples every level).
EVAL_LEVELS = (1, 2, 3, 4, 5)
#: The held-out sets :func:`eval_items` knows.
EVAL_SETS = ("arith", "arith-reference", "processbench")
#: The promotion metric of ensemble PRMs.
ENSEMBLE_METRIC = PROMOTION_METRIC["prm_ensemble"]


def eval_items(eval_set: str, *, limit: int, threads: int | None = None, say: Any = log.info) -> list[PoolItem]:
    """The validation solutions of ``eval_set`` (``arith``: ``limit`` questions per level 1-5;
    ``arith-reference``: per level 1-3)."""
    state = StateSettings()
    if eval_set == "arith":
        shipped = _shipped_validation(limit)
        if shipped is not None:
            return shipped
        items = build_pool(
            "arith",
            root=state.home / "bench" / "active",
            arith_questions=limit,
            arith_seed=EVAL_SEED,
            arith_levels=EVAL_LEVELS,
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


def _shipped_validation(per_level: int) -> list[PoolItem] | None:
    """The shipped validation set (seed :data:`EVAL_SEED`), its first ``per_level`` questions of each
    level, where it was made by the installed generator and holds that many; else ``None``."""
    from prmloop.flows.pools.testset import load_testset, read_manifest
    from prmloop.models.prm.features import backbone_digest

    manifest = read_manifest(seed=EVAL_SEED)
    if manifest is None or manifest["generator"]["digest"] != backbone_digest("smollm2"):
        return None
    if int(manifest["questions_per_level"]) < per_level or tuple(manifest["sampling"]["levels"]) != EVAL_LEVELS:
        return None
    _, items = load_testset(seed=EVAL_SEED)
    return [i for i in items if int(i.question.rsplit("/", 1)[1]) < per_level]


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
    """Train, evaluate on the validation set (promotion) and the test set (the figures), save and build
    the ``ModelRegistered`` event."""
    state = StateSettings()
    prm, metrics = train_ensemble_prm(examples, spec=spec, config=config, cache_dir=state.features_dir, threads=threads)
    held = eval_items(eval_set, limit=eval_limit, threads=threads, say=logger.info)
    if eval_set == "arith" and prm.cache is not None:
        from prmloop.flows.pools.testset import seed_features

        seed_features(prm.cache, seed=EVAL_SEED)
    features = dict(
        zip([i.key for i in held], prm.features([i.problem for i in held], [list(i.steps) for i in held]), strict=True)
    )
    metrics[ENSEMBLE_METRIC] = round(held_out_f1(prm, held, features), 4)
    metrics["heldout_solutions"] = float(len(held))
    test = score_on_test(prm, threads=threads, say=logger.info)
    metrics.update(test_metrics(test["test"]))
    artifact = prm.save(out_dir / "ensembles" / f"{snapshot_id}-seed{config.seed}")
    current = current_model(db, kind="prm_ensemble")
    promote, decision, paired = _promotion(
        prm, metrics=metrics, current=current, held=held, features=features, eval_set=eval_set, threads=threads
    )
    metrics.update(paired)
    logger.info(
        "ensemble PRM on %d solutions in %.1fs: test F1 %.3f [%.3f, %.3f] on %d test solutions; validation F1 %.3f "
        "on %d %s solutions; %s",
        len(examples),
        metrics["train_seconds"],
        metrics.get("test_f1", float("nan")),
        metrics.get("test_f1_lo", float("nan")),
        metrics.get("test_f1_hi", float("nan")),
        int(metrics.get("test_solutions", 0)),
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
            "test_set": test["test_set"],
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


def score_on_test(
    prm: EnsemblePRM,
    *,
    threads: int | None = None,
    say: Any = log.info,
    directory: Path | None = None,
    seed: int | None = None,
) -> dict[str, Any]:
    """The PRM on the test set (:func:`prmloop.flows.pools.testset.test_items`; or the one built into
    ``directory``, of ``seed`` or the folder's only seed): ``{"test_set": name and digest, "test": {"all":
    {f1, lo, hi, n}, "L1": ...}}`` (bootstrap 95 % intervals over questions)."""
    from prmloop.flows.pools.testset import SHIPPED_DIR, TEST_SEED, load_testset, seed_features, seed_in, test_items

    if directory is None:
        manifest, items = test_items(threads=threads, say=say)
        directory, seed = SHIPPED_DIR, TEST_SEED
    else:
        seed = seed_in(directory) if seed is None else seed
        manifest, items = load_testset(directory, seed)
    if prm.cache is not None:
        seed_features(prm.cache, directory, seed)
    started = time.monotonic()
    cached = len(prm.cache) if prm.cache is not None else 0
    vectors = prm.features([i.problem for i in items], [list(i.steps) for i in items])
    if prm.cache is not None and len(prm.cache) > cached:
        seconds = time.monotonic() - started
        say(f"test set: features of {len(prm.cache) - cached} solutions computed in {seconds:.0f}s (now cached)")
    features = dict(zip([i.key for i in items], vectors, strict=True))
    predicted = predict_first_errors(prm, items, features)
    report = items_f1_report(predicted, items)
    return {"test_set": f"{manifest['file']}@{manifest['sha256'][:12]}", "test": report}


def test_metrics(report: dict[str, dict[str, Any]]) -> dict[str, float]:
    """A test report as flat metrics (``test_f1``, ``test_f1_lo``, ``test_f1_hi``, ``test_solutions``,
    and per level ``test_f1_L1`` ...): what a ``ModelRegistered`` carries."""
    out: dict[str, float] = {}
    for subset, figures in report.items():
        prefix = "test_f1" if subset == "all" else f"test_f1_{subset}"
        if figures["f1"] is not None:
            out[prefix] = float(figures["f1"])
            out[f"{prefix}_lo"] = float(figures["lo"])
            out[f"{prefix}_hi"] = float(figures["hi"])
        if subset == "all":
            out["test_solutions"] = float(figures["n"])
    return out


def _promotion(
    prm: EnsemblePRM,
    *,
    metrics: dict[str, float],
    current: dict[str, Any] | None,
    held: list[PoolItem],
    features: dict[str, Any],
    eval_set: str,
    threads: int | None,
) -> tuple[bool, str, dict[str, float]]:
    """``(promote, why, figures)``: on the arith sets, the paired bootstrap against the model in force on
    the same validation solutions (promoted unless worse beyond noise); elsewhere, the metric alone."""
    if current is None or eval_set == "processbench":
        promote, decision = should_promote(metrics, current, ENSEMBLE_METRIC)
        return promote, decision, {}
    model = current.get("model_id")
    try:
        in_force = EnsemblePRM.load(
            Path(current["artifact_uri"]), cache_dir=StateSettings().features_dir, threads=threads
        )
    except (OSError, ValueError, KeyError) as exc:
        promote, decision = should_promote(metrics, current, ENSEMBLE_METRIC)
        return promote, f"{decision} (the model in force could not be loaded for a paired comparison: {exc})", {}
    truth = [i.first_error for i in held]
    questions = [i.question for i in held]
    try:
        paired = paired_f1_diff(
            predict_first_errors(prm, held, features), predict_first_errors(in_force, held, features), truth, questions
        )
    except ValueError as exc:
        promote, decision = should_promote(metrics, current, ENSEMBLE_METRIC)
        return promote, f"{decision} ({exc})", {}
    figures = {
        "val_diff": round(paired.diff, 4),
        "val_diff_lo": round(paired.lo, 4),
        "val_diff_hi": round(paired.hi, 4),
    }
    span = f"validation F1 {paired.candidate:.3f} vs {paired.current:.3f} of the model in force ({model}), " + (
        f"difference {paired.diff:+.3f} [{paired.lo:+.3f}, {paired.hi:+.3f}]"
    )
    if paired.worse:
        return False, f"not promoted: worse beyond noise: {span}", figures
    return True, f"promoted: not worse beyond noise (the newest such model is in force): {span}", figures
