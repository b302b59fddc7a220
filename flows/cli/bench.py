"""``prmloop bench ...``: each benchmark prints one JSON line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from prmloop.flows.cli.app import bench_app, err, progress_line


@bench_app.command("sink")
def bench_sink_cmd(  # noqa: PLR0917 - one parameter per command-line option
    n: Annotated[int, typer.Option("--n", help="events to publish")] = 100_000,
    quick: Annotated[bool, typer.Option(help="10k events")] = False,
    rate: Annotated[int, typer.Option(help="events/s for the latency phase")] = 1000,
    latency_seconds: Annotated[float, typer.Option(help="length of the latency phase")] = 10.0,
    store: Annotated[
        str, typer.Option(help="duckdb (the single-writer file) or ducklake (PostgreSQL catalog, Parquet)")
    ] = "duckdb",
    sinks: Annotated[int, typer.Option(help="ducklake: sink processes in one consumer group")] = 1,
) -> None:
    """Raw kafka-python consume rate vs the sink's rate into the store; on DuckDB also the
    publish-to-queryable latency and reader waits, on DuckLake the rate of N sink processes and a
    reader's query time while they write."""
    n = 10_000 if quick else n
    if store == "ducklake":
        from prmloop.flows.lab.bench.sink_lake import bench_sink_lake

        typer.echo(
            json.dumps(bench_sink_lake(n=n, sinks=sinks, rate=rate, latency_seconds=5.0 if quick else latency_seconds))
        )
        return
    if store != "duckdb":
        raise ValueError(f"--store must be duckdb or ducklake, got {store!r}")
    if sinks != 1:
        raise ValueError("--sinks > 1 needs --store ducklake: a DuckDB file has one writer")
    from prmloop.flows.lab.bench.sink import bench_sink

    result = bench_sink(n=n, rate=rate, latency_seconds=5.0 if quick else latency_seconds)
    typer.echo(json.dumps({**result, "store": "duckdb", "sinks": 1}))


@bench_app.command("generate")
def bench_generate_cmd(  # noqa: PLR0917 - one parameter per command-line option
    quick: Annotated[bool, typer.Option(help="4 questions x 32 tokens (--wrapper: 4 x 32, one repeat)")] = False,
    threads: Annotated[
        int | None, typer.Option(help="CPU threads of every engine (default: the cores, at most 2)")
    ] = None,
    seed: int = 0,
    wrapper: Annotated[
        bool,
        typer.Option(help="instead: the transformers wrapper vs its raw generate(), batched vs one-at-a-time rollouts"),
    ] = False,
    model: Annotated[
        str, typer.Option(help="--wrapper: 'smollm2' (the embedded GGUF), a folder or hub id")
    ] = "smollm2",
    dtype: Annotated[
        str | None,
        typer.Option(help="every engine's dtype: float32 or bfloat16 (default: float32 on a CPU, bfloat16 on a GPU)"),
    ] = None,
    engines: Annotated[
        str, typer.Option(help="which engines to run, comma-separated: transformers, inprocess (vLLM), server (vLLM)")
    ] = "transformers,inprocess,server",
) -> None:
    """Transformers in process, vLLM in process and the vLLM server on the same workloads: tokens/s for
    sampling (k=8) and for MC rollouts sharing a prefix, vLLM's prefix cache on and off
    (`vllm_to_transformers_ratio`, `prefix_cache_speedup`). vLLM comes from .venv-vllm (`make vllm`)."""
    if wrapper:
        from prmloop.flows.lab.bench.generate import bench_generate

        typer.echo(json.dumps(bench_generate(quick, model=model, threads=threads, seed=seed)))
        return
    from prmloop.flows.lab.bench.generate_engines import bench_engines

    say = lambda line: err.print(f"bench generate: {line}", markup=False, highlight=False)  # noqa: E731
    if dtype not in (None, "float32", "bfloat16"):
        raise ValueError(f"--dtype must be float32 or bfloat16, got {dtype!r}")
    chosen = [e.strip() for e in engines.split(",") if e.strip()]
    typer.echo(json.dumps(bench_engines(quick, threads=threads, seed=seed, dtype=dtype, engines=chosen, say=say)))


@bench_app.command("annotate")
def bench_annotate_cmd(
    n_solutions: Annotated[int, typer.Option(help="simulated incorrect solutions")] = 800,
    quick: Annotated[bool, typer.Option(help="100 solutions")] = False,
    correlation: Annotated[float, typer.Option(help="how strongly step uncertainty marks the first error")] = 0.7,
    seed: int = 0,
) -> None:
    """Every annotation strategy on the same simulated solutions: accuracy and cost."""
    from prmloop.flows.lab.bench.annotate import bench_annotate

    typer.echo(json.dumps(bench_annotate(n_solutions=n_solutions, quick=quick, correlation=correlation, seed=seed)))


@bench_app.command("annotator")
def bench_annotator_cmd(
    n_solutions: Annotated[int, typer.Option("--solutions", help="simulated incorrect solutions")] = 48,
    latency: Annotated[float, typer.Option(help="simulated engine seconds per batched rollout call")] = 0.05,
    seed: int = 0,
) -> None:
    """Annotator service throughput: 1 process, 2 processes in one group, 1 process with 4 in flight."""
    from prmloop.flows.lab.bench.annotator import bench_annotator

    typer.echo(json.dumps(bench_annotator(n_solutions=n_solutions, latency_s=latency, seed=seed)))


@bench_app.command("aggregate")
def bench_aggregate_cmd(
    pool: Annotated[Path | None, typer.Option(help="Best-of-N pool (default: the GSM8K pool)")] = None,
    scores: Annotated[Path | None, typer.Option(help="step scores file (default: beside the pool)")] = None,
    prm: str = "qwen_prm",
    score_rule: Annotated[str, typer.Option(help="min, product or last")] = "min",
    repeats: int = 5,
) -> None:
    """All aggregation methods on a 500 x 32 pool: vectorized vs a per-question Python loop."""
    from prmloop.flows.lab.bench.aggregate import bench_aggregate

    result = bench_aggregate(pool, scores, prm=prm, score_rule=score_rule, repeats=repeats)
    result.pop("per_method", None)
    typer.echo(json.dumps(result))


@bench_app.command("loop")
def bench_loop_cmd(
    *,
    questions: Annotated[int, typer.Option(help="questions in the simulated pool")] = 400,
    budget_tokens: Annotated[int, typer.Option(help="generated tokens each arm may spend")] = 1_000_000,
    k: Annotated[int, typer.Option("-k", help="solutions sampled per taken question")] = 8,
    probe_k: Annotated[int, typer.Option(help="probe samples per question (prioritized arm)")] = 4,
    judge_accuracy: Annotated[float, typer.Option(help="probability the judge agrees with a label")] = 0.75,
    oversample: Annotated[int, typer.Option(help="questions probed per question taken (prioritized arm)")] = 2,
    repeats: Annotated[int, typer.Option(help="simulated pools; ratios are averaged over them")] = 5,
    real: Annotated[
        bool,
        typer.Option(help="run the real loops instead: streaming, rounds and random order on the embedded model"),
    ] = False,
    minutes: Annotated[float, typer.Option(help="--real: wall-clock minutes per arm")] = 5.0,
    quick: Annotated[
        bool,
        typer.Option(
            help="--real: level 1, 80 s per arm, each ending at its third retrain (rounds: past 80 s if need be)"
        ),
    ] = False,
    arms: Annotated[str, typer.Option(help="--real: which arms, comma-separated")] = "streaming,rounds,random_order",
    levels: Annotated[
        str | None, typer.Option(help="--real: arith curriculum levels, e.g. 1,2 (default 1,2; --quick: 1)")
    ] = None,
    threads: Annotated[int | None, typer.Option(help="--real: torch CPU threads of in-process models")] = None,
    seed: int = 0,
) -> None:
    """Simulated (default): prioritized vs random question order on one pool and token budget. --real: the
    streaming loop, the round-based loop and the streaming loop in random question order, one after the
    other on one engine for the same wall-clock time (progress on stderr, one JSON line on stdout)."""
    from prmloop.flows.lab.bench.loop import LoopBenchSettings, bench_loop

    if real:
        from prmloop.flows.lab.bench.loop_real import ARMS, bench_loop_real

        chosen = tuple(a.strip() for a in arms.split(",") if a.strip())
        if not chosen or any(a not in ARMS for a in chosen):
            raise typer.BadParameter(f"--arms must name some of {', '.join(ARMS)}, not {arms!r}")
        if minutes <= 0:
            raise typer.BadParameter(f"--minutes must be positive, not {minutes:g}")
        result = bench_loop_real(
            minutes=minutes,
            quick=quick,
            arms=chosen,
            levels=levels,
            seed=seed,
            threads=threads,
            say=progress_line,
        )
        typer.echo(json.dumps(result, default=str))
        return

    settings = LoopBenchSettings(
        questions=questions,
        budget_tokens=budget_tokens,
        k=k,
        probe_k=probe_k,
        judge_accuracy=judge_accuracy,
        oversample=oversample,
        seed=seed,
    )
    typer.echo(json.dumps(bench_loop(settings, repeats=repeats)))


@bench_app.command("broker")
def bench_broker_cmd(
    n: Annotated[int, typer.Option(help="events produced and consumed per storage")] = 20_000,
    batch: Annotated[int, typer.Option(help="events per publish call (each waits for the broker's acks)")] = 500,
    dsn: Annotated[
        str | None, typer.Option(help="PostgreSQL URL for the durable broker (default: a throw-away pgserver one)")
    ] = None,
) -> None:
    """Produce and consume rates of the embedded broker in memory and on PostgreSQL: one JSON line."""
    from prmloop.flows.lab.bench.broker import bench_broker_storage

    typer.echo(json.dumps(bench_broker_storage(n, batch=batch, dsn=dsn)))


@bench_app.command("replay")
def bench_replay_cmd(
    *,
    requests: Annotated[
        Path | None, typer.Option(help="a run's recorded requests (default: $PRMLOOP_HOME/requests)")
    ] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="requests in flight at once in the replay")] = 64,
    skip_s: Annotated[float, typer.Option(min=0, help="leave out the run's first seconds (its warm-up)")] = 60.0,
    threads: Annotated[int | None, typer.Option(min=1, help="the engine's CPU threads (default: the loop's)")] = None,
    at_loop: Annotated[
        bool,
        typer.Option(
            "--at-loop",
            help="replay again at the loop's own requests in flight: splits the gap into batch_factor x "
            "contention_factor (takes as long again)",
        ),
    ] = False,
) -> None:
    """The engine's own tokens a second on a recorded run's requests (`prmloop run --record-requests`), sent
    again at full concurrency to an engine of the bench's own, against the tokens a second the loop got
    from them (issue 55). Progress to stderr, one JSON line to stdout."""
    from prmloop.flows.cli.app import print_error
    from prmloop.flows.lab.bench.replay import bench_replay
    from prmloop.flows.ops.engine import EngineError
    from prmloop.store.settings import StateSettings

    folder = requests or StateSettings().home / "requests"

    try:
        result = bench_replay(
            folder, concurrency=concurrency, skip_s=skip_s, threads=threads, at_loop=at_loop, say=progress_line
        )
    except (ValueError, OSError, EngineError) as exc:
        print_error(f"bench replay: {exc}")
        raise typer.Exit(1) from None
    typer.echo(json.dumps(result))


@bench_app.command("stalls")
def bench_stalls_cmd(  # noqa: PLR0917 - one parameter per command-line option
    flood_seconds: Annotated[float, typer.Option(help="seconds of the other user's connection flood")] = 60.0,
    threads: Annotated[int, typer.Option(help="the flood's threads, as the user nobody")] = 200,
    interval: Annotated[float, typer.Option(help="seconds between two connections of one flood thread")] = 1.0,
    query_seconds: Annotated[float, typer.Option(help="seconds the long query runs (its --max-seconds)")] = 300.0,
    rate: Annotated[int, typer.Option(help="events/s published while the long query runs")] = 100,
    quick: Annotated[bool, typer.Option(help="a 10 s flood of 50 threads, a 20 s query")] = False,
) -> None:
    """Can another user or a query stall the loop? The owner's produce-to-stored p99 and failed requests
    during another user's connection flood, the gate's CPU share and log growth; publish-to-queryable
    while a long query runs; the runaway query's exit and time (issue 54)."""
    from prmloop.flows.lab.bench.stalls import bench_stalls

    if quick:
        flood_seconds, threads, query_seconds = 10.0, 50, 20.0
    result = bench_stalls(
        flood_seconds=flood_seconds,
        threads=threads,
        interval=interval,
        query_seconds=query_seconds,
        rate=rate,
        say=progress_line,
    )
    typer.echo(json.dumps(result))
