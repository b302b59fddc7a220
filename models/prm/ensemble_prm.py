"""The ensemble as a PRM: frozen-backbone features, K heads, a first-error threshold, saved and loaded.

:class:`EnsemblePRM` has the LoRA PRM's interface (``score_solutions``, ``save``, ``load``,
``describe``), so the registry, ``prioritize``, ``eval processbench`` and Best-of-N use it unchanged,
and adds :meth:`EnsemblePRM.step_stats` (mean and standard deviation over the heads per step) for
the selection rule of :mod:`prmloop.models.prm.active`. Its threshold ``τ`` (a step scored below it is
predicted wrong) is chosen on the training solutions' out-of-bag predictions with the ProcessBench
F1 (Qwen "Lessons", the scalar-PRM protocol), so choosing it needs no held-out data.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from prmloop.models.prm.data import PRMExample
from prmloop.models.prm.ensemble import EnsembleConfig, FittedEnsemble, StepStats, fit_ensemble
from prmloop.models.prm.evaluate import best_threshold, processbench_scores
from prmloop.models.prm.features import FeatureCache, FeatureExtractor, FeatureSpec, cached_features, shared_extractor

__all__ = ["ENSEMBLE_KIND", "EnsemblePRM", "first_error_of", "step_targets", "train_ensemble_prm"]

#: ``prm.json``'s ``kind`` for an ensemble PRM folder (a LoRA PRM folder has ``prm_config.json`` instead).
ENSEMBLE_KIND = "ensemble"


def first_error_of(labels: Sequence[bool]) -> int:
    """The 0-based first ``False`` label, or -1 (ProcessBench's "no error")."""
    return next((i for i, ok in enumerate(labels) if not ok), -1)


def step_targets(example: PRMExample, soft: bool = False) -> list[float]:
    """Training targets of the steps through the first error (what follows it carries no label)."""
    targets = example.targets(soft)
    first = first_error_of(example.labels)
    return list(targets if first < 0 else targets[: first + 1])


class EnsemblePRM:
    """A PRM made of :class:`~prmloop.models.prm.ensemble.FittedEnsemble` heads on cached features."""

    def __init__(
        self,
        ensemble: FittedEnsemble,
        spec: FeatureSpec,
        *,
        threshold: float = 0.5,
        cache_dir: Path | None = None,
        threads: int | None = None,
        extractor: FeatureExtractor | None = None,
    ) -> None:
        self.ensemble = ensemble
        self.spec = spec
        self.threshold = threshold
        self.threads = threads
        self.cache = FeatureCache(cache_dir, spec) if cache_dir is not None else None
        self._extractor = extractor

    def extractor(self) -> FeatureExtractor:
        """The backbone, loaded on first need (only for solutions whose features are not cached)."""
        if self._extractor is None:
            self._extractor = shared_extractor(self.spec, threads=self.threads)
        return self._extractor

    def features(
        self, problems: Sequence[str], steps: Sequence[Sequence[str]], progress: Callable[..., None] | None = None
    ) -> list[np.ndarray]:
        return cached_features(problems, steps, cache=self.cache, extractor=self.extractor, progress=progress)

    def step_stats(self, problems: Sequence[str], steps: Sequence[Sequence[str]]) -> list[StepStats]:
        """Mean and standard deviation over the heads for every step (steps past ``max_length``: none)."""
        return self.ensemble.stats(self.features(problems, steps))

    def score_solutions(
        self, problems: Sequence[str], steps: Sequence[Sequence[str]], *, batch_size: int = 8
    ) -> list[list[float]]:
        """Every step's score (the heads' mean probability that it is correct)."""
        del batch_size  # the backbone batches by tokens; kept for the LoRA PRM's signature
        return [list(s.mean) for s in self.step_stats(problems, steps)]

    def describe(self) -> dict[str, Any]:
        return {
            "kind": ENSEMBLE_KIND,
            "feature_spec": self.spec.model_dump(mode="json"),
            "config": self.ensemble.config.model_dump(mode="json"),
            "threshold": self.threshold,
            **self.ensemble.meta,
        }

    def save(self, path: Path) -> Path:
        """Write the heads (``heads.pt``, ``ensemble.json``) and ``prm.json``; returns ``path``."""
        path = Path(path)
        self.ensemble.save(path)
        (path / "prm.json").write_text(json.dumps(self.describe(), indent=2))
        return path

    @classmethod
    def load(
        cls,
        path: Path,
        *,
        cache_dir: Path | None = None,
        threads: int | None = None,
        extractor: FeatureExtractor | None = None,
    ) -> EnsemblePRM:
        path = Path(path)
        described = json.loads((path / "prm.json").read_text())
        if described.get("kind") != ENSEMBLE_KIND:
            raise ValueError(f"{path}/prm.json: kind {described.get('kind')!r} is not an ensemble PRM")
        return cls(
            FittedEnsemble.load(path),
            # a PRM saved before the spec had `uncertainty` was trained on the hidden state alone
            FeatureSpec.model_validate({"uncertainty": False, **described["feature_spec"]}),
            threshold=float(described["threshold"]),
            cache_dir=cache_dir,
            threads=threads,
            extractor=extractor,
        )


def train_ensemble_prm(
    examples: Sequence[PRMExample],
    *,
    spec: FeatureSpec | None = None,
    config: EnsembleConfig | None = None,
    cache_dir: Path | None = None,
    threads: int | None = None,
    extractor: FeatureExtractor | None = None,
    soft: bool = False,
    features: Sequence[np.ndarray] | None = None,
) -> tuple[EnsemblePRM, dict[str, float]]:
    """Train an ensemble PRM on ``examples``; returns it and its metrics (out-of-bag F1, timings).

    ``features`` (one array per example) skips the backbone, for callers that hold them already.
    """
    if not examples:
        raise ValueError("no training solutions: an ensemble PRM needs at least one labelled solution")
    spec = spec or FeatureSpec()
    config = config or EnsembleConfig(threads=threads)
    prm = EnsemblePRM(FittedEnsemble(config, {}), spec, cache_dir=cache_dir, threads=threads, extractor=extractor)
    started = time.perf_counter()
    if features is None:
        features = prm.features([e.prompt for e in examples], [list(e.completions) for e in examples])
    feature_s = time.perf_counter() - started
    targets = [step_targets(e, soft) for e in examples]
    ensemble, out_of_bag = fit_ensemble(features, targets, config, raw_tail=spec.uncertainty_dims)
    first_errors = [first_error_of(e.labels) for e in examples]
    scored = [(list(map(float, o)), f) for o, f in zip(out_of_bag, first_errors, strict=True) if len(o)]
    threshold = best_threshold([s for s, _ in scored], [f for _, f in scored]) if scored else 0.5
    oob = processbench_scores([s for s, _ in scored], [f for _, f in scored], threshold) if scored else {}
    prm.ensemble, prm.threshold = ensemble, threshold
    metrics = {
        "train_solutions": float(len(examples)),
        "train_steps": float(ensemble.meta["train_steps"]),
        "feature_seconds": round(feature_s, 3),
        "train_seconds": float(ensemble.meta["train_seconds"]),
        "threshold": float(threshold),
        "oob_f1": float(oob.get("f1") or 0.0),
    }
    ensemble.meta.update({"threshold": threshold, "oob_f1": metrics["oob_f1"]})
    return prm, metrics
