"""The ``prmloop`` command line: help, read-only SQL, clear errors without a broker."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cli_process import prmloop_cli
from typer.testing import CliRunner

from prmloop.consumers.sink import events_to_arrow
from prmloop.flows.cli import app
from prmloop.flows.lab.bench.synthetic import synthetic_events
from prmloop.store.auth.signing import sign
from prmloop.store.events import Envelope, ModelRef, ModelRegistered, make_event
from prmloop.store.kafka.runtime import ConsumedEvent
from prmloop.store.tables.duck import DuckEventStore
from prmloop.store.tables.registry import PROMOTION_METRIC

runner = CliRunner()


def cli(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    return prmloop_cli(home, *args, timeout=120, drop=("KAFKA_BOOTSTRAP_SERVERS",))


@pytest.fixture
def db(tmp_path: Path) -> Path:
    store = DuckEventStore(tmp_path / "prmloop.duckdb")
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


def test_bench_generate_names_the_engines_it_can_run(tmp_path: Path) -> None:
    result = cli("bench", "generate", "--quick", "--engines", "server,gpu", home=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "--engines takes some of transformers, inprocess, server, got server, gpu" in result.stderr
    assert "Traceback" not in result.stderr


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


def _registration(kind: str, promoted: bool, second: int, f1: float) -> Envelope:
    metric = PROMOTION_METRIC[kind]
    payload = ModelRegistered(
        model_id=f"{kind}-{second:012x}",
        kind=kind,  # type: ignore[arg-type]
        base_model=ModelRef(backend="transformers", name="HuggingFaceTB/SmolLM2-135M-Instruct"),
        artifact_uri=f"/home/someone/a/long/path/to/the/artifacts/{kind}/{second}",
        dataset_snapshot="f" * 64,
        train_examples=10 + second,
        parameters={"promoted": promoted, "decision": "test"},
        metrics={metric: f1, "loss": 0.25},
    )
    return make_event(  # signed as the retrain flows sign: prmloop's own registration
        sign(payload), producer="test", occurred_at=datetime(2026, 1, 1, tzinfo=UTC) + timedelta(minutes=second)
    )


#: (kind, promoted when registered, F1) in registration order, and each model's status now.
_MODELS = [
    ("prm", True, 0.4, "in force"),
    ("prm", False, 0.3, "not promoted"),
    ("prm_ensemble", True, 0.61, "superseded"),
    ("prm_ensemble", True, 0.62, "in force"),
    ("prm_ensemble", False, 0.5, "not promoted"),
]


@pytest.fixture
def registry(tmp_path: Path) -> Path:
    store = DuckEventStore(tmp_path / "registry.duckdb")
    events = [_registration(kind, promoted, i, f1) for i, (kind, promoted, f1, _) in enumerate(_MODELS)]
    store.write_batch(events_to_arrow([ConsumedEvent(e, "t", 0, i, 0) for i, e in enumerate(events)]), [("t", 0, 5)])
    return store.path


@pytest.mark.parametrize("columns", [80, 120])
def test_models_list_shows_every_model_whole_with_its_kind_and_the_one_in_force(registry: Path, columns: int) -> None:
    """Seen: `models list` cut its columns ("model…", "base_…") and said `promoted: true` with no word on
    which model is in use; the registry has two PRM kinds, the LoRA `prm` and the selector's `prm_ensemble`."""
    result = runner.invoke(app, ["models", "list", "--db", str(registry)], env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert "…" not in result.stdout and max(len(line) for line in lines) <= columns
    assert "prm: the LoRA PRM, promoted by processbench_gsm8k_f1" in lines
    assert "prm_ensemble: the ensemble PRM the selector uses, promoted by heldout_f1" in lines
    shown = dict(re.findall(r"^(prm\S*)\s+(in force|superseded|not promoted)\s", result.stdout, re.MULTILINE))
    expected = {f"{kind}-{i:012x}": status for i, (kind, _, _, status) in enumerate(_MODELS)}
    assert shown == expected
    assert re.search(rf"^{'prm_ensemble-' + format(3, '012x')}\s+in force\s+0\.620\s+13\s", result.stdout, re.MULTILINE)


def test_models_list_as_json_has_every_column_and_the_decision(registry: Path) -> None:
    result = runner.invoke(app, ["models", "list", "--db", str(registry), "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    got = {r["model_id"]: (r["kind"], r["promoted"], r["in_force"]) for r in rows}
    assert got == {
        f"{kind}-{i:012x}": (kind, promoted, status == "in force")
        for i, (kind, promoted, _, status) in enumerate(_MODELS)
    }
    assert all(isinstance(r["metrics"], dict) and r["decision"] == "test" and r["artifact_uri"] for r in rows)


def test_a_promotion_anyone_on_the_broker_publishes_is_stored_but_never_in_force(registry: Path) -> None:
    """Issue 39, point 3: a ModelRegistered with `promoted: true` from any client (producer "mallory")
    showed as in force in `prmloop models list`. Now the newest promoted model that prmloop signed stays
    in force, for the registry (what retrain and the selector use), `models list` and `status`; an
    unsigned one, or one whose signature is not prmloop's, is listed as unverified. The same for a
    calibration."""
    from prmloop.store.events import CalibrationFitted
    from prmloop.store.tables.metrics import loop_metrics
    from prmloop.store.tables.registry import current_model

    forged = _registration("prm_ensemble", True, 9, 0.99).payload.model_copy(update={"signature": None})
    bad = forged.model_copy(update={"model_id": "prm_ensemble-forged-sig", "signature": "hmac-sha256:" + "0" * 64})
    calibration = CalibrationFitted(
        calibration_id="cal-prmloop", generator="g", prm="p", score_rule="min", method="logit", fit={},
        calibration_split="s",
    )  # fmt: skip
    stolen = calibration.model_copy(update={"calibration_id": "cal-mallory"})
    late = datetime(2027, 1, 1, tzinfo=UTC)
    events = [
        make_event(forged, producer="mallory", occurred_at=late),
        make_event(bad, producer="mallory", occurred_at=late + timedelta(minutes=1)),
        make_event(sign(calibration), producer="prmloop-calibrate", occurred_at=late),
        make_event(stolen, producer="mallory", occurred_at=late + timedelta(minutes=1)),
    ]
    store = DuckEventStore(registry)
    store.write_batch(events_to_arrow([ConsumedEvent(e, "m", 0, i, 0) for i, e in enumerate(events)]), [("m", 0, 4)])
    store.close()
    result = runner.invoke(app, ["models", "list", "--db", str(registry)], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert "…" not in result.stdout
    assert re.search(r"^prm_ensemble-0{11}9\s+not used: unsigned\s", result.stdout, re.MULTILINE)
    assert re.search(r"^prm_ensemble-forged-sig\s+not used: bad sig\s", result.stdout, re.MULTILINE)
    assert re.search(rf"^prm_ensemble-{3:012x}\s+in force", result.stdout, re.MULTILINE), result.stdout
    in_force = current_model(registry, kind="prm_ensemble")
    assert in_force is not None and in_force["model_id"] == f"prm_ensemble-{3:012x}"
    metrics = loop_metrics(registry)
    assert metrics["current_prm_ensemble"]["model_id"] == f"prm_ensemble-{3:012x}"
    assert {(m["model_id"], m["why"]) for m in metrics["not_in_force"]["models"]} == {
        (f"prm_ensemble-{9:012x}", "unsigned: never in force"),
        ("prm_ensemble-forged-sig", "bad signature: never in force"),
    }
    assert metrics["calibration"]["calibration_id"] == "cal-prmloop"
    assert metrics["not_in_force"]["calibrations"] == [
        {"calibration_id": "cal-mallory", "why": "unsigned: never in force"}
    ]


def test_sql_help_names_every_statement_the_readme_lists() -> None:
    """Seen: the README listed EXPLAIN among the statements `prmloop sql` runs; `sql --help` left it out."""
    readme = (Path(__file__).resolve().parents[3] / "docs" / "events-and-sql.md").read_text()
    found = re.search(r"refuses anything but (.+?) \(EXPLAIN only", readme, re.DOTALL)
    assert found is not None
    listed = re.findall(r"`([A-Z]+)`", found.group(1))
    assert "EXPLAIN" in listed and "SELECT" in listed
    result = runner.invoke(app, ["sql", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert [word for word in listed if word not in result.output] == []


def test_screenshots_without_chromium_say_how_to_install_it(tmp_path: Path) -> None:
    """Checked before looking for a Prefect server: Chromium is installed once, a server started each time."""
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {"PATH": str(empty), "PRMLOOP_HOME": str(tmp_path / "home"), "PREFECT_API_URL": None}
    result = runner.invoke(app, ["screenshots", "--out", str(tmp_path / "shots")], env=env)  # type: ignore[arg-type]
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "apt-get install chromium" in lines[0], result.stderr
    assert not (tmp_path / "shots").exists()


def test_the_readme_s_sql_example_is_readable_at_80_columns(db: Path) -> None:
    query = "SELECT * FROM current_labels ORDER BY solution_id, step_index LIMIT 5"
    result = runner.invoke(app, ["sql", query, "--db", str(db)], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert sum(line.startswith("-- record ") for line in lines) == 5
    # Every id is shown whole (a table at 80 columns cut them to a few characters).
    ids = [row[0] for row in query_rows(db, query)]
    assert all(any(line.split(None, 1) == ["solution_id", sid] for line in lines) for sid in ids)
    as_csv = runner.invoke(app, ["sql", query, "--db", str(db), "--format", "csv"], env={"COLUMNS": "80"})
    assert as_csv.stdout.splitlines()[0].startswith("solution_id,question_id,step_index")


def query_rows(db: Path, sql: str) -> list[tuple[object, ...]]:
    from prmloop.store.tables.duck import query

    return [tuple(row) for row in query(db, sql).rows]


def _in_a_terminal(argv: list[str], home: Path, columns: int = 80) -> str:
    """Run ``prmloop argv`` with its stdout on a pseudo-terminal of ``columns`` columns; its output."""
    import pty

    env = {k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP_SERVERS"}
    env.update({"PRMLOOP_HOME": str(home), "COLUMNS": str(columns), "TERM": "dumb"})
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "prmloop.flows.cli", *argv], stdout=follower, stderr=subprocess.PIPE, env=env
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed with the process
            break
        if not chunk:
            break
        chunks.append(chunk)
    proc.wait(timeout=120)
    os.close(leader)
    assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
    return b"".join(chunks).decode().replace("\r\n", "\n")


def test_status_is_a_readable_summary_on_a_terminal_and_json_when_asked_or_piped(db: Path, tmp_path: Path) -> None:
    shown = _in_a_terminal(["status", "--db", str(db), "--timeout", "3"], tmp_path)
    lines = shown.splitlines()
    assert "{" not in shown and max(len(line) for line in lines) <= 80
    starts = [line.split(None, 1)[0] for line in lines if line and not line.startswith(" ")]
    for heading in ("store", "services", "broker", "lag", "dead", "per", "labels", "cost", "PRM", "calibrated"):
        assert heading in starts, (heading, shown)
    assert "100 events" in shown and "none in force yet" in shown
    asked = _in_a_terminal(["status", "--db", str(db), "--timeout", "3", "--json"], tmp_path)
    assert json.loads(asked)["events"] == 100
    piped = runner.invoke(app, ["status", "--db", str(db), "--timeout", "3"])
    report = json.loads(piped.stdout)
    assert report["events"] == 100 and "acceptance_rate" in report and "mc_exact_agreement" in report
