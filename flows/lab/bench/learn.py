"""``prmloop bench learn``: are the loop's labels worth their keep? Three arms on the test set.

From a loop's store (``prmloop run`` or ``make demo``), at budgets doubling up to the labels it accepted,
the ensemble PRM the loop retrains (the same features and heads) is trained on:

- **loop**: the first N labels consensus accepted, as the loop trained on them;
- **oracle**: the same N solutions with the curriculum checker's exact first errors (where it decides):
  what the loop's choice of solutions is worth with perfect labels, so loop - oracle is what the
  labels lose, oracle - random what the choice wins;
- **random**: N solutions drawn at random from every solution the loop sampled (skipped, rejected and
  unlabelled ones too), with exact labels: random order with every solution labelled. ``draws`` draws
  (20 by default), each trained like the other arms.

Each training set is trained with the same ``seeds`` head seeds and scored on the shipped test set
(:mod:`prmloop.flows.pools.testset`), which nothing trains or promotes on: the F1 pools the seeds'
predictions (random's is the mean of its draws' F1s) and its 95 % interval is a bootstrap over test questions
(:func:`prmloop.models.prm.scoreboard.f1_interval`). That interval is about one model; at a few labels
the training set matters far more (:mod:`prmloop.models.prm.scoreboard`), and the loop's labels are one
training set. So the random arm also gives its draws' spread (``draw_f1``: 2.5 %, 50 %, 97.5 %, sd), and
the loop and oracle arms their rank among the draws (``random_rank``: the percentage of random draws
they beat) and ``vs_random`` (``above``, ``within`` or ``below`` the draws' 95 % range).

The x axes are accepted labels and generated tokens: for the loop and the oracle, the tokens the loop
had spent (solutions, rollouts, judge) when its N-th label was accepted; for random order, the drawn
solutions' own tokens and what labelling each cost (:func:`labelling_cost`), averaged over the draws.
``tokens_to_match`` says where the loop reaches random order's final F1 and with what share of its
tokens. Beside the curves: where the loop's labels fell (levels, questions, first-error positions),
how often consensus agrees with the checker on the labels it kept, and what it rejected. Reading the
store is :mod:`prmloop.flows.lab.bench.learn_store`; this module trains and scores the arms.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from prmloop.flows.lab.bench.learn_store import (
    LearnRow,
    accepted_labels,
    first_error,
    label_spread,
    read_loop_store,
)

__all__ = [
    "across_runs",
    "bench_learn",
    "bench_learn_runs",
    "budgets_for",
    "draw_f1s",
    "labelling_cost",
    "random_draws",
    "random_order_tokens",
    "random_summary",
    "tokens_to_match",
]

Say = Callable[[str], None]


def labelling_cost(rows: list[LearnRow]) -> Callable[[LearnRow], float]:
    """What labelling one solution costs in generated tokens, as the loop paid it: a solution its annotator
    labelled costs what it cost; any other costs the mean of those the annotator labelled with the same
    outcome (a right answer is labelled without rollouts, a wrong one needs them), or of all it labelled
    where none had that outcome. Random order labels every solution, so its cost is estimated this way."""
    labelled = [r for r in rows if r.mc_labelled]
    overall = _mean([float(r.label_tokens) for r in labelled]) or 0.0
    by_outcome = {
        outcome: _mean([float(r.label_tokens) for r in labelled if r.correct is outcome])
        for outcome in (True, False, None)
    }

    def cost(row: LearnRow) -> float:
        if row.mc_labelled:
            return float(row.label_tokens)
        known = by_outcome.get(row.correct)
        return overall if known is None else known

    return cost


def random_order_tokens(drawn: list[list[LearnRow]], cost: Callable[[LearnRow], float]) -> int:
    """The generated tokens of random order with every solution labelled, averaged over the draws: each
    drawn solution's own tokens and its labelling cost."""
    if not drawn:
        return 0
    return round(sum(sum(r.own_tokens + cost(r) for r in d) for d in drawn) / len(drawn))


def tokens_to_match(arms: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Where the loop reaches random order's final F1 (the draws' mean at the largest budget), and with
    what share of random order's tokens there: ``ratio`` under 1 means the loop needed fewer; None where
    the loop never reached it (within the budgets benched)."""
    final = arms["random"][-1]
    target = final["f1"]
    reached = next((a for a in arms["loop"] if target is not None and a["f1"] is not None and a["f1"] >= target), None)
    ratio = round(reached["tokens"] / final["tokens"], 3) if reached and final.get("tokens") else None
    return {
        "random_final_f1": target,
        "random_labels": final["labels"],
        "random_tokens": final.get("tokens"),
        "loop_labels": reached["labels"] if reached else None,
        "loop_tokens": reached["tokens"] if reached else None,
        "ratio": ratio,
    }


def budgets_for(labels: int, first: int = 15) -> list[int]:
    """Doubling budgets from ``first`` up to ``labels``, ending on ``labels`` itself."""
    out = []
    n = first
    while n < labels:
        out.append(n)
        n *= 2
    return [*out, labels] if labels >= 1 else []


def random_draws(pool: list[Any], n: int, draws: int) -> list[list[Any]]:
    """The random arm's ``draws`` draws of ``n`` solutions (all of them where fewer), the same on every
    run: many draws, so one unlucky draw does not decide the arm and their spread can be read."""
    return [random.Random(f"{n}/{draw}").sample(pool, min(n, len(pool))) for draw in range(draws)]


def draw_f1s(per_draw: list[list[int | None]], truth: list[int]) -> list[float]:
    """Each draw's F1 on its own predictions (draws with no F1, one kind of solution missing, left out)."""
    from prmloop.models.processbench import processbench_f1

    return [f for f in (processbench_f1(p, truth)["f1"] for p in per_draw) if f is not None]


def _mean(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return round(sum(kept) / len(kept), 4) if kept else None


def random_summary(per_draw: list[list[int | None]], truth: list[int], levels: list[str]) -> dict[str, Any]:
    """The random arm at one budget from each draw's test predictions (``truth`` and ``levels`` per
    prediction): ``f1`` the mean of the draws' F1s, ``lo``/``hi`` their 95 % range (the spread over draws,
    not over test questions), ``by_level`` the mean per level, ``draw_f1`` the spread, and ``pooled_f1``
    the F1 of every draw's predictions pooled, which overstates a random choice (see
    :class:`~prmloop.models.prm.scoreboard.DrawSpread`) and is kept for the tables before it."""
    from prmloop.models.prm.scoreboard import draw_spread
    from prmloop.models.processbench import processbench_f1

    f1s = draw_f1s(per_draw, truth)
    by_level: dict[str, float | None] = {}
    for level in sorted(set(levels)):
        chosen = [i for i, v in enumerate(levels) if v == level]
        by_level[level] = _mean(draw_f1s([[p[i] for i in chosen] for p in per_draw], [truth[i] for i in chosen]))
    pooled = processbench_f1([p for block in per_draw for p in block], truth * len(per_draw))["f1"]
    spread = draw_spread(f1s) if f1s else None
    return {
        "f1": round(spread.mean, 4) if spread else None,
        "lo": round(spread.lo, 4) if spread else None,
        "hi": round(spread.hi, 4) if spread else None,
        "by_level": by_level,
        "draw_f1": spread.as_dict() if spread else None,
        "pooled_f1": None if pooled is None else round(pooled, 4),
    }


def bench_learn(
    db: Any,
    *,
    seeds: int = 3,
    draws: int = 20,
    budgets: list[int] | None = None,
    threads: int | None = None,
    say: Say = lambda _line: None,
) -> dict[str, Any]:
    """The three arms at every budget (see the module docstring): one JSON-able dict."""
    import numpy as np

    from prmloop.flows.pools.testset import seed_features, test_items
    from prmloop.models.prm.ensemble import EnsembleConfig
    from prmloop.models.prm.ensemble_prm import train_ensemble_prm
    from prmloop.models.prm.features import FeatureCache, FeatureSpec
    from prmloop.models.prm.pool_items import example_at, items_f1_report, predict_first_errors
    from prmloop.models.prm.scoreboard import draw_spread, rank_among
    from prmloop.store.settings import StateSettings

    started = time.monotonic()
    rows = read_loop_store(db)
    loop_order = sorted((r for r in rows if r.accepted_first_error is not None), key=lambda r: r.accepted_at or 0.0)
    exact_pool = [r for r in rows if r.exact_first_error is not None]
    if len(loop_order) < 2:
        raise ValueError(f"{db}: {len(loop_order)} accepted labels; run the loop longer (`prmloop run --minutes 15`)")
    cost = labelling_cost(rows)
    budgets = budgets or budgets_for(len(loop_order))
    over = [n for n in budgets if n > len(loop_order) or n < 1]
    if over:
        raise ValueError(
            f"{db}: budget {over[0]} is not within the {len(loop_order)} labels it accepted; "
            f"choose --budgets up to {len(loop_order)}"
        )
    spec = FeatureSpec()
    cache_dir = StateSettings().features_dir
    seed_features(FeatureCache(cache_dir, spec))
    manifest, test = test_items(threads=threads, say=say)
    say(
        f"bench learn: {len(loop_order)} accepted labels, {len(rows)} sampled solutions ({len(exact_pool)} the "
        f"checker decides); budgets {budgets}; {seeds} seeds, {draws} random draws; test set {manifest['file']} "
        f"({len(test)} solutions)"
    )
    test_features: dict[str, np.ndarray] | None = None
    truth = [i.first_error for i in test] * seeds
    levels = [i.subset for i in test] * seeds

    def predict(examples: list[Any]) -> list[int | None]:
        """Trained on ``examples`` with each head seed: the seeds' test predictions, one block each."""
        nonlocal test_features
        predicted: list[int | None] = []
        for seed in range(seeds):
            config = EnsembleConfig(threads=threads or 1, seed=seed)
            prm, _ = train_ensemble_prm(examples, spec=spec, config=config, cache_dir=cache_dir, threads=threads)
            if test_features is None:
                vectors = prm.features([i.problem for i in test], [list(i.steps) for i in test])
                test_features = dict(zip([i.key for i in test], vectors, strict=True))
            predicted += predict_first_errors(prm, test, test_features)
        return predicted

    def report(predicted: list[int | None], blocks: int) -> dict[str, Any]:
        out = items_f1_report(predicted, test, blocks)
        by_level = {k: v["f1"] for k, v in out.items() if k != "all"}
        return {"f1": out["all"]["f1"], "lo": out["all"]["lo"], "hi": out["all"]["hi"], "by_level": by_level}

    def against(arm: dict[str, Any], f1s: list[float]) -> dict[str, Any]:
        if arm["f1"] is None or not f1s:
            return {**arm, "random_rank": None, "vs_random": None}
        return {**arm, "random_rank": rank_among(arm["f1"], f1s), "vs_random": draw_spread(f1s).verdict(arm["f1"])}

    arms: dict[str, list[dict[str, Any]]] = {"loop": [], "oracle": [], "random": []}
    for n in budgets:
        chosen = loop_order[:n]
        tokens = chosen[-1].tokens_by_then
        loop_examples = [example_at(r.problem, r.steps, first_error(r.accepted_first_error)) for r in chosen]
        oracle = [r for r in chosen if r.exact_first_error is not None]
        drawn = random_draws(exact_pool, n, draws)
        per_draw = [
            predict([example_at(r.problem, r.steps, first_error(r.exact_first_error)) for r in d]) for d in drawn
        ]
        arms["random"].append(
            {
                "labels": len(drawn[0]),
                "tokens": random_order_tokens(drawn, cost),
                **random_summary(per_draw, truth, levels),
            }
        )
        spread = arms["random"][-1]["draw_f1"]
        random_f1s = draw_f1s(per_draw, truth)
        loop = {"labels": n, "tokens": tokens, **report(predict(loop_examples), seeds)}
        arms["loop"].append(against(loop, random_f1s))
        exact_same = [example_at(r.problem, r.steps, first_error(r.exact_first_error)) for r in oracle]
        oracle_arm = {"labels": n, "exact_labels": len(oracle), "tokens": tokens, **report(predict(exact_same), seeds)}
        arms["oracle"].append(against(oracle_arm, random_f1s))
        loop_line, random_line = arms["loop"][-1], arms["random"][-1]
        spread_words = f" (draws {spread['lo']:.3f}-{spread['hi']:.3f})" if spread else ""
        say(
            f"bench learn: {n} labels: loop {loop_line['f1']} (beats {loop_line['random_rank']} % of random draws, "
            f"{loop_line['vs_random']} their 95 % range), oracle {arms['oracle'][-1]['f1']}, random draws' mean "
            f"{random_line['f1']}{spread_words}; tokens: loop {loop_line['tokens']:,}, random order "
            f"{random_line['tokens']:,} ({time.monotonic() - started:.0f}s)"
        )
    return {
        "bench": "learn",
        "store": str(db),
        "test_set": f"{manifest['file']}@{manifest['sha256'][:12]}",
        "test_solutions": len(test),
        "seeds": seeds,
        "draws": draws,
        "budgets": budgets,
        "arms": arms,
        "tokens_to_match": tokens_to_match(arms),
        "spread": label_spread(rows),
        "seconds": round(time.monotonic() - started, 1),
    }


def across_runs(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per budget, the loops of several stores against their random draws: the mean F1 of each arm, every
    run's rank of the loop among its own random draws and their mean, and how many runs fell above, within
    or below the draws' 95 % range. One run is one draw of the loop; several tell its spread."""
    out = []
    for i, n in enumerate(results[0]["budgets"]):
        loops = [r["arms"]["loop"][i] for r in results]
        ranks = [a["random_rank"] for a in loops if a["random_rank"] is not None]

        out.append(
            {
                "labels": n,
                "runs": len(results),
                "loop_f1_mean": _mean([a["f1"] for a in loops]),
                "oracle_f1_mean": _mean([r["arms"]["oracle"][i]["f1"] for r in results]),
                "random_f1_mean": _mean([r["arms"]["random"][i]["f1"] for r in results]),
                "loop_tokens_mean": _mean([a.get("tokens") for a in loops]),
                "random_tokens_mean": _mean([r["arms"]["random"][i].get("tokens") for r in results]),
                "loop_ranks": ranks,
                "loop_rank_mean": _mean(ranks),
                "loop_vs_random": {v: sum(a["vs_random"] == v for a in loops) for v in ("above", "within", "below")},
            }
        )
    return out


def bench_learn_runs(
    dbs: list[Any], *, budgets: list[int] | None = None, say: Say = lambda _line: None, **options: Any
) -> dict[str, Any]:
    """:func:`bench_learn` on one store, or on each of several loops' stores (runs of other ``--seed``s,
    say) at the budgets they all reached, with :func:`across_runs` beside the runs."""
    if len(dbs) == 1:
        return bench_learn(dbs[0], budgets=budgets, say=say, **options)
    counts = {str(db): accepted_labels(db) for db in dbs}
    fewest = min(counts.values())
    chosen = budgets or budgets_for(fewest)
    results = []
    for k, db in enumerate(dbs, 1):
        say(f"bench learn: run {k} of {len(dbs)}: {db} ({counts[str(db)]} accepted labels)")
        results.append(bench_learn(db, budgets=chosen, say=say, **options))
    return {
        "bench": "learn",
        "stores": [str(db) for db in dbs],
        "budgets": chosen,
        "seeds": results[0]["seeds"],
        "draws": results[0]["draws"],
        "test_set": results[0]["test_set"],
        "across_runs": across_runs(results),
        "tokens_to_match": [r["tokens_to_match"] for r in results],
        "runs": results,
        "seconds": round(sum(r["seconds"] for r in results), 1),
    }


def write_json(path: Path, result: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
