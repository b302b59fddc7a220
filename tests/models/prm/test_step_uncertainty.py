"""A step's token uncertainty under the backbone: the statistics on hand-computed distributions, the
extractor's values against a full forward pass, and the heads keeping them apart from the projection."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from prmloop.models.prm.ensemble import EnsembleConfig, fit_ensemble
from prmloop.models.prm.ensemble_prm import EnsemblePRM
from prmloop.models.prm.features import FeatureExtractor, FeatureSpec
from prmloop.models.prm.step_uncertainty import UNCERTAINTY_FEATURES, digit_tokens, step_token_statistics


def _entropy(p: list[float]) -> float:
    return -sum(v * math.log(v) for v in p)


def test_the_statistics_of_hand_computed_distributions() -> None:
    import torch

    # vocabulary: 0 "a", 1 "7", 2 "b", 3 "="; only 1 is a digit
    digits = torch.tensor([False, True, False, False])
    logits = torch.tensor(
        [
            [0.0, 0.0, 0.0, 0.0],  # uniform: p(7) = 1/4, a tie for the top, so no gap
            [math.log(3), 0.0, 0.0, 0.0],  # p = 3/6, 1/6, 1/6, 1/6: "7" is 1/6, the top "a" is 3/6
            [0.0, 0.0, math.log(2), 0.0],  # p = 1/5, 1/5, 2/5, 1/5: "b" is the top
        ]
    )
    tokens = torch.tensor([1, 1, 2])
    stats = step_token_statistics(logits, tokens, digits, [(0, 2), (2, 3), (3, 3)])
    assert stats.shape == (3, len(UNCERTAINTY_FEATURES)) == (3, 12)
    h0, h1, h2 = math.log(4), _entropy([3 / 6, 1 / 6, 1 / 6, 1 / 6]), _entropy([1 / 5, 1 / 5, 2 / 5, 1 / 5])
    first = dict(zip(UNCERTAINTY_FEATURES, stats[0], strict=True))
    assert first == pytest.approx(
        {
            "logprob_min": math.log(1 / 6),
            "logprob_mean": (math.log(1 / 4) + math.log(1 / 6)) / 2,
            "gap_max": math.log(3),
            "entropy_mean": (h0 + h1) / 2,
            "entropy_max": h0,
            "log1p_off_top": math.log(2),  # one of the two tokens was not the top choice
            "log1p_tokens": math.log(3),
            "digit_logprob_min": math.log(1 / 6),
            "digit_gap_max": math.log(3),
            "digit_gap_mean": math.log(3) / 2,
            "digit_log1p_off_top": math.log(2),
            "digit_log1p_tokens": math.log(3),
        },
        abs=1e-5,
    )
    second = dict(zip(UNCERTAINTY_FEATURES, stats[1], strict=True))
    assert second["logprob_min"] == second["logprob_mean"] == pytest.approx(math.log(2 / 5), abs=1e-6)
    assert second["gap_max"] == 0.0 and second["log1p_off_top"] == 0.0
    assert second["entropy_mean"] == second["entropy_max"] == pytest.approx(h2, abs=1e-6)
    assert stats[1, 7:].tolist() == [0.0] * 5  # no digit in the step
    assert stats[2].tolist() == [0.0] * 12  # an empty step


def test_digit_tokens_follow_the_tokenizer(smollm2_tokenizer: Any) -> None:
    flags = digit_tokens(smollm2_tokenizer, len(smollm2_tokenizer) + 3)
    assert len(flags) == len(smollm2_tokenizer) + 3 and not flags[-3:].any()
    for text, digit in (("7", True), ("42", True), (" apples", False), ("=", False)):
        ids = smollm2_tokenizer.encode(text, add_special_tokens=False)
        assert all(bool(flags[i]) == digit for i in ids), text


def test_the_extractors_uncertainty_is_that_of_a_full_forward_pass(
    tiny_lm: Callable[..., Any], smollm2_tokenizer: Any
) -> None:
    import torch

    from prmloop.models.prm.data import encode_solution

    model = tiny_lm()
    extractor = FeatureExtractor(FeatureSpec(backbone="tiny"), model=model, tokenizer=smollm2_tokenizer)
    problem, steps = "Tom has 4 apples and eats 1. How many are left?", ["4 - 1 = 3", "He has 3 left."]
    [features] = extractor.extract([problem], [steps])
    encoded = encode_solution(smollm2_tokenizer, problem, steps)
    with torch.inference_mode():
        logp = torch.log_softmax(model(input_ids=torch.tensor([encoded.input_ids])).logits[0].float(), dim=-1)
    for row, (start, end) in enumerate(encoded.step_spans()):
        chosen = [float(logp[p - 1, encoded.input_ids[p]]) for p in range(start, end)]
        gaps = [float(logp[p - 1].max()) - c for p, c in zip(range(start, end), chosen, strict=True)]
        text = smollm2_tokenizer.convert_ids_to_tokens(encoded.input_ids[start:end])
        digit_gaps = [g for g, t in zip(gaps, text, strict=True) if any(ch.isdigit() for ch in t)]
        got = dict(zip(UNCERTAINTY_FEATURES, features[row, -12:], strict=True))
        assert got["logprob_min"] == pytest.approx(min(chosen), abs=1e-4)
        assert got["logprob_mean"] == pytest.approx(sum(chosen) / len(chosen), abs=1e-4)
        assert got["gap_max"] == pytest.approx(max(gaps), abs=1e-4)
        assert got["log1p_tokens"] == pytest.approx(math.log1p(end - start), abs=1e-6)
        assert got["digit_gap_max"] == pytest.approx(max(digit_gaps), abs=1e-4)
        assert got["digit_log1p_tokens"] == pytest.approx(math.log1p(len(digit_gaps)), abs=1e-6)


def test_a_small_informative_tail_survives_the_projection_when_kept_apart() -> None:
    """Six loud noise columns and one quiet column that decides the label: two principal directions
    keep only noise, unless the quiet column is a raw tail of its own."""
    rng = np.random.default_rng(0)

    def toy(n: int) -> tuple[list[np.ndarray], list[list[float]]]:
        x = np.concatenate([rng.normal(size=(n, 6)) * 100.0, rng.normal(size=(n, 1)) * 1e-3], axis=1)
        return [row[None, :].astype(np.float32) for row in x], [[float(row[-1] > 0)] for row in x]

    features, targets = toy(300)
    test_x, test_y = toy(200)
    config = EnsembleConfig(heads=8, hidden=8, pca_dims=2, epochs=150, learning_rate=2e-2, threads=1)

    def accuracy(raw_tail: int) -> float:
        ensemble, _ = fit_ensemble(features, targets, config, raw_tail=raw_tail)
        means = [s.mean[0] for s in ensemble.stats(test_x)]
        return float(np.mean([(m >= 0.5) == (y[0] >= 0.5) for m, y in zip(means, test_y, strict=True)]))

    assert accuracy(1) > 0.9
    assert accuracy(0) < 0.7
    ensemble, _ = fit_ensemble(features, targets, config, raw_tail=1)
    assert ensemble.meta["pca_dims"] == 2 and ensemble.meta["raw_dims"] == 1
    z = (np.concatenate(features) - ensemble.tensors["center"].numpy()) @ ensemble.tensors["basis"].numpy()
    assert z.shape[1] == 3
    assert z.mean(axis=0) == pytest.approx([0.0, 0.0, 0.0], abs=1e-3)
    assert z.std(axis=0, ddof=1) == pytest.approx([1.0, 1.0, 1.0], abs=1e-3)  # whitened head, standardized tail


def test_a_prm_saved_before_token_uncertainty_loads_as_hidden_state_only(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    features = [rng.normal(size=(2, 5)).astype(np.float32) for _ in range(20)]
    ensemble, _ = fit_ensemble(features, [[1.0, float(i % 2)] for i in range(20)], EnsembleConfig(heads=2, epochs=2))
    EnsemblePRM(ensemble, FeatureSpec(backbone="tiny", uncertainty=False)).save(tmp_path / "old")
    described = json.loads((tmp_path / "old" / "prm.json").read_text())
    del described["feature_spec"]["uncertainty"]  # as a PRM of the first feature version wrote it
    (tmp_path / "old" / "prm.json").write_text(json.dumps(described))
    assert EnsemblePRM.load(tmp_path / "old").spec.uncertainty is False
    assert EnsemblePRM.load(tmp_path / "old").spec.uncertainty_dims == 0
