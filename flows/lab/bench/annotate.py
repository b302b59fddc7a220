"""``prmloop bench annotate``: every annotation strategy on the same simulated incorrect solutions.

The simulator (:mod:`prmloop.models.simulator`) knows each solution's first error, so accuracy and cost
are exact. The papers' anchors: adaptive binary search used 66% fewer rollouts and 64% fewer tokens than
sequential search (EpicPRM Table 2); uncertainty-driven search 34% fewer rollouts and 40% fewer tokens
than adaptive binary search (UnPRM Table 2).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

from prmloop.models.annotation.bisection import BISECTION_STOPPING
from prmloop.models.annotation.estimate import ADAPTIVE_SAMPLING
from prmloop.models.annotation.strategies import (
    AnnotationStrategy,
    BinarySearch,
    SequentialSearch,
    StateTest,
    annotate,
    make_strategy,
)
from prmloop.models.simulator import SimulatedCompleter, SimulatedSolution, SimulatorConfig, simulate_solutions

__all__ = ["PAPER_ANCHORS", "SWEEP_STRATEGIES", "bench_annotate", "rule_of", "run_strategy", "variants"]

PAPER_ANCHORS = {
    "adaptive_binary_vs_sequential": {
        "rollouts_reduction": 0.66,
        "tokens_reduction": 0.64,
        "source": "EpicPRM Table 2",
    },
    "uncertainty_driven_vs_adaptive_binary": {
        "rollouts_reduction": 0.34,
        "tokens_reduction": 0.40,
        "source": "UnPRM Table 2",
    },
}

DEFAULT_SWEEP = (0.0, 0.25, 0.5, 0.75, 1.0)


def run_strategy(
    strategy: AnnotationStrategy, solutions: Sequence[SimulatedSolution], config: SimulatorConfig, seed: int
) -> dict[str, Any]:
    """Accuracy against the simulator's ground truth and summed cost of ``strategy`` on ``solutions``."""
    completer = SimulatedCompleter(solutions, config, seed=seed)
    hits = step_hits = steps = verified = rollouts = tokens = 0
    resolved = 0
    failures: dict[str, int] = {}
    started = time.perf_counter()
    for solution in solutions:
        result = annotate(solution.to_label(), strategy, [completer])
        truth = tuple(t < solution.first_error_step for t in range(solution.n_steps))
        steps += solution.n_steps
        if result.status == "labelled":
            resolved += 1
            hits += result.first_error_step == solution.first_error_step
            step_hits += sum(a == b for a, b in zip(result.labels, truth, strict=True))
        verified += result.cost.verified_steps
        rollouts += result.cost.rollouts
        tokens += result.cost.generated_tokens
        for kind, count in result.cost.failures.items():
            failures[kind] = failures.get(kind, 0) + count
    n = max(len(solutions), 1)
    return {
        "first_error_accuracy": round(hits / n, 4),
        "step_accuracy": round(step_hits / max(steps, 1), 4),
        "verified_steps": verified,
        "rollouts": rollouts,
        "generated_tokens": tokens,
        "resolved": round(resolved / n, 4),
        "failures": failures,
        "seconds": round(time.perf_counter() - started, 3),
    }


def _reduction(new: dict[str, Any], old: dict[str, Any], key: str) -> float:
    return round(1.0 - new[key] / old[key], 4) if old[key] else 0.0


def _ratios(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    ab, seq, ud = results["adaptive_binary"], results["sequential"], results["uncertainty_driven"]
    return {
        "adaptive_binary_vs_sequential": {
            "rollouts_reduction": _reduction(ab, seq, "rollouts"),
            "tokens_reduction": _reduction(ab, seq, "generated_tokens"),
        },
        "uncertainty_driven_vs_adaptive_binary": {
            "rollouts_reduction": _reduction(ud, ab, "rollouts"),
            "tokens_reduction": _reduction(ud, ab, "generated_tokens"),
            "first_error_accuracy_delta": round(ud["first_error_accuracy"] - ab["first_error_accuracy"], 4),
        },
    }


def variants() -> dict[str, AnnotationStrategy]:
    """Every strategy the bench compares, by report name.

    The papers' four as published (``sequential`` and ``binary`` on Math-Shepherd's hard rule, N=48);
    the same two searches under adaptive binary search's rule (``@relative``: ``MC(s_t) <= 0.5
    MC(s_0)``, as many rollouts per state as ``s_0`` took), so that accuracy differences between
    searches come from the search alone; the papers' two MC-PPL searches with sequential stopping
    (``+stop``); and the probabilistic bisection (its own rule is the relative one, with stopping),
    also without its boundary check (``@no_check``, probes settled at 98 % as ``+stop``).
    """
    stop = BISECTION_STOPPING
    relative = StateTest("relative")
    return {
        "sequential": make_strategy("sequential"),
        "binary": make_strategy("binary"),
        "adaptive_binary": make_strategy("adaptive_binary"),
        "uncertainty_driven": make_strategy("uncertainty_driven"),
        "sequential@relative": make_strategy("sequential", test=relative, weighting="inv_ppl"),
        "binary@relative": make_strategy("binary", test=relative, weighting="inv_ppl"),
        "binary@relative+stop": make_strategy("binary", test=StateTest("relative", stopping=stop), weighting="inv_ppl"),
        "adaptive_binary+stop": make_strategy("adaptive_binary", stopping=stop),
        "uncertainty_driven+stop": make_strategy("uncertainty_driven", stopping=stop),
        "bisection": make_strategy("bisection"),
        "bisection@no_check": make_strategy("bisection", stopping=stop, check=None),
        "bisection@paper_s0": make_strategy("bisection", sampling=ADAPTIVE_SAMPLING),
    }


def rule_of(strategy: AnnotationStrategy) -> str:
    """Which state-labelling rule ``strategy`` used, in words (the bench prints it per strategy)."""
    params = strategy.parameters()
    if isinstance(strategy, SequentialSearch | BinarySearch):
        test = strategy.test or StateTest("hard", n=strategy.n)
        return test.describe()
    stopping = params.get("stopping")
    base = f"MC <= {params.get('alpha', 0.5)} MC(s_0), N as s_0"
    if strategy.name == "uncertainty_driven":
        base = f"MC < {params.get('tau_scale', 1.0)} MC(s_0), adaptive N per state"
    if stopping:
        stop = f"batch {stopping['batch']}, confidence {stopping['confidence']}, at most {stopping['n_max']}"
        base += f", sequential stop ({stop})"
    check = params.get("check")
    if check:
        base += f"; answer's two states re-settled at {check['confidence']} (at most {check['n_max']})"
    return base


SWEEP_STRATEGIES = (
    "adaptive_binary",
    "uncertainty_driven",
    "adaptive_binary+stop",
    "bisection",
    "bisection@no_check",
    "bisection@paper_s0",
)


def bench_annotate(
    n_solutions: int = 800,
    quick: bool = False,
    correlation: float = 0.7,
    seed: int = 0,
    *,
    sweep: Sequence[float] = DEFAULT_SWEEP,
    compare_weightings: bool = True,
    config: SimulatorConfig | None = None,
) -> dict[str, Any]:
    """Run every strategy (:func:`variants`) on the same ``n_solutions`` simulated incorrect solutions
    (100 with ``quick``).

    Returns ``{"strategies": {name: {rule, first_error_accuracy, step_accuracy, verified_steps, rollouts,
    generated_tokens, tokens_vs_adaptive, ...}}, "ratios": ..., "paper_anchors": ..., "correlation_sweep":
    [...], "weighting": ...}``. ``correlation`` is the simulator's uncertainty-error correlation (the
    chance the error step has the largest Δu); ``sweep`` re-runs :data:`SWEEP_STRATEGIES` at other
    correlations; ``compare_weightings`` runs the MC-PPL searches with each rollout weight.
    """
    n = 100 if quick else n_solutions
    base = dataclasses.replace(config or SimulatorConfig(), uncertainty_correlation=correlation)
    solutions = simulate_solutions(n, base, seed)
    chosen = variants()
    strategies = {
        name: {"rule": rule_of(strategy), **run_strategy(strategy, solutions, base, seed)}
        for name, strategy in chosen.items()
    }
    _tokens_vs(strategies, "adaptive_binary")
    out: dict[str, Any] = {
        "strategies": strategies,
        "ratios": _ratios(strategies),
        "paper_anchors": PAPER_ANCHORS,
        "simulator": {**dataclasses.asdict(base), "n_solutions": n, "seed": seed},
    }
    if sweep:
        rows = []
        for rho in sweep:
            cfg = dataclasses.replace(base, uncertainty_correlation=rho)
            sols = simulate_solutions(n, cfg, seed)
            per = {name: run_strategy(chosen[name], sols, cfg, seed) for name in SWEEP_STRATEGIES}
            _tokens_vs(per, "adaptive_binary")
            rows.append(
                {
                    "correlation": rho,
                    **{
                        name: {
                            key: row[key]
                            for key in ("first_error_accuracy", "rollouts", "generated_tokens", "tokens_vs_adaptive")
                        }
                        for name, row in per.items()
                    },
                }
            )
        out["correlation_sweep"] = rows
    if compare_weightings:
        out["weighting"] = {
            name: {
                weighting: {
                    key: run_strategy(make_strategy(name, weighting=weighting), solutions, base, seed)[key]
                    for key in ("first_error_accuracy", "step_accuracy", "rollouts")
                }
                for weighting in ("inv_ppl", "log_ppl", "count")
            }
            for name in ("adaptive_binary", "uncertainty_driven")
        }
    return out


def _tokens_vs(results: dict[str, dict[str, Any]], reference: str) -> None:
    ref = results[reference]["generated_tokens"]
    for row in results.values():
        row["tokens_vs_adaptive"] = round(row["generated_tokens"] / ref, 4) if ref else None
