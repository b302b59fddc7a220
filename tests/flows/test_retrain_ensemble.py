"""The ensemble retrain's scoreboard: test F1 with its interval and per level on the shipped test set,
promotion on the validation set by the paired bootstrap against the model in force (real SmolLM2
features, a real DuckDB store, signed registrations)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from prmloop.consumers.sink import events_to_arrow
from prmloop.flows.retrain_ensemble import train_register_ensemble
from prmloop.models.arith import generate_question
from prmloop.models.arith.corrupt import corrupted_solution
from prmloop.models.prm.data import PRMExample
from prmloop.models.prm.ensemble import EnsembleConfig
from prmloop.models.prm.features import FeatureSpec
from prmloop.store.kafka.records import ConsumedEvent
from prmloop.store.tables.duck import DuckEventStore

pytestmark = pytest.mark.integration


def _examples(n: int, seed: int) -> list[PRMExample]:
    rng = random.Random(seed)
    out = []
    for index in range(n):
        question = generate_question(1 + index % 2, 91, index)
        steps = tuple(question.reference_steps)
        out.append(PRMExample(question.problem, steps, (True,) * len(steps)))
        wrong = corrupted_solution(question, rng)
        if wrong is not None:
            bad, first = tuple(wrong[0]), wrong[1]
            out.append(PRMExample(question.problem, bad[: first + 1], tuple(t < first for t in range(first + 1))))
    return out


def test_a_retrain_is_scored_on_the_test_set_and_promoted_unless_worse_beyond_noise(tmp_path: Path) -> None:
    from prmloop.flows.pools.testset import read_manifest

    store = DuckEventStore(tmp_path / "loop.duckdb")
    common = {
        "db": str(store.path),
        "out_dir": tmp_path / "prm",
        "config": EnsembleConfig(heads=4, epochs=20, threads=1),
        "spec": FeatureSpec(),
        "eval_set": "arith",
        "eval_limit": 6,
        "threads": 1,
    }
    first, event = train_register_ensemble(_examples(6, 0), snapshot_id="s1", **common)
    metrics = first["metrics"]
    shipped = read_manifest()
    assert shipped is not None and metrics["test_solutions"] == shipped["solutions"]
    assert metrics["test_f1_lo"] <= metrics["test_f1"] <= metrics["test_f1_hi"]
    assert metrics["test_f1_hi"] - metrics["test_f1_lo"] < 0.2  # 1,600 solutions: a usable interval
    assert {k for k in metrics if k.startswith("test_f1_L") and k.count("_") == 2} >= {"test_f1_L1", "test_f1_L2"}
    assert first["promoted"] and first["decision"].startswith("promoted: the first")
    assert event.payload.parameters["config"]["test_set"].startswith(shipped["file"])
    store.write_batch(events_to_arrow([ConsumedEvent(event, "models.registered", 0, 0, 0)]), [("m", 0, 1)])

    second, _ = train_register_ensemble(_examples(12, 1), snapshot_id="s2", **common)
    found = second["metrics"]
    # judged against the model in force on the same validation solutions, with the interval named
    assert {"val_diff", "val_diff_lo", "val_diff_hi"} <= set(found)
    assert found["val_diff_lo"] <= found["val_diff"] <= found["val_diff_hi"]
    assert second["promoted"] == (found["val_diff_hi"] >= 0.0)  # not worse unless the whole interval is below 0
    said = "promoted: not worse beyond noise" if second["promoted"] else "not promoted: worse beyond noise"
    assert second["decision"].startswith(said), second["decision"]


def test_testset_score_on_a_set_of_another_seed_sets_the_reported_f1_beside_the_fresh_one(tmp_path: Path) -> None:
    """The re-score check: the PRM in force scored on a set built anew (here the shipped validation set's
    seed, copied into a folder of its own) names that set, and the gap to the test F1 it registered with."""
    import json
    import shutil

    from typer.testing import CliRunner

    from prmloop.flows.cli import app
    from prmloop.flows.pools.testset import SHIPPED_DIR, read_manifest

    store = DuckEventStore(tmp_path / "loop.duckdb")
    summary, event = train_register_ensemble(
        _examples(6, 0),
        snapshot_id="s1",
        db=str(store.path),
        out_dir=tmp_path / "prm",
        config=EnsembleConfig(heads=4, epochs=20, threads=1),
        spec=FeatureSpec(),
        eval_set="arith",
        eval_limit=6,
        threads=1,
    )
    store.write_batch(events_to_arrow([ConsumedEvent(event, "models.registered", 0, 0, 0)]), [("m", 0, 1)])
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    for path in SHIPPED_DIR.glob("arith-smollm2-seed1000-*"):
        shutil.copy(path, fresh / path.name)
    result = CliRunner().invoke(app, ["testset", "score", "--db", str(store.path), "--dir", str(fresh)])
    assert result.exit_code == 0, result.output
    line = json.loads(result.stdout.strip().splitlines()[-1])
    other = read_manifest(fresh, 1000)
    assert other is not None and line["test_set"].startswith(other["file"])
    assert line["test"]["all"]["n"] == other["solutions"]
    reported = summary["metrics"]["test_f1"]
    assert line["reported"]["f1"] == pytest.approx(reported)
    assert line["f1_minus_reported"] == pytest.approx(line["test"]["all"]["f1"] - reported, abs=1e-4)
    # the shipped folder itself: the test set, and no gap line (the same solutions it reported on)
    again = CliRunner().invoke(app, ["testset", "score", "--db", str(store.path)])
    assert again.exit_code == 0, again.output
    same = json.loads(again.stdout.strip().splitlines()[-1])
    assert same["test"]["all"]["f1"] == pytest.approx(reported) and "f1_minus_reported" not in same
