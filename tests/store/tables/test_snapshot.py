"""Snapshots from a real DuckDB store, importers of outside data, and the model registry."""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prmloop.consumers.sink import events_to_arrow
from prmloop.flows.datasets import import_rows
from prmloop.flows.lab.bench.synthetic import synthetic_events
from prmloop.store.auth.signing import sign
from prmloop.store.events import Envelope, ModelRef, ModelRegistered, make_event
from prmloop.store.kafka.runtime import ConsumedEvent
from prmloop.store.tables.duck import DuckEventStore, query
from prmloop.store.tables.metrics import loop_metrics
from prmloop.store.tables.registry import current_model, model_registered, should_promote
from prmloop.store.tables.snapshot import SPLITS, load_snapshot, select_labels, split_of, write_snapshot


def _store(path: Path, events: list) -> Path:
    store = DuckEventStore(path)
    store.write_batch(
        events_to_arrow([ConsumedEvent(e, "t", 0, i, 0) for i, e in enumerate(events)]), [("t", 0, len(events))]
    )
    return store.path


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return _store(tmp_path / "prmloop.duckdb", synthetic_events(600, k=4, seed=2))


def test_accepted_and_mc_selections_match_the_store(db: Path) -> None:
    accepted = select_labels(db, kind="accepted")
    mc = select_labels(db, kind="mc")
    n_accepted = query(db, "SELECT count(DISTINCT solution_id) FROM consensus WHERE decision = 'accepted'").rows[0][0]
    assert 0 < len(accepted) <= n_accepted and len(mc) >= len(accepted)
    for row in accepted + mc:
        assert len(row.labels) == len(row.completions) > 0 and row.prompt
        assert row.first_error_step is None or row.labels[row.first_error_step] is False
    assert len({(r.question_id, r.completions) for r in mc}) == len(mc)  # identical solutions kept once
    methods = Counter(r.source for r in mc)
    one = next(iter(methods))
    assert all(r.source == one for r in select_labels(db, kind="mc", method=one))


def test_snapshot_round_trip_is_content_addressed(db: Path, tmp_path: Path) -> None:
    rows = select_labels(db, kind="mc")
    first = write_snapshot(rows, tmp_path / "snaps", selection={"kind": "mc"})
    again = write_snapshot(list(reversed(rows)), tmp_path / "snaps", selection={"kind": "other"})
    assert again == first  # same content -> same id, the existing snapshot is not rewritten
    other = write_snapshot(rows[1:], tmp_path / "snaps", selection={"kind": "mc"})
    assert other["snapshot_id"] != first["snapshot_id"]
    folder = tmp_path / "snaps" / first["snapshot_id"]
    loaded = [r for split in SPLITS for r in load_snapshot(folder, split)[1]]
    assert sorted(loaded, key=lambda r: r.solution_id) == sorted(rows, key=lambda r: r.solution_id)
    questions = {split: {r.question_id for r in load_snapshot(folder, split)[1]} for split in SPLITS}
    assert not (questions["train"] & questions["test"]) and not (questions["train"] & questions["validation"])
    line = json.loads((folder / "train.jsonl").read_text().splitlines()[0])
    assert set(line) == {"prompt", "completions", "labels"}
    with pytest.raises(ValueError, match="nothing to snapshot"):
        write_snapshot([], tmp_path / "snaps", selection={})
    with pytest.raises(FileNotFoundError, match="prmloop dataset snapshot"):
        load_snapshot(tmp_path / "nothing")


@given(st.lists(st.text(min_size=1, max_size=20), min_size=1, max_size=50, unique=True))
def test_a_question_has_one_split_whatever_else_is_there(ids: list[str]) -> None:
    first = {q: split_of(q) for q in ids}
    assert {q: split_of(q) for q in reversed(ids)} == first
    assert set(first.values()) <= set(SPLITS)


def test_split_ratios_are_respected() -> None:
    counts = Counter(split_of(f"q{i}", (0.5, 0.0, 0.5)) for i in range(4000))
    assert counts["validation"] == 0 and abs(counts["train"] - 2000) < 150


def test_importers(shared_data_dir: Path, tmp_path: Path) -> None:
    rows, errors = import_rows("processbench", shared_data_dir / "processbench" / "gsm8k.json")
    assert len(rows) == 400 and not errors
    for row in rows:
        assert (row.first_error_step is None) == all(row.labels)
        if row.first_error_step is not None:
            assert len(row.labels) == row.first_error_step + 1 and row.labels[-1] is False
    bench_file = sorted((shared_data_dir / "prmbench").glob("*circular*"))[0]
    bench, bench_errors = import_rows("prmbench", bench_file)
    assert bench and not bench_errors and any(r.source == "prmbench:original" for r in bench)
    shepherd = tmp_path / "shepherd.jsonl"
    shepherd.write_text(
        json.dumps(
            {
                "input": "What is 2+3? Step 1: 2+3=5 ки\nStep 2: The answer is 6 ки",
                "label": "What is 2+3? Step 1: 2+3=5 +\nStep 2: The answer is 6 -",
            }
        )
        + "\n"
        + "not json\n"
        + json.dumps({"input": "Q? Step 1: x ки", "label": "Q? Step 1: x ?"})
        + "\n"
    )
    found, problems = import_rows("shepherd", shepherd)
    assert len(found) == 1 and found[0].labels == (True, False) and found[0].first_error_step == 1
    assert [p.split(": ")[0] for p in problems] == [f"{shepherd}:2", f"{shepherd}:3"]
    with pytest.raises(ValueError, match="unknown data set kind"):
        import_rows("gsm9k", shepherd)


def test_registry_promotes_only_when_not_worse(tmp_path: Path) -> None:
    assert should_promote({"f1": 0.4}, None, "f1")[0]
    assert not should_promote({"f1": 0.3}, {"model_id": "m", "metrics": {"f1": 0.4}}, "f1")[0]
    assert should_promote({"f1": 0.4}, {"model_id": "m", "metrics": {"f1": 0.4}}, "f1")[0]
    assert not should_promote({}, None, "f1")[0]
    artifact = tmp_path / "prm"
    artifact.mkdir()
    (artifact / "w.bin").write_bytes(b"weights")
    ref = ModelRef(backend="transformers", name="smollm2")
    kept = model_registered(
        artifact=artifact,
        base_model=ref,
        snapshot_id="s1",
        train_examples=3,
        config={},
        metrics={"f1": 0.4},
        promoted=True,
        decision="first",
    )
    dropped = model_registered(
        artifact=artifact,
        base_model=ref,
        snapshot_id="s1",
        train_examples=3,
        config={},
        metrics={"f1": 0.1},
        promoted=False,
        decision="worse",
    )
    db = _store(tmp_path / "prmloop.duckdb", [kept, dropped])
    current = current_model(db)
    assert current is not None and current["metrics"] == {"f1": 0.4} and current["model_id"].startswith("prm-")
    (artifact / "w.bin").write_bytes(b"other weights")
    changed = model_registered(
        artifact=artifact,
        base_model=ref,
        snapshot_id="s1",
        train_examples=3,
        config={},
        metrics={},
        promoted=False,
        decision="x",
    )
    assert changed.payload.model_id != kept.payload.model_id  # type: ignore[union-attr]


def test_a_promotion_decision_says_whether_it_promoted() -> None:
    """Seen: the demo printed the decision of a promoted model, "no promoted model yet", and read as "not
    promoted" while `models list` said promoted: true. The text now starts with what was decided."""
    current = {"model_id": "prm-1", "metrics": {"f1": 0.4}}
    cases = [
        ({"f1": 0.4}, None),
        ({"f1": 0.3}, current),
        ({"f1": 0.5}, current),
        ({"f1": 0.4}, current),
        ({}, None),
        ({"f1": 0.4}, {"model_id": "prm-0", "metrics": {}}),
    ]
    for candidate, in_force in cases:
        promote, why = should_promote(candidate, in_force, "f1")
        assert why.startswith("promoted: " if promote else "not promoted: "), why
        if in_force is not None and "f1" in candidate:
            assert str(in_force["model_id"]) in why


def _registration(kind: str, promoted: bool, second: int, signed: bool = True) -> Envelope:
    payload = ModelRegistered(
        model_id=f"{kind}-{second:012d}",
        kind=kind,  # type: ignore[arg-type]
        base_model=ModelRef(backend="transformers", name="smollm2"),
        artifact_uri=f"/tmp/{kind}-{second}",
        dataset_snapshot="s",
        train_examples=second,
        parameters={"promoted": promoted, "decision": "test"},
        metrics={"f1": 0.5},
    )
    return make_event(
        sign(payload) if signed else payload,
        producer="test" if signed else "mallory",
        occurred_at=datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=second),
    )


@given(
    st.lists(st.tuples(st.sampled_from(["prm", "prm_ensemble"]), st.booleans(), st.booleans()), min_size=1, max_size=8)
)
@settings(max_examples=15, deadline=None)
def test_the_model_in_force_is_the_newest_promoted_and_signed_of_its_kind(
    registrations: list[tuple[str, bool, bool]],
) -> None:
    """`model_versions.in_force`, `current_model` (what retrain and the selector use) and `loop_metrics`
    (what `prmloop status` shows) name the same model: the newest promoted one of each kind that
    prmloop signed; an unsigned one (any broker client's) is never in force (issue 39, point 3)."""
    with tempfile.TemporaryDirectory() as folder:
        events = [_registration(kind, p, i, signed) for i, (kind, p, signed) in enumerate(registrations)]
        db = _store(Path(folder) / "prmloop.duckdb", events)
        marked = dict(query(db, "SELECT kind, model_id FROM model_versions WHERE in_force").rows)
        promoted = query(db, "SELECT count(*) FROM model_versions WHERE promoted").rows[0][0]
        assert promoted == sum(p for _, p, _ in registrations)
        metrics = loop_metrics(db)
        refused = {m["model_id"] for m in metrics["not_in_force"]["models"]}
        assert refused == {f"{k}-{i:012d}" for i, (k, p, signed) in enumerate(registrations) if p and not signed}
        for kind in ("prm", "prm_ensemble"):
            last = [i for i, (k, p, signed) in enumerate(registrations) if k == kind and p and signed]
            expected = f"{kind}-{last[-1]:012d}" if last else None
            current = current_model(db, kind)
            assert marked.get(kind) == expected
            assert (current["model_id"] if current else None) == expected
            shown = metrics["current_prm" if kind == "prm" else "current_prm_ensemble"]
            assert (shown["model_id"] if shown else None) == expected


def test_an_empty_signature_is_unsigned_in_the_view_as_in_the_registry(tmp_path: Path) -> None:
    """Issue 54, point 3: a forged promotion with `signature: ""` showed `signed = true, in_force = true`
    in `model_versions` while the registry and `models list` called it unsigned. The view, which users
    query, now agrees with the registry on what is signed and in force."""
    real = _registration("prm", True, 1)
    forged_payload = _registration("prm", True, 2, signed=False).payload.model_copy(update={"signature": ""})
    forged = make_event(forged_payload, producer="mallory", occurred_at=datetime(2026, 1, 2, tzinfo=UTC))
    db = _store(tmp_path / "prmloop.duckdb", [real, forged])
    rows = {r[0]: r[1:] for r in query(db, "SELECT model_id, signed, in_force FROM model_versions").rows}
    assert rows[forged_payload.model_id] == (False, False)
    assert rows[real.payload.model_id] == (True, True)  # type: ignore[union-attr]
    current = current_model(db, "prm")
    assert current is not None and current["model_id"] == real.payload.model_id  # type: ignore[union-attr]
