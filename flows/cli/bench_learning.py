"""``prmloop bench active``, ``learn`` and ``deep``: what the PRM learns from labels, each one JSON line.

``active``: does choosing what to label pay (pool-based, against labels known to be true); ``learn``:
are a loop's labels worth their keep (its store, three arms on the test set); ``deep``: would a deeper
PRM learn more from the same exact labels (half the test set trains, the other half scores).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from prmloop.flows.cli.app import bench_app, progress_line

#: ``bench active --quick``: curriculum questions per level and MC-labelled solutions of its arith pools
#: (the first questions of the full pools: what a quick run samples, a full run reuses), and the minutes
#: of model work (sampling, MC rollouts, features) it may spend building pools the cache lacks.
QUICK_ARITH_QUESTIONS, QUICK_MC_LIMIT, QUICK_BUILD_MINUTES = 8, 24, 5.0


@bench_app.command("active")
def bench_active_cmd(  # noqa: PLR0917 - one parameter per command-line option
    pool: Annotated[
        str | None,
        typer.Option(
            help="processbench (human labels), arith (exact labels), arith-mc (MC labels, tokens), all (those "
            "three), testset (the shipped test set's halves: exact labels, no model work); default: all, "
            "with --quick testset"
        ),
    ] = None,
    quick: Annotated[
        bool,
        typer.Option(
            help=f"4 budgets, 16 heads, on the shipped test set's halves unless --pool says otherwise (about "
            f"4 minutes on 2 cores: a verdict on 800 pool solutions); small arith pools ({QUICK_ARITH_QUESTIONS} "
            f"questions per level, {QUICK_MC_LIMIT} MC labels); pools whose build would take over "
            f"--max-build-minutes ({QUICK_BUILD_MINUTES:.0f} with --quick) are skipped, saying what they cost"
        ),
    ] = False,
    seeds: Annotated[int, typer.Option(help="random seeds per arm (first labelled set and head initialisation)")] = 5,
    arms: Annotated[str, typer.Option(help="comma-separated: random, actprm, epistemic, aleatoric, priority, full")] = (
        "random,actprm,epistemic,aleatoric,priority,full"
    ),
    arith_questions: Annotated[
        int | None, typer.Option(help="arith pools: questions sampled per level (default 300; --quick 8)")
    ] = None,
    levels: Annotated[str, typer.Option(help="arith pools: curriculum levels, comma-separated")] = "1,2,3,4,5",
    mc_limit: Annotated[
        int | None, typer.Option(help="arith-mc: pool-half solutions labelled by MC rollouts (default 160; --quick 24)")
    ] = None,
    label_quality: Annotated[bool, typer.Option(help="arith-mc: also MC vs consensus vs exact labels")] = True,
    order: Annotated[
        str,
        typer.Option(
            help="uncertainty arms: rank (most uncertain first) or filter (ActPRM Alg. 1: random order, "
            "confident ones passed over)"
        ),
    ] = "rank",
    engine: Annotated[
        str,
        typer.Option(
            help="what samples and MC-labels pools the cache lacks: auto (vLLM if it can), vllm, transformers"
        ),
    ] = "auto",
    max_build_minutes: Annotated[
        float | None,
        typer.Option(
            help="skip pools whose build (sampling, MC, features) is estimated to take longer (default: none)"
        ),
    ] = None,
    out: Annotated[Path, typer.Option(help="folder for the PNG of the learning curves")] = Path("out/bench-active"),
    threads: Annotated[int | None, typer.Option(help="torch CPU threads for the backbone and the sampler")] = None,
) -> None:
    """Learning curves of the ensemble PRM under each labelling order, against labels known to be true.

    Pool-based active learning: the pool half is labelled in each arm's order, the held-out half scores
    (ProcessBench protocol); actprm minus random gets a 95 % interval over the seeds (paired t and
    bootstrap). Sampled pools, MC labels and backbone features are computed once and cached under
    $PRMLOOP_HOME (an arith pool's first run samples SmolLM2 on the vLLM engine where it runs, else on
    transformers; arith-mc also runs MC rollouts): what a build will cost is said before it starts.
    Progress goes to stderr; one JSON line to stdout.
    """
    from prmloop.flows.lab.bench.active import TESTSET_POOL, ActiveSettings
    from prmloop.flows.lab.bench.active_run import bench_active
    from prmloop.flows.pools.build import POOLS
    from prmloop.flows.pools.sampling import ENGINES
    from prmloop.models.prm.ensemble import EnsembleConfig
    from prmloop.store.settings import StateSettings

    if order not in ("rank", "filter"):
        raise typer.BadParameter(f"--order {order!r}: choose rank or filter")
    if engine not in ENGINES:
        raise typer.BadParameter(f"--engine {engine!r}: choose one of {', '.join(ENGINES)}")
    pool = pool or ("testset" if quick else "all")
    names = list(POOLS) if pool == "all" else [pool]
    if any(name not in (*POOLS, TESTSET_POOL) for name in names):
        raise typer.BadParameter(f"--pool {pool!r}: choose one of {', '.join((*POOLS, TESTSET_POOL))} or all")
    try:
        level_list = tuple(sorted({int(x) for x in levels.split(",") if x.strip()}))
    except ValueError:
        level_list = ()
    if not level_list or not set(level_list) <= {1, 2, 3, 4, 5}:
        raise typer.BadParameter(f"--levels {levels!r}: give curriculum levels 1-5, comma-separated")
    settings = ActiveSettings(
        arms=tuple(a.strip() for a in arms.split(",") if a.strip()),
        budgets=(0.1, 0.2, 0.35, 0.5) if quick else (0.05, 0.1, 0.2, 0.3, 0.5, 0.75),
        seeds=seeds,
        ensemble=EnsembleConfig(threads=1, heads=16) if quick else EnsembleConfig(threads=1),
        arith_questions=arith_questions or (QUICK_ARITH_QUESTIONS if quick else 300),
        arith_levels=level_list,
        mc_limit=mc_limit or (QUICK_MC_LIMIT if quick else 160),
        threads=threads,
        order=order,
        engine=engine,
    )

    try:
        results = bench_active(
            names,
            settings,
            root=StateSettings().home / "bench" / "active",
            out_dir=out,
            budget_minutes=max_build_minutes
            if max_build_minutes is not None
            else (QUICK_BUILD_MINUTES if quick else None),
            with_label_quality=label_quality,
            say=progress_line,
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    one = len(names) == 1 and set(results) <= {names[0], "skipped"}
    summary: dict[str, object] = {"bench": "active", "quick": quick}
    summary |= results[names[0]] if one else results
    typer.echo(json.dumps(summary))


@bench_app.command("learn")
def bench_learn_cmd(
    *,
    db: Annotated[
        list[str] | None,
        typer.Option(help="the loop's store (default: this home's); repeat for several loops, e.g. other --seeds"),
    ] = None,
    seeds: Annotated[int, typer.Option(min=1, help="head seeds every training set is trained with")] = 3,
    draws: Annotated[
        int, typer.Option(min=1, help="random draws per budget: their F1s' spread and the loop's rank in it")
    ] = 20,
    budgets: Annotated[
        str | None, typer.Option(help="accepted-label budgets, e.g. 15,30,60 (default: doubling from 15)")
    ] = None,
    threads: Annotated[int | None, typer.Option(help="CPU threads for training and features")] = None,
    out: Annotated[Path | None, typer.Option(help="also write the result here as indented JSON")] = None,
) -> None:
    """From a loop's store: test F1 (95 % interval) against accepted labels and generated tokens for the
    loop's consensus labels, exact labels of the same solutions (oracle) and exact labels of random
    solutions the loop sampled (many draws: their spread, and the loop's rank among them); and where the
    loop's labels fell. With several --db (loops of other --seed values), each loop is ranked among its own
    draws at the budgets they all reached, and across_runs gives the ranks side by side. One JSON line."""
    from prmloop.flows.cli.app import db_path
    from prmloop.flows.lab.bench.learn import bench_learn_runs, write_json

    try:
        chosen = [int(v) for v in budgets.split(",")] if budgets else None
    except ValueError:
        raise typer.BadParameter(f"--budgets takes numbers like 15,30,60, not {budgets!r}") from None

    stores = [db_path(d) for d in db] if db else [db_path(None)]
    try:
        result = bench_learn_runs(stores, seeds=seeds, draws=draws, budgets=chosen, threads=threads, say=progress_line)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    if out is not None:
        write_json(out, result)
    typer.echo(json.dumps(result))


@bench_app.command("deep")
def bench_deep_cmd(
    *,
    arms: Annotated[str, typer.Option(help="of frozen, hidden, layers, lora, lora_heads (comma-separated)")] = (
        "frozen,hidden,layers,lora,lora_heads"
    ),
    budgets: Annotated[str, typer.Option(help="exact labels per arm, e.g. 120,812 (capped at the training pool)")] = (
        "120,812"
    ),
    seeds: Annotated[int, typer.Option(min=1, help="draws and head seeds of the head arms (LoRA: one draw)")] = 3,
    epochs: Annotated[int, typer.Option(min=1, help="LoRA passes over its training solutions")] = 2,
    layers: Annotated[str, typer.Option(help="the layers arm's layers, as fractions of the depth")] = "0.5,1.0",
    split_seed: Annotated[int, typer.Option(help="shuffles the test set's questions into training and held-out")] = 7,
    held_limit: Annotated[int | None, typer.Option(min=1, help="score on this many held-out solutions only")] = None,
    threads: Annotated[int | None, typer.Option(help="CPU threads for training and features")] = None,
    out: Annotated[Path | None, typer.Option(help="also write the result here as indented JSON")] = None,
) -> None:
    """Would a deeper PRM learn more from the same labels? Heads on the frozen middle layer and the steps'
    token uncertainty (the loop's), on the hidden state alone, on more layers, a LoRA PRM, and heads on
    the LoRA-tuned backbone, trained on exact labels of half the
    test set's questions and scored on the other half: F1 with its interval and the paired difference
    to the frozen arm. One JSON line (27 minutes for the defaults on 2 cores, most of it LoRA; `--arms
    frozen`: seconds)."""
    from prmloop.flows.lab.bench.deep import bench_deep
    from prmloop.flows.lab.bench.learn import write_json

    chosen = [a.strip() for a in arms.split(",") if a.strip()]
    try:
        sizes = [int(v) for v in budgets.split(",")]
        depths = tuple(float(v) for v in layers.split(","))
    except ValueError:
        raise typer.BadParameter(
            f"--budgets takes numbers like 120,812 and --layers like 0.5,1.0, not {budgets!r} / {layers!r}"
        ) from None
    if any(not 0.0 < d <= 1.0 for d in depths):
        raise typer.BadParameter(f"--layers: fractions of the depth in (0, 1], not {layers!r}")
    try:
        result = bench_deep(
            arms=chosen,
            budgets=sizes,
            seeds=seeds,
            epochs=epochs,
            layers=depths,
            split_seed=split_seed,
            held_limit=held_limit,
            threads=threads,
            say=progress_line,
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    if out is not None:
        write_json(out, result)
    typer.echo(json.dumps(result))
