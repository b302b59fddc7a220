"""``prmloop sql`` runs the user's query in a process of its own, so no statement can crash the command.

DuckDB and its extensions run the query in C++: a statement that crashes them (``ducklake_set_option``
on a read-only lake ended the process with SIGSEGV) would end ``prmloop sql`` with no word, and, on a
``ducklake:pgserver:`` lake, leave its pid among the local PostgreSQL's holders, so that the catalog
never stopped. The command's own process holds the catalog (it starts or joins its PostgreSQL, and lets
go of it when it exits, whatever happened to the query) and hands the query process the lake as a
plain PostgreSQL catalog (:func:`~prmloop.store.tables.lake_catalog.served_form`); a query process that dies
of a signal is one line naming it.

The query process stops its query at the time limit itself (DuckDB's ``interrupt()``); should a
statement not heed it, this process ends the query process 15 s later, in one line as well.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import typer

from prmloop.flows.cli.app import print_error
from prmloop.flows.ops.broker import parent_death_signal
from prmloop.store.tables.duck import locate
from prmloop.store.tables.lake import LakeStore

__all__ = ["QUERY_NICENESS", "QueryLimits", "in_query_process", "run_in_query_process"]

#: Set in the query process's environment.
CHILD = "PRMLOOP_SQL_QUERY_PROCESS"
#: The query process's niceness: it runs on what CPU the sink and the loop leave (a runaway query took
#: a whole core of two from them).
QUERY_NICENESS = 10
#: How long past its time limit a query process may go on before it is ended from here.
_GRACE_S = 15.0


@dataclass(frozen=True)
class QueryLimits:
    """A query's limits: seconds (None: none) and memory (DuckDB's units)."""

    max_seconds: float | None = 60.0
    max_memory: str = "2GB"


def in_query_process() -> bool:
    return os.environ.get(CHILD) == "1"


def run_in_query_process(
    store: Path | str, query: str, *, fmt: str, timeout: float, limits: QueryLimits | None = None
) -> int:
    """Run ``prmloop sql`` for ``query`` on ``store`` in a child process; echo what it prints; its exit
    code (2, with one line, when it died of a signal)."""
    from prmloop.store.tables.lake_catalog import served_form

    located = locate(store)
    # Passwords stay in passfiles (or in PRMLOOP_STORE as the user gave it): the environment is theirs only.
    spec = served_form(located).spec if isinstance(located, LakeStore) else str(located)
    env = {**os.environ, CHILD: "1", "PRMLOOP_STORE": spec}
    limits = limits or QueryLimits()
    argv = [sys.executable, "-m", "prmloop.flows.cli", "sql", query, "--format", fmt, "--timeout", str(timeout)]
    argv += ["--max-seconds", str(limits.max_seconds or 0), "--max-memory", limits.max_memory]
    try:
        done = subprocess.run(
            argv,
            env=env,
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            preexec_fn=parent_death_signal(),
            check=False,
            # the wait for the snapshot, the query's own limit, and the start of Python
            timeout=timeout + limits.max_seconds + _GRACE_S + 30 if limits.max_seconds else None,
        )
    except subprocess.TimeoutExpired:
        print_error(
            f"the query was stopped at its time limit of {limits.max_seconds:g} s (its process ended: it did not "
            "stop by itself): give --max-seconds with more (0: no limit)"
        )
        return 2
    if done.stdout:
        typer.echo(done.stdout, nl=False)
    if done.returncode < 0:
        name = signal.Signals(-done.returncode).name
        print_error(
            f"the query crashed DuckDB ({name}) in its own process; nothing was changed and the store is intact: "
            "report the statement (`prmloop sql` refuses what it knows to crash)"
        )
        return 2
    if done.stderr:
        sys.stderr.write(done.stderr)
    return done.returncode
