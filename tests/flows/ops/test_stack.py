"""`prmloop up` / `prmloop down` with real processes: the embedded broker, the sink, a Prefect server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_process import prmloop_cli

from prmloop.flows.lab.bench.synthetic import synthetic_events
from prmloop.flows.ops.services import read_state, running_services
from prmloop.store.kafka.broker_file import read_broker_file
from prmloop.store.kafka.follow import read_links
from prmloop.store.kafka.producer import EventProducer
from prmloop.store.settings import StateSettings
from prmloop.store.tables.duck import StoreLocked, query

_prmloop = prmloop_cli


def _gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.split(") ", 1)[-1].startswith("Z")


def _count(home: Path, sql: str) -> int:
    try:
        return int(query(home / "prmloop.duckdb", sql, timeout_s=5).rows[0][0])
    except (StoreLocked, FileNotFoundError):
        return -1


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True, check=False)
    return [int(p) for p in out.stdout.split()]


def test_up_starts_once_and_down_leaves_nothing_running(tmp_path: Path) -> None:
    first = _prmloop(tmp_path, "up", "--only", "broker", "--only", "sink")
    assert first.returncode == 0, first.stderr
    summary = json.loads(first.stdout)
    assert summary["started"] == ["broker", "sink"]
    state = StateSettings(home=tmp_path)
    running = running_services(state)
    assert set(running) == {"broker", "sink"}
    broker = running["broker"]
    tansu = _children(broker.pid)
    assert tansu, "the broker process has no Tansu child"
    assert (tmp_path / "logs" / "sink.log").exists()

    second = _prmloop(tmp_path, "up", "--only", "broker", "--only", "sink")
    assert second.returncode == 0 and json.loads(second.stdout)["started"] == []
    assert "broker is already running" in second.stderr and "sink is already running" in second.stderr

    down = _prmloop(tmp_path, "down")
    assert down.returncode == 0, down.stderr
    assert json.loads(down.stdout)["stopped"] == ["sink", "broker"]
    deadline = time.monotonic() + 10
    pids = [broker.pid, running["sink"].pid, *tansu]
    while time.monotonic() < deadline and not all(_gone(p) for p in pids):
        time.sleep(0.2)
    assert all(_gone(p) for p in pids), "a process outlived `prmloop down`"
    assert read_state(state, "broker") is None and running_services(state) == {}
    assert json.loads(_prmloop(tmp_path, "down").stdout)["stopped"] == []


def test_unknown_service_is_a_one_line_error(tmp_path: Path) -> None:
    out = _prmloop(tmp_path, "up", "--only", "kafka")
    assert out.returncode == 2 and "unknown service 'kafka'" in out.stderr


@pytest.mark.slow
def test_prefect_server_and_served_deployments(tmp_path: Path) -> None:
    try:
        up = _prmloop(tmp_path, "up", "--only", "prefect", "--only", "deployments")
        assert up.returncode == 0, up.stderr
        url = json.loads(up.stdout)["running"]["prefect"]["url"]
        assert (tmp_path / "prefect").is_dir()  # Prefect's state under $PRMLOOP_HOME

        probe = (
            "import asyncio, time\n"
            "from prefect.client.orchestration import get_client\n"
            "from prefect.client.schemas.sorting import DeploymentSort\n"
            "async def main():\n"
            "    async with get_client() as c:\n"
            "        for _ in range(120):\n"
            "            found = await c.read_deployments(limit=50, sort=DeploymentSort.NAME_ASC)\n"
            "            names = sorted(d.name for d in found)\n"
            "            if len(names) >= 5: break\n"
            "            await asyncio.sleep(1)\n"
            "        print(names)\n"
            "asyncio.run(main())\n"
        )
        from prmloop.store.auth.credentials import load_credentials

        # The server asks for the credentials' auth string (issue 39): a client without it gets 401.
        env = {
            **os.environ,
            "PREFECT_API_URL": url,
            "PREFECT_API_AUTH_STRING": load_credentials(tmp_path).prefect_auth_string,
        }
        out = subprocess.run(
            [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300, check=False
        )
        assert out.returncode == 0, out.stderr
        assert all(f"{n}-local" in out.stdout for n in ("prioritize", "sample", "monitor", "retrain", "calibrate"))
    finally:
        _prmloop(tmp_path, "down")
    assert running_services(StateSettings(home=tmp_path)) == {}


@pytest.mark.slow
def test_screenshots_of_the_prefect_ui_show_the_loop(tmp_path: Path) -> None:
    """The stack, one monitor run against a real store, and Chromium pictures of the UI pages."""
    import shutil

    from prmloop.consumers.sink import events_to_arrow
    from prmloop.flows.lab.bench.synthetic import synthetic_events
    from prmloop.store.kafka.runtime import ConsumedEvent
    from prmloop.store.tables.duck import DuckEventStore

    if shutil.which("chromium") is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    store = DuckEventStore(tmp_path / "prmloop.duckdb")
    events = synthetic_events(200, k=4, seed=1)
    store.write_batch(events_to_arrow([ConsumedEvent(e, "t", 0, i, 0) for i, e in enumerate(events)]), [("t", 0, 200)])
    try:
        assert _prmloop(tmp_path, "up", "--only", "prefect").returncode == 0
        ran = _prmloop(tmp_path, "monitor", "--db", str(store.path))
        assert ran.returncode == 0, ran.stderr
        shots = _prmloop(tmp_path, "screenshots", "--out", str(tmp_path / "shots"), timeout=900)
        assert shots.returncode == 0, shots.stderr
        files = json.loads(shots.stdout)
        assert {"flow-runs", "artifacts", "artifact-loop-summary", "artifact-loop-per-hour"} <= set(files)
        sizes = {name: Path(path).stat().st_size for name, path in files.items()}
        assert all(size > 20_000 for size in sizes.values()), sizes  # a blank page is a few kB
    finally:
        _prmloop(tmp_path, "down")


def _status(home: Path) -> dict[str, Any]:
    out = _prmloop(home, "status", timeout=120)
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout))


def test_up_after_a_killed_broker_moves_the_services_and_status_flags_a_dead_one(
    tmp_path: Path, wait_until: Callable[..., None]
) -> None:
    """The issue's reproduction, small: `up`, SIGKILL the broker, `up` again: the running sink moves to
    the new broker (it is not left on the dead port), events published then are stored, and `status`
    says which broker the sink reads from; a SIGKILLed sink is then listed as dead, not dropped."""
    state = StateSettings(home=tmp_path)
    try:
        first = _prmloop(tmp_path, "up", "--only", "broker", "--only", "sink")
        assert first.returncode == 0, first.stderr
        old = read_broker_file(state)
        assert old is not None and old.cluster_id
        sink = running_services(state)["sink"]
        wait_until(lambda: any(link["pid"] == sink.pid for link in read_links(state)), 60, "the sink to connect")
        os.kill(running_services(state)["broker"].pid, signal.SIGKILL)  # its Tansu dies with it

        again = _prmloop(tmp_path, "up", "--only", "broker", "--only", "sink")
        assert again.returncode == 0, again.stderr
        new = read_broker_file(state)
        assert new is not None and new.cluster_id != old.cluster_id
        assert json.loads(again.stdout)["started"] == ["broker"]
        assert f"sink is already running (pid {sink.pid}) and uses the new broker {new.describe()}" in again.stderr

        events = [e.model_copy(update={"event_id": uuid.uuid4()}) for e in synthetic_events(20, seed=7)]
        with EventProducer(new.bootstrap_servers) as producer:
            producer.publish(events)
        ids = ",".join(f"'{e.event_id}'" for e in events)
        wait_until(
            lambda: _count(tmp_path, f"SELECT count(*) FROM events WHERE event_id IN ({ids})") == 20,
            30,
            "the 20 events published after the restart to be stored",
        )

        status = _status(tmp_path)
        assert status["broker"] == {
            "bootstrap_servers": new.bootstrap_servers,
            "from": "broker.json",
            "cluster_id": new.cluster_id,
            "reachable": True,
            # Whether Tansu runs in a network namespace of its own (issue 39), with the reason where it cannot.
            "isolated": new.isolated,
            **({"why_not_isolated": new.why_not_isolated} if not new.isolated else {}),
        }
        assert isinstance(new.isolated, bool)
        shown = status["services"]["sink"]
        assert shown["state"] == "running" and shown["pid"] == sink.pid
        assert shown["broker"]["cluster_id"] == new.cluster_id and shown["broker"]["current"] is True
        assert status["services"]["broker"]["serves"]["cluster_id"] == new.cluster_id
        assert status["dead_letters"]["steps.labeled.dlq"] == {"count": 0}

        os.kill(sink.pid, signal.SIGKILL)
        wait_until(lambda: _gone(sink.pid), 10, "the killed sink to be gone")
        dead = _status(tmp_path)["services"]["sink"]
        assert dead["state"] == "dead" and dead["pid"] == sink.pid
        assert dead["last_log_line"] and "broker was replaced" in Path(dead["log"]).read_text()
    finally:
        _prmloop(tmp_path, "down")
    assert running_services(state) == {}
    assert read_links(state) == [], "down left the killed sink's link record"


def _processes_of(home: Path, argument: str) -> list[int]:
    """Live `prmloop <argument>` processes (not zombies) whose environment names ``home``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        ours = f"PRMLOOP_HOME={home}".encode() in environ and b"prmloop.flows.cli" in cmdline
        if ours and argument.encode() in cmdline and not _gone(int(entry.name)):
            found.append(int(entry.name))
    return found


def test_two_ups_at_once_start_one_sink_and_down_leaves_nothing(tmp_path: Path) -> None:
    """Issue 39, point 7: two `prmloop up` at once started two sinks; run/sink.json recorded one and
    `down` left the other running. Now the second waits for the first (a lock in the home) and then finds
    everything running."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "KAFKA_"))}
    env["PRMLOOP_HOME"] = str(tmp_path)
    argv = [sys.executable, "-m", "prmloop.flows.cli", "up", "--only", "broker", "--only", "sink"]
    ups = [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        outputs = [up.communicate(timeout=300) for up in ups]
        assert [up.returncode for up in ups] == [0, 0], outputs
        started = sorted(json.loads(out)["started"] for out, _ in outputs)
        assert started == [[], ["broker", "sink"]], outputs
        assert any("another `prmloop up` (pid" in err and "waiting for it" in err for _, err in outputs), outputs
        assert len(_processes_of(tmp_path, "sink")) == 1
        assert len(_processes_of(tmp_path, "broker")) == 1
    finally:
        assert _prmloop(tmp_path, "down").returncode == 0
    deadline = time.monotonic() + 20
    while _processes_of(tmp_path, "sink") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _processes_of(tmp_path, "sink") == [] and _processes_of(tmp_path, "broker") == []


def test_sigterm_to_a_command_stops_the_process_it_started(tmp_path: Path) -> None:
    """No command leaves a process behind when it is stopped: `prmloop sql` runs its query in a process of
    its own; SIGTERM to the command (while the query runs) ends that process too."""
    from prmloop.consumers.sink import events_to_arrow
    from prmloop.flows.lab.bench.synthetic import synthetic_events
    from prmloop.store.kafka.runtime import ConsumedEvent
    from prmloop.store.tables.duck import DuckEventStore

    store = DuckEventStore(tmp_path / "prmloop.duckdb")
    store.write_batch(
        events_to_arrow([ConsumedEvent(e, "t", 0, i, 0) for i, e in enumerate(synthetic_events(5))]), [("t", 0, 5)]
    )
    store.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "KAFKA_"))}
    env["PRMLOOP_HOME"] = str(tmp_path / "home")
    slow = "SELECT count(*) FROM range(100000000000) a"
    command = subprocess.Popen(
        [sys.executable, "-m", "prmloop.flows.cli", "sql", slow, "--db", str(store.path)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while not (children := _children(command.pid)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert children, "the query process never started"
        time.sleep(1.0)  # the query runs
        command.send_signal(signal.SIGTERM)
        assert command.wait(timeout=30) == 128 + signal.SIGTERM
        deadline = time.monotonic() + 20
        while not all(_gone(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert all(_gone(pid) for pid in children), "the query process outlived the command"
    finally:
        if command.poll() is None:
            command.kill()
