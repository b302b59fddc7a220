"""``prmloop bench learn``: are the loop's labels worth their keep? Three arms on the test set.

From a loop's store (``prmloop run`` or ``make demo``), at budgets doubling up to the labels it accepted,
the ensemble PRM the loop retrains (the same features and heads) is trained on:

- **loop**: the first N labels consensus accepted, as the loop trained on them;
- **oracle**: the same N solutions with the curriculum checker's exact first errors (where it decides):
  what the loop's choice of solutions is worth with perfect labels, so loop - oracle is what the
  labels lose, oracle - random what the choice wins;
- **random**: N solutions drawn at random from every solution the loop sampled (skipped, rejected and
  unlabelled ones too), with exact labels: random order with every solution labelled.

Each arm is trained with ``seeds`` head seeds (and, for random, that many draws) and scored on the
shipped test set (:mod:`prmloop.flows.pools.testset`), which nothing trains or promotes on: the F1 pools
the seeds' predictions and its 95 % interval is a bootstrap over test questions
(:func:`prmloop.models.prm.scoreboard.f1_interval`). The x axes are accepted labels and the generated
tokens the loop had spent when its N-th label was accepted. Beside the curves: where the loop's labels
fell (levels, questions, first-error positions), how often consensus agrees with the checker on the
labels it kept, and what it rejected.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["LearnRow", "bench_learn", "budgets_for", "random_draws", "read_loop_store"]

Say = Callable[[str], None]


@dataclass(frozen=True)
class LearnRow:
    """One solution the loop sampled, with what the loop and the checker say of it."""

    solution_id: str
    question_id: str
    problem: str
    steps: tuple[str, ...]
    correct: bool | None
    sampled_at: float
    #: cumulative generated tokens of the loop when this solution's label was accepted (or sampled)
    tokens_by_then: int
    #: the accepted label's first error (-1: none), None: not accepted
    accepted_first_error: int | None
    accepted_at: float | None
    rejected: bool
    #: the checker's first error (-1: none), None: it does not decide
    exact_first_error: int | None


_EVENTS = """
SELECT event_type, epoch(occurred_at) AS at, payload
FROM events
WHERE event_type IN ('SolutionSampled', 'LabelsAccepted', 'LabelsRejected', 'StepsLabeled', 'StepsJudged')
ORDER BY occurred_at, event_id
"""


def read_loop_store(db: Any) -> list[LearnRow]:
    """Every sampled curriculum solution of the store with its accepted label, if any, and its exact one."""
    from prmloop.flows.pools.build import decided
    from prmloop.store.tables.duck import query

    solutions: dict[str, dict[str, Any]] = {}
    accepted: dict[str, tuple[int, float, int]] = {}
    rejected: set[str] = set()
    tokens = 0
    for event_type, at, payload in query(db, _EVENTS).rows:
        p = json.loads(payload) if isinstance(payload, str) else payload
        if event_type == "SolutionSampled":
            tokens += int(p.get("completion_tokens") or 0)
            solutions.setdefault(p["solution_id"], {**p, "at": float(at), "tokens": tokens})
        elif event_type in ("StepsLabeled", "StepsJudged"):
            tokens += int(((p.get("cost") or {}).get("generated_tokens")) or 0)
        elif event_type == "LabelsAccepted" and p["solution_id"] not in accepted:
            first = p.get("first_error_step")
            accepted[p["solution_id"]] = (-1 if first is None else int(first), float(at), tokens)
        elif event_type == "LabelsRejected":
            rejected.add(p["solution_id"])
    rows = []
    for sid, p in solutions.items():
        if not str(p["question_id"]).startswith("arith/") or not p.get("problem") or not p.get("steps"):
            continue
        truth = decided({"question_id": p["question_id"], "steps": list(p["steps"]), "correct": p.get("correct")})
        label = accepted.get(sid)
        rows.append(
            LearnRow(
                solution_id=sid,
                question_id=p["question_id"],
                problem=p["problem"],
                steps=tuple(p["steps"]),
                correct=p.get("correct"),
                sampled_at=p["at"],
                tokens_by_then=label[2] if label else p["tokens"],
                accepted_first_error=label[0] if label else None,
                accepted_at=label[1] if label else None,
                rejected=sid in rejected and label is None,
                exact_first_error=truth,
            )
        )
    return rows


def budgets_for(labels: int, first: int = 15) -> list[int]:
    """Doubling budgets from ``first`` up to ``labels``, ending on ``labels`` itself."""
    out = []
    n = first
    while n < labels:
        out.append(n)
        n *= 2
    return [*out, labels] if labels >= 1 else []


def random_draws(pool: list[Any], n: int, seeds: int) -> list[list[Any]]:
    """The random arm's ``seeds`` draws of ``n`` solutions (all of them where fewer), one per head seed:
    each seed trains on a draw of its own, so one unlucky draw does not decide the arm."""
    return [random.Random(f"{n}/{seed}").sample(pool, min(n, len(pool))) for seed in range(seeds)]


def _fe(first: int | None) -> int:
    """A first error as a number: -1 for none (``None`` too, where the caller kept only labelled rows)."""
    return -1 if first is None else int(first)


def _level(question_id: str) -> str:
    parts = question_id.split("/")
    return parts[1] if len(parts) == 4 else "other"


def _position(first: int) -> str:
    return "none" if first < 0 else (str(first + 1) if first < 3 else "4+")


def label_spread(rows: list[LearnRow]) -> dict[str, Any]:
    """Where the loop's accepted labels fell, and consensus against the checker."""
    kept = sorted((r for r in rows if r.accepted_first_error is not None), key=lambda r: r.accepted_at or 0.0)
    checked = [r for r in kept if r.exact_first_error is not None]
    agree = sum(r.accepted_first_error == r.exact_first_error for r in checked)
    rejected = [r for r in rows if r.rejected]
    rejected_checked = [r for r in rejected if r.exact_first_error is not None]
    return {
        "sampled": len(rows),
        "sampled_by_level": dict(sorted(Counter(_level(r.question_id) for r in rows).items())),
        "accepted": len(kept),
        "accepted_by_level": dict(sorted(Counter(_level(r.question_id) for r in kept).items())),
        "accepted_questions": len({r.question_id for r in kept}),
        "sampled_questions": len({r.question_id for r in rows}),
        "accepted_first_error_position": dict(
            sorted(Counter(_position(_fe(r.accepted_first_error)) for r in kept).items())
        ),
        "exact_first_error_position_all_sampled": dict(
            sorted(Counter(_position(r.exact_first_error) for r in rows if r.exact_first_error is not None).items())
        ),
        "accepted_checked_by_exact": len(checked),
        "accepted_agree_with_exact": round(agree / len(checked), 4) if checked else None,
        "accepted_with_error_share": round(sum(_fe(r.accepted_first_error) >= 0 for r in kept) / len(kept), 4)
        if kept
        else None,
        "rejected": len(rejected),
        "rejected_exact_with_error_share": round(
            sum(_fe(r.exact_first_error) >= 0 for r in rejected_checked) / len(rejected_checked), 4
        )
        if rejected_checked
        else None,
        "unlabelled": len(rows) - len(kept) - len(rejected),
    }


def bench_learn(
    db: Any,
    *,
    seeds: int = 3,
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
    from prmloop.store.settings import StateSettings

    started = time.monotonic()
    rows = read_loop_store(db)
    loop_order = sorted((r for r in rows if r.accepted_first_error is not None), key=lambda r: r.accepted_at or 0.0)
    exact_pool = [r for r in rows if r.exact_first_error is not None]
    if len(loop_order) < 2:
        raise ValueError(f"{db}: {len(loop_order)} accepted labels; run the loop longer (`prmloop run --minutes 15`)")
    budgets = budgets or budgets_for(len(loop_order))
    spec = FeatureSpec()
    cache_dir = StateSettings().features_dir
    seed_features(FeatureCache(cache_dir, spec))
    manifest, test = test_items(threads=threads, say=say)
    say(
        f"bench learn: {len(loop_order)} accepted labels, {len(rows)} sampled solutions ({len(exact_pool)} the "
        f"checker decides); budgets {budgets}; {seeds} seeds; test set {manifest['file']} ({len(test)} solutions)"
    )
    test_features: dict[str, np.ndarray] | None = None

    def score(examples: list[Any], per_seed: list[list[Any]] | None = None) -> dict[str, Any]:
        """Trained with each head seed, on ``examples`` or on ``per_seed[seed]`` (the random arm's draws)."""
        nonlocal test_features
        predicted: list[int] = []
        for seed in range(seeds):
            config = EnsembleConfig(threads=threads or 1, seed=seed)
            examples = per_seed[seed] if per_seed is not None else examples
            prm, _ = train_ensemble_prm(examples, spec=spec, config=config, cache_dir=cache_dir, threads=threads)
            if test_features is None:
                vectors = prm.features([i.problem for i in test], [list(i.steps) for i in test])
                test_features = dict(zip([i.key for i in test], vectors, strict=True))
            predicted += predict_first_errors(prm, test, test_features)
        report = items_f1_report(predicted, test, seeds)
        by_level = {k: v["f1"] for k, v in report.items() if k != "all"}
        return {"f1": report["all"]["f1"], "lo": report["all"]["lo"], "hi": report["all"]["hi"], "by_level": by_level}

    arms: dict[str, list[dict[str, Any]]] = {"loop": [], "oracle": [], "random": []}
    for n in budgets:
        chosen = loop_order[:n]
        tokens = chosen[-1].tokens_by_then
        loop_examples = [example_at(r.problem, r.steps, _fe(r.accepted_first_error)) for r in chosen]
        oracle = [r for r in chosen if r.exact_first_error is not None]
        arms["loop"].append({"labels": n, "tokens": tokens, **score(loop_examples)})
        arms["oracle"].append(
            {
                "labels": n,
                "exact_labels": len(oracle),
                "tokens": tokens,
                **score([example_at(r.problem, r.steps, _fe(r.exact_first_error)) for r in oracle]),
            }
        )
        draws = random_draws(exact_pool, n, seeds)
        exact = [[example_at(r.problem, r.steps, _fe(r.exact_first_error)) for r in drawn] for drawn in draws]
        arms["random"].append({"labels": len(draws[0]), **score(exact[0], per_seed=exact)})
        say(
            f"bench learn: {n} labels: loop {arms['loop'][-1]['f1']}, oracle {arms['oracle'][-1]['f1']}, "
            f"random {arms['random'][-1]['f1']} ({time.monotonic() - started:.0f}s)"
        )
    return {
        "bench": "learn",
        "store": str(db),
        "test_set": f"{manifest['file']}@{manifest['sha256'][:12]}",
        "test_solutions": len(test),
        "seeds": seeds,
        "budgets": budgets,
        "arms": arms,
        "spread": label_spread(rows),
        "seconds": round(time.monotonic() - started, 1),
    }


def write_json(path: Path, result: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
