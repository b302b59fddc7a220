"""Commands that run the whole loop on one machine: up, down, deployments serve."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer

from prmloop.flows.cli.app import DbOption, app, db_path, progress_line, usage_error

deployments_app = typer.Typer(help="The loop's Prefect deployments on this machine.", no_args_is_help=True)
app.add_typer(deployments_app, name="deployments")


@app.command()
def up(  # noqa: PLR0917 (typer's options)
    only: Annotated[
        list[str] | None,
        typer.Option(
            "--only",
            help="start just these (repeatable): engine, broker, sink, scorer, selector, annotator, judge, consensus, prefect, deployments",  # noqa: E501
        ),
    ] = None,
    without: Annotated[list[str] | None, typer.Option("--without", help="start all but these (repeatable)")] = None,
    engine: Annotated[
        str,
        typer.Option(
            help="vllm: start the machine's vLLM engine (`make vllm`) and point the sampler, scorer, annotator, "
            "judge and prioritize at it; transformers: each service loads the model itself; auto: vllm where "
            ".venv-vllm is ready and the whole stack starts (no --only), else transformers",
        ),
    ] = "auto",
    engine_threads: Annotated[
        int | None, typer.Option(min=1, help="vllm: the engine's OpenMP threads (default: the cores, at most 2)")
    ] = None,
    cluster: Annotated[
        bool,
        typer.Option(
            "--cluster",
            help="the compose file's topology as native processes: PostgreSQL, two brokers on it, Prefect server, "
            "work pools and workers, two of each service (see infra/OPERATIONS.md)",
        ),
    ] = False,
    cluster_engine: Annotated[
        str, typer.Option(help="--cluster: the engine in place of the vLLM servers: simulator or model")
    ] = "simulator",
) -> None:
    """Start everything one machine needs in the background: the embedded broker, the sink, the scorer,
    annotator, judge and consensus services, a Prefect server with its UI, and the served deployments.
    With --engine vllm, first the machine's vLLM engine (`prmloop engine`), which the sampler, scorer,
    annotator, judge and prioritize then use; a running engine is used by whatever `up` starts.

    State and logs go under $PRMLOOP_HOME (run/, logs/); a second `up` says what is already running.
    `prmloop down` stops it all.
    """
    if cluster:
        from prmloop.flows.ops.cluster import cluster_up

        if cluster_engine not in ("simulator", "model"):
            raise typer.BadParameter(f"{cluster_engine!r}: write simulator or model", param_hint="--cluster-engine")
        typer.echo(json.dumps(cluster_up(engine=cluster_engine, say=progress_line)))
        return
    from prmloop.flows.ops.services import STACK_SERVICES
    from prmloop.flows.ops.stack import up as start

    if engine not in ("auto", "transformers", "vllm"):
        raise typer.BadParameter(f"--engine must be auto, transformers or vllm, got {engine!r}")
    services = [s for s in (only or STACK_SERVICES) if s not in set(without or ())]
    if engine == "auto":
        engine = _auto_engine(bool(only), "engine" in set(without or ()))
    if engine == "vllm" and "engine" not in services:
        services.insert(0, "engine")
    _engine_threads(engine_threads)
    summary = start(services, say=progress_line)
    prefect = summary["running"].get("prefect")
    if prefect:
        progress_line(
            f"Prefect UI: {prefect['url'].removesuffix('/api')}  (prmloop commands now report their flow runs there)"
        )
    typer.echo(json.dumps(summary))


def _auto_engine(only: bool, without_engine: bool) -> str:
    """vllm where it can run (bench generate measured it faster than transformers here and on GPUs)."""
    from prmloop.flows.ops.engine import engine_unavailable

    if only or without_engine:
        return "transformers"
    reason = engine_unavailable()
    if reason is not None:
        progress_line(f"engine: transformers in each service (vLLM engine unavailable: {reason})")
        return "transformers"
    progress_line("engine: the vLLM engine, shared by the services (--engine transformers: each loads its own model)")
    return "vllm"


def _engine_threads(threads: int | None) -> None:
    if threads is not None:
        os.environ["PRMLOOP_ENGINE_THREADS"] = str(threads)


@app.command()
def engine(
    threads: Annotated[
        int | None,
        typer.Option(
            min=1, help="the engine's OpenMP threads (default: the cores, at most 2; with --replicas: 1 each)"
        ),
    ] = None,
    replicas: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=16,
            help="servers of the model under one engine, the services' requests spread over them "
            "(default: $PRMLOOP_ENGINE_REPLICAS, else 1)",
        ),
    ] = None,
) -> None:
    """Start the machine's vLLM engine in the background (an OpenAI-compatible server on a free port,
    from .venv-vllm, which `make vllm` builds) and print its URL and how to point a command at it.

    `prmloop status` shows it and its load, `prmloop down` stops it; `prmloop up` points the services it
    starts at a running engine.
    """
    from prmloop.flows.ops.engine import service_environment
    from prmloop.flows.ops.stack import up as start

    _engine_threads(threads)
    if replicas is not None:
        os.environ["PRMLOOP_ENGINE_REPLICAS"] = str(replicas)
    summary = start(["engine"], say=progress_line)
    url = summary["running"]["engine"]["url"]
    progress_line(f"vLLM engine: {url}  (one command: prmloop sample --backend openai --base-url {url})")
    typer.echo(json.dumps({**summary, "environment": service_environment(url)}))


@app.command()
def down(
    grace: Annotated[float, typer.Option(help="seconds each service gets to stop before it is killed")] = 20.0,
    cluster: Annotated[bool, typer.Option("--cluster", help="stop what `prmloop up --cluster` started")] = False,
) -> None:
    """Stop everything `prmloop up` started, in reverse order."""
    from prmloop.flows.ops.stack import down as stop

    if cluster:
        from prmloop.flows.ops.cluster import cluster_down

        typer.echo(json.dumps({"stopped": cluster_down(grace_s=grace, say=progress_line)}))
        return

    typer.echo(json.dumps({"stopped": stop(grace_s=grace, say=progress_line)}))


@deployments_app.command("serve")
def serve(
    schedule: Annotated[
        bool, typer.Option(help="run the deployments on their schedules (off: run them from the UI)")
    ] = False,
) -> None:
    """Serve the prioritize, sample and calibrate deployments to the Prefect server until Ctrl-C."""
    from prmloop.flows.deployments import serve_deployments

    serve_deployments(schedule=schedule)


@app.command()
def screenshots(
    out: Annotated[Path, typer.Option(help="folder for the PNG files")] = Path("out/screenshots"),
    url: Annotated[str | None, typer.Option(help="the Prefect UI (default: the server `prmloop up` started)")] = None,
    wait: Annotated[float, typer.Option(help="seconds each page gets to load its data")] = 20.0,
) -> None:
    """Screenshots of the Prefect UI (flow runs, deployments, the loop's artifacts) in headless Chromium
    (Debian's `chromium` package: `apt-get install chromium`)."""
    from prmloop.flows.ops.screenshots import find_chromium, take_screenshots
    from prmloop.flows.ops.services import prefect_api_url

    # Chromium first: it is installed once, while a server is started every session.
    try:
        find_chromium()
    except FileNotFoundError as exc:
        usage_error(str(exc))
    target = url or prefect_api_url()
    if not target:
        usage_error("no Prefect server found: start one with `prmloop up`, or give --url")
    from prmloop.store.auth.credentials import load_credentials

    # prmloop's servers ask for the credentials' auth string (one given by --url may ask for another:
    # PREFECT_API_AUTH_STRING).
    auth = os.environ.get("PREFECT_API_AUTH_STRING") or load_credentials().prefect_auth_string
    files = take_screenshots(target, out, wait_ms=int(wait * 1000), auth_string=auth)
    for name, path in files.items():
        progress_line(f"{name}: {path}")
    typer.echo(json.dumps(files))


@app.command()
def monitor(db: DbOption = None) -> None:
    """Publish the loop's metrics as Prefect artifacts (loop-per-hour, loop-summary): the flow `monitor`."""
    from prmloop.flows.monitor import monitor as run_monitor

    metrics = run_monitor(str(db_path(db)))
    typer.echo(json.dumps({k: v for k, v in metrics.items() if k != "per_hour"}, default=str))
