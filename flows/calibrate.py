"""Prefect flow ``calibrate``: fit the aggregation calibration for one (generator, PRM, score rule)
pair on a scored Best-of-N pool, evaluate every method against it, and publish the accuracy table,
the compute fraction and the plots as artifacts with stable keys (history shows in the UI)."""

from __future__ import annotations

import base64
import hashlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from prmloop.models.aggregation.calibration import AggregationCalibration
from prmloop.models.aggregation.evaluation import DEFAULT_NS, AggregationEvaluation, evaluate_aggregation
from prmloop.models.aggregation.loader import load_for_eval
from prmloop.models.aggregation.plots import slug, write_outputs
from prmloop.models.aggregation.pool import CandidatePool, ScoreKind, ScoreRule
from prmloop.models.aggregation.selection import CALIBRATED_METHODS
from prmloop.store.auth.signing import sign
from prmloop.store.events import CalibrationFitted

log = logging.getLogger(__name__)


@task(name="load-scored-pool")
def load_scored_pool(
    pool: str, scores: str | None, prm: str, reference: str | None, score_kind: ScoreKind | None
) -> CandidatePool:
    return load_for_eval(pool, scores, prm=prm, reference=reference, score_kind=score_kind)


@task(name="fit-and-evaluate")
def fit_and_evaluate(
    loaded: CandidatePool,
    *,
    score_rule: ScoreRule,
    ns: Sequence[int],
    subsamples: int,
    splits: int,
    calibration_size: int,
    seed: int,
) -> AggregationEvaluation:
    return evaluate_aggregation(
        loaded,
        ns=[n for n in ns if n <= loaded.n_candidates],
        subsamples=subsamples,
        splits=splits,
        calibration_size=calibration_size,
        score_rule=score_rule,
        seed=seed,
    )


def calibration_fitted_payload(fit: AggregationCalibration, *, split: str) -> CalibrationFitted:
    """The ``CalibrationFitted`` payload for a fit: one event per (generator, PRM, score rule) with
    every calibrated method's parameters; ``AggregationCalibration.model_validate(payload.fit)``
    restores the record at selection time. ``calibration_id`` is a content hash of what was
    calibrated on what, so a re-run of the same fit yields the same id. Signed with the credentials'
    key (store/auth/signing.py): only a fit prmloop made is ever put in force."""
    ident = json.dumps(
        [
            fit.schema_version,
            fit.generator,
            fit.prm_name,
            fit.dataset,
            fit.score_rule,
            sorted(fit.calibration_question_ids),
        ]
    )
    unsigned = CalibrationFitted(
        calibration_id="cal-" + hashlib.sha256(ident.encode()).hexdigest()[:16],
        generator=fit.generator,
        prm=fit.prm_name,
        score_rule=fit.score_rule,
        method="+".join(CALIBRATED_METHODS),
        fit=fit.model_dump(mode="json"),
        calibration_split=split,
        metrics=dict(fit.calibration_accuracy),
    )
    return sign(unsigned)


def _png_markdown(path: str, title: str) -> str:
    """Inline PNG (a data URI: the Prefect UI only shows images from URLs, and these files are local)."""
    data = base64.b64encode(Path(path).read_bytes()).decode()
    return f"### {title}\n\n`{path}`\n\n![{title}](data:image/png;base64,{data})\n"


@task(name="publish-artifacts")
def publish_artifacts(ev: AggregationEvaluation, files: dict[str, str]) -> list[str]:
    """Accuracy table + compute fraction + plots, keyed by dataset, PRM and score rule."""
    p = ev.pool
    key = slug("aggregation", p["dataset"], p["prm_name"], ev.score_rule)
    create_table_artifact(
        table=ev.table_rows(),
        key=f"{key}-accuracy",
        description=(
            f"Test accuracy (%) mean ± std over {ev.splits} calibration/test splits, {ev.subsamples} subsamples "
            f"per N; {p['dataset']} · {p['generator']} · {p['prm_name']} · score {ev.score_rule}. Compute "
            "fraction: smallest N reaching vanilla WV at the largest N, over that N (log-interpolated)."
        ),
    )
    fit = ev.fits[0]
    summary = (
        f"## Calibration {p['dataset']} · {p['generator']} · {p['prm_name']} · score {ev.score_rule}\n\n"
        f"split 0: logit b = {fit.logit_b:.4g}, linear b = {fit.linear_b:.4g}, WRF alpha = {fit.wrf_alpha:.2f}, "
        f"score transform = {fit.score_transform.kind}\n\n" + ev.markdown() + "\n\n"
    )
    create_markdown_artifact(
        markdown=summary
        + _png_markdown(files["accuracy_png"], "accuracy vs N")
        + _png_markdown(files["weights_png"], "fitted weighting functions"),
        key=f"{key}-report",
        description="calibrated aggregation: table and plots",
    )
    return [f"{key}-accuracy", f"{key}-report"]


@flow(name="calibrate")
def calibrate(
    pool: str,
    *,
    scores: str | None = None,
    prm: str = "qwen_prm",
    reference: str | None = None,
    score_rule: ScoreRule = "min",
    score_kind: ScoreKind | None = None,
    ns: list[int] = list(DEFAULT_NS),  # noqa: B006 - Prefect parameters are copied per run
    subsamples: int = 50,
    splits: int = 5,
    calibration_size: int = 100,
    seed: int = 0,
    out_dir: str = "out/aggregate",
    publish: bool = True,
) -> dict[str, Any]:
    """Fit + evaluate aggregation calibration on a scored pool and publish the results.

    Returns the evaluation summary (``evaluate_aggregation(...).to_dict()``), the split-0 fit as
    ``calibration`` (its ``model_dump()``), ``event_payload`` (that fit as a ``CalibrationFitted``
    payload, ready for ``make_event``; publishing it is the caller's), written ``files`` and the
    artifact keys.
    """
    logger = get_run_logger()
    # Prefect's Task.__call__ overloads type a sync task's result as a Coroutine under mypy.
    loaded = cast(CandidatePool, load_scored_pool(pool, scores, prm, reference, score_kind))
    ev = cast(
        AggregationEvaluation,
        fit_and_evaluate(
            loaded,
            score_rule=score_rule,
            ns=ns,
            subsamples=subsamples,
            splits=splits,
            calibration_size=calibration_size,
            seed=seed,
        ),
    )
    target = Path(out_dir) / slug(loaded.dataset, loaded.prm_name, score_rule)
    files = write_outputs(ev, target)
    keys = publish_artifacts(ev, files) if publish else []
    logger.info("calibration of %s/%s/%s written to %s", loaded.dataset, loaded.prm_name, score_rule, target)
    result = ev.to_dict()
    result["calibration"] = ev.fits[0].model_dump()
    split = f"{loaded.dataset}: {calibration_size} random questions, seed {seed} (split 0)"
    result["event_payload"] = calibration_fitted_payload(ev.fits[0], split=split).model_dump(mode="json")
    result["files"] = files
    result["artifacts"] = keys
    result["table_markdown"] = ev.markdown()
    return result


def calibrate_and_publish(home: Path, bootstrap_servers: str, *, say: Any = log.info) -> bool:
    """Fit the aggregation calibration on the shared GSM8K Best-of-N pool (a published PRM's scores)
    and publish its ``CalibrationFitted``: the loop's calibration on its schedule. False when the
    pool is missing (``../shared`` must sit beside the clone), said once through ``say``."""
    from prmloop.models.questions import data_dir
    from prmloop.store.events import make_event
    from prmloop.store.kafka.producer import EventProducer

    pool = data_dir() / "bon" / "gsm8k_candidates.jsonl.gz"
    if not pool.is_file():
        say(f"calibrate: skipped: {pool} not found (../shared must sit beside the clone)")
        return False
    result = calibrate(str(pool), subsamples=10, splits=2, out_dir=str(home / "calibration"))
    payload = CalibrationFitted.model_validate(result["event_payload"])
    with EventProducer(bootstrap_servers) as producer:
        producer.publish([make_event(payload, producer="prmloop-calibrate/0.3.0")])
    return True
