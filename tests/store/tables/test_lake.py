"""DuckLake as the store: many writers at once, readers that never wait, compaction, export, specs.

Real components: DuckDB with the DuckLake extension from its wheel, a PostgreSQL catalog (pgserver)
and Parquet files in a temporary folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from prmloop.consumers.sink import events_to_arrow
from prmloop.flows.cli import app
from prmloop.flows.lab.bench.synthetic import synthetic_events
from prmloop.store.events import Envelope
from prmloop.store.kafka.runtime import ConsumedEvent
from prmloop.store.tables.duck import DuckEventStore, locate, open_writer, query
from prmloop.store.tables.export import export_views
from prmloop.store.tables.lake import LakeError, LakeEventStore, LakeStore, compact, open_lake, parse_lake
from prmloop.store.tables.lake_catalog import release_local_postgres


def consumed(events: list[Envelope], partition: int = 0, start: int = 0) -> list[ConsumedEvent]:
    return [ConsumedEvent(e, "t", partition, start + i, 0) for i, e in enumerate(events)]


def lake_writer(store: LakeStore) -> LakeEventStore:
    writer = open_writer(store)
    assert isinstance(writer, LakeEventStore)
    return writer


def test_specs_parse_and_bad_ones_say_what_to_write(tmp_path: Path) -> None:
    store = parse_lake(f"ducklake:pgserver:{tmp_path}/pg", default_data_path=tmp_path / "d")
    assert store.catalog == f"pgserver:{tmp_path}/pg" and store.data_path == tmp_path / "pg" / "data"
    given = parse_lake(f"ducklake:pgserver:{tmp_path}/pg#data={tmp_path}/elsewhere", default_data_path=tmp_path)
    assert given.data_path == tmp_path / "elsewhere"
    custom = parse_lake(f"ducklake:postgres:dbname=x password=secret#data={tmp_path}/p", default_data_path=tmp_path)
    assert custom.data_path == tmp_path / "p" and custom.reader == ""
    assert parse_lake(custom.spec, default_data_path=tmp_path) == custom  # the spec round-trips
    assert "secret" not in str(custom) and "password=***" in str(custom)
    reading = parse_lake(
        f"ducklake:postgres:dbname=x user=w password=secret#reader=user=r password=other#data={tmp_path}/p",
        default_data_path=tmp_path,
    )
    assert (reading.catalog, reading.reader) == ("postgres:dbname=x user=w password=secret", "user=r password=other")
    assert parse_lake(reading.spec, default_data_path=tmp_path) == reading
    assert "secret" not in str(reading) and "other" not in str(reading)
    with pytest.raises(ValueError, match="postgres:<libpq conninfo>"):
        parse_lake("ducklake:mysql:db", default_data_path=tmp_path)
    with pytest.raises(ValueError, match="#reader= is for postgres"):
        parse_lake(f"ducklake:pgserver:{tmp_path}/pg#reader=user=r", default_data_path=tmp_path)
    (tmp_path / "afile").write_text("not a folder")
    with pytest.raises(ValueError, match="is a file; ducklake:pgserver: needs a folder"):
        parse_lake(f"ducklake:pgserver:{tmp_path}/afile", default_data_path=tmp_path)
    assert isinstance(locate(tmp_path / "x.duckdb"), Path)
    assert isinstance(locate(f"ducklake:pgserver:{tmp_path}/pg"), LakeStore)


def test_a_folder_postgresql_cannot_use_is_named_in_one_line(tmp_path: Path) -> None:
    """A pgserver folder that is neither empty nor a PostgreSQL cluster, or a data folder inside the
    cluster's: one line naming the folder (was a 40-line CalledProcessError from initdb)."""
    (tmp_path / "used" / "catalog").mkdir(parents=True)
    (tmp_path / "used" / "catalog" / "notes.txt").write_text("not PostgreSQL")
    used = parse_lake(f"ducklake:pgserver:{tmp_path}/used", default_data_path=tmp_path / "d")
    with pytest.raises(LakeError, match=f"in {tmp_path}/used/catalog: the folder is not empty") as info:
        open_writer(used)
    assert "\n" not in str(info.value)
    inside = parse_lake(f"ducklake:pgserver:{tmp_path}/in#data={tmp_path}/in/catalog/x", default_data_path=tmp_path)
    with pytest.raises(LakeError, match=f"data folder {tmp_path}/in/catalog/x is inside"):
        open_writer(inside)
    env = {**os.environ, "PRMLOOP_HOME": str(tmp_path), "PRMLOOP_STORE": f"ducklake:pgserver:{tmp_path}/used"}
    env.pop("KAFKA_BOOTSTRAP_SERVERS", None)
    cli = subprocess.run(
        [sys.executable, "-m", "prmloop.flows.cli", "sql", "SELECT 1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert cli.returncode == 2 and len(cli.stderr.strip().splitlines()) == 1, cli.stderr
    assert f"{tmp_path}/used/catalog" in cli.stderr and "Traceback" not in cli.stderr


def test_a_pgserver_cluster_made_in_the_folder_itself_keeps_working(tmp_path: Path) -> None:
    """Stores made before the catalog got a folder of its own: PostgreSQL in ``<dir>``, the data
    where it was (the default data path)."""
    import pgserver

    legacy = tmp_path / "pg"
    pgserver.get_server(legacy, cleanup_mode="stop").cleanup()  # what an older prmloop left behind
    store = parse_lake(f"ducklake:pgserver:{legacy}", default_data_path=tmp_path / "lake-data")
    assert store.data_path == tmp_path / "lake-data"
    try:
        writer = lake_writer(store)
        writer.write_batch(events_to_arrow(consumed(synthetic_events(20, k=1))), [("t", 0, 20)])
        writer.close()
        assert query(store, "SELECT count(*) FROM events", sandboxed=True).rows == [(20,)]
        assert not (legacy / "catalog").exists()
    finally:
        release_local_postgres(str(legacy))


def test_two_writers_storing_the_same_events_at_once_show_each_event_once(lake_store: LakeStore) -> None:
    events = synthetic_events(600, k=2, seed=3)
    writers = [lake_writer(lake_store), lake_writer(lake_store)]
    barrier = threading.Barrier(2)
    results = []

    def write(w: LakeEventStore, offset: int) -> None:
        barrier.wait()
        for i in range(0, len(events), 100):  # the same events, in the same batches, at the same time
            results.append(w.write_batch(events_to_arrow(consumed(events[i : i + 100])), [("t", 0, i + 100)]))

    threads = [threading.Thread(target=write, args=(w, n)) for n, w in enumerate(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for w in writers:
        w.close()
    assert sum(r.inserted for r in results) >= len(events)
    assert query(lake_store, "SELECT count(*), count(DISTINCT event_id) FROM events").rows == [(600, 600)]
    stored = query(lake_store, "SELECT count(*) FROM events_log").rows[0][0]
    report = compact(lake_store)
    assert report["doubled_events_removed"] == stored - 600
    assert query(lake_store, "SELECT count(*), count(DISTINCT event_id) FROM events_log").rows == [(600, 600)]


def test_a_conflicting_version_is_kept_in_conflicts_not_dropped(lake_store: LakeStore) -> None:
    [event] = synthetic_events(1, k=1, seed=4)[:1]
    changed = event.payload.model_copy(update={"question_id": "another question"})
    other = event.model_copy(update={"producer": "someone-else", "payload": changed})
    writer = lake_writer(lake_store)
    writer.write_batch(events_to_arrow(consumed([event])), [("t", 0, 1)])
    result = writer.write_batch(events_to_arrow(consumed([other, other], start=1)), [("t", 0, 3)])
    again = writer.write_batch(events_to_arrow(consumed([other], start=3)), [("t", 0, 4)])
    writer.close()
    assert (result.inserted, result.conflicts, again.conflicts) == (0, 1, 0)
    rows = query(lake_store, "SELECT producer FROM events").rows
    assert rows == [(event.producer,)]
    assert query(lake_store, "SELECT count(*) FROM conflicts").rows == [(1,)]


def test_readers_do_not_wait_for_a_writer_in_the_middle_of_a_transaction(lake_store: LakeStore) -> None:
    writer = lake_writer(lake_store)
    writer.write_batch(events_to_arrow(consumed(synthetic_events(50, k=1, seed=5))), [("t", 0, 50)])
    with open_lake(lake_store, read_only=False) as con:
        con.execute("BEGIN TRANSACTION")
        con.execute("INSERT INTO events_log SELECT * FROM events_log")  # uncommitted
        result = query(lake_store, "SELECT count(*) FROM events_log", timeout_s=1)
        assert result.rows == [(50,)] and result.waited_s == 0.0
        con.execute("ROLLBACK")
    writer.close()


def test_readers_never_draw_a_progress_bar_on_stdout(lake_store: LakeStore, tmp_path: Path) -> None:
    """DuckDB draws a progress bar on stdout for a query over 2 s: `prmloop status` printed one into
    its JSON while a killed piece of the cluster slowed the catalog down. No reader may draw one. Run in
    a fresh interpreter as a command would be: under pytest DuckDB's default already reads off."""
    import duckdb

    lake_writer(lake_store).close()
    file_store = tmp_path / "store.duckdb"
    duckdb.connect(str(file_store)).close()
    script = (
        "import sys\nfrom prmloop.store.tables.duck import query\n"
        "for store in sys.argv[1:]:\n"
        "    print(query(store, \"SELECT current_setting('enable_progress_bar')\").rows[0][0])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, lake_store.spec, str(file_store)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert done.stdout.split() == ["False", "False"], done.stdout


def test_compaction_merges_small_files_and_the_data_stays(lake_store: LakeStore) -> None:
    writer = lake_writer(lake_store)
    events = synthetic_events(1200, k=2, seed=6)
    for i in range(0, len(events), 150):
        writer.write_batch(events_to_arrow(consumed(events[i : i + 150], start=i)), [("t", 0, i + 150)])
    writer.close()
    before = query(lake_store, "SELECT count(*), sum(hash(event_id)) FROM events").rows
    report = compact(lake_store, keep_snapshots_for=timedelta(0))
    assert report["files_after"] < report["files_before"]
    assert report["snapshots_expired"] > 0
    assert query(lake_store, "SELECT count(*), sum(hash(event_id)) FROM events").rows == before


@pytest.mark.parametrize("kind", ["duckdb", "ducklake"])
def test_export_writes_views_as_parquet_with_every_row(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    location: Path | LakeStore
    if kind == "duckdb":
        location = tmp_path / "s.duckdb"
        DuckEventStore(location).write_batch(events_to_arrow(consumed(synthetic_events(300, k=2))), [("t", 0, 1)])
    else:
        location = request.getfixturevalue("lake_store")
        w = lake_writer(location)
        w.write_batch(events_to_arrow(consumed(synthetic_events(300, k=2))), [("t", 0, 1)])
        w.close()
    rows = export_views(location, ["steps", "events"], tmp_path / "out")
    assert [r["view"] for r in rows] == ["steps", "events"]
    steps = pq.read_table(tmp_path / "out" / "steps.parquet")
    assert steps.num_rows == query(location, "SELECT count(*) FROM steps").rows[0][0] > 0
    assert "step_index" in steps.column_names
    assert not list((tmp_path / "out").glob(".*partial"))
    with pytest.raises(ValueError, match=r"choose from .*current_labels"):
        export_views(location, ["nope"], tmp_path / "out")


def test_cli_sql_export_and_compact_on_a_lake(lake_store: LakeStore, tmp_path: Path) -> None:
    w = lake_writer(lake_store)
    w.write_batch(events_to_arrow(consumed(synthetic_events(100, k=2))), [("t", 0, 1)])
    w.close()
    runner = CliRunner()
    env = {"PRMLOOP_STORE": lake_store.spec, "PRMLOOP_HOME": str(tmp_path / "home")}
    res = runner.invoke(app, ["sql", "SELECT count(*) AS n FROM events", "--format", "json"], env=env)
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout.strip().splitlines()[-1]) in ({"n": 100}, [{"n": 100}])
    res = runner.invoke(app, ["export", "current_labels", "--out", str(tmp_path / "x")], env=env)
    assert res.exit_code == 0, res.output
    assert (tmp_path / "x" / "current_labels.parquet").exists()
    res = runner.invoke(app, ["compact", "--no-prefect"], env=env)
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout.strip().splitlines()[-1])["doubled_events_removed"] == 0


def test_sinks_attaching_a_new_lake_at_once_all_attach(lake_store: LakeStore, tmp_path: Path) -> None:
    """The cluster starts two sinks together: both create the new catalog's tables, and the loser saw
    PostgreSQL's 'duplicate key value' or 'relation ... already exists' (the chaos test's sink-2 exited
    on the second). Every sink process must attach to the one catalog the winner made."""
    import time

    script = (
        "import os, sys, time\n"
        "from prmloop.store.tables.duck import open_writer\n"
        "open(sys.argv[2] + '.' + str(os.getpid()), 'w').close()\n"
        "while not os.path.exists(sys.argv[2]): time.sleep(0.001)\n"
        "open_writer(sys.argv[1]).close()\n"
    )
    go = tmp_path / "go"
    processes = [
        subprocess.Popen([sys.executable, "-c", script, lake_store.spec, str(go)], stderr=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("go.*"))) < len(processes) and time.monotonic() < deadline:
        time.sleep(0.05)
    go.touch()  # every process has imported: they attach together
    failures = [p.communicate(timeout=180)[1][-600:] for p in processes if p.wait(timeout=180) != 0]
    assert failures == []
    assert query(lake_store, "SELECT count(*) FROM events").rows == [(0,)]
