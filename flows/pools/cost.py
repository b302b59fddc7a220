"""What building a pool still costs, said before anything starts: solutions to sample, MC labels to
compute, features to extract, and the seconds that takes at the speeds measured on this machine
(:func:`~prmloop.flows.pools.sampling.speed`)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from prmloop.flows.pools import build
from prmloop.flows.pools.build import (
    POOLS,
    arith_file,
    arith_todo,
    decided,
    mc_chosen,
    mc_file,
    processbench_items,
    question_index,
    read_lines,
    tokens_per_solution,
)
from prmloop.flows.pools.sampling import (
    MC_TOKENS_PER_SOLUTION,
    Sampler,
    describe_cost,
    speed,
)
from prmloop.models.prm.pool_items import PoolItem

__all__ = ["DECIDED_SHARE", "estimate_pool"]


#: Share of sampled curriculum solutions the checker decides, until a cache says its own.
DECIDED_SHARE = 0.4


def estimate_pool(
    name: str,
    *,
    root: Path,
    arith_questions: int = 160,
    mc_limit: int = 240,
    arith_seed: int = 0,
    arith_levels: tuple[int, ...] = (1, 2, 3, 4, 5),
    threads: int | None = None,
    engine: str = "auto",
    spec: Any = None,
    work: Any = None,
) -> dict[str, Any]:
    """What building pool ``name`` and its features still costs, before anything starts: solutions to
    sample, MC labels to compute, features to extract, and the seconds all that takes at the speeds
    :func:`speed` knows (plus starting an engine, unless ``work``'s runs already). Starts nothing."""
    from prmloop.models.prm.features import FeatureCache, FeatureSpec, solution_key
    from prmloop.store.settings import StateSettings

    if name not in POOLS:
        raise ValueError(f"unknown pool {name!r}; choose one of {', '.join(POOLS)}")
    out: dict[str, Any] = {
        "pool": name,
        "sample_solutions": 0,
        "sample_tokens": 0.0,
        "mc_solutions": 0,
        "mc_tokens": 0.0,
    }
    seconds, parts, to_come = 0.0, [], 0.0
    items: list[PoolItem] = []
    if name == "processbench":
        items = processbench_items()
    else:
        sampling = {**build.ARITH_SAMPLING, "seed": arith_seed, "levels": tuple(arith_levels)}
        rows = [r for r in read_lines(arith_file(root, sampling)) if r["level"] in arith_levels]
        rows = [r for r in rows if question_index(r) < arith_questions]
        missing = sum(
            arith_questions - first for first in arith_todo(rows, tuple(arith_levels), arith_questions).values()
        )
        missing *= int(build.ARITH_SAMPLING["k"])
        checked = [(r, decided(r)) for r in rows]
        share = sum(t is not None for _, t in checked) / len(checked) if checked else DECIDED_SHARE
        items = [
            PoolItem(
                f"{r['question_id']}/{r['sample']}",
                r["question_id"],
                "",
                r["problem"],
                tuple(r["steps"]),
                t,
                t,
                1.0,
                r["correct"],
            )
            for r, t in checked
            if t is not None
        ]
        to_come = missing * share
        sampler = (
            (work.sampler() if work is not None else Sampler(engine, threads))
            if missing or name == "arith-mc"
            else None
        )
        if missing and sampler is not None:
            rate, source = speed(root, f"{sampler.kind}.sample")
            tokens = missing * tokens_per_solution(rows, tuple(arith_levels))
            out.update(sample_solutions=missing, sample_tokens=round(tokens))
            seconds += tokens / rate + sampler.start_seconds
            parts.append(f"sampling {missing:,} solutions (~{tokens:,.0f} tokens at {rate:.0f} tokens/s, {source})")
        if name == "arith-mc" and sampler is not None:
            known = {r["key"]: r for r in read_lines(mc_file(root, sampling))}
            chosen, held = mc_chosen(items, mc_limit)
            pool_to_come = min(to_come / 2, max(0, mc_limit - len(chosen)))
            todo = sum(i.key not in known for i in chosen) + round(pool_to_come)
            if todo:
                rate, source = speed(root, f"{sampler.kind}.mc")
                per = statistics.fmean(r["tokens"] for r in known.values()) if known else MC_TOKENS_PER_SOLUTION
                out.update(mc_solutions=todo, mc_tokens=round(todo * per))
                seconds += todo * per / rate + (0 if missing else sampler.start_seconds)
                parts.append(
                    f"MC labels of {todo} solutions (~{todo * per:,.0f} tokens at {rate:.0f} tokens/s, {source})"
                )
            items, to_come = chosen + held, pool_to_come + to_come / 2
        if sampler is not None:
            out["engine"] = sampler.note
    cache = FeatureCache(StateSettings().features_dir, spec or FeatureSpec())
    keys = [solution_key(i.problem, list(i.steps)) for i in items]
    features = len(keys) - len(cache.get(keys)) + round(to_come)
    if features:
        rate, source = speed(root, "features")
        seconds += features / rate
        parts.append(f"features of ~{features:,} solutions ({rate:.1f}/s, {source})")
    out.update(features=features, seconds=round(seconds, 1))
    out["line"] = f"{name}: " + (
        f"{'; '.join(parts)}: {describe_cost(seconds)} to build once" if parts else "cached, nothing to build"
    )
    return out
