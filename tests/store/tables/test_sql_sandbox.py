"""``prmloop sql`` reads the store's tables and views and nothing else, on the DuckDB file and on a
real ``ducklake:pgserver:`` lake (its own PostgreSQL, started here): every case of the DuckDB
file's refusal suite (tests/store/tables/test_duck.py, test_store_guards.py, tests/flows/cli/test_cli.py) runs
against both, with the ways into PostgreSQL a hostile tester found (issue 25.1): ``postgres_query``
(``pg_read_file``, ``pg_terminate_backend`` of a sink's session) and ``postgres_scan`` to any host.
Behind the statement check, the lake's readers reach the catalog as a role that may only read."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pytest

from prmloop.consumers.sink import events_to_arrow
from prmloop.flows.lab.bench.synthetic import synthetic_events
from prmloop.store.kafka.runtime import ConsumedEvent
from prmloop.store.tables.duck import (
    DuckEventStore,
    QueryError,
    ReadOnlyViolation,
    StoreLocation,
    locate,
    open_writer,
    query,
)
from prmloop.store.tables.lake import METADATA_CATALOG, LakeStore, ReaderRoleError, extension_file, open_lake
from prmloop.store.tables.lake_catalog import READER_ROLE, reader_conninfo, release_local_postgres
from prmloop.store.tables.sql_guard import READING_DUCKLAKE_FUNCTIONS, check_read_only

N_EVENTS = 60
READ_PASSWD = "SELECT * FROM postgres_query('__ducklake_metadata_lake', 'SELECT pg_read_file(''/etc/passwd'') AS f')"
TERMINATE = (
    "SELECT * FROM postgres_query('__ducklake_metadata_lake', "
    "'SELECT pg_terminate_backend(pid) AS t FROM pg_stat_activity WHERE pid <> pg_backend_pid()')"
)


@dataclass
class Stores:
    duckdb: Path
    lake: LakeStore
    sink: duckdb.DuckDBPyConnection  # a writer's connection to the lake, its catalog sessions open as a sink's

    def at(self, kind: str) -> StoreLocation:
        return self.duckdb if kind == "duckdb" else self.lake


def _owner_backends(con: duckdb.DuckDBPyConnection) -> list[int]:
    """The PostgreSQL sessions of the catalog's owner (the sinks'), as the writer sees them."""
    sql = "SELECT pid FROM pg_stat_activity WHERE usename = ''prmloop_sink'' AND backend_type = ''client backend''"
    return [int(r[0]) for r in con.execute(f"SELECT * FROM postgres_query('{METADATA_CATALOG}', '{sql}')").fetchall()]


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stores]:
    """A DuckDB file and a ``ducklake:pgserver:<home>/lake`` lake with ``PRMLOOP_HOME=<home>`` (the
    layout that used to put the data inside PostgreSQL's folder), each with the same events."""
    home = tmp_path_factory.mktemp("sandbox")
    events = synthetic_events(N_EVENTS, k=2)
    rows = events_to_arrow([ConsumedEvent(e, "t", 0, i, 0) for i, e in enumerate(events)])
    DuckEventStore(home / "store.duckdb").write_batch(rows, [("t", 0, N_EVENTS)])
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PRMLOOP_HOME", str(home))
        lake = locate(f"ducklake:pgserver:{home}/lake")
    assert isinstance(lake, LakeStore)
    writer = open_writer(lake)
    writer.write_batch(rows, [("t", 0, N_EVENTS)])
    writer.close()
    try:
        with open_lake(lake, read_only=False) as sink:
            assert _owner_backends(sink)
            yield Stores(home / "store.duckdb", lake, sink)
    finally:
        release_local_postgres(lake.catalog.partition(":")[2])


def _intact(stores: Stores, kind: str) -> None:
    """Nothing was changed, and the sink's sessions still work."""
    assert query(stores.at(kind), "SELECT count(*) FROM events").rows == [(N_EVENTS,)]
    assert stores.sink.execute("SELECT count(*) FROM events").fetchone() == (N_EVENTS,)
    assert _owner_backends(stores.sink)


def test_the_pgserver_lake_keeps_its_catalog_and_its_data_apart(stores: Stores) -> None:
    """Issue 25.6: with no data path the Parquet files went to ``$PRMLOOP_HOME/lake/data``, inside
    the PostgreSQL folder ``<home>/lake``, and initdb refused the non-empty folder."""
    home = stores.duckdb.parent
    assert stores.lake.data_path == home / "lake" / "data"
    assert (home / "lake" / "catalog" / "PG_VERSION").exists()
    assert list((home / "lake" / "data").rglob("*.parquet"))
    assert not (home / "lake" / "data" / "PG_VERSION").exists()


STORES = ["duckdb", "pgserver-lake"]

#: The DuckDB file's refusal suite (test_duck.py, test_cli.py), then ways around a name check.
WRITING = [
    "INSERT INTO events SELECT * FROM events",
    "DELETE FROM events",
    "UPDATE events SET producer = 'x'",
    "CREATE TABLE x AS SELECT 1",
    "DROP VIEW steps",
    "COPY events TO '/tmp/out.csv'",
    "ATTACH '/tmp/other.duckdb' AS other",
    "SET enable_external_access = true",
    "PRAGMA enable_profiling",
    "CALL checkpoint()",
    "INSTALL httpfs",
    "LOAD httpfs",
    "EXPORT DATABASE '/tmp/dump'",
    "SELECT 1; DELETE FROM events",
    "",
    "COPY events TO 'x.csv'",
    "ATTACH 'other.duckdb'",
    # test_store_guards.py: EXPLAIN only of a read
    "EXPLAIN ANALYZE CREATE TEMP TABLE t AS SELECT 1",
    "explain analyze insert into events select * from events",
    "/* hidden */ EXPLAIN ANALYZE CREATE TEMP TABLE t AS SELECT 1",
    "EXPLAIN (FORMAT json) CREATE TEMP TABLE t (a INT)",
    "SELECT 1; EXPLAIN ANALYZE COPY (SELECT 1) TO '/tmp/x.csv'",
    # issue 25.1, and the same calls spelled otherwise
    READ_PASSWD,
    TERMINATE,
    "SELECT * FROM postgres_scan('host=127.0.0.1 port=1 dbname=x', 'public', 't')",
    "CALL postgres_execute('__ducklake_metadata_lake', 'DROP TABLE ducklake_snapshot')",
    "SELECT * FROM \"POSTGRES_QUERY\" /* a comment */ ('__ducklake_metadata_lake', 'SELECT 1')",
    "SELECT * FROM system.main.Postgres_Scan_Pushdown('host=127.0.0.1', 'public', 't')",
    "SELECT * FROM postgres_attach('host=127.0.0.1')",
    "SELECT * FROM query('SELECT * FROM postgres_query(''__ducklake_metadata_lake'', ''SELECT 1'')')",
    "SELECT * FROM json_execute_serialized_sql(json_serialize_sql('SELECT 1'))",
    "EXPLAIN SELECT * FROM postgres_query('__ducklake_metadata_lake', 'SELECT 1')",
    "SELECT 1; SELECT * FROM pg_clear_cache()",
]


@pytest.mark.parametrize("kind", STORES)
@pytest.mark.parametrize("sql", WRITING)
def test_anything_but_a_read_of_the_store_is_refused(stores: Stores, kind: str, sql: str) -> None:
    with pytest.raises(ReadOnlyViolation) as info:
        query(stores.at(kind), sql, sandboxed=True)
    assert "\n" not in str(info.value)
    with pytest.raises(ReadOnlyViolation):
        check_read_only(sql)


@pytest.mark.parametrize(
    ("sql", "named"),
    [
        ("INSTALL httpfs", "INSTALL"),
        ("/* hidden */ install httpfs", "INSTALL"),
        ("FORCE INSTALL httpfs", "FORCE INSTALL"),
        ("LOAD httpfs", "LOAD"),
        ("UPDATE EXTENSIONS", "UPDATE EXTENSIONS"),
        ("USE memory", "USE"),
        ("COPY events TO 'x.csv'", "COPY"),
        ("EXPLAIN INSTALL httpfs", "an EXPLAIN of INSTALL"),
    ],
)
def test_a_refusal_names_the_statement_as_written(sql: str, named: str) -> None:
    """Issue 54: `INSTALL httpfs` was refused as "statement 1 is LOAD" (DuckDB parses INSTALL into a
    LOAD statement); the refusal names what the statement says it is."""
    with pytest.raises(ReadOnlyViolation) as info:
        check_read_only(sql)
    assert str(info.value).startswith(f"statement 1 is {named}: "), info.value


def test_after_every_refusal_the_store_and_the_sink_are_intact(stores: Stores) -> None:
    for kind in STORES:
        for sql in WRITING:
            with pytest.raises(ReadOnlyViolation):
                query(stores.at(kind), sql, sandboxed=True)
        _intact(stores, kind)


def test_every_function_of_the_postgresql_scanner_is_refused() -> None:
    """Whatever the scanner's version adds: the functions a connection has only after loading it."""
    config = {"autoinstall_known_extensions": False, "autoload_known_extensions": False}
    listing = "SELECT DISTINCT function_name FROM duckdb_functions()"
    with duckdb.connect(config=config) as bare, duckdb.connect(config=config) as loaded:
        loaded.execute(f"LOAD '{extension_file('duckdb_extension_postgres_scanner', 'postgres_scanner')}'")
        added = {r[0] for r in loaded.execute(listing).fetchall()} - {r[0] for r in bare.execute(listing).fetchall()}
    assert {"postgres_query", "postgres_scan", "postgres_execute"} <= added
    for name in sorted(added):
        with pytest.raises(ReadOnlyViolation, match=name):
            check_read_only(f"SELECT * FROM {name}('x')")


@pytest.mark.parametrize("kind", STORES)
def test_reading_files_from_a_select_is_blocked(stores: Stores, kind: str, tmp_path: Path) -> None:
    secret = tmp_path / "secret.csv"
    secret.write_text("a\n1\n")
    with pytest.raises(QueryError, match=r"(?i)external access|permission"):
        query(stores.at(kind), f"SELECT * FROM read_csv('{secret}')", sandboxed=True)


@pytest.mark.parametrize("kind", STORES)
@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("SELECT * FROM no_such_table", "no_such_table"),
        ("SELECT CAST('x' AS INTEGER)", "Conversion"),
        ("SELECT 1; SELECT nope FROM events", "statement 2"),
    ],
)
def test_a_failing_query_is_one_line_naming_the_problem(stores: Stores, kind: str, sql: str, expected: str) -> None:
    with pytest.raises(QueryError) as info:
        query(stores.at(kind), sql, sandboxed=True)
    message = str(info.value)
    assert "\n" not in message and expected in message and "^^^" not in message


@pytest.mark.parametrize("kind", STORES)
@pytest.mark.parametrize(
    "sql",
    [
        "EXPLAIN SELECT 1",
        "EXPLAIN ANALYZE SELECT count(*) FROM events",
        "EXPLAIN FROM events",
        "SELECT count(*) FROM current_labels",
        "SELECT query FROM (SELECT 1 AS query)",
    ],
)
def test_reads_still_work(stores: Stores, kind: str, sql: str) -> None:
    assert query(stores.at(kind), sql, sandboxed=True).rows


def test_a_postgresql_error_from_the_catalog_is_one_line(stores: Stores) -> None:
    """A table of the catalog's database that is not the lake's: the reader role may not read it."""
    stores.sink.execute(
        f"CALL postgres_execute('{METADATA_CATALOG}', "
        "'CREATE SCHEMA IF NOT EXISTS private; CREATE TABLE IF NOT EXISTS private.secret (a int)')"
    )
    with pytest.raises(QueryError) as info:
        query(stores.lake, f"SELECT * FROM {METADATA_CATALOG}.private.secret", sandboxed=True)
    assert "\n" not in str(info.value) and "permission denied for schema private" in str(info.value)


def test_the_lakes_readers_reach_the_catalog_as_a_role_that_may_only_read(stores: Stores) -> None:
    """The second wall: even a call the statement check let through could not read the host's
    files, end the sink's session or change the catalog."""
    with open_lake(stores.lake, read_only=True, sandboxed=True) as con:

        def catalog(sql: str) -> object:
            quoted = sql.replace("'", "''")
            return con.execute(f"SELECT * FROM postgres_query('{METADATA_CATALOG}', '{quoted}')").fetchall()

        assert catalog("SELECT current_user") == [(READER_ROLE,)]
        assert catalog("SELECT count(*) FROM ducklake_snapshot")  # the catalog's tables: readable
        with pytest.raises(duckdb.Error, match="permission denied for function pg_read_file"):
            catalog("SELECT pg_read_file('/etc/passwd')")
        for pid in _owner_backends(stores.sink):
            with pytest.raises(duckdb.Error, match="permission denied to terminate"):
                catalog(f"SELECT pg_terminate_backend({pid})")
        with pytest.raises(duckdb.Error, match=r"read-only transaction|permission denied"):
            con.execute(f"CALL postgres_execute('{METADATA_CATALOG}', 'DELETE FROM ducklake_snapshot')")
    _intact(stores, "pgserver-lake")


def test_postgres_scan_opens_no_connection(stores: Stores) -> None:
    """What the tester saw: ``postgres_scan`` dialled any host. Now nothing reaches a listener."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.settimeout(1.0)
        port = listener.getsockname()[1]
        for kind in STORES:
            with pytest.raises(ReadOnlyViolation):
                query(stores.at(kind), f"SELECT * FROM postgres_scan('host=127.0.0.1 port={port}', 'public', 't')")
        with pytest.raises(TimeoutError):
            listener.accept()


def _cli(home: Path, store: str, sql: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP_SERVERS"}
    env.update(PRMLOOP_HOME=str(home), PRMLOOP_STORE=store)
    return subprocess.run(
        [sys.executable, "-m", "prmloop.flows.cli", "sql", sql, "--format", "csv"],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def test_the_command_line_prints_one_line_and_no_host_file(stores: Stores, tmp_path: Path) -> None:
    for sql in (READ_PASSWD, TERMINATE, "SELECT * FROM postgres_scan('host=127.0.0.1 port=1', 'public', 't')"):
        result = _cli(tmp_path, stores.lake.spec, sql)
        assert result.returncode == 2, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
        assert "root:" not in result.stdout + result.stderr
    ok = _cli(tmp_path, stores.lake.spec, "SELECT count(*) AS n FROM events")
    assert ok.returncode == 0 and ok.stdout.splitlines() == ["n", str(N_EVENTS)], ok.stderr
    _intact(stores, "pgserver-lake")


def test_sql_on_a_postgres_catalog_refuses_a_reader_that_could_write(lake_store: LakeStore) -> None:
    """A ``ducklake:postgres:`` lake read as the owner (a superuser, here) is refused for someone's
    SQL, with what to set up; with ``#reader=`` (a role that may only SELECT) it reads."""
    writer = open_writer(lake_store)
    writer.close()
    as_owner = LakeStore(lake_store.catalog, lake_store.data_path)
    with pytest.raises(ReaderRoleError) as info:
        query(as_owner, "SELECT count(*) FROM events", sandboxed=True)
    message = str(info.value)
    assert "\n" not in message and "superuser" in message and "#reader=" in message
    assert query(as_owner, "SELECT count(*) FROM events").rows == [(0,)]  # prmloop's own reads go on
    assert query(lake_store, "SELECT count(*) FROM events", sandboxed=True).rows == [(0,)]
    paths = query(lake_store, "SELECT path FROM duckdb_databases() WHERE path IS NOT NULL", sandboxed=True).rows
    assert any("user=prmloop_test_reader" in str(p) for (p,) in paths)


def test_a_reader_of_its_own_never_carries_the_writers_password() -> None:
    base = "dbname=lake host=db user=writer password='s3 cret' sslmode=require"
    assert (
        reader_conninfo(base, "user=reader password=r") == "dbname=lake host=db user=reader sslmode=require password=r"
    )
    assert (
        reader_conninfo(base, "sslmode=disable") == "dbname=lake host=db user=writer password='s3 cret' sslmode=disable"
    )


# ------------------------------------------------------------------ the DuckLake extension's own functions


def test_every_ducklake_function_that_writes_or_sets_options_is_refused() -> None:
    """Issue 39, point 6: whatever the extension's version has, listed from the extension itself (the
    functions a connection has only after loading it): those that merely read go through, every other
    is refused, by name, quoted or not."""
    config = {"autoinstall_known_extensions": False, "autoload_known_extensions": False}
    listing = "SELECT DISTINCT function_name FROM duckdb_functions() WHERE function_name LIKE 'ducklake%'"
    with duckdb.connect(config=config) as loaded:
        loaded.execute(f"LOAD '{extension_file('duckdb_extension_ducklake', 'ducklake')}'")
        functions = {r[0] for r in loaded.execute(listing).fetchall()}
    assert functions >= READING_DUCKLAKE_FUNCTIONS
    writing = functions - READING_DUCKLAKE_FUNCTIONS
    assert {"ducklake_merge_adjacent_files", "ducklake_set_option", "ducklake_expire_snapshots"} <= writing
    for name in sorted(writing):
        for call in (f"SELECT * FROM {name}('lake')", f"SELECT * FROM \"{name.upper()}\"('lake')"):
            with pytest.raises(ReadOnlyViolation, match=name):
                check_read_only(call)
    for name in sorted(READING_DUCKLAKE_FUNCTIONS):
        check_read_only(f"SELECT * FROM {name}('lake')")


def _parquet_files(stores: Stores) -> int:
    return len(list(stores.lake.data_path.rglob("*.parquet")))


def test_merging_files_or_setting_options_from_prmloop_sql_changes_nothing(stores: Stores, tmp_path: Path) -> None:
    """What the issue saw: ``ducklake_merge_adjacent_files('lake')`` left a new Parquet file per call, and
    ``ducklake_set_option(...)`` killed the process with SIGSEGV (exit 139). Now: one line, exit 2."""
    before = _parquet_files(stores)
    for sql in (
        "SELECT * FROM ducklake_merge_adjacent_files('lake')",
        "SELECT * FROM ducklake_set_option('lake', 'parquet_compression', 'zstd')",
        "SELECT * FROM ducklake_expire_snapshots('lake', older_than => now())",
    ):
        result = _cli(tmp_path, stores.lake.spec, sql)
        assert result.returncode == 2, (sql, result.returncode, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1 and "is refused" not in result.stdout
        assert "change the lake or its options are refused" in result.stderr
    assert _parquet_files(stores) == before
    reading = _cli(tmp_path, stores.lake.spec, "SELECT count(*) > 0 AS any FROM ducklake_snapshots('lake')")
    assert reading.returncode == 0 and reading.stdout.splitlines() == ["any", "True"], reading.stderr
    _intact(stores, "pgserver-lake")


def test_a_query_that_crashes_duckdb_ends_in_one_line_and_leaves_the_catalog_to_stop(tmp_path: Path) -> None:
    """No statement can crash `prmloop sql`: the query runs in a process of its own. Shown with a query
    process made to die of SIGSEGV (as ducklake_set_option did): the command says so in one line, exits
    2, and lets go of the local catalog, which stops with its last holder (before, the dead process's pid
    stayed among its holders and the catalog never stopped)."""
    home, lake_dir = tmp_path / "home", tmp_path / "lake"
    lake = locate(f"ducklake:pgserver:{lake_dir}")
    assert isinstance(lake, LakeStore)
    writer = open_writer(lake)
    writer.close()
    release_local_postgres(str(lake_dir))  # this test process holds nothing now
    crash = tmp_path / "site"
    crash.mkdir()
    (crash / "sitecustomize.py").write_text(
        "import os, signal\n"
        "if os.environ.get('PRMLOOP_SQL_QUERY_PROCESS') == '1':\n"
        "    os.kill(os.getpid(), signal.SIGSEGV)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP_SERVERS"}
    env.update(PRMLOOP_HOME=str(home), PRMLOOP_STORE=lake.spec, PYTHONPATH=str(crash))
    result = subprocess.run(
        [sys.executable, "-m", "prmloop.flows.cli", "sql", "SELECT 1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        "error: the query crashed DuckDB (SIGSEGV) in its own process; nothing was changed and the store is "
        "intact: report the statement (`prmloop sql` refuses what it knows to crash)"
    ]
    catalog = lake_dir / "catalog"
    holders = catalog / ".handle_pids.json"
    assert not holders.exists() or json.loads(holders.read_text() or "[]") == []
    assert not (catalog / "postmaster.pid").exists(), "the catalog's PostgreSQL is still running"
