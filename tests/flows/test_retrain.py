"""The retrain flow end to end on the embedded model: snapshot, LoRA training, ProcessBench, registry."""

from __future__ import annotations

from pathlib import Path

import pytest

from prmloop.consumers.sink import events_to_arrow
from prmloop.flows.lab.bench.synthetic import synthetic_events
from prmloop.store.kafka.runtime import ConsumedEvent
from prmloop.store.tables.duck import DuckEventStore


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api", "shared_data_dir")
def test_retrain_trains_evaluates_and_decides_promotion(tmp_path: Path) -> None:
    from prmloop.flows.retrain import run_retrain
    from prmloop.models.prm.model import PRMConfig

    store = DuckEventStore(tmp_path / "prmloop.duckdb")
    events = synthetic_events(200, k=4, seed=4)
    store.write_batch(events_to_arrow([ConsumedEvent(e, "t", 0, i, 0) for i, e in enumerate(events)]), [("t", 0, 200)])
    config = PRMConfig(max_steps=2, batch_size=2, max_length=256, threads=2)
    summary = run_retrain(
        db=str(store.path),
        kind="mc",
        out_dir=str(tmp_path / "prm"),
        config=config,
        eval_limit=2,
        min_examples=2,
        publish=False,
        ratios=(1.0, 0.0, 0.0),
        prm_kind="lora",
    )
    assert summary["trained"] and summary["promoted"] and summary["decision"].startswith("promoted: the first")
    assert Path(summary["artifact"], "adapter", "adapter_config.json").is_file()
    assert summary["evaluation"]["gsm8k"]["samples"] == 2 and "processbench_gsm8k_f1" in summary["metrics"]
    refused = run_retrain(
        prefect=False,
        db=str(store.path),
        kind="mc",
        out_dir=str(tmp_path / "prm2"),
        config=config,
        min_examples=10_000,
        prm_kind="lora",
    )
    assert not refused["trained"] and "min_examples" in refused["reason"]


def test_a_retrain_on_the_last_retrains_snapshot_trains_nothing(tmp_path: Path) -> None:
    """The loop passes its last trained snapshot: labels that add no training solution (or are not stored
    yet) train the same PRM again nowhere; a store with new labels makes a new snapshot, which passes."""
    from prmloop.flows.retrain import run_retrain

    store = DuckEventStore(tmp_path / "prmloop.duckdb")
    events = synthetic_events(60, k=4, seed=4)

    def write(start: int, end: int) -> None:
        consumed = [ConsumedEvent(events[i], "t", 0, i, 0) for i in range(start, end)]
        store.write_batch(events_to_arrow(consumed), [("t", 0, end)])

    write(0, 30)
    common = {"prefect": False, "db": str(store.path), "kind": "mc", "out_dir": str(tmp_path / "prm")}
    first = run_retrain(**common, min_examples=10_000)
    snapshot = first["snapshot"]["snapshot_id"]
    assert not first["trained"] and "min_examples" in first["reason"]
    again = run_retrain(**common, min_examples=10_000, unless_snapshot=snapshot)
    assert not again["trained"] and again["reason"] == f"no new training solution (snapshot {snapshot} unchanged)"
    write(30, 60)  # the rest arrive
    grown = run_retrain(**common, min_examples=10_000, unless_snapshot=snapshot)
    assert grown["snapshot"]["snapshot_id"] != snapshot
    assert not grown["trained"] and "min_examples" in grown["reason"]  # past the guard: a new snapshot
