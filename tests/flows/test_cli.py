"""The ``prmloop`` command line: help, read-only SQL, clear errors without a broker."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prmloop.consumers.sink import events_to_arrow
from prmloop.flows.bench.synthetic import synthetic_events
from prmloop.flows.cli import app
from prmloop.store.consumer import ConsumedEvent
from prmloop.store.duck import EventStore

runner = CliRunner()


def cli(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP_SERVERS"}
    env["PRMLOOP_HOME"] = str(home)
    return subprocess.run(
        [sys.executable, "-m", "prmloop.flows.cli", *args],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def db(tmp_path: Path) -> Path:
    store = EventStore(tmp_path / "prmloop.duckdb")
    events = synthetic_events(100, k=2)
    store.write_batch(events_to_arrow([ConsumedEvent(e, "t", 0, i, 0) for i, e in enumerate(events)]), [("t", 0, 100)])
    return store.path


def test_help_lists_the_commands() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("broker", "sink", "sql", "reconcile", "demo", "bench"):
        assert command in result.output


def test_sql_prints_csv_and_json(db: Path) -> None:
    out = runner.invoke(
        app,
        [
            "sql",
            "SELECT event_type, count(*) AS n FROM events GROUP BY 1 ORDER BY 1",
            "--db",
            str(db),
            "--format",
            "csv",
        ],
    )
    assert out.exit_code == 0, out.output
    lines = out.output.strip().splitlines()
    assert lines[0] == "event_type,n"
    assert sum(int(line.split(",")[1]) for line in lines[1:]) == 100
    out = runner.invoke(app, ["sql", "SELECT count(*) AS n FROM solutions", "--db", str(db), "--format", "json"])
    sampled = sum(e.event_type == "SolutionSampled" for e in synthetic_events(100, k=2))
    assert json.loads(out.output.strip()) == {"n": sampled}


@pytest.mark.parametrize(
    "statement",
    [
        "DELETE FROM events",
        "COPY events TO 'x.csv'",
        "ATTACH 'other.duckdb'",
        "INSERT INTO events SELECT * FROM events",
    ],
)
def test_sql_refuses_statements_that_change_anything(db: Path, tmp_path: Path, statement: str) -> None:
    result = cli("sql", statement, "--db", str(db), home=tmp_path)
    assert result.returncode == 2
    assert "only reads" in result.stderr
    assert "Traceback" not in result.stderr
    after = cli("sql", "SELECT count(*) FROM events", "--db", str(db), "--format", "csv", home=tmp_path)
    assert after.stdout.splitlines()[1] == "100"  # nothing was lost


def test_commands_that_need_a_broker_say_how_to_get_one(tmp_path: Path) -> None:
    result = cli("topics", home=tmp_path)
    assert result.returncode == 2
    assert "prmloop broker" in result.stderr and "KAFKA_BOOTSTRAP_SERVERS" in result.stderr


def test_broker_command_serves_until_interrupted_and_others_find_it(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP_SERVERS"}
    env["PRMLOOP_HOME"] = str(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "prmloop.flows.cli", "broker"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        address = proc.stdout.readline().strip()
        assert address.startswith("127.0.0.1:")
        found = cli("topics", home=tmp_path)  # no KAFKA_BOOTSTRAP_SERVERS: found through broker.json
        assert found.returncode == 0, found.stderr
        assert "all existed" in found.stdout
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    assert not (tmp_path / "broker.json").exists()


def test_status_counts_events_and_conflicts(db: Path) -> None:
    result = runner.invoke(app, ["status", "--db", str(db)])
    assert result.exit_code == 0, result.output
    health = json.loads(result.output)
    assert health["events"] == 100 and health["conflicts"] == 0
    assert sum(health["events_per_type"].values()) == 100


def test_sql_table_output_never_passes_control_characters_or_markup(db: Path) -> None:
    query = "SELECT chr(27) || '[31mred' || chr(13) AS ansi, '[bold]loud[/bold]' AS markup"
    result = runner.invoke(app, ["sql", query, "--db", str(db)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.output and "\r" not in result.output
    assert "\\x1b[31mred\\r" in result.output and "[bold]loud[/bold]" in result.output
