"""Commands of the store: the embedded broker, topics, the sink, read-only SQL, reconcile."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from prmloop.flows.cli.app import DbOption, app, db_path, err, stop_on_signals, store_label
from prmloop.flows.cli.output import OutputFormat, print_rows, print_status
from prmloop.flows.ops.broker import EmbeddedBroker
from prmloop.store.kafka.broker_file import require_bootstrap_servers
from prmloop.store.settings import StateSettings


@app.command()
def broker(
    port: Annotated[int | None, typer.Option(help="port on 127.0.0.1 (default: a free one)")] = None,
    partitions: Annotated[int, typer.Option(help="partitions per topic")] = 4,
    storage: Annotated[
        str | None,
        typer.Option(
            help="memory (default), postgres (a PostgreSQL of the broker's own under $PRMLOOP_HOME/broker-postgres), "
            "or postgresql://user@host:port/database; default $PRMLOOP_BROKER_STORAGE"
        ),
    ] = None,
    announce: Annotated[
        bool, typer.Option(help="write $PRMLOOP_HOME/broker.json (off for the brokers of a cluster)")
    ] = True,
    name: Annotated[str, typer.Option(help="the broker's name: its log is logs/<name>.log")] = "broker",
) -> None:
    """Start the embedded Kafka broker (Tansu) and create the topics; runs until Ctrl-C, SIGTERM or
    SIGHUP, and then stops Tansu and removes $PRMLOOP_HOME/broker.json.

    In memory by default. With --storage postgres every topic, record and committed offset is kept in
    PostgreSQL: a restarted (or SIGKILLed) broker loses nothing, and brokers on one database are one
    cluster. Other commands find it through $PRMLOOP_HOME/broker.json, unless KAFKA_BOOTSTRAP_SERVERS is set.
    """
    from prmloop.flows.ops.broker import serve_embedded_broker
    from prmloop.flows.ops.postgres import resolve_storage
    from prmloop.store.kafka.broker_file import BrokerError

    state = StateSettings()
    try:
        dsn = resolve_storage(storage or state.broker_storage, state)
    except BrokerError as exc:
        raise typer.BadParameter(str(exc), param_hint="--storage") from exc

    def ready(b: EmbeddedBroker) -> None:
        typer.echo(b.bootstrap_servers)
        kept = "in PostgreSQL" if b.durable else "in memory"
        err.print(f"embedded broker on {b.bootstrap_servers} ({kept}, cluster {b.cluster_id}; Ctrl-C stops it)")
        err.print(f"  export KAFKA_BOOTSTRAP_SERVERS={b.bootstrap_servers}   # for other shells")

    serve_embedded_broker(
        port=port, partitions=partitions, state=state, on_ready=ready, storage=dsn, announce=announce, name=name
    )


@app.command()
def postgres(
    port: Annotated[int, typer.Option(help="port on 127.0.0.1")] = 5432,
    data_dir: Annotated[
        Path | None, typer.Option("--dir", help="the cluster's folder (default $PRMLOOP_HOME/postgres)")
    ] = None,
    database: Annotated[
        list[str] | None, typer.Option("--database", help="create this database if missing (repeatable)")
    ] = None,
) -> None:
    """Run a PostgreSQL server in the foreground (initdb on first use) until Ctrl-C or SIGTERM: the
    cluster's database server (broker storage, Prefect, the DuckLake catalog) on one machine."""
    from prmloop.flows.ops.postgres import PostgresError, serve_postgres

    state = StateSettings()
    folder = data_dir or state.home / "postgres"
    log = state.home / "logs" / "postgres-server.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    try:
        code = serve_postgres(
            folder,
            port,
            database or [],
            log=log,
            on_ready=lambda: err.print(f"PostgreSQL on 127.0.0.1:{port} ({folder}; its log: {log})"),
        )
    except PostgresError as exc:
        err.print(f"error: {exc}")
        raise typer.Exit(1) from exc
    raise typer.Exit(code)


@app.command()
def topics(partitions: Annotated[int, typer.Option(help="partitions per new topic")] = 4) -> None:
    """Create the event topics and their dead-letter topics (idempotent)."""
    from prmloop.store.events.topics import all_topic_specs
    from prmloop.store.kafka.producer import ensure_topics

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
    from prmloop.consumers.sink import SinkSettings, run_sink
    from prmloop.store.kafka.producer import ensure_topics

    stop = stop_on_signals()
    servers = require_bootstrap_servers()
    ensure_topics(servers)
    path = db_path(db)
    err.print(f"sink: {servers} -> {store_label(db)}")
    stats = run_sink(
        SinkSettings(group=group, max_batch=max_batch, max_wait=max_wait),
        bootstrap_servers=servers,
        db_path=path,
        until=stop.is_set,
    )
    err.print(
        f"sink stopped: {stats.counters['inserted']} new events stored of {stats.counters['received']} received, "
        f"{stats.dead_lettered} dead-lettered, {stats.counters['conflicts']} conflicting duplicates kept in `conflicts`"
    )


@app.command()
def sql(  # noqa: PLR0917 - one parameter per command-line option
    query: Annotated[
        str,
        typer.Argument(help="read-only SQL: SELECT, WITH, FROM, DESCRIBE, SHOW, SUMMARIZE, or EXPLAIN of one of them"),
    ],
    db: DbOption = None,
    fmt: Annotated[
        OutputFormat,
        typer.Option(
            "--format",
            "-f",
            help="table (one block per record when the columns do not fit the terminal), records, csv or json",
        ),
    ] = OutputFormat.table,
    timeout: Annotated[float, typer.Option(help="seconds to wait for the store's read snapshot")] = 30.0,
    max_seconds: Annotated[
        float, typer.Option(min=0, help="seconds the query may run before it is stopped (0: no limit)")
    ] = 60.0,
    max_memory: Annotated[str, typer.Option(help="memory the query may use, in DuckDB's units (2GB, 500MB)")] = "2GB",
) -> None:
    """Query the label history with SQL, also while the pipeline runs (a query reads a snapshot and
    never holds the sink up). Never modifies anything: only SELECT, WITH, FROM, DESCRIBE, SHOW, SUMMARIZE
    and EXPLAIN (of a read) run; anything else is refused. A query that runs past --max-seconds or
    needs more than --max-memory is stopped, in one line naming the limit (exit code 2). Reads --db,
    else PRMLOOP_STORE, else the DuckLake of the cluster `up --cluster` runs here, else the DuckDB file."""
    from prmloop.flows.cli.sql_process import QUERY_NICENESS, QueryLimits, in_query_process, run_in_query_process
    from prmloop.flows.ops.cluster import cluster_connection
    from prmloop.store.tables.duck import query as run_query

    store = _reading_store(db, cluster_connection())
    limits = QueryLimits(max_seconds or None, max_memory)
    if not in_query_process():
        # The query runs in a process of its own: no statement can crash this one (ducklake_set_option
        # did, with SIGSEGV, leaving its pid among the catalog's holders).
        raise typer.Exit(run_in_query_process(store, query, fmt=fmt.value, timeout=timeout, limits=limits))
    # Below the loop's priority: a query uses the cores the sink and the services leave idle.
    os.nice(QUERY_NICENESS)
    result = run_query(
        store, query, timeout_s=timeout, sandboxed=True, max_seconds=limits.max_seconds, max_memory=limits.max_memory
    )
    print_rows(result.columns, result.rows, fmt, err=err)


@app.command()
def reconcile(db: DbOption = None) -> None:
    """Re-publish outbox events missing from DuckDB (after the in-memory broker restarted)."""
    from prmloop.store.kafka.reconcile import reconcile as run_reconcile

    report = run_reconcile(require_bootstrap_servers(), db_path(db), StateSettings().outbox_dir)
    typer.echo(json.dumps(report))


@app.command()
def status(
    db: DbOption = None,
    timeout: Annotated[
        float, typer.Option(help="seconds to wait while the sink holds the file, and for the brokers' answers")
    ] = 30.0,
    as_json: Annotated[
        bool, typer.Option("--json", help="one JSON object (the default when stdout is not a terminal)")
    ] = False,
) -> None:
    """How the loop is doing: the services `prmloop up` started (running, or dead with their last log
    line; which broker each Kafka service reads from), the processes of `prmloop up --cluster` (the
    same, and the cluster's brokers and store are read when neither KAFKA_BOOTSTRAP_SERVERS nor
    PRMLOOP_STORE says otherwise), the broker, consumer lag per topic, dead letters per topic (count,
    newest error type), events per topic and type, solutions/labels per hour, acceptance rate, tokens per
    accepted label, MC-vs-judge agreement and the commonest rejections, the PRM in force (ensemble or
    LoRA), the learning curve and the latest calibration, conflicting duplicates, the last ingestion. A
    broker or store that cannot be read is said so; the rest is still reported. A few readable lines on
    a terminal; one JSON object with --json or when piped."""
    from prmloop.flows.ops.cluster import cluster_connection, cluster_report
    from prmloop.flows.ops.services import service_report
    from prmloop.store.kafka.broker_file import BrokerInfo, find_bootstrap_servers, read_broker_file
    from prmloop.store.settings import KafkaSettings

    cluster = cluster_connection()
    configured = KafkaSettings().bootstrap_servers
    report: dict[str, object] = {"services": service_report()}
    if cluster is not None:
        report["cluster"] = cluster_report()
    if configured or cluster is None:
        servers = find_bootstrap_servers()
        named = None if configured else read_broker_file()
        report["broker"] = {
            "bootstrap_servers": configured or (named.bootstrap_servers if named else None),
            "from": "KAFKA_BOOTSTRAP_SERVERS" if configured else "broker.json",
            **({"cluster_id": named.cluster_id} if named else {}),
            "reachable": servers is not None,
            # Whether only this user reaches it (Tansu in a network namespace of its own), and why not.
            **({"isolated": named.isolated} if named is not None and named.isolated is not None else {}),
            **({"why_not_isolated": named.why_not_isolated} if named is not None and named.why_not_isolated else {}),
        }
    else:
        addresses = cluster["bootstrap_servers"].split(",")
        answering = [a for a in addresses if BrokerInfo(a).reachable]
        servers = ",".join(answering) or None
        report["broker"] = {"bootstrap_servers": ",".join(addresses), "from": "up --cluster", "reachable": answering}
    if servers:
        try:
            report.update(
                _kafka_status_within(servers, approximate=cluster is not None or not configured, timeout=timeout)
            )
        except Exception as exc:  # noqa: BLE001 - status reports what it cannot read and goes on
            report["consumers"] = report["dead_letters"] = f"the broker did not answer: {_one_line(exc)}"
    else:
        report["consumers"] = report["dead_letters"] = "no broker reachable (prmloop up, or KAFKA_BOOTSTRAP_SERVERS)"
    report.update(_store_status(_reading_store(db, cluster), timeout))
    if as_json or not sys.stdout.isatty():
        typer.echo(json.dumps(report, default=str))
    else:
        print_status(json.loads(json.dumps(report, default=str)))


def _reading_store(db: str | None, cluster: dict[str, str] | None) -> Path | str:
    """The store `sql` and `status` read: ``--db``, else ``PRMLOOP_STORE``, else the store of the cluster
    `up --cluster` runs under this home (its DuckLake), else the DuckDB file."""
    if db or StateSettings().store or cluster is None:
        return db_path(db)
    return db_path(cluster["store"])


def _kafka_status_within(servers: str, *, approximate: bool, timeout: float) -> dict[str, object]:
    """:func:`_kafka_status`, given up after ``timeout`` seconds: a broker whose storage died (the
    cluster's PostgreSQL killed) accepts connections and answers no request, and the Kafka client asks
    again for minutes (`prmloop status` hung over 240 s in the chaos test)."""
    import threading

    report: list[dict[str, object]] = []
    error: list[Exception] = []

    def read() -> None:
        try:
            report.append(_kafka_status(servers, approximate=approximate))
        except Exception as exc:  # noqa: BLE001 - handed to the caller's thread
            error.append(exc)

    reader = threading.Thread(target=read, name="status-kafka", daemon=True)  # abandoned if it hangs
    reader.start()
    reader.join(timeout)
    if error:
        raise error[0]
    if not report:
        raise TimeoutError(
            f"no answer within {timeout:g} s (--timeout): a broker that takes connections but answers nothing; "
            "is its storage (the cluster's PostgreSQL) down?"
        )
    return report[0]


def _kafka_status(servers: str, *, approximate: bool) -> dict[str, object]:
    from prmloop.consumers.annotator import ANNOTATOR_GROUP
    from prmloop.consumers.consensus import CONSENSUS_GROUP
    from prmloop.consumers.judge import JUDGE_GROUP
    from prmloop.consumers.scorer import SCORER_GROUP
    from prmloop.consumers.selector import SELECTOR_GROUP
    from prmloop.consumers.sink import SINK_GROUP
    from prmloop.store.kafka.deadletter import dead_letter_summary
    from prmloop.store.kafka.lag import consumer_lag

    groups = [SINK_GROUP, SCORER_GROUP, SELECTOR_GROUP, ANNOTATOR_GROUP, JUDGE_GROUP, CONSENSUS_GROUP]
    # Tansu (the embedded broker and the cluster's) undercounts end offsets by up to a batch.
    return {
        "consumers": consumer_lag(servers, groups, approximate=approximate),
        "dead_letters": dead_letter_summary(servers),
    }


def _store_status(path: Path | str, timeout: float) -> dict[str, object]:
    from prmloop.store.tables.duck import store_health
    from prmloop.store.tables.metrics import loop_metrics

    try:
        return {**store_health(path, timeout_s=timeout), **loop_metrics(path, timeout_s=timeout)}
    except FileNotFoundError:
        raise  # no store at all: the command's one-line error says how to make one
    except Exception as exc:  # noqa: BLE001 - a store that is down (its PostgreSQL killed) is reported, not fatal
        return {"store": f"cannot be read: {_one_line(exc)}"}


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:400]


@app.command()
def export(
    views: Annotated[list[str], typer.Argument(help="tables or views to export (e.g. current_labels steps)")],
    out: Annotated[str, typer.Option("--out", "-o", help="folder for <view>.parquet files")] = "export",
    db: DbOption = None,
    force: Annotated[bool, typer.Option("--force", help="replace <view>.parquet files that exist")] = False,
) -> None:
    """Write tables or views of the store as Parquet files (streamed; a file appears only when whole).
    Refuses to overwrite an existing <view>.parquet unless --force (then says what it replaced).
    Prints one JSON line per file."""
    from pathlib import Path

    from prmloop.store.tables.export import export_views

    def progress(p: dict[str, object]) -> None:
        err.print(f"export: {p['view']}: {p['rows']} rows", highlight=False)

    for row in export_views(db_path(db), views, Path(out), force=force, progress=progress):
        if row["replaced_bytes"] is not None:
            err.print(
                f"export: replaced {row['path']} ({row['replaced_bytes']} bytes before)",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )
        typer.echo(json.dumps(row))


@app.command()
def compact(
    db: DbOption = None,
    keep_days: Annotated[float, typer.Option(help="keep snapshots (time travel) this many days")] = 7.0,
    no_prefect: Annotated[bool, typer.Option("--no-prefect", help="run without a Prefect flow run")] = False,
) -> None:
    """Compact a DuckLake store: merge small Parquet files, drop doubled event ids, expire old
    snapshots, delete unneeded files. Safe while sinks write. Prints one JSON line."""
    from prmloop.flows.maintenance import compact as compact_flow
    from prmloop.flows.maintenance import compact_store

    store = str(db_path(db))
    report = compact_store(store, keep_days) if no_prefect else compact_flow(store, keep_days)
    typer.echo(json.dumps(report, default=str))
