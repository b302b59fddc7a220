"""The Prefect flow ``calibrate`` on a slice of the real GSM8K pool: it runs fit + evaluation and
publishes the accuracy table and the report (with both plots) under stable artifact keys."""

from __future__ import annotations

from pathlib import Path

import pytest


def test_calibrate_flow_publishes_table_and_report_artifacts(
    prefect_api: None, shared_data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey, FlowRunFilter, TaskRunFilter
    from prefect.client.schemas.sorting import ArtifactSort

    from prmloop.flows.calibrate import calibrate

    monkeypatch.setenv("PRMLOOP_CACHE_DIR", str(tmp_path / "cache"))
    # the flow reads the pool itself; a 40-question slice keeps the run short
    from prmloop.models.aggregation import loader as eval_aggregate

    real_load = eval_aggregate.load_pool
    monkeypatch.setattr(eval_aggregate, "load_pool", lambda *a, **kw: real_load(*a, **{**kw, "limit": 40}))

    result = calibrate(
        str(shared_data_dir / "bon" / "gsm8k_candidates.jsonl.gz"),
        ns=[1, 4, 32],
        subsamples=2,
        splits=2,
        calibration_size=15,
        out_dir=str(tmp_path / "out"),
    )
    assert result["artifacts"] == ["aggregation-gsm8k-qwen-prm-min-accuracy", "aggregation-gsm8k-qwen-prm-min-report"]
    assert result["calibration"]["prm_name"] == "qwen_prm"
    assert result["event_payload"]["event_type"] == "CalibrationFitted"
    assert Path(result["files"]["accuracy_png"]).is_file()
    # every filter field is given: Prefect 3.8.8's client sends None for omitted ones, which its own
    # server rejects with 422 (Artifact.get fails the same way)
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=result["artifacts"])),
            flow_run_filter=FlowRunFilter(),
            task_run_filter=TaskRunFilter(),
            sort=ArtifactSort.UPDATED_DESC,
            limit=10,
            offset=0,
        )
    by_key = {a.key: a for a in found}
    table = by_key.get("aggregation-gsm8k-qwen-prm-min-accuracy")
    report = by_key.get("aggregation-gsm8k-qwen-prm-min-report")
    assert table is not None and table.type == "table"
    assert "Logit WV" in str(table.data)
    assert report is not None and str(report.data).count("data:image/png;base64,") == 2


def test_a_fit_becomes_a_calibration_fitted_event_and_back() -> None:
    import numpy as np

    from prmloop.flows.calibrate import calibration_fitted_payload
    from prmloop.models.aggregation.calibration import AggregationCalibration, fit_calibration
    from prmloop.models.aggregation.pool import CandidatePool
    from prmloop.store.events import make_event

    answers = np.tile(np.array([1, 0, 0, 1, 0, 0]), (12, 1))
    correct = answers == 1
    pool = CandidatePool(
        question_ids=tuple(f"q{i}" for i in range(12)),
        answers=answers,
        correct=correct,
        step_scores=np.where(correct, 0.8, 0.45)[:, :, None],
        n_steps=np.ones(answers.shape, dtype=np.int64),
        generator="toy-gen",
        prm_name="toy-prm",
        dataset="toy",
    )
    fit = fit_calibration(pool, objective_ns=(6,))
    payload = calibration_fitted_payload(fit, split="toy: all 12 questions")
    again = calibration_fitted_payload(fit_calibration(pool, objective_ns=(6,)), split="toy: all 12 questions")
    assert payload.calibration_id == again.calibration_id  # same fit on the same questions, same id
    event = make_event(payload, producer="calibrate")
    assert event.event_type == "CalibrationFitted"
    assert event.correlation_id == payload.calibration_id
    assert AggregationCalibration.model_validate(payload.fit) == fit
    assert payload.metrics["logit_wv"] == 1.0
