"""Commands of the store: the embedded broker, topics, the sink, read-only SQL, reconcile."""

from __future__ import annotations

import csv
import json
import sys
import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from prmloop.flows.cli.app import DbOption, app, db_path, err, stop_on_signals
from prmloop.store.broker import EmbeddedBroker, require_bootstrap_servers, write_broker_file
from prmloop.store.settings import StateSettings


class OutputFormat(StrEnum):
    table = "table"
    csv = "csv"
    json = "json"


def _mkdir(path: Path) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    return True


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

    stop = stop_on_signals()
    servers = require_bootstrap_servers()
    ensure_topics(servers)
    path = db_path(db)
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

    result = run_query(db_path(db), query, timeout_s=timeout)
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

    report = run_reconcile(require_bootstrap_servers(), db_path(db), StateSettings().outbox_dir)
    typer.echo(json.dumps(report))
