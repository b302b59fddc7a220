"""The ``prmloop`` command line."""

from __future__ import annotations

import csv
import json
import logging
import signal
import sys
import threading
import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from prmloop.store.broker import BrokerError, EmbeddedBroker, require_bootstrap_servers, write_broker_file
from prmloop.store.duck import ReadOnlyViolation, StoreLocked
from prmloop.store.settings import StateSettings

app = typer.Typer(
    help="prmloop: event-sourced, active data curation for process reward models.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
bench_app = typer.Typer(help="Benchmarks; each prints one JSON line.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")
eval_app = typer.Typer(help="Evaluations on the shared data sets.", no_args_is_help=True)
app.add_typer(eval_app, name="eval")

err = Console(stderr=True)

DbOption = Annotated[Path | None, typer.Option("--db", help="DuckDB file (default: $PRMLOOP_HOME/prmloop.duckdb)")]


class OutputFormat(StrEnum):
    table = "table"
    csv = "csv"
    json = "json"


def _db(db: Path | None) -> Path:
    return db or StateSettings().db_path


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # kafka-python logs every reconnect attempt at ERROR; the runtime reports what matters.
    logging.getLogger("kafka").setLevel(logging.CRITICAL if not verbose else logging.WARNING)


@app.callback()
def _root(verbose: Annotated[bool, typer.Option("--verbose", "-v", help="log progress")] = False) -> None:
    _setup_logging(verbose)


@app.command()
def broker(
    port: Annotated[int | None, typer.Option(help="port on 127.0.0.1 (default: a free one)")] = None,
    partitions: Annotated[int, typer.Option(help="partitions per topic")] = 4,
) -> None:
    """Start the embedded Kafka broker (Tansu, in memory) and create the topics; runs until Ctrl-C.

    Other commands find it through $PRMLOOP_HOME/broker.json, unless KAFKA_BOOTSTRAP_SERVERS is set.
    """
    from prmloop.store.kafka import ensure_topics
    from prmloop.store.topics import all_topic_specs

    state = StateSettings()
    with EmbeddedBroker(port=port, log_path=state.home / "broker.log" if _mkdir(state.home) else None) as b:
        ensure_topics(b.bootstrap_servers, all_topic_specs(partitions))
        write_broker_file(b, state)
        typer.echo(b.bootstrap_servers)
        err.print(f"embedded broker on {b.bootstrap_servers} (in memory; Ctrl-C stops it)")
        err.print(f"  export KAFKA_BOOTSTRAP_SERVERS={b.bootstrap_servers}   # for other shells")
        try:
            while True:
                time.sleep(1)
        except KeyboardInterrupt:
            pass
        finally:
            state.broker_file.unlink(missing_ok=True)


def _stop_on_signals() -> threading.Event:
    """SIGTERM/SIGINT during start-up ask for a clean stop too (the runtime takes over once running)."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stop.set())
    return stop


def _mkdir(path: Path) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    return True


@app.command()
def topics(partitions: Annotated[int, typer.Option(help="partitions per new topic")] = 4) -> None:
    """Create the event topics and their dead-letter topics (idempotent)."""
    from prmloop.store.kafka import ensure_topics
    from prmloop.store.topics import all_topic_specs

    created = ensure_topics(require_bootstrap_servers(), all_topic_specs(partitions))
    typer.echo(f"created {len(created)} topics" + (f": {', '.join(created)}" if created else " (all existed)"))


@app.command()
def sink(
    db: DbOption = None,
    max_batch: Annotated[int, typer.Option(help="events per DuckDB transaction at most")] = 5000,
    max_wait: Annotated[float, typer.Option(help="seconds a batch waits to fill")] = 0.2,
    group: Annotated[str, typer.Option(help="consumer group the offsets are committed under")] = "prmloop-sink",
) -> None:
    """Run the store sink: the only writer of the DuckDB file. Stops cleanly on Ctrl-C / SIGTERM."""
    from prmloop.consumers.sink import run_sink
    from prmloop.store.kafka import ensure_topics

    stop = _stop_on_signals()
    servers = require_bootstrap_servers()
    ensure_topics(servers)
    path = _db(db)
    err.print(f"sink: {servers} -> {path}")
    stats, sink_stats = run_sink(
        bootstrap_servers=servers,
        db_path=path,
        group_id=group,
        max_batch=max_batch,
        max_wait_s=max_wait,
        until=stop.is_set,
    )
    err.print(
        f"sink stopped: {sink_stats.inserted} new events stored of {sink_stats.received} received, "
        f"{stats.dead_lettered} dead-lettered"
    )


@app.command()
def sql(
    query: Annotated[str, typer.Argument(help="read-only SQL (SELECT/WITH/FROM/DESCRIBE/SHOW/SUMMARIZE)")],
    db: DbOption = None,
    fmt: Annotated[OutputFormat, typer.Option("--format", "-f", help="output format")] = OutputFormat.table,
    timeout: Annotated[float, typer.Option(help="seconds to wait while the sink holds the file")] = 30.0,
) -> None:
    """Query the label history with SQL, also while the pipeline runs. Never modifies anything."""
    from prmloop.store.duck import query as run_query

    result = run_query(_db(db), query, timeout_s=timeout)
    _print_rows(result.columns, result.rows, fmt)


def _print_rows(columns: list[str], rows: list[tuple[Any, ...]], fmt: OutputFormat) -> None:
    if fmt is OutputFormat.csv:
        w = csv.writer(sys.stdout)
        w.writerow(columns)
        w.writerows(rows)
    elif fmt is OutputFormat.json:
        for row in rows:
            typer.echo(json.dumps(dict(zip(columns, row, strict=True)), default=str))
    else:
        table = Table(*columns, show_lines=False)
        for row in rows:
            table.add_row(*("NULL" if v is None else str(v) for v in row))
        Console().print(table)
        err.print(f"{len(rows)} row(s)")


@app.command()
def reconcile(db: DbOption = None) -> None:
    """Re-publish outbox events missing from DuckDB (after the in-memory broker restarted)."""
    from prmloop.store.reconcile import reconcile as run_reconcile

    report = run_reconcile(require_bootstrap_servers(), _db(db), StateSettings().outbox_dir)
    typer.echo(json.dumps(report))


@app.command()
def demo(
    questions: Annotated[int, typer.Option(help="GSM8K questions to sample with SmolLM2")] = 3,
    k: Annotated[int, typer.Option("-k", help="solutions per question")] = 4,
    synthetic: Annotated[int, typer.Option(help="synthetic label events to publish as well")] = 5_000,
    annotate: Annotated[int, typer.Option(help="incorrect solutions to label with SmolLM2 rollouts")] = 1,
    db: DbOption = None,
) -> None:
    """The main job on embedded defaults: broker, sink, sample (Prefect flow), score, annotate, store, query."""
    from prmloop.flows.demo import run_demo

    run_demo(n_events=synthetic, db_path=db, questions=questions, k=k, annotate=annotate)


@bench_app.command("sink")
def bench_sink_cmd(
    n: Annotated[int, typer.Option("--n", help="events to publish")] = 100_000,
    quick: Annotated[bool, typer.Option(help="10k events")] = False,
    rate: Annotated[int, typer.Option(help="events/s for the latency phase")] = 1000,
    latency_seconds: Annotated[float, typer.Option(help="length of the latency phase")] = 10.0,
) -> None:
    """Raw kafka-python consume rate vs sink rate into DuckDB, and publish-to-queryable latency."""
    from prmloop.flows.bench.sink import bench_sink

    result = bench_sink(n=10_000 if quick else n, rate=rate, latency_seconds=5.0 if quick else latency_seconds)
    typer.echo(json.dumps(result))


@bench_app.command("generate")
def bench_generate_cmd(
    quick: Annotated[bool, typer.Option(help="4 prompts x 32 tokens, one repeat")] = False,
    model: Annotated[str, typer.Option(help="'smollm2' (embedded GGUF), a local folder or hub id")] = "smollm2",
    threads: Annotated[int | None, typer.Option(help="torch CPU threads (default: torch's choice)")] = None,
    seed: int = 0,
) -> None:
    """Tokens/s of the backend wrapper vs the raw engine call, and batched vs one-at-a-time rollouts."""
    from prmloop.flows.bench.generate import bench_generate

    typer.echo(json.dumps(bench_generate(quick, model=model, threads=threads, seed=seed)))


@bench_app.command("annotate")
def bench_annotate_cmd(
    n_solutions: Annotated[int, typer.Option(help="simulated incorrect solutions")] = 800,
    quick: Annotated[bool, typer.Option(help="100 solutions")] = False,
    correlation: Annotated[float, typer.Option(help="how strongly step uncertainty marks the first error")] = 0.7,
    seed: int = 0,
) -> None:
    """Every annotation strategy on the same simulated solutions: accuracy and cost."""
    from prmloop.flows.bench.annotate import bench_annotate

    typer.echo(json.dumps(bench_annotate(n_solutions=n_solutions, quick=quick, correlation=correlation, seed=seed)))


@bench_app.command("annotator")
def bench_annotator_cmd(
    n_solutions: Annotated[int, typer.Option("--solutions", help="simulated incorrect solutions")] = 48,
    latency: Annotated[float, typer.Option(help="simulated engine seconds per batched rollout call")] = 0.05,
    seed: int = 0,
) -> None:
    """Annotator service throughput: 1 process, 2 processes in one group, 1 process with 4 in flight."""
    from prmloop.flows.bench.annotator import bench_annotator

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
    from prmloop.flows.bench.aggregate import bench_aggregate

    result = bench_aggregate(pool, scores, prm=prm, score_rule=score_rule, repeats=repeats)
    result.pop("per_method", None)
    typer.echo(json.dumps(result))


@eval_app.command("aggregate")
def eval_aggregate_cmd(  # noqa: PLR0917 - one parameter per command-line option
    pool: Annotated[Path, typer.Option(help="Best-of-N pool, e.g. ../shared/data/bon/gsm8k_candidates.jsonl.gz")],
    scores: Annotated[Path | None, typer.Option(help="step scores (default: step_scores/<prm>_<dataset>)")] = None,
    prm: str = "qwen_prm",
    reference: Annotated[Path | None, typer.Option(help="gold answers to re-grade against (MATH-500)")] = None,
    score_rule: Annotated[str, typer.Option(help="min, product or last")] = "min",
    score_kind: Annotated[str | None, typer.Option(help="probability or reward (default: by PRM)")] = None,
    ns: Annotated[str, typer.Option(help="comma-separated budgets N")] = "1,2,4,8,16,32",
    subsamples: int = 50,
    splits: int = 5,
    calibration_size: int = 100,
    seed: int = 0,
    out_dir: Annotated[Path, typer.Option(help="where PNGs and JSON go")] = Path("out/aggregate"),
    as_json: Annotated[bool, typer.Option("--json", help="print the whole result as JSON")] = False,
) -> None:
    """Accuracy of every aggregation method at each N, and the compute fraction of calibrated methods."""
    from prmloop.flows.evals.aggregate import eval_aggregate

    result = eval_aggregate(
        pool,
        scores,
        prm=prm,
        reference=reference,
        score_rule=score_rule,
        score_kind=score_kind,
        ns=tuple(int(n) for n in ns.split(",")),
        subsamples=subsamples,
        splits=splits,
        calibration_size=calibration_size,
        seed=seed,
        out_dir=out_dir,
    )
    if as_json:
        typer.echo(json.dumps(result, default=str))
        return
    typer.echo(result["table_markdown"])
    for name, path in result.get("files", {}).items():
        err.print(f"{name}: {path}")


@app.command()
def sample(  # noqa: PLR0917 - one parameter per command-line option
    dataset: Annotated[str | None, typer.Option(help="gsm8k, math500, math, gsm_plus (from ../shared/data)")] = None,
    file: Annotated[Path | None, typer.Option(help="JSONL questions: {id, problem, answer} per line")] = None,
    limit: Annotated[int | None, typer.Option(help="only the first N questions")] = None,
    split: Annotated[str | None, typer.Option(help="data-set split, e.g. test or train")] = None,
    k: Annotated[int, typer.Option("-k", help="solutions sampled per question")] = 8,
    m: Annotated[int, typer.Option("-m", help="correct solutions kept per question")] = 2,
    n: Annotated[int, typer.Option("-n", help="incorrect solutions kept per question")] = 6,
    strategy: Annotated[str, typer.Option(help="uncertainty, epicprm or random")] = "uncertainty",
    seed: int = 0,
    step_format: Annotated[str, typer.Option("--format", help="step_k or double_newline")] = "step_k",
    temperature: float = 0.7,
    max_new_tokens: int = 384,
    uncertainty_temperature: Annotated[float, typer.Option(help="T of UnPRM's softmax (1 paper, 5 code)")] = 1.0,
    publish_unselected: Annotated[bool, typer.Option(help="also publish solutions no strategy kept")] = False,
    backend: Annotated[str, typer.Option(help="transformers, vllm or openai")] = "transformers",
    model: Annotated[str, typer.Option(help="'smollm2' (embedded), a folder, or a served model name")] = "smollm2",
    threads: Annotated[int | None, typer.Option(help="transformers: torch CPU threads (1 on a shared CPU)")] = None,
    batch_size: Annotated[int, typer.Option(help="questions per Prefect task")] = 4,
    use_prefect: Annotated[bool, typer.Option("--prefect/--no-prefect", help="run as the Prefect flow")] = True,
) -> None:
    """Sample solutions, grade them, score uncertainty, select, and publish `solutions.sampled`."""
    from prmloop.flows.sample import run_sample

    if (dataset is None) == (file is None):
        raise typer.BadParameter("give exactly one of --dataset and --file")
    summary = run_sample(
        dataset=dataset,
        file=file,
        limit=limit,
        split=split,
        k=k,
        m=m,
        n=n,
        strategy=strategy,
        seed=seed,
        prompt_format=step_format,
        temperature=temperature,
        max_new_tokens=max_new_tokens,
        uncertainty_temperature=uncertainty_temperature,
        publish_unselected=publish_unselected,
        backend={"backend": backend, "model": model, "options": {"num_threads": threads} if threads else {}},
        batch_size=batch_size,
        prefect=use_prefect,
    )
    for message in summary.get("question_errors", []):
        err.print(f"[yellow]skipped:[/] {message}")
    typer.echo(json.dumps({k: v for k, v in summary.items() if k != "question_errors"}, default=str))


class CompleterKind(StrEnum):
    model = "model"
    simulator = "simulator"


@app.command()
def simulate(
    n_solutions: Annotated[int, typer.Option("--n", help="simulated incorrect solutions")] = 100,
    seed: Annotated[int, typer.Option(help="world seed (give `annotate --completer simulator` the same)")] = 0,
    correlation: Annotated[float, typer.Option(help="how strongly step uncertainty marks the first error")] = 0.7,
) -> None:
    """Publish simulated incorrect solutions (question, solution, step scores) for the annotator to label."""
    from prmloop.models.simulator import SimulatorConfig, simulate_solutions
    from prmloop.producers.simulated import simulated_events
    from prmloop.store.kafka import EventProducer, ensure_topics

    if n_solutions < 1:
        raise typer.BadParameter(f"--n must be at least 1, got {n_solutions}")
    servers = require_bootstrap_servers()
    ensure_topics(servers)
    solutions = simulate_solutions(n_solutions, SimulatorConfig(uncertainty_correlation=correlation), seed=seed)
    events = simulated_events(solutions, seed)
    with EventProducer(servers) as producer:
        producer.publish(events)
    typer.echo(json.dumps({"solutions": len(solutions), "events": len(events), "seed": seed}))


@app.command()
def annotate(  # noqa: PLR0917 - one parameter per command-line option
    strategy: Annotated[str, typer.Option(help="sequential, binary, adaptive_binary or uncertainty_driven")] = (
        "adaptive_binary"
    ),
    completer: Annotated[CompleterKind, typer.Option(help="a model backend, or the simulator")] = CompleterKind.model,
    backend: Annotated[str, typer.Option(help="transformers, vllm or openai")] = "transformers",
    model: Annotated[str, typer.Option(help="'smollm2' (embedded), a folder, or a served model name")] = "smollm2",
    base_url: Annotated[str | None, typer.Option(help="openai backend: the server's /v1 URL")] = None,
    threads: Annotated[int | None, typer.Option(help="transformers: torch CPU threads")] = None,
    step_format: Annotated[str, typer.Option("--format", help="step_k or double_newline")] = "step_k",
    temperature: Annotated[float, typer.Option(help="rollout sampling temperature")] = 0.7,
    max_new_tokens: Annotated[int, typer.Option(help="rollout budget; longer rollouts count as wrong")] = 384,
    rollouts: Annotated[int, typer.Option(help="sequential/binary: rollouts per state (hard MC)")] = 48,
    n0: Annotated[int, typer.Option(help="adaptive sampling: first rollouts of a state (N0)")] = 16,
    n_min: Annotated[int, typer.Option(help="adaptive sampling: grow until this many correct (N_min)")] = 10,
    n_max: Annotated[int, typer.Option(help="adaptive sampling: at most this many rollouts (N_max)")] = 72,
    alpha: Annotated[float, typer.Option(help="adaptive_binary: contribution threshold")] = 0.5,
    weighting: Annotated[
        str | None, typer.Option(help="MC weighting: count, inv_ppl (1/PPL, default) or log_ppl (printed Eq. 2)")
    ] = None,
    in_flight: Annotated[int, typer.Option(help="solutions annotated at once (engines that batch requests)")] = 1,
    group: Annotated[str, typer.Option(help="consumer group; processes in one group share partitions")] = (
        "prmloop-annotator"
    ),
    until_idle: Annotated[float | None, typer.Option(help="exit after this many seconds without new solutions")] = None,
    topic: Annotated[str, typer.Option(help="read solutions from this topic")] = ("solutions.sampled"),
    sim_n: Annotated[int, typer.Option(help="simulator: the world's size (as given to `prmloop simulate`)")] = 100,
    sim_seed: Annotated[int, typer.Option(help="simulator: the world's seed")] = 0,
    correlation: Annotated[float, typer.Option(help="simulator: uncertainty-error correlation")] = 0.7,
    sim_latency: Annotated[float, typer.Option(help="simulator: seconds per engine call")] = 0.0,
) -> None:
    """Label the first wrong step of sampled solutions with MC rollouts and publish `steps.labeled`."""
    from prmloop.consumers.annotator import run_annotator
    from prmloop.models.annotation.completer import Completer, GeneratorCompleter, exact_match, math_equivalent
    from prmloop.models.annotation.estimate import Sampling
    from prmloop.models.annotation.strategies import STRATEGIES, make_strategy
    from prmloop.store.events import ModelRef
    from prmloop.store.kafka import ensure_topics

    if strategy not in STRATEGIES:
        raise typer.BadParameter(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    params: dict[str, Any] = {}
    if strategy in ("sequential", "binary"):
        params["n"] = rollouts
    else:
        params["sampling"] = Sampling(n0=n0, n_min_correct=n_min, n_max=max(n_max, n0))
        if strategy == "adaptive_binary":
            params["alpha"] = alpha
    if weighting is not None:
        params["weighting"] = weighting
    chosen = make_strategy(strategy, **params)
    stop = _stop_on_signals()
    servers = require_bootstrap_servers()
    ensure_topics(servers)
    completers: list[Completer]
    if completer is CompleterKind.simulator:
        from prmloop.models.simulator import SimulatedCompleter, SimulatorConfig, simulate_solutions
        from prmloop.producers.simulated import SIMULATOR_REF

        config = SimulatorConfig(uncertainty_correlation=correlation)
        world = simulate_solutions(sim_n, config, seed=sim_seed)
        completers = [SimulatedCompleter(world, config, seed=sim_seed, latency_s=sim_latency)]
        refs, checker = [SIMULATOR_REF], exact_match
    else:
        from prmloop.models.backends.base import SamplingParams
        from prmloop.models.backends.registry import BackendConfig, build_backend

        options: dict[str, Any] = {}
        if threads is not None:
            options["num_threads"] = threads
        if base_url is not None:
            options["base_url"] = base_url
        engine = build_backend(BackendConfig(backend=backend, model=model, options=options))
        sampling = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens)
        style = "double_newline" if step_format == "double_newline" else "step_k"
        completers = [GeneratorCompleter(engine, style=style, params=sampling, lock=backend == "transformers")]
        refs, checker = [ModelRef(backend=backend, name=engine.model_name)], math_equivalent
    err.print(f"annotator: {strategy} with {refs[0].name} on {servers}, group {group}", soft_wrap=True)
    summary = run_annotator(
        bootstrap_servers=servers,
        strategy=chosen,
        completers=completers,
        completer_refs=refs,
        checker=checker,
        group_id=group,
        topic=topic,
        max_in_flight=in_flight,
        outbox_dir=StateSettings().outbox_dir,
        until=stop.is_set,
        idle_timeout_s=until_idle,
    )
    typer.echo(json.dumps(summary))


@eval_app.command("annotate")
def eval_annotate_cmd(  # noqa: PLR0917 - one parameter per command-line option
    file: Annotated[Path | None, typer.Option(help="ProcessBench file (default: processbench/gsm8k.json)")] = None,
    limit: Annotated[int, typer.Option(help="solutions with a wrong final answer to label")] = 5,
    strategy: Annotated[str, typer.Option(help="sequential, binary, adaptive_binary or uncertainty_driven")] = (
        "adaptive_binary"
    ),
    n0: Annotated[int, typer.Option(help="first rollouts per state (fixed count for sequential/binary)")] = 8,
    n_min: Annotated[int, typer.Option(help="grow until this many correct rollouts")] = 4,
    n_max: Annotated[int, typer.Option(help="at most this many rollouts per state")] = 16,
    model: Annotated[str, typer.Option(help="'smollm2' (embedded), a folder, or a served model name")] = "smollm2",
    backend: Annotated[str, typer.Option(help="transformers, vllm or openai")] = "transformers",
    threads: Annotated[int | None, typer.Option(help="transformers: torch CPU threads")] = None,
    max_new_tokens: int = 256,
    temperature: float = 0.7,
    seed: int = 0,
) -> None:
    """Label ProcessBench solutions with a real completer; agreement with the human first-error labels."""
    from prmloop.flows.evals.annotate import evaluate_processbench

    options: dict[str, Any] = {"num_threads": threads} if threads is not None else {}
    summary = evaluate_processbench(
        file,
        limit=limit,
        strategy=strategy,
        n0=n0,
        n_min=n_min,
        n_max=max(n_max, n0),
        backend={"backend": backend, "model": model, "options": options},
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        seed=seed,
        progress=lambda row: err.print(
            f"{row['id']}: human {row['human_first_error']}, predicted {row['predicted_first_error']} "
            f"({row['status']}), {row['rollouts']} rollouts, {row['wall_s']}s",
            soft_wrap=True,
        ),
    )
    typer.echo(json.dumps(summary))


@app.command()
def score(  # noqa: PLR0917 - one parameter per command-line option
    model: Annotated[
        str | None, typer.Option(help="teacher-force solutions without log-probs with this model ('smollm2', ...)")
    ] = None,
    backend: Annotated[str, typer.Option(help="transformers, vllm or openai")] = "transformers",
    threads: Annotated[int | None, typer.Option(help="transformers: torch CPU threads")] = None,
    temperature: Annotated[float, typer.Option(help="T of UnPRM's softmax (1 paper, 5 code)")] = 1.0,
    group: Annotated[str, typer.Option(help="consumer group")] = "prmloop-scorer",
    max_batch: Annotated[int, typer.Option(help="solutions per batch")] = 64,
    until_idle: Annotated[float | None, typer.Option(help="exit after this many seconds without new solutions")] = None,
) -> None:
    """Score each sampled solution's steps: u(s_t), Δu and step order (`steps.scored`, UnPRM Alg. 1)."""
    from prmloop.consumers.scorer import run_scorer
    from prmloop.models.backends.registry import BackendConfig
    from prmloop.store.kafka import ensure_topics

    stop = _stop_on_signals()
    servers = require_bootstrap_servers()
    ensure_topics(servers)
    config = None
    if model is not None:
        options: dict[str, Any] = {"num_threads": threads} if threads is not None else {}
        config = BackendConfig(backend=backend, model=model, options=options)
    err.print(f"scorer: {model or 'sampled log-probs only'} on {servers}, group {group}", soft_wrap=True)
    counters = run_scorer(
        bootstrap_servers=servers,
        backend=config,
        group_id=group,
        temperature=temperature,
        max_batch=max_batch,
        until=stop.is_set,
        until_idle_s=until_idle,
    )
    typer.echo(json.dumps(counters))


@app.command("import")
def import_cmd(
    source: Annotated[str, typer.Argument(help="what to import: processbench")],
    file: Annotated[Path, typer.Argument(help="the file, e.g. ../shared/data/processbench/gsm8k.json")],
    limit: Annotated[int | None, typer.Option(help="only the first N solutions")] = None,
) -> None:
    """Publish solutions sampled elsewhere (ProcessBench) as questions and `solutions.sampled` events."""
    from prmloop.flows.evals.annotate import load_processbench
    from prmloop.producers.processbench import processbench_events
    from prmloop.store.kafka import EventProducer, ensure_topics

    if source != "processbench":
        raise typer.BadParameter(f"cannot import {source!r}; supported: processbench")
    subset = "math" if "math" in file.stem else "gsm8k"
    items = load_processbench(file, subset=subset)[:limit]
    events = processbench_events(items, subset)
    skipped = len(items) - sum(1 for e in events if e.event_type == "SolutionSampled")
    servers = require_bootstrap_servers()
    ensure_topics(servers)
    with EventProducer(servers) as producer:
        producer.publish(events)
    typer.echo(json.dumps({"solutions": len(items) - skipped, "skipped_without_gold": skipped, "events": len(events)}))


@app.command()
def serve(
    model: Annotated[str, typer.Option(help="'smollm2' (embedded GGUF), a local folder or hub id")] = "smollm2",
    host: str = "127.0.0.1",
    port: Annotated[int, typer.Option(help="0 picks a free port")] = 8000,
    device: str = "cpu",
    num_threads: Annotated[int | None, typer.Option(help="torch CPU threads")] = None,
) -> None:
    """Serve a model over an OpenAI-compatible /v1/completions API (with log-probs) for CPU nodes."""
    from prmloop.models.serve import serve as run_server

    err.print(f"serving {model} on http://{host}:{port}/v1 (Ctrl-C stops)")
    run_server(model, host=host, port=port, device=device, num_threads=num_threads)


def main() -> None:
    """Entry point: known failures print one actionable line and exit 2, never a traceback."""
    try:
        app()
    except (BrokerError, ReadOnlyViolation, StoreLocked, FileNotFoundError, ValueError) as exc:
        err.print(f"[bold red]error:[/] {exc}")
        sys.exit(2)


if __name__ == "__main__":
    main()
