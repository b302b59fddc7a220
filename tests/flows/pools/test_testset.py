"""The test set: built from sampled solutions (here a cache written by the test: no engine), kept where
the checker decides, digest-checked on load; and the shipped sets themselves."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import numpy as np
import pytest

from prmloop.flows.pools.build import ARITH_SAMPLING, arith_file, decided
from prmloop.flows.pools.testset import (
    SHIPPED_DIR,
    TEST_LEVELS,
    TEST_SEED,
    TestSetError,
    build_testset,
    load_testset,
    read_manifest,
    seed_in,
)
from prmloop.models.arith import arith_question_id, generate_question
from prmloop.models.arith.corrupt import corrupted_solution

SEED = 4242


def _cache(root: Path, questions: int) -> Path:
    """A sampled-solutions cache as the pool builder writes it: per question a right solution (the
    reference steps), a corrupted one and one with no steps (the checker cannot decide it)."""
    sampling = {**ARITH_SAMPLING, "seed": SEED, "levels": (1,)}
    path = arith_file(root, sampling)
    rng = random.Random(0)
    lines = []
    for index in range(questions):
        question = generate_question(1, SEED, index)
        wrong = corrupted_solution(question, rng)
        assert wrong is not None
        versions = [(list(question.reference_steps), True), (list(wrong[0]), False), ([], False)]
        for sample, (steps, correct) in enumerate(versions):
            lines.append(
                {
                    "question_id": arith_question_id(1, SEED, index),
                    "level": 1,
                    "sample": sample,
                    "problem": question.problem,
                    "gold_answer": str(question.answer),
                    "steps": steps,
                    "answer": str(question.answer) if correct else "0",
                    "correct": correct,
                    "tokens": 10 + sample,
                    "engine": "test",
                }
            )
    root.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return path


def test_a_build_keeps_what_the_checker_decides_with_its_first_errors(tmp_path: Path) -> None:
    cache = _cache(tmp_path / "cache", questions=3)
    rows = [json.loads(line) for line in cache.read_text().splitlines()]
    manifest = build_testset(tmp_path / "out", questions=3, seed=SEED, levels=(1,), cache=tmp_path / "cache")
    expected = {f"{r['question_id']}/{r['sample']}": decided(r) for r in rows}
    kept = {k: v for k, v in expected.items() if v is not None}
    assert 0 < len(kept) < len(rows)  # the stepless samples are left out
    loaded_manifest, items = load_testset(tmp_path / "out", seed=SEED)
    assert loaded_manifest == manifest
    assert {i.key: i.first_error for i in items} == kept
    assert manifest["solutions"] == len(items)
    assert manifest["per_level"]["L1"]["sampled"] == 9 and manifest["per_level"]["L1"]["decided"] == len(items)
    assert manifest["generator"]["engine"] == "cached"  # nothing was sampled: no engine started
    assert manifest["generated_tokens"] == sum(r["tokens"] for r in rows)
    assert all(i.subset == "L1" for i in items)
    # the same solutions give the same bytes: a rebuild from the cache names the same digest
    again = build_testset(tmp_path / "again", questions=3, seed=SEED, levels=(1,), cache=tmp_path / "cache")
    assert again["sha256"] == manifest["sha256"]


def test_a_changed_file_is_refused_in_one_line_saying_what_to_do(tmp_path: Path) -> None:
    _cache(tmp_path / "cache", questions=2)
    manifest = build_testset(tmp_path / "out", questions=2, seed=SEED, levels=(1,), cache=tmp_path / "cache")
    data = tmp_path / "out" / manifest["file"]
    with gzip.open(data, "rt") as handle:
        lines = handle.read().splitlines()
    first = json.loads(lines[0])
    first["first_error"] = 5
    with gzip.open(data, "wt") as handle:
        handle.write("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    with pytest.raises(TestSetError, match="SHA-256 is not the manifest's") as caught:
        load_testset(tmp_path / "out", seed=SEED)
    assert "\n" not in str(caught.value)
    with pytest.raises(TestSetError, match="prmloop testset build"):
        load_testset(tmp_path / "nowhere", seed=SEED)


def test_the_shipped_test_set_is_large_covers_every_level_and_uses_a_reserved_seed() -> None:
    from prmloop.flows.loop.settings import LoopSettings
    from prmloop.flows.retrain_ensemble import EVAL_SEED
    from prmloop.models.prm.features import backbone_digest

    manifest, items = load_testset()
    assert TEST_SEED not in (LoopSettings().seed, EVAL_SEED)
    assert len(items) >= 1500 and manifest["solutions"] == len(items)
    assert {i.subset for i in items} == {f"L{level}" for level in TEST_LEVELS}
    assert all(i.question.split("/")[2] == str(TEST_SEED) for i in items)
    assert manifest["generator"]["digest"] == backbone_digest("smollm2")  # the model this suite runs
    erroneous = [i for i in items if i.first_error >= 0]
    assert 0.1 < len(erroneous) / len(items) < 0.9  # both kinds, or F1 would say nothing
    # the truth is the checker's today too
    rows = [
        {"question_id": i.question, "steps": list(i.steps), "correct": i.correct}
        for i in items[:: max(1, len(items) // 200)]
    ]
    assert [decided(r) for r in rows] == [i.first_error for i in items[:: max(1, len(items) // 200)]]


def test_the_shipped_validation_set_shares_no_question_with_the_test_set() -> None:
    from prmloop.flows.retrain_ensemble import EVAL_SEED, eval_items

    validation = read_manifest(seed=EVAL_SEED)
    assert validation is not None
    _, test = load_testset()
    held = eval_items("arith", limit=int(validation["questions_per_level"]))
    assert len(held) == validation["solutions"]
    assert not {i.question for i in held} & {i.question for i in test}
    fewer = eval_items("arith", limit=2)
    assert {i.question.rsplit("/", 1)[1] for i in fewer} == {"0", "1"}


def test_the_shipped_features_fill_a_fresh_cache_for_the_default_spec(tmp_path: Path) -> None:
    from prmloop.flows.pools.testset import seed_features
    from prmloop.models.prm.features import FeatureCache, FeatureSpec, solution_key

    cache = FeatureCache(tmp_path, FeatureSpec())
    _, items = load_testset()
    assert seed_features(cache) == len({solution_key(i.problem, i.steps) for i in items})
    assert seed_features(cache) == 0  # already there
    found = cache.get([solution_key(items[0].problem, items[0].steps)])
    (array,) = found.values()
    assert array.shape[0] == len(items[0].steps) and array.shape[1] > 0
    other = FeatureCache(tmp_path / "other", FeatureSpec(layers=(1.0,)))
    assert seed_features(other) == 0  # another spec computes its own
    assert SHIPPED_DIR.is_dir()


def test_a_folder_names_its_set_by_seed_and_an_ambiguous_one_asks_for_seed(tmp_path: Path) -> None:
    assert seed_in(SHIPPED_DIR) == TEST_SEED  # the validation set beside it does not make it ambiguous
    _cache(tmp_path / "cache", questions=2)
    build_testset(tmp_path / "one", questions=2, seed=SEED, levels=(1,), cache=tmp_path / "cache")
    assert seed_in(tmp_path / "one") == SEED
    with pytest.raises(TestSetError, match=r"no test set in .*prmloop testset build"):
        seed_in(tmp_path / "cache")
    two = tmp_path / "one"
    (two / "arith-smollm2-seed77-v1.manifest.json").write_text("{}")
    with pytest.raises(TestSetError, match=r"seeds \[77, 4242\]: pass --seed") as caught:
        seed_in(two)
    assert "\n" not in str(caught.value)


@pytest.mark.integration
def test_features_anew_replace_the_old_file_and_fill_a_cache_of_the_default_spec(tmp_path: Path) -> None:
    """`prmloop testset features` after the feature spec changed: the real backbone, every solution's rows."""
    from typer.testing import CliRunner

    from prmloop.flows.cli import app
    from prmloop.flows.pools.testset import seed_features
    from prmloop.models.prm.features import FeatureCache, FeatureSpec, solution_key

    _cache(tmp_path / "cache", questions=2)
    folder = tmp_path / "set"
    build_testset(folder, questions=2, seed=SEED, levels=(1,), cache=tmp_path / "cache")
    manifest_path = folder / f"arith-smollm2-seed{SEED}-v1.manifest.json"
    manifest = json.loads(manifest_path.read_text())
    (folder / "old.npz").write_bytes(b"features of an older spec")
    manifest_path.write_text(json.dumps({**manifest, "features": {"file": "old.npz"}}))
    result = CliRunner().invoke(app, ["testset", "features", "--dir", str(folder), "--threads", "1"])
    assert result.exit_code == 0, result.output
    entry = json.loads(result.stdout.strip().splitlines()[-1])
    assert entry["spec"] == FeatureSpec().model_dump(mode="json") and entry["spec"]["uncertainty"] is True
    assert not (folder / "old.npz").exists() and (folder / entry["file"]).is_file()
    assert json.loads(manifest_path.read_text())["features"] == entry
    cache = FeatureCache(tmp_path / "features", FeatureSpec())
    _, items = load_testset(folder, seed=SEED)
    assert seed_features(cache, folder, seed=SEED) == len(items)
    found = cache.get([solution_key(i.problem, i.steps) for i in items])
    for item in items:
        rows = found[solution_key(item.problem, item.steps)]
        assert rows.shape == (len(item.steps), 576 + 12)  # SmolLM2's middle layer and the 12 uncertainties
        assert np.isfinite(rows).all()
