"""Commands of the pipeline: sample, score, annotate (options from their settings objects), simulate,
import, serve and the demo."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from prmloop.consumers.annotator import AnnotatorSettings
from prmloop.consumers.consensus import ConsensusSettings
from prmloop.consumers.judge import JudgeSettings
from prmloop.consumers.scorer import ScorerSettings
from prmloop.consumers.selector import SelectorSettings
from prmloop.flows.cli.app import app, err, stop_on_signals, usage_error
from prmloop.flows.cli.options import settings_command
from prmloop.models.simulator import SimulatorOptions
from prmloop.producers.prioritize import PrioritizeSettings
from prmloop.producers.sampler import SampleSettings
from prmloop.producers.sources import QuestionFileError, check_source, default_dataset
from prmloop.store.kafka.broker_file import require_bootstrap_servers
from prmloop.store.settings import StateSettings


def _check_source(dataset: str | None, file: Path | None, split: str | None) -> None:
    """A missing data-set or question file is a usage error before the flow run starts (not a failed run)."""
    try:
        check_source(dataset=dataset, file=file, split=split)
    except QuestionFileError as exc:
        usage_error(str(exc))


@settings_command(app, SampleSettings, name="sample")
def sample(settings: SampleSettings) -> None:
    """Sample solutions, grade them, score their uncertainty, select, and publish `solutions.sampled`.

    Runs as the Prefect flow `sample` (PRMLOOP_SAMPLE_PREFECT=0 or --no-prefect: plain functions).
    """
    from prmloop.flows.sample import run_sample

    given = sum((settings.dataset is not None, settings.file is not None, settings.from_queue))
    if given > 1:
        usage_error("give at most one of --dataset, --file and --from-queue")
    if given == 0:
        dataset = default_dataset(settings.backend, settings.model)
        err.print(f"no question source given: --dataset {dataset}", soft_wrap=True)
        settings = settings.model_copy(update={"dataset": dataset})
    _check_source(settings.dataset, settings.file, settings.split)
    # The broker too is found before the flow run starts: without one, one line and no failed run.
    servers = require_bootstrap_servers()
    summary = run_sample(settings, bootstrap_servers=servers, progress=err.is_terminal, prefect=settings.prefect)
    for message in summary.get("question_errors", []):
        err.print(f"skipped: {message}", markup=False, highlight=False)
    typer.echo(json.dumps({k: v for k, v in summary.items() if k != "question_errors"}, default=str))


@settings_command(app, PrioritizeSettings, name="prioritize")
def prioritize(settings: PrioritizeSettings) -> None:
    """Probe questions with a few samples each and publish their priorities (`questions.prioritized`).

    The priority favours questions the generator answers right about half the time, with dispersed
    answers and uncertain tokens; all-wrong and all-right probes rank down. `prmloop sample --from-queue`
    then samples the highest first. Runs as the Prefect flow `prioritize` (--no-prefect: plain functions).
    """
    from prmloop.flows.prioritize import run_prioritize

    if settings.dataset is not None and settings.file is not None:
        usage_error("give at most one of --dataset and --file")
    if settings.dataset is None and settings.file is None:
        dataset = default_dataset(settings.backend, settings.model)
        err.print(f"no question source given: --dataset {dataset}", soft_wrap=True)
        settings = settings.model_copy(update={"dataset": dataset})
    _check_source(settings.dataset, settings.file, settings.split)
    servers = require_bootstrap_servers()
    prm = None
    if settings.prm is not None:
        from prmloop.models.prm.load import load_prm

        prm = load_prm(settings.prm, cache_dir=StateSettings().features_dir, threads=settings.threads)
    summary = run_prioritize(settings, bootstrap_servers=servers, prm=prm)
    for message in summary.get("question_errors", []):
        err.print(f"skipped: {message}", markup=False, highlight=False)
    typer.echo(json.dumps({k: v for k, v in summary.items() if k != "question_errors"}, default=str))


@settings_command(app, ScorerSettings, name="score")
def score(settings: ScorerSettings) -> None:
    """Score each sampled solution's steps: u(s_t), Δu and step order (`steps.scored`, UnPRM Alg. 1)."""
    from prmloop.consumers.scorer import run_scorer
    from prmloop.store.kafka.producer import ensure_topics

    stop = stop_on_signals()
    servers = require_bootstrap_servers()
    ensure_topics(servers)
    source = "the simulator" if settings.simulator else (settings.model or "sampled log-probs only")
    err.print(f"scorer: {source} on {servers}, group {settings.group}", soft_wrap=True)
    typer.echo(json.dumps(run_scorer(settings, bootstrap_servers=servers, until=stop.is_set)))


@settings_command(app, SelectorSettings, name="select")
def select(settings: SelectorSettings) -> None:
    """Decide, with the promoted ensemble PRM, which scored solutions are worth their labels (ActPRM):
    publish `steps.selected` (label or skip, with the per-step mean and std behind it). The annotator
    and the judge label only what it sends on; with no promoted ensemble yet, everything is labelled.
    `--revisit`: decide again on what an older PRM skipped, then exit."""
    from prmloop.consumers.selector import run_selector
    from prmloop.store.kafka.producer import ensure_topics

    stop = stop_on_signals()
    servers = require_bootstrap_servers()
    ensure_topics(servers)
    if settings.revisit:
        from prmloop.flows.reselect import revisit_skipped

        typer.echo(json.dumps(revisit_skipped(settings, bootstrap_servers=servers)))
        return
    prm = settings.prm or "the promoted ensemble PRM in the store's registry"
    err.print(f"selector: {settings.rule} with {prm} on {servers}, group {settings.group}", soft_wrap=True)
    typer.echo(json.dumps(run_selector(settings, bootstrap_servers=servers, until=stop.is_set)))


@settings_command(app, AnnotatorSettings, name="annotate")
def annotate(settings: AnnotatorSettings) -> None:
    """Label the first wrong step of scored solutions with MC rollouts and publish `steps.labeled`."""
    from prmloop.consumers.annotator import build_annotator, run_annotator
    from prmloop.store.kafka.producer import ensure_topics

    components = build_annotator(settings)
    stop = stop_on_signals()
    servers = require_bootstrap_servers()
    ensure_topics(servers)
    err.print(
        f"annotator: {settings.strategy} with {components[2][0].name} on {servers}, group {settings.group}",
        soft_wrap=True,
    )
    summary = run_annotator(
        settings,
        bootstrap_servers=servers,
        outbox_dir=StateSettings().outbox_dir,
        until=stop.is_set,
        components=components,
    )
    typer.echo(json.dumps(summary))


@settings_command(app, JudgeSettings, name="judge")
def judge(settings: JudgeSettings) -> None:
    """Judge scored solutions with an LLM (CoT judge per step with CoT Entropy, or the ProcessBench
    critic) and publish `steps.judged`."""
    from prmloop.consumers.judge import build_judge, run_judge
    from prmloop.store.kafka.producer import ensure_topics

    components = build_judge(settings)
    stop = stop_on_signals()
    servers = require_bootstrap_servers()
    ensure_topics(servers)
    err.print(
        f"judge: {settings.method} with {components[1].name} on {servers}, group {settings.group}", soft_wrap=True
    )
    summary = run_judge(settings, bootstrap_servers=servers, until=stop.is_set, components=components)
    typer.echo(json.dumps(summary))


@settings_command(app, ConsensusSettings, name="consensus")
def consensus(settings: ConsensusSettings) -> None:
    """Join MC labels and judge verdicts per solution; accept the labels only where both agree on the
    first error (Qwen "Lessons" consensus filtering): `labels.accepted` / `labels.rejected`."""
    from prmloop.consumers.consensus import run_consensus
    from prmloop.store.kafka.producer import ensure_topics

    stop = stop_on_signals()
    servers = require_bootstrap_servers()
    ensure_topics(servers)
    err.print(f"consensus: {servers}, group {settings.group}", soft_wrap=True)
    summary = run_consensus(
        settings, bootstrap_servers=servers, outbox_dir=StateSettings().outbox_dir, until=stop.is_set
    )
    typer.echo(json.dumps(summary))


@settings_command(app, SimulatorOptions, name="simulate")
def simulate(settings: SimulatorOptions) -> None:
    """Publish simulated incorrect solutions (questions and solutions) for `score --simulator` and
    `annotate --completer simulator` with the same --sim-n/--sim-seed/--correlation."""
    from prmloop.producers.simulated import simulated_events
    from prmloop.store.kafka.producer import EventProducer, ensure_topics

    servers = require_bootstrap_servers()
    ensure_topics(servers)
    _, world = settings.world()
    events = simulated_events(world, settings.sim_seed)
    with EventProducer(servers) as producer:
        producer.publish(events)
    typer.echo(json.dumps({"solutions": len(world), "events": len(events), "seed": settings.sim_seed}))


@app.command("import")
def import_cmd(
    source: Annotated[str, typer.Argument(help="what to import: processbench")],
    file: Annotated[Path, typer.Argument(help="the file, e.g. ../shared/data/processbench/gsm8k.json")],
    limit: Annotated[int | None, typer.Option(help="only the first N solutions")] = None,
) -> None:
    """Publish solutions sampled elsewhere (ProcessBench) as questions and `solutions.sampled` events."""
    from prmloop.models.processbench import load_processbench, processbench_subset
    from prmloop.producers.import_processbench import processbench_events
    from prmloop.store.kafka.producer import EventProducer, ensure_topics

    if source != "processbench":
        raise typer.BadParameter(f"cannot import {source!r}; supported: processbench")
    subset = processbench_subset(file)
    items, errors = load_processbench(file, subset=subset)
    items = items[:limit]
    for message in errors:
        err.print(f"skipped: {message}", markup=False, highlight=False)
    events = processbench_events(items, subset, source=file)
    solutions = sum(1 for e in events if e.event_type == "SolutionSampled")
    servers = require_bootstrap_servers()
    ensure_topics(servers)
    with EventProducer(servers) as producer:
        producer.publish(events)
    typer.echo(
        json.dumps(
            {
                "solutions": solutions,
                "skipped_without_gold": len(items) - solutions,
                "invalid_items": len(errors),
                "events": len(events),
            }
        )
    )


@app.command()
def serve(
    model: Annotated[str, typer.Option(help="'smollm2' (embedded GGUF), a local folder or hub id")] = "smollm2",
    host: str = "127.0.0.1",
    port: Annotated[int, typer.Option(help="0 picks a free port")] = 8000,
    device: str = "cpu",
    num_threads: Annotated[int | None, typer.Option(help="torch CPU threads")] = None,
) -> None:
    """Serve a model over an OpenAI-compatible /v1/completions API (with log-probs) for CPU nodes."""
    from prmloop.flows.ops.serve import serve as run_server

    err.print(f"serving {model} on http://{host}:{port}/v1 (Ctrl-C stops)")
    run_server(model, host=host, port=port, device=device, num_threads=num_threads)


@app.command()
def demo(
    *,
    minutes: Annotated[float, typer.Option(help="time budget, start-up and summary included")] = 15.0,
    home: Annotated[
        Path | None, typer.Option(help="state folder (default $PRMLOOP_HOME, where every command looks)")
    ] = None,
    threads: Annotated[int | None, typer.Option(help="torch CPU threads of in-process models")] = None,
    levels: Annotated[
        str, typer.Option(help="arithmetic curriculum levels the loop samples, e.g. 1,2 (default: every level)")
    ] = "1,2,3,4,5",
    judge: Annotated[
        str, typer.Option(help="exact (the curriculum's step checker), critic or stepwise (the LLM judge)")
    ] = "exact",
    seed: int = 0,
    engine: Annotated[
        str,
        typer.Option(
            help="auto: the machine's vLLM engine where `make vllm` made it ready (started for the demo, or the "
            "one `prmloop up` runs), else transformers in each service; vllm; transformers"
        ),
    ] = "auto",
) -> None:
    """The streaming loop (`prmloop run`) for a time budget on the embedded defaults: every service at once
    on one engine, the ensemble PRM retrained as accepted labels arrive; a live view, then the learning
    curve, the figures, queries and commands to try. Library output goes to $PRMLOOP_HOME/logs/demo.log."""
    from prmloop.flows.demo.main import DemoError, DemoSettings, run_demo

    if judge not in ("exact", "critic", "stepwise"):
        raise typer.BadParameter(f"--judge must be exact, critic or stepwise, not {judge!r}")
    if minutes <= 0:
        raise typer.BadParameter(f"--minutes must be positive, not {minutes:g}")
    if engine not in ("auto", "transformers", "vllm"):
        raise typer.BadParameter(f"--engine must be auto, transformers or vllm, not {engine!r}")
    try:
        parsed = tuple(int(v) for v in levels.split(",") if v.strip())
    except ValueError:
        raise typer.BadParameter(f"--levels must be curriculum levels 1-5 such as 1,2, not {levels!r}") from None
    if not parsed or any(not 1 <= v <= 5 for v in parsed):
        raise typer.BadParameter(f"--levels must be curriculum levels 1-5 such as 1,2, not {levels!r}")
    try:
        run_demo(
            DemoSettings(
                home=home, minutes=minutes, threads=threads, levels=parsed, seed=seed, judge=judge, engine=engine
            )
        )
    except DemoError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
