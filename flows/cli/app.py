"""The ``prmloop`` typer application and what its command groups share."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console

from prmloop.flows.ops.prefect_home import USER_CHOSE_PREFECT, isolate_prefect_state
from prmloop.store.auth.credentials import private_files, secure_home
from prmloop.store.settings import StateSettings
from prmloop.store.tables.duck import locate
from prmloop.store.tables.lake import is_lake_spec

__all__ = [
    "DbOption",
    "app",
    "bench_app",
    "db_path",
    "err",
    "eval_app",
    "print_error",
    "stop_on_signals",
    "usage_error",
]

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

DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        help="the store: a DuckDB file or ducklake:... (default: $PRMLOOP_STORE, else $PRMLOOP_HOME/prmloop.duckdb)",
    ),
]


def progress_line(line: str) -> None:
    """A long command's progress line, on stderr (its result goes to stdout), printed as it is."""
    err.print(line, markup=False, highlight=False, soft_wrap=True)


def print_error(message: str) -> None:
    """``error: message`` as one line on stderr: never wrapped, data never read as markup."""
    line = " ".join(message.split())
    err.print("[bold red]error:[/] ", end="", soft_wrap=True)
    err.print(line, markup=False, highlight=False, soft_wrap=True)


def usage_error(message: str) -> NoReturn:
    """A wrong option: one line naming it and what to do, exit code 2, before any work (or flow run) starts.
    (typer's own usage box takes five lines and wraps the list of choices.)"""
    print_error(message)
    raise typer.Exit(2)


def db_path(db: str | Path | None) -> Path | str:
    """The store a command reads or writes: ``--db``, else ``PRMLOOP_STORE``, else the DuckDB file.
    A DuckLake stays its ``ducklake:...`` text (passwords included: print :func:`store_label`)."""
    where = db if db else StateSettings().store_location
    return where if isinstance(where, Path) or is_lake_spec(where) else Path(where)


def store_label(db: str | Path | None) -> str:
    """The store for messages: a DuckLake with any password masked."""
    return str(locate(db_path(db)))


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # kafka-python logs every reconnect attempt at ERROR; the runtime reports what matters.
    logging.getLogger("kafka").setLevel(logging.CRITICAL if not verbose else logging.WARNING)


@app.callback()
def _root(
    ctx: typer.Context, verbose: Annotated[bool, typer.Option("--verbose", "-v", help="log progress")] = False
) -> None:
    _setup_logging(verbose)
    # What prmloop writes is its user's alone: files 0600 in a home closed to other users.
    private_files()
    home = secure_home(StateSettings().home)
    _exit_cleanly_on_signals(ctx)
    # Prefect's state goes under $PRMLOOP_HOME, not the ~/.prefect every other Prefect run shares.
    ctx.with_resource(isolate_prefect_state(home))
    # While `prmloop up` runs a Prefect server, flow runs go to it (and show in its UI).
    if not USER_CHOSE_PREFECT and "prefect" not in sys.modules:
        from prmloop.flows.ops.services import prefect_api_url

        url = prefect_api_url(StateSettings(home=home))
        if url:
            os.environ["PREFECT_API_URL"] = url


def _exit_cleanly_on_signals(ctx: typer.Context) -> None:
    """SIGTERM or SIGHUP end the command as Ctrl-C would, through its ``finally`` blocks and context
    managers: a server it started for itself (the vLLM server of `bench generate`, the query process of
    `sql`, a bench's sinks) is stopped, never left behind with parent 1. Commands that stop their own
    way install their own handlers over this one (the broker, the services, the demo)."""
    if threading.current_thread() is not threading.main_thread():
        return

    def leave(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = {sig: signal.signal(sig, leave) for sig in (signal.SIGTERM, signal.SIGHUP)}
    ctx.call_on_close(lambda: [signal.signal(sig, handler) for sig, handler in previous.items()])


def stop_on_signals() -> threading.Event:
    """SIGTERM/SIGINT during start-up ask for a clean stop too (the runtime takes over once running)."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stop.set())
    return stop
