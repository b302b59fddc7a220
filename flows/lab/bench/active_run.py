"""``prmloop bench active`` over several pools: one sampling engine for all, and a budget for building.

Before each pool, :func:`~prmloop.flows.pools.cost.estimate_pool` says what building what
the cache lacks (sampling, MC labels, features) will cost; with a budget (``--max-build-minutes``,
five minutes under ``--quick``) a pool that would not fit in what is left of it is skipped, saying so
and what it would cost, and the run goes on with the others. If none is left, the run is refused.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from prmloop.flows.lab.bench.active import TESTSET_POOL, ActiveSettings, label_quality, run_active
from prmloop.flows.pools.build import PoolWork
from prmloop.flows.pools.cost import estimate_pool
from prmloop.flows.pools.sampling import describe_cost

__all__ = ["OverBudget", "bench_active"]


class OverBudget(ValueError):
    """No pool can be built within the budget (the message says what each would cost)."""


def bench_active(
    pools: Sequence[str],
    base: ActiveSettings,
    *,
    root: Path,
    out_dir: Path | None,
    budget_minutes: float | None = None,
    with_label_quality: bool = True,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run :func:`~prmloop.flows.lab.bench.active.run_active` on each of ``pools`` (``base`` with its
    ``pool`` replaced); returns ``{pool: result, ...}`` (and ``label_quality`` after ``arith-mc``,
    ``skipped`` for pools over the budget).

    Raises:
        OverBudget: every pool was over the budget.
    """
    results: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    left = None if budget_minutes is None else budget_minutes * 60
    work = PoolWork(base.engine, base.threads, say)
    try:
        for name in pools:
            settings = replace(base, pool=name)
            if name == TESTSET_POOL:
                say(f"{name}: the shipped test set's solutions and features: no model work to build it")
                results[name] = run_active(settings, root=root, out_dir=out_dir, say=say, work=work)
                continue
            cost = estimate_pool(
                name,
                root=root,
                arith_questions=settings.arith_questions,
                mc_limit=settings.mc_limit,
                arith_levels=settings.arith_levels,
                threads=settings.threads,
                engine=settings.engine,
                spec=settings.spec,
                work=work,
            )
            say(cost["line"])
            if left is not None and cost["seconds"] > left:
                skipped[name] = (
                    f"{cost['line']}: over what is left of the build budget of {budget_minutes:g} min "
                    f"({describe_cost(left)}); --max-build-minutes {math.ceil(cost['seconds'] / 60) + 1} builds "
                    "it once (cached after)"
                )
                say(f"skipped {skipped[name]}")
                continue
            if left is not None:
                left -= cost["seconds"]
            results[name] = run_active(settings, root=root, out_dir=out_dir, say=say, work=work)
            if name == "arith-mc" and with_label_quality:
                results["label_quality"] = label_quality(settings, root=root, say=say, work=work)
    finally:
        work.close()
    if not results:
        raise OverBudget(f"nothing to run: {'; '.join(skipped.values())}")
    if skipped:
        results["skipped"] = skipped
    return results
