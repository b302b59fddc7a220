"""The ensemble PRM: heads trained together, their mean, disagreement and out-of-bag predictions;
features from a frozen backbone and their cache."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from prmloop.models.prm.data import PRMExample
from prmloop.models.prm.ensemble import EnsembleConfig, FittedEnsemble, StepStats, fit_ensemble
from prmloop.models.prm.ensemble_prm import EnsemblePRM, first_error_of, step_targets, train_ensemble_prm
from prmloop.models.prm.features import (
    FeatureCache,
    FeatureExtractor,
    FeatureSpec,
    cached_features,
    solution_key,
)

FAST = EnsembleConfig(heads=8, hidden=8, pca_dims=0, epochs=120, learning_rate=2e-2, threads=1)


def _toy(n: int, seed: int = 0) -> tuple[list[np.ndarray], list[list[float]]]:
    """Steps in 6 dimensions; a step is correct when its first coordinate is positive."""
    rng = np.random.default_rng(seed)
    features, targets = [], []
    for _ in range(n):
        x = rng.normal(size=(int(rng.integers(1, 5)), 6)).astype(np.float32)
        features.append(x)
        targets.append([float(v > 0) for v in x[:, 0]])
    return features, targets


def test_aleatoric_is_the_means_distance_from_certainty() -> None:
    stats = StepStats(mean=(0.9, 0.5, 0.2), std=(0.0, 0.0, 0.0))
    assert stats.aleatoric == pytest.approx((0.1, 0.5, 0.2))


def test_the_heads_learn_a_separable_task_and_out_of_bag_predictions_are_honest() -> None:
    features, targets = _toy(300)
    ensemble, out_of_bag = fit_ensemble(features, targets, FAST)
    test_x, test_y = _toy(100, seed=1)
    stats = ensemble.stats(test_x)
    hits = [
        (m >= 0.5) == (y >= 0.5) for s, ys in zip(stats, test_y, strict=True) for m, y in zip(s.mean, ys, strict=True)
    ]
    assert sum(hits) / len(hits) > 0.9
    oob = [
        (p >= 0.5) == (y >= 0.5) for o, ys in zip(out_of_bag, targets, strict=True) for p, y in zip(o, ys, strict=True)
    ]
    assert sum(oob) / len(oob) > 0.85
    assert ensemble.meta["train_steps"] == sum(len(t) for t in targets)


def test_heads_disagree_more_far_from_the_data_than_near_it() -> None:
    features, targets = _toy(200)
    ensemble, _ = fit_ensemble(features, targets, FAST)
    near = ensemble.head_probs(np.random.default_rng(2).normal(size=(200, 6)).astype(np.float32)).std(axis=0)
    far = ensemble.head_probs((np.random.default_rng(3).normal(size=(200, 6)) * 25).astype(np.float32)).std(axis=0)
    assert far.mean() > 2 * near.mean()


def test_the_heads_train_on_different_shares_and_so_differ() -> None:
    features, targets = _toy(60)
    ensemble, _ = fit_ensemble(features, targets, FAST)
    probs = ensemble.head_probs(np.concatenate(features))
    assert probs.shape == (FAST.heads, sum(len(f) for f in features))
    assert float(probs.std(axis=0).mean()) > 1e-3


def test_a_saved_ensemble_predicts_exactly_as_before(tmp_path: Path) -> None:
    features, targets = _toy(50)
    ensemble, _ = fit_ensemble(features, targets, FAST)
    prm = EnsemblePRM(ensemble, FeatureSpec(backbone="tiny"), threshold=0.37)
    prm.save(tmp_path / "prm")
    again = EnsemblePRM.load(tmp_path / "prm")
    x = np.concatenate(features)
    assert np.array_equal(again.ensemble.head_probs(x), ensemble.head_probs(x))
    assert again.threshold == 0.37
    assert again.describe()["kind"] == "ensemble"


def test_training_needs_one_labelled_step() -> None:
    with pytest.raises(ValueError, match="nothing to train"):
        fit_ensemble([np.zeros((0, 3), dtype=np.float32)], [[]], FAST)


def test_targets_stop_at_the_first_error() -> None:
    example = PRMExample("q", ("a", "b", "c", "d"), (True, False, False, False))
    assert first_error_of(example.labels) == 1
    assert step_targets(example) == [1.0, 0.0]
    assert first_error_of((True, True)) == -1


# -- features from a frozen backbone -----------------------------------------------------------------


@pytest.fixture
def extractor(tiny_lm: Callable[..., Any], smollm2_tokenizer: Any) -> FeatureExtractor:
    return FeatureExtractor(FeatureSpec(backbone="tiny", layers=(0.5,)), model=tiny_lm(), tokenizer=smollm2_tokenizer)


def test_a_middle_layer_feature_equals_that_layer_of_a_full_forward_pass(extractor: FeatureExtractor) -> None:
    import torch

    from prmloop.models.prm.data import encode_solution

    [features] = extractor.extract(["What is 2 + 3?"], [["2 + 3 = 5", "The answer is 5."]])
    assert features.shape == (2, 32 + 12)  # one row per step: hidden size 32 of layer 1 of 2, 12 uncertainties
    encoded = encode_solution(extractor.tokenizer, "What is 2 + 3?", ["2 + 3 = 5", "The answer is 5."])
    with torch.inference_mode():
        states = extractor.model(input_ids=torch.tensor([encoded.input_ids]), output_hidden_states=True).hidden_states
    expected = states[1][0, encoded.tag_positions].numpy()
    assert np.allclose(features[:, :32], expected, atol=1e-5)
    hidden_only = FeatureExtractor(
        FeatureSpec(backbone="tiny", uncertainty=False), model=extractor.model, tokenizer=extractor.tokenizer
    )
    [alone] = hidden_only.extract(["What is 2 + 3?"], [["2 + 3 = 5", "The answer is 5."]])
    assert alone.shape == (2, 32)
    assert np.allclose(alone, features[:, :32], atol=1e-5)


def test_batched_features_equal_one_solution_at_a_time(extractor: FeatureExtractor) -> None:
    problems = ["What is 2 + 3?", "Tom has 4 apples and eats 1. How many are left?"]
    steps = [["2 + 3 = 5"], ["4 - 1 = 3", "He has 3 left.", "The answer is 3."]]
    together = extractor.extract(problems, steps)
    alone = [extractor.extract([p], [s])[0] for p, s in zip(problems, steps, strict=True)]
    for a, b in zip(together, alone, strict=True):
        assert np.allclose(a, b, atol=1e-4)


def test_promoted_prms_share_one_backbone_whose_passes_take_turns(
    tmp_path: Path, tiny_lm: Callable[..., Any], smollm2_tokenizer: Any
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    folder = tmp_path / "backbone"
    tiny_lm().save_pretrained(folder)
    smollm2_tokenizer.save_pretrained(folder)
    spec = FeatureSpec(backbone=str(folder), layers=(0.5,))
    first = EnsemblePRM(FittedEnsemble(FAST, {}), spec).extractor()
    second = EnsemblePRM(FittedEnsemble(FAST, {}), spec).extractor()
    # the next promoted PRM reuses the loaded model instead of loading the backbone again
    assert second is not first
    assert second.model is first.model

    def solutions(n: int) -> tuple[list[str], list[list[str]]]:
        problems = [f"What is {a} + {a + 1}?" for a in range(n)]
        return problems, [[f"{a} + {a + 1} = {2 * a + 1}", "So it is."] * (1 + a % 3) for a in range(n)]

    # two threads at once on different solutions: the layers are caught by hooks on the shared model, so
    # passes that overlapped would mix the two threads' states
    work = [(first, solutions(24)), (second, solutions(7))] * 4
    alone = {len(p): extractor.extract(p, st) for extractor, (p, st) in work[:2]}
    with ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(lambda job: (len(job[1][0]), job[0].extract(*job[1])), work))
    for n, run in runs:
        assert all(a.shape == b.shape and np.allclose(a, b, atol=1e-5) for a, b in zip(alone[n], run, strict=True))


def test_the_cache_computes_only_what_it_lacks(tmp_path: Path, extractor: FeatureExtractor) -> None:
    spec = FeatureSpec(backbone="smollm2")  # the cache keys on the embedded model's digest
    cache = FeatureCache(tmp_path, spec)
    calls: list[int] = []

    class Counting:
        def extract(self, problems: list[str], steps: list[list[str]]) -> list[np.ndarray]:
            calls.append(len(problems))
            return extractor.extract(problems, steps)

    problems, steps = ["a?", "b?", "c?"], [["x"], ["y", "z"], ["w"]]
    first = cached_features(problems, steps, cache=cache, extractor=Counting)  # type: ignore[arg-type]
    second = cached_features(problems, steps, cache=cache, extractor=Counting)  # type: ignore[arg-type]
    assert calls == [3]
    assert len(cache) == 3
    assert all(np.array_equal(a, b) for a, b in zip(first, second, strict=True))
    assert solution_key("b?", ["y", "z"]) != solution_key("b?", ["yz"])


def test_an_ensemble_prm_trains_scores_and_reloads(
    tmp_path: Path, extractor: FeatureExtractor, smollm2_tokenizer: Any
) -> None:
    examples = [
        PRMExample(
            f"What is {a} + {b}?", (f"{a} + {b} = {a + b}", f"The answer is {a + b + (a % 2)}."), (True, a % 2 == 0)
        )
        for a in range(1, 9)
        for b in range(1, 4)
    ]
    prm, metrics = train_ensemble_prm(examples, config=FAST, extractor=extractor, spec=extractor.spec)
    assert metrics["train_solutions"] == len(examples)
    assert 0.0 <= metrics["threshold"] <= 1.0 + 1e-6
    scores = prm.score_solutions([e.prompt for e in examples[:3]], [list(e.completions) for e in examples[:3]])
    assert [len(s) for s in scores] == [2, 2, 2]
    assert all(0.0 <= v <= 1.0 for s in scores for v in s)
    prm.save(tmp_path / "prm")
    again = EnsemblePRM.load(tmp_path / "prm", extractor=extractor)
    [reloaded] = again.score_solutions([examples[0].prompt], [list(examples[0].completions)])
    assert reloaded == pytest.approx(scores[0], abs=1e-5)  # one solution alone vs in a padded batch
