"""The monitor flow's artifacts."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from prmloop.consumers.sink import events_to_arrow
from prmloop.flows.lab.bench.synthetic import synthetic_events
from prmloop.store.kafka.runtime import ConsumedEvent
from prmloop.store.tables.duck import DuckEventStore


@pytest.mark.usefixtures("prefect_api")
def test_monitor_publishes_artifacts_with_stable_keys(tmp_path: Path) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey, FlowRunFilter, TaskRunFilter
    from prefect.client.schemas.sorting import ArtifactSort

    from prmloop.flows.monitor import ARTIFACT_KEYS, monitor

    store = DuckEventStore(tmp_path / "prmloop.duckdb")
    events = synthetic_events(300, k=4, seed=5)
    store.write_batch(events_to_arrow([ConsumedEvent(e, "t", 0, i, 0) for i, e in enumerate(events)]), [("t", 0, 300)])
    metrics = monitor(str(store.path))
    assert metrics["accepted"] > 0
    monitor(str(store.path))  # a second run adds a version under the same keys
    found: list[Any] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(found) < 4:
        with get_client(sync_client=True) as client:
            found = client.read_artifacts(
                artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=list(ARTIFACT_KEYS))),
                flow_run_filter=FlowRunFilter(),
                task_run_filter=TaskRunFilter(),
                sort=ArtifactSort.UPDATED_DESC,
                limit=20,
                offset=0,
            )
        time.sleep(0.5)
    assert sorted({a.key for a in found}) == sorted(ARTIFACT_KEYS)
    assert sum(a.key == "loop-summary" for a in found) == 2
    summary = next(a for a in found if a.key == "loop-summary")
    assert f"{metrics['accepted']} accepted" in str(summary.data) and "data:image/png;base64," in str(summary.data)


@pytest.mark.usefixtures("prefect_api")
def test_the_learning_curve_is_published_inside_the_monitor_flow_run(tmp_path: Path) -> None:
    import warnings

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from prmloop.flows.monitor import CURVE_KEY, monitor

    store = DuckEventStore(tmp_path / "prmloop.duckdb")
    events = synthetic_events(40, k=4, seed=6)
    store.write_batch(events_to_arrow([ConsumedEvent(e, "t", 0, i, 0) for i, e in enumerate(events)]), [("t", 0, 40)])
    png = tmp_path / "curve.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n not a whole picture, enough for its bytes")
    figures = {
        "accepted_labels": 4817,
        "accepted_per_minute": 2.5,
        "f1_curve": [[60.0, 0.4], [150.0, 0.75]],
        "test_curve": [
            {"at_s": 60.0, "labels": 10, "f1": 0.4, "lo": 0.35, "hi": 0.45},
            {"at_s": 150.0, "labels": 30, "f1": 0.75, "lo": 0.7, "hi": 0.8},
        ],
    }
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        monitor(str(store.path), curve=str(png), figures=figures)
    assert not [w for w in caught if "outside of a flow or task run" in str(w.message)]
    found: list[Any] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not found:
        with get_client(sync_client=True) as client:
            listed = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[CURVE_KEY])))
        # this run's curve, whatever other tests published under the key in the session's server
        found = [a for a in listed if "accepted labels: 4817 (2.5 per minute)" in str(a.data)]
        time.sleep(0.5)
    assert len(found) == 1 and found[0].flow_run_id is not None
    assert "0.750 [0.700, 0.800] at 30 labels (2.5 min)" in str(found[0].data)
