"""``prmloop bench deep``: would a deeper PRM than heads on frozen features learn more from the same labels?

The loop's fast retrain puts an ensemble of heads on the frozen backbone's middle layer. Before a deep
retrain is run beside it, this bench measures whether one pays. Every arm trains on exact labels of the
same solutions and is scored on the same others:

- the test set's questions (:mod:`prmloop.flows.pools.testset`) are shuffled with ``split_seed``; the
  first half's solutions are the training pool, the other half's are held out (no question on both
  sides; nothing is promoted, so no validation set is needed);
- at each budget N, N solutions are drawn from the training pool with their checker's first errors.

Arms:

- ``frozen``: the loop's ensemble (the default :class:`~prmloop.models.prm.features.FeatureSpec`: the
  middle layer's hidden state and the step's token uncertainty), one draw and head seed per ``seeds``;
- ``hidden``: the same heads on the middle layer's hidden state alone (the first feature version's
  spec), which says what the token uncertainty adds;
- ``layers``: the same heads on more of the frozen backbone's layers (``layers``, concatenated);
- ``lora``: a LoRA PRM (:mod:`prmloop.models.prm.train`, the step-tag formulation, ``epochs`` passes)
  on 85 % of the draw's questions; its threshold τ is chosen on the other 15 %; one draw (it costs
  minutes per hundred solutions on a CPU);
- ``lora_heads``: the ensemble's heads (``seeds`` head seeds) on the middle-layer features of the
  backbone with that LoRA adapter merged in.

Each arm's F1 pools its draws' predictions, with a 95 % bootstrap interval over held-out questions;
``vs_frozen`` is the paired difference (the same questions drawn) of the arm's first draw against
``frozen``'s first draw, which trained on the same solutions.
"""

from __future__ import annotations

import random
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["ARMS", "bench_deep", "split_test_set"]

Say = Callable[[str], None]

#: The arms, in the order they run.
ARMS = ("frozen", "hidden", "layers", "lora", "lora_heads")
#: Share of a LoRA draw's questions kept out of training to choose its threshold.
LORA_TAU_SHARE = 0.15


def split_test_set(items: Sequence[Any], split_seed: int) -> tuple[list[Any], list[Any]]:
    """(training pool, held out): the items of the first half of the shuffled questions, and the rest."""
    questions = sorted({i.question for i in items})
    random.Random(split_seed).shuffle(questions)
    train = set(questions[: len(questions) // 2])
    return [i for i in items if i.question in train], [i for i in items if i.question not in train]


def _draw(pool: Sequence[Any], n: int, draw: int) -> list[Any]:
    return random.Random(100 + draw).sample(list(pool), min(n, len(pool)))


def _lora(
    chosen: list[Any], held: list[Any], *, epochs: int, threads: int | None, split_seed: int, say: Say
) -> tuple[Any, list[int], dict[str, Any]]:
    """A LoRA PRM on ``chosen`` less its threshold questions; (the PRM, its first errors on ``held``, figures)."""
    from prmloop.models.prm.evaluate import best_threshold, first_below
    from prmloop.models.prm.model import PRM, PRMConfig
    from prmloop.models.prm.pool_items import example_at
    from prmloop.models.prm.train import train_prm

    by_question = sorted({i.question for i in chosen})
    random.Random(split_seed).shuffle(by_question)
    tau_questions = set(by_question[: max(1, round(len(by_question) * LORA_TAU_SHARE))])
    fit = [i for i in chosen if i.question not in tau_questions] or chosen
    tau_items = [i for i in chosen if i.question in tau_questions]
    config = PRMConfig(epochs=epochs, threads=threads, checkpoint_every=10**9)
    total = -(-len(fit) * epochs // config.batch_size)
    say(f"bench deep: lora: training on {len(fit)} solutions, {epochs} epoch(s), {total} steps")

    def on_step(m: dict[str, float]) -> None:
        if int(m["step"]) % 50 == 0 or int(m["step"]) == total:
            say(f"bench deep: lora step {int(m['step'])}/{total} loss {m['loss']:.3f}")

    examples = [example_at(i.problem, i.steps, i.first_error) for i in fit]
    with tempfile.TemporaryDirectory(prefix="prmloop-bench-deep-") as scratch:
        result = train_prm(examples, config, Path(scratch), on_step=on_step)
        prm = PRM.load(result.artifact_dir)
    scored = prm.score_solutions([i.problem for i in tau_items], [list(i.steps) for i in tau_items])
    tau = best_threshold(scored, [i.first_error for i in tau_items]) if tau_items else 0.5
    held_scores = prm.score_solutions([i.problem for i in held], [list(i.steps) for i in held])
    figures = {
        "epochs": epochs,
        "trained_on": len(fit),
        "tau": round(tau, 4),
        "final_loss": round(result.metrics["final_loss"], 4),
    }
    return prm, [first_below(s, tau) for s in held_scores], figures


def bench_deep(
    *,
    arms: Sequence[str] = ARMS,
    budgets: Sequence[int] = (120, 812),
    seeds: int = 3,
    epochs: int = 2,
    layers: tuple[float, ...] = (0.5, 1.0),
    split_seed: int = 7,
    held_limit: int | None = None,
    threads: int | None = None,
    say: Say = lambda _line: None,
) -> dict[str, Any]:
    """The arms at every budget (see the module docstring): one JSON-able dict."""
    import numpy as np

    from prmloop.flows.pools.testset import seed_features, test_items
    from prmloop.models.prm.ensemble import EnsembleConfig
    from prmloop.models.prm.ensemble_prm import train_ensemble_prm
    from prmloop.models.prm.features import FeatureCache, FeatureExtractor, FeatureSpec, cached_features
    from prmloop.models.prm.pool_items import example_at, items_f1_report, predict_first_errors
    from prmloop.models.prm.scoreboard import paired_f1_diff
    from prmloop.store.settings import StateSettings

    unknown = [a for a in arms if a not in ARMS]
    if unknown or not arms:
        raise ValueError(f"arms {list(arms)}: choose from {','.join(ARMS)} (comma-separated)")
    if "lora_heads" in arms and "lora" not in arms:
        arms = [*arms, "lora"]  # the heads need the LoRA backbone
    arms = [a for a in ARMS if a in arms]
    started = time.monotonic()
    manifest, items = test_items(threads=threads, say=say)
    train_pool, held = split_test_set(items, split_seed)
    if held_limit is not None:
        held = random.Random(split_seed).sample(held, min(held_limit, len(held)))
    budgets = sorted({min(int(b), len(train_pool)) for b in budgets})
    if not budgets or budgets[0] < 2:
        raise ValueError(f"budgets {list(budgets)}: each needs at least 2 labelled solutions")
    say(
        f"bench deep: arms {', '.join(arms)}; budgets {budgets}; training pool {len(train_pool)}, held out "
        f"{len(held)} (test set {manifest['file']}, split seed {split_seed})"
    )
    features_dir = StateSettings().features_dir

    drawn = {i.key: i for n in budgets for d in range(seeds) for i in _draw(train_pool, n, d)}

    def frozen_features(spec: FeatureSpec) -> dict[str, Any]:
        cache = FeatureCache(features_dir, spec)
        seed_features(cache)
        solutions = [*drawn.values(), *held]  # what some draw trains on, and what is scored

        def progress(done: int, missing: int, seconds: float) -> None:
            if done == missing or done // 32 % 10 == 0:
                say(f"bench deep: features {spec.layers}: {done}/{missing} in {seconds:.0f}s (cached for next time)")

        vectors = cached_features(
            [i.problem for i in solutions],
            [list(i.steps) for i in solutions],
            cache=cache,
            extractor=lambda: FeatureExtractor(spec, threads=threads),
            progress=progress,
        )
        return dict(zip([i.key for i in solutions], vectors, strict=True))

    def heads(chosen: list[Any], features: dict[str, Any], seed: int, spec: FeatureSpec) -> list[int]:
        examples = [example_at(i.problem, i.steps, i.first_error) for i in chosen]
        config = EnsembleConfig(threads=threads or 1, seed=seed)
        # the full solution's features: the ensemble trains on the rows through the first error
        features_of = [features[i.key] for i in chosen]
        prm, _ = train_ensemble_prm(examples, config=config, spec=spec, features=features_of)
        return predict_first_errors(prm, held, features)

    def row(arm: str, n: int, predicted: list[int], draws: int, since: float, **extra: Any) -> dict[str, Any]:
        report = items_f1_report(predicted, held, draws)
        by_level = {k: v["f1"] for k, v in report.items() if k != "all"}
        out = {"arm": arm, "labels": n, **{k: report["all"][k] for k in ("f1", "lo", "hi")}, "by_level": by_level}
        out |= {"draws": draws, **extra, "seconds": round(time.monotonic() - since, 1)}
        say(f"bench deep: {arm} at {n} labels: F1 {out['f1']} [{out['lo']}, {out['hi']}] ({out['seconds']}s)")
        return out

    rows: list[dict[str, Any]] = []
    first_draw: dict[tuple[str, int], list[int]] = {}
    feature_sets: dict[str, dict[str, Any]] = {}
    specs = {
        "frozen": FeatureSpec(),
        "hidden": FeatureSpec(uncertainty=False),
        "layers": FeatureSpec(layers=tuple(layers)),
    }
    for arm, spec in specs.items():
        if arm in arms:
            feature_sets[arm] = frozen_features(spec)
    for n in budgets:
        for arm, features in feature_sets.items():
            since, predicted = time.monotonic(), []
            for draw in range(seeds):
                predicted += heads(_draw(train_pool, n, draw), features, draw, specs[arm])
            first_draw[(arm, n)] = predicted[: len(held)]
            extra = {"layers": list(layers)} if arm == "layers" else {}
            rows.append(row(arm, n, predicted, seeds, since, **extra))
        if "lora" not in arms:
            continue
        since = time.monotonic()
        chosen = _draw(train_pool, n, 0)
        prm, predicted, lora_extra = _lora(chosen, held, epochs=epochs, threads=threads, split_seed=split_seed, say=say)
        first_draw[("lora", n)] = predicted
        rows.append(row("lora", n, predicted, 1, since, **lora_extra))
        if "lora_heads" in arms:
            since = time.monotonic()
            merged = prm.model.merge_and_unload().eval()
            extractor = FeatureExtractor(specs["frozen"], model=merged, tokenizer=prm.tokenizer, threads=threads)
            solutions = [*chosen, *held]
            vectors = extractor.extract([i.problem for i in solutions], [list(i.steps) for i in solutions])
            tuned = dict(zip([i.key for i in solutions], (np.asarray(v) for v in vectors), strict=True))
            predicted = []
            for seed in range(seeds):
                predicted += heads(chosen, tuned, seed, specs["frozen"])
            first_draw[("lora_heads", n)] = predicted[: len(held)]
            rows.append(row("lora_heads", n, predicted, seeds, since, epochs=epochs))
    for r in rows:
        base = first_draw.get(("frozen", r["labels"]))
        if r["arm"] != "frozen" and base is not None:
            try:
                truth, questions = [i.first_error for i in held], [i.question for i in held]
                diff = paired_f1_diff(first_draw[(r["arm"], r["labels"])], base, truth, questions)
            except ValueError:  # a held-out sample without both kinds of solution has no F1
                continue
            r["vs_frozen"] = {"diff": round(diff.diff, 4), "lo": round(diff.lo, 4), "hi": round(diff.hi, 4)}
    return {
        "bench": "deep",
        "test_set": f"{manifest['file']}@{manifest['sha256'][:12]}",
        "split_seed": split_seed,
        "train_pool": len(train_pool),
        "held_out": len(held),
        "budgets": budgets,
        "arms": arms,
        "seeds": seeds,
        "rows": rows,
        "seconds": round(time.monotonic() - started, 1),
    }
