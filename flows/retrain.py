"""The Prefect flow ``retrain``: snapshot the labels, train a PRM, evaluate it, register it.

Two kinds of PRM (``prm_kind``): ``ensemble`` (the default, every round of the loop: heads on cached
frozen-backbone features, trained in seconds, promoted by held-out F1, the PRM the selector decides
with; :mod:`prmloop.flows.retrain_ensemble`) and ``lora`` (the final PRM, steps below).

1. **snapshot**: the store's accepted labels (or MC labels, or an imported snapshot) as an immutable,
   content-hashed snapshot (:mod:`prmloop.store.tables.snapshot`); it refuses to train on fewer than
   ``min_examples`` solutions;
2. **train**: LoRA on the embedded model by default (:func:`~prmloop.models.prm.train.train_prm`),
   resumable, with the loss per step logged to the flow run;
3. **evaluate**: ProcessBench F1 (the Qwen protocol, a few solutions per subset on a laptop);
4. **register**: a ``ModelRegistered`` event with the artifact's digest, the snapshot, the parent
   model, the config and the metrics; promoted only if its F1 is not worse than the current promoted
   PRM's (:func:`~prmloop.store.tables.registry.should_promote`). A table artifact ``retrain-models`` records it.
"""

from __future__ import annotations

import inspect
import logging
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from prmloop.models.prm.data import PRMExample
from prmloop.models.prm.ensemble import EnsembleConfig
from prmloop.models.prm.evaluate import score_processbench
from prmloop.models.prm.model import PRM, PRMConfig
from prmloop.models.prm.train import train_prm
from prmloop.store.events import Envelope, ModelRef
from prmloop.store.tables.registry import PROMOTION_METRIC, current_model, model_registered, should_promote
from prmloop.store.tables.snapshot import load_snapshot, select_labels, write_snapshot

__all__ = ["examples_of", "retrain", "run_retrain"]

log = logging.getLogger(__name__)


def examples_of(snapshot: Path, split: str = "train") -> list[PRMExample]:
    """A snapshot split as training examples."""
    _, rows = load_snapshot(snapshot, split)
    return [PRMExample(r.prompt, r.completions, r.labels, r.soft_labels) for r in rows]


@task(name="snapshot", cache_policy=NO_CACHE)
def snapshot_task(db: str, kind: str, root: str, ratios: tuple[float, float, float]) -> dict[str, Any]:
    rows = select_labels(db, kind="accepted" if kind == "accepted" else "mc")
    return write_snapshot(rows, Path(root), selection={"db": db, "kind": kind}, ratios=ratios)


@task(name="evaluate", cache_policy=NO_CACHE)
def evaluate_task(prm: PRM, limit: int) -> dict[str, Any]:
    return score_processbench(prm.score_solutions, limit=limit)


def _pipeline(
    *,
    db: str,
    kind: str,
    snapshot: str | None,
    out_dir: str,
    config: PRMConfig,
    eval_limit: int,
    min_examples: int,
    publish: bool,
    use_prefect: bool,
    ratios: tuple[float, float, float] = (0.8, 0.1, 0.1),
    bootstrap_servers: str | None = None,
    prm_kind: str = "ensemble",
    ensemble: EnsembleConfig | None = None,
    eval_set: str = "processbench",
    unless_snapshot: str | None = None,
) -> dict[str, Any]:
    logger = get_run_logger() if use_prefect else log
    if prm_kind not in ("ensemble", "lora"):
        raise ValueError(f"prm_kind must be ensemble or lora, got {prm_kind!r}")
    root = Path(out_dir)
    if snapshot is None:
        args = (db, kind, str(root / "snapshots"), ratios)
        manifest = snapshot_task(*args) if use_prefect else snapshot_task.fn(*args)
        snapshot_dir = root / "snapshots" / manifest["snapshot_id"]
    else:
        snapshot_dir = Path(snapshot)
        manifest = load_snapshot(snapshot_dir)[0]
    examples = examples_of(snapshot_dir)
    logger.info("snapshot %s: %d training solutions", manifest["snapshot_id"], len(examples))
    if manifest["snapshot_id"] == unless_snapshot:
        # The labels that triggered this retrain are not in the store yet, or add no training solution:
        # the same snapshot would train the same PRM again (and count as a point on the curve).
        return {
            "trained": False,
            "reason": f"no new training solution (snapshot {unless_snapshot} unchanged)",
            "snapshot": manifest,
        }
    if len(examples) < min_examples:
        return {
            "trained": False,
            "reason": f"{len(examples)} training solutions < min_examples {min_examples}",
            "snapshot": manifest,
        }
    if prm_kind == "ensemble":
        from prmloop.flows.retrain_ensemble import train_register_ensemble
        from prmloop.models.prm.features import FeatureSpec

        summary, event = train_register_ensemble(
            examples,
            db=db,
            snapshot_id=manifest["snapshot_id"],
            out_dir=root,
            config=ensemble or EnsembleConfig(threads=1),
            spec=FeatureSpec(),
            eval_set=eval_set,
            eval_limit=eval_limit,
            threads=config.threads,
            logger=logger,
        )
        _publish(event, publish, bootstrap_servers)
        if use_prefect:
            _artifact(summary, summary["metrics"], manifest["snapshot_id"])
        return summary
    run_dir = root / "runs" / f"{manifest['snapshot_id']}-{config.formulation}-{config.labels}"
    result = train_prm(
        examples,
        config,
        run_dir,
        on_step=lambda m: logger.info(
            "step %d loss %.4f (%.2f steps/s, %.0f tokens/s)",
            int(m["step"]),
            m["loss"],
            m["steps_per_s"],
            m["tokens_per_s"],
        ),
    )
    prm = PRM.load(result.artifact_dir)
    evaluation = evaluate_task(prm, eval_limit) if use_prefect else evaluate_task.fn(prm, eval_limit)
    metrics = {
        **result.metrics,
        "processbench_gsm8k_f1": evaluation["gsm8k"]["f1"] or 0.0,
        "processbench_math_f1": evaluation["math"]["f1"] or 0.0,
        "threshold": evaluation["threshold"],
    }
    current = current_model(db)
    promote, decision = should_promote(metrics, current, PROMOTION_METRIC["prm"])
    logger.info(
        "trained %s: ProcessBench F1 gsm8k %.3f, math %.3f; %s",
        result.artifact_dir,
        metrics["processbench_gsm8k_f1"],
        metrics["processbench_math_f1"],
        decision,
    )
    event = model_registered(
        artifact=result.artifact_dir,
        base_model=ModelRef(backend="transformers", name=config.base_model),
        snapshot_id=manifest["snapshot_id"],
        train_examples=result.examples,
        config=config.model_dump(mode="json"),
        metrics=metrics,
        promoted=promote,
        decision=decision,
        parent=current.get("model_id") if current else None,
    )
    _publish(event, publish, bootstrap_servers)
    summary = {
        "trained": True,
        "model_id": event.payload.model_id,
        "artifact": str(result.artifact_dir),
        "promoted": promote,
        "decision": decision,
        "metrics": metrics,
        "snapshot": manifest["snapshot_id"],
        "evaluation": evaluation,
    }
    if use_prefect:
        _artifact(summary, metrics, manifest["snapshot_id"])
    return summary


def _publish(event: Envelope, publish: bool, bootstrap_servers: str | None) -> None:
    if not publish:
        return
    from prmloop.store.kafka.broker_file import require_bootstrap_servers
    from prmloop.store.kafka.producer import EventProducer

    with EventProducer(bootstrap_servers or require_bootstrap_servers()) as producer:
        producer.publish([event])


def _artifact(summary: dict[str, Any], metrics: dict[str, float], snapshot_id: str) -> None:
    from prefect.artifacts import create_table_artifact

    create_table_artifact(
        key="retrain-models",
        table=[{"model": summary["model_id"], "promoted": summary["promoted"], **metrics}],
        description=f"retrain on snapshot {snapshot_id}: {summary['decision']}",
    )


@flow(name="retrain")
def retrain(  # noqa: PLR0917 - a Prefect flow's parameters are its UI form
    db: str | None = None,
    kind: str = "accepted",
    snapshot: str | None = None,
    out_dir: str = "out/prm",
    config: PRMConfig | None = None,
    eval_limit: int = 20,
    min_examples: int = 8,
    publish: bool = True,
    ratios: tuple[float, float, float] = (0.8, 0.1, 0.1),
    bootstrap_servers: str | None = None,
    prm_kind: str = "ensemble",
    ensemble: EnsembleConfig | None = None,
    eval_set: str = "processbench",
    unless_snapshot: str | None = None,
) -> dict[str, Any]:
    """Snapshot, train, evaluate and register a PRM (see the module docstring). ``db``: the store
    (default ``PRMLOOP_STORE``, else the DuckDB file in ``PRMLOOP_HOME``); ``prm_kind``: ``ensemble``
    (every round, seconds) or ``lora`` (the final PRM); ``eval_set``: the ensemble's held-out set,
    ``processbench`` or ``arith``; ``unless_snapshot``: train nothing when the labels' snapshot is this
    one (the last retrain's: nothing new to learn)."""
    if not db:
        from prmloop.store.settings import StateSettings

        db = str(StateSettings().store_location)
    return _pipeline(
        ratios=ratios,
        bootstrap_servers=bootstrap_servers,
        db=db,
        kind=kind,
        snapshot=snapshot,
        out_dir=out_dir,
        config=config or PRMConfig(),
        eval_limit=eval_limit,
        min_examples=min_examples,
        publish=publish,
        use_prefect=True,
        prm_kind=prm_kind,
        ensemble=ensemble,
        eval_set=eval_set,
        unless_snapshot=unless_snapshot,
    )


def run_retrain(*, prefect: bool = True, **kwargs: Any) -> dict[str, Any]:
    """:func:`retrain` as a Prefect flow run, or the same steps as plain functions (same defaults)."""
    if prefect:
        return retrain(**kwargs)
    bound = inspect.signature(retrain.fn).bind(**kwargs)
    bound.apply_defaults()
    args = dict(bound.arguments)
    args["config"] = args["config"] or PRMConfig()
    return _pipeline(**args, use_prefect=False)
