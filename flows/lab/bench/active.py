"""``prmloop bench active``: does choosing what to label grow a better PRM per label (and per token)?

Pool-based active learning (ActPRM, Duan et al., 2025, Sec. 4.1) on the pools of
:mod:`prmloop.flows.pools.build`: the pool half starts unlabelled, the held-out half only
measures. Every arm starts from the same random labelled set (per seed) and, at each budget, asks the
labeller for more solutions in its own order, retrains the ensemble PRM
(:mod:`prmloop.models.prm.ensemble_prm`) on everything labelled so far, and is scored on the held-out
half with the ProcessBench protocol (first step below the model's threshold τ, τ chosen on the
labelled solutions' out-of-bag predictions: nothing is tuned on the held-out half). Arms:

- ``random``: a random order;
- ``actprm``: the solutions the current ensemble is not confident about (both uncertainties,
  :func:`~prmloop.models.prm.active.decide`), most uncertain first; ``epistemic`` / ``aleatoric``: by
  one uncertainty alone;
- ``priority``: today's question-level signal (:mod:`prmloop.models.priority`: accuracy near one half,
  dispersed answers) computed from the pool's graded answers, highest first;
- ``full``: the whole pool, the ceiling.

Pools: those of :mod:`prmloop.flows.pools.build`, and ``testset``: the shipped test set's solutions
(:mod:`prmloop.flows.pools.testset`, exact first errors, their features shipped), split by question like
the others. It needs no model work, so ``--quick`` runs on it in minutes with 800 solutions a half; as
in ``bench deep``, a lab measurement on the test set's halves (no model it trains is put in force).

Budgets are shares of what the pool's labels cost: labels for ``processbench`` and ``arith``, generated
tokens for ``arith-mc`` (a correct solution's label is free, as in the loop). Per arm: F1 per budget
(mean and standard deviation over seeds), ``auc`` (mean F1 over the budget range, the area under the
curve normalised by its width) and ``label_fraction_to_95`` (the smallest budget share at which the
arm's mean F1 reaches 95 % of ``full``'s; 1.0 if never). ``actprm_vs_random``: actprm minus random,
paired by seed, with 95 % intervals (:mod:`prmloop.flows.lab.bench.active_stats`), and whether the
advantage survives them.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from prmloop.flows.lab.bench.active_stats import compare_arms
from prmloop.flows.pools.build import ARITH_LEVELS, build_pool
from prmloop.models.prm.active import Thresholds, decide, rank_uncertain
from prmloop.models.prm.ensemble import EnsembleConfig
from prmloop.models.prm.ensemble_prm import EnsemblePRM, train_ensemble_prm
from prmloop.models.prm.features import FeatureCache, FeatureExtractor, FeatureSpec, cached_features
from prmloop.models.prm.pool_items import PoolItem, example_of, held_out_f1, split_pool

__all__ = ["ARMS", "TESTSET_POOL", "ActiveSettings", "label_quality", "pool_items", "run_active"]

ARMS = ("random", "actprm", "epistemic", "aleatoric", "priority", "full")
#: The pool of the shipped test set's solutions: exact first errors and features shipped, no model work.
TESTSET_POOL = "testset"
Say = Callable[[str], None]


@dataclass(frozen=True)
class ActiveSettings:
    pool: str = "processbench"
    arms: tuple[str, ...] = ARMS
    budgets: tuple[float, ...] = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75)
    seeds: int = 5
    ensemble: EnsembleConfig = field(default_factory=lambda: EnsembleConfig(threads=1))
    thresholds: Thresholds = field(default_factory=Thresholds)
    #: How an uncertainty arm orders the unlabelled pool: ``rank`` (most uncertain first) or ``filter``
    #: (ActPRM's Algorithm 1: the pool streams by in a random order and the confident are passed over).
    order: str = "rank"
    spec: FeatureSpec = field(default_factory=FeatureSpec)
    arith_questions: int = 60
    arith_levels: tuple[int, ...] = ARITH_LEVELS
    mc_limit: int = 160
    threads: int | None = None
    #: What samples a pool the cache lacks: auto (vLLM where it runs, else transformers), vllm, transformers.
    engine: str = "auto"


def _train(items: Sequence[PoolItem], features: dict[str, np.ndarray], config: EnsembleConfig) -> EnsemblePRM | None:
    pairs = [(example_of(i), features[i.key]) for i in items]
    kept = [(e, f) for e, f in pairs if e is not None and len(f)]
    if not kept:
        return None
    prm, _ = train_ensemble_prm([e for e, _ in kept], config=config, features=[f for _, f in kept])
    return prm


def _priority_order(items: Sequence[PoolItem], rng: random.Random) -> list[int]:
    from prmloop.models.priority import Probe, priority, priority_signals

    groups: dict[str, list[PoolItem]] = {}
    for item in items:
        groups.setdefault(item.question, []).append(item)
    value = {
        q: priority(
            priority_signals(Probe(answers=tuple(i.answer or "?" for i in g), correct=tuple(i.correct for i in g)))
        )
        for q, g in groups.items()
    }
    noise = [rng.random() for _ in items]
    return sorted(range(len(items)), key=lambda i: (-value[items[i].question], noise[i]))


def _take(order: Sequence[int], items: Sequence[PoolItem], budget: float, spent: float) -> tuple[list[int], float]:
    """Items of ``order`` until the cost reaches ``budget`` (free labels are taken as they come)."""
    chosen = []
    for index in order:
        if spent >= budget and items[index].cost > 0:
            break
        chosen.append(index)
        spent += items[index].cost
    return chosen, spent


def _curve(
    arm: str,
    *,
    pool: list[PoolItem],
    held: list[PoolItem],
    features: dict[str, np.ndarray],
    budgets: list[float],
    seed: int,
    settings: ActiveSettings,
) -> list[dict[str, float]]:
    rng = random.Random(seed)
    start_order = list(range(len(pool)))
    rng.shuffle(start_order)
    labelled, spent = _take(start_order, pool, budgets[0], 0.0)  # the same first set for every arm
    static: list[int] | None = None
    if arm == "random":
        static = [i for i in start_order if i not in set(labelled)]
    elif arm == "priority":
        static = _priority_order(pool, random.Random(seed + 1))
    config = settings.ensemble.model_copy(update={"seed": seed})
    points = []
    prm = _train([pool[i] for i in labelled], features, config)
    for budget in budgets:
        if spent < budget:
            taken = set(labelled)
            rest = [i for i in (static or range(len(pool))) if i not in taken]
            if static is None and prm is not None:
                tau = min(0.99, max(0.01, prm.threshold))
                rule = Thresholds(**{**settings.thresholds.__dict__, "rule": arm, "tau": tau})
                stats = prm.ensemble.stats([features[pool[i].key] for i in rest])
                decisions = [decide(s, rule) for s in stats]
                if settings.order == "filter":
                    arrival = {i: rng.random() for i in rest}
                    rest = sorted(rest, key=lambda i: (not decisions[rest.index(i)].label, arrival[i]))
                else:
                    rest = [rest[r] for r in rank_uncertain(decisions)]
            more, spent = _take(rest, pool, budget, spent)
            labelled.extend(more)
            prm = _train([pool[i] for i in labelled], features, config)
        points.append(
            {"budget": budget, "labels": len(labelled), "cost": spent, "f1": held_out_f1(prm, held, features)}
        )
    return points


def _load_features(
    items: Sequence[PoolItem], settings: ActiveSettings, say: Say, root: Path | None = None
) -> dict[str, np.ndarray]:
    from prmloop.flows.pools.sampling import describe_cost, record_speed
    from prmloop.store.settings import StateSettings

    cache = FeatureCache(StateSettings().features_dir, settings.spec)
    if settings.pool == TESTSET_POOL:
        from prmloop.flows.pools.testset import seed_features

        seed_features(cache)  # the shipped features, where the spec is theirs: no forward pass
    last = [0.0]

    def progress(done: int, missing: int, seconds: float) -> None:
        if time.monotonic() - last[0] > 15 or done == missing:
            last[0] = time.monotonic()
            left = describe_cost((missing - done) * seconds / max(done, 1))
            say(
                f"features: {done}/{missing} solutions through the backbone ({seconds:.0f}s, {left} left; "
                "cached for next time)"
            )
            if done == missing and root is not None and missing >= 32:
                record_speed(root, "features", missing / max(seconds, 1e-6))

    arrays = cached_features(
        [i.problem for i in items],
        [list(i.steps) for i in items],
        cache=cache,
        extractor=lambda: FeatureExtractor(settings.spec, threads=settings.threads),
        progress=progress,
    )
    return {i.key: a for i, a in zip(items, arrays, strict=True)}


def _summarise(curves: dict[str, list[list[dict[str, float]]]], total_cost: float) -> dict[str, Any]:
    full = curves.get("full")
    full_f1 = statistics.fmean(c[0]["f1"] for c in full) if full else None
    arms: dict[str, Any] = {}
    for arm, runs in curves.items():
        if arm == "full":
            arms[arm] = {"f1": round(full_f1 or 0.0, 4), "f1_std": round(_std([c[0]["f1"] for c in runs]), 4)}
            continue
        n = len(runs[0])
        f1 = [statistics.fmean(r[i]["f1"] for r in runs) for i in range(n)]
        xs = [statistics.fmean(r[i]["cost"] for r in runs) / total_cost for i in range(n)]
        aucs = [_auc(r, total_cost) for r in runs]
        reach = next((x for x, y in zip(xs, f1, strict=True) if full_f1 and y >= 0.95 * full_f1), 1.0)
        arms[arm] = {
            "f1": [round(v, 4) for v in f1],
            "f1_std": [round(_std([r[i]["f1"] for r in runs]), 4) for i in range(n)],
            "share": [round(v, 4) for v in xs],
            "labels": [round(statistics.fmean(r[i]["labels"] for r in runs), 1) for i in range(n)],
            "auc": round(statistics.fmean(aucs), 4),
            "auc_std": round(_std(aucs), 4),
            "label_fraction_to_95": round(reach, 4),
        }
    return arms


def _auc(run: Sequence[dict[str, float]], total_cost: float) -> float:
    """One seed's mean F1 over the budget range: the trapezoid area under F1 vs share, over its width."""
    x = [p["cost"] / total_cost for p in run]
    y = [p["f1"] for p in run]
    width = x[-1] - x[0]
    return float(np.trapezoid(y, x) / width) if width > 0 else y[-1]


def _versus_random(
    curves: dict[str, list[list[dict[str, float]]]], total_cost: float, budgets: Sequence[float]
) -> dict[str, Any]:
    """actprm minus random, paired by seed (:func:`~prmloop.flows.lab.bench.active_stats.compare_arms`), and the
    AUC difference of every other uncertainty arm against random."""
    rnd = curves["random"]
    out = compare_arms(
        [_auc(r, total_cost) for r in curves["actprm"]],
        [_auc(r, total_cost) for r in rnd],
        [[p["f1"] for p in r] for r in curves["actprm"]],
        [[p["f1"] for p in r] for r in rnd],
        budgets,
    )
    others = {}
    for arm in ("epistemic", "aleatoric", "priority"):
        if arm in curves:
            row = compare_arms(
                [_auc(r, total_cost) for r in curves[arm]], [_auc(r, total_cost) for r in rnd], [], [], []
            )
            others[arm] = {"auc_difference": row["auc"]["difference"], "ci": row["auc"]["ci"]}
    if others:
        out["other_arms_auc_minus_random"] = others
    return out


def _std(values: Sequence[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def pool_items(settings: ActiveSettings, *, root: Path, say: Say = print, work: Any = None) -> list[PoolItem]:
    """The solutions of ``settings.pool``: the shipped test set's, or a pool built (and cached) under ``root``."""
    if settings.pool == TESTSET_POOL:
        from prmloop.flows.pools.testset import test_items

        return test_items(engine=settings.engine, threads=settings.threads, say=say)[1]
    return build_pool(
        settings.pool,
        root=root,
        arith_questions=settings.arith_questions,
        arith_levels=settings.arith_levels,
        mc_limit=settings.mc_limit,
        threads=settings.threads,
        engine=settings.engine,
        say=say,
        work=work,
    )


def run_active(
    settings: ActiveSettings, *, root: Path, out_dir: Path | None = None, say: Say = print, work: Any = None
) -> dict[str, Any]:
    """Run every arm on one pool; returns the summary (the bench's JSON line). ``work``
    (:class:`~prmloop.flows.pools.build.PoolWork`) shares one sampling engine between pools."""
    unknown = [a for a in settings.arms if a not in ARMS]
    if unknown:
        raise ValueError(f"unknown arm {unknown[0]!r}; choose from {', '.join(ARMS)}")
    started = time.perf_counter()
    items = pool_items(settings, root=root, say=say, work=work)
    pool, held = split_pool(items)
    say(f"{settings.pool}: {len(pool)} pool solutions, {len(held)} held out")
    features = _load_features(items, settings, say, root)
    total_cost = sum(i.cost for i in pool)
    budgets = [b * total_cost for b in settings.budgets]
    curves: dict[str, list[list[dict[str, float]]]] = {}
    for arm in settings.arms:
        for seed in range(settings.seeds):
            tick = time.perf_counter()
            if arm == "full":
                prm = _train(pool, features, settings.ensemble.model_copy(update={"seed": seed}))
                run = [
                    {
                        "budget": total_cost,
                        "labels": len(pool),
                        "cost": total_cost,
                        "f1": held_out_f1(prm, held, features),
                    }
                ]
            else:
                run = _curve(
                    arm, pool=pool, held=held, features=features, budgets=budgets, seed=seed, settings=settings
                )
            curves.setdefault(arm, []).append(run)
            say(
                f"{settings.pool} {arm} seed {seed}: F1 "
                + " ".join(f"{p['f1']:.3f}" for p in run)
                + f" ({time.perf_counter() - tick:.0f}s)"
            )
    arms = _summarise(curves, total_cost)
    n = min(1000, len(items))
    tick = time.perf_counter()
    _train(random.Random(0).sample(items, n), features, settings.ensemble)
    train_speed = {"solutions": n, "seconds": round(time.perf_counter() - tick, 2), "heads": settings.ensemble.heads}
    result: dict[str, Any] = {
        "pool": settings.pool,
        "pool_solutions": len(pool),
        "held_out_solutions": len(held),
        "cost_unit": "tokens" if settings.pool == "arith-mc" else "labels",
        "pool_cost": total_cost,
        "budgets": list(settings.budgets),
        "seeds": settings.seeds,
        "arms": arms,
        "train_speed": train_speed,
        "thresholds": settings.thresholds.__dict__,
        "order": settings.order,
        "ensemble": settings.ensemble.model_dump(mode="json"),
    }
    if settings.pool == TESTSET_POOL:
        levels = sorted({i.subset for i in items})
        result["test_set"] = {
            "questions_per_level": {v: len({i.question for i in items if i.subset == v}) for v in levels},
            "decided_solutions_per_level": {v: sum(i.subset == v for i in items) for v in levels},
        }
    elif settings.pool != "processbench":
        result["arith"] = {
            "levels": list(settings.arith_levels),
            "questions_per_level": settings.arith_questions,
            "decided_solutions_per_level": {
                level: sum(i.subset == level for i in items) for level in sorted({i.subset for i in items})
            },
        }
    if "actprm" in arms and "random" in arms and "full" in arms:
        act, rnd = arms["actprm"], arms["random"]
        result["target"] = {
            "actprm_label_fraction_to_95": act["label_fraction_to_95"],
            "reaches_95_with_half": act["label_fraction_to_95"] <= 0.5,
            # The first budget is the same random set for every arm: compared from the second on.
            "above_random_at_every_budget": all(a > r for a, r in zip(act["f1"][1:], rnd["f1"][1:], strict=True)),
        }
    if "actprm" in curves and "random" in curves and settings.seeds > 1:
        result["actprm_vs_random"] = _versus_random(curves, total_cost, settings.budgets)
        versus = result["actprm_vs_random"]
        say(f"{settings.pool}: actprm - random AUC {versus['auc']}: {versus['verdict']}")
    if out_dir is not None:
        result["png"] = str(_plot(result, out_dir / f"active-{settings.pool}.png"))
    result["seconds"] = round(time.perf_counter() - started, 1)
    return result


def _plot(result: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for arm, row in result["arms"].items():
        if arm == "full":
            ax.axhline(row["f1"], color="black", linestyle="--", linewidth=1, label=f"full ({row['f1']:.3f})")
            ax.axhline(0.95 * row["f1"], color="grey", linestyle=":", linewidth=1, label="95 % of full")
            continue
        x, y, s = np.array(row["share"]), np.array(row["f1"]), np.array(row["f1_std"])
        ax.plot(x, y, marker="o", label=f"{arm} (AUC {row['auc']:.3f})")
        ax.fill_between(x, y - s, y + s, alpha=0.12)
    unit = "generated tokens" if result["cost_unit"] == "tokens" else "labels"
    ax.set_xlabel(f"share of the pool's {unit} spent")
    ax.set_ylabel("held-out ProcessBench-protocol F1")
    ax.set_title(f"active learning on {result['pool']} ({result['pool_solutions']} pool, {result['seeds']} seeds)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def label_quality(settings: ActiveSettings, *, root: Path, say: Say = print, work: Any = None) -> dict[str, Any]:
    """Ensembles trained on the same number of MC, consensus (MC = exact) and exact labels of the
    ``arith-mc`` pool's pool half, scored against exact first errors on its held-out half (3 seeds)."""
    items = build_pool(
        "arith-mc",
        root=root,
        arith_questions=settings.arith_questions,
        arith_levels=settings.arith_levels,
        mc_limit=settings.mc_limit,
        threads=settings.threads,
        engine=settings.engine,
        say=say,
        work=work,
    )
    pool, held = split_pool(items)
    features = _load_features(items, settings, say, root)
    labelled = [i for i in pool if i.label_first_error is not None]
    agree = [i for i in labelled if i.label_first_error == i.first_error]
    n = len(agree)
    exact = [PoolItem(**{**i.__dict__, "label_first_error": i.first_error}) for i in pool]
    rows: dict[str, list[float]] = {"mc": [], "consensus": [], "exact": []}
    for seed in range(settings.seeds):
        rng = random.Random(seed)
        config = settings.ensemble.model_copy(update={"seed": seed})
        sets = {"mc": rng.sample(labelled, n), "consensus": agree, "exact": rng.sample(exact, n)}
        for name, chosen in sets.items():
            rows[name].append(held_out_f1(_train(chosen, features, config), held, features))
    quality = {name: {"f1": round(statistics.fmean(v), 4), "f1_std": round(_std(v), 4)} for name, v in rows.items()}
    out: dict[str, Any] = {
        "solutions_each": n,
        "mc_labelled": len(labelled),
        "mc_agreeing_with_exact": round(n / max(1, len(labelled)), 4),
        **quality,
    }
    say(f"label quality ({n} solutions each): " + ", ".join(f"{k} {v['f1']:.3f}" for k, v in quality.items()))
    return out
