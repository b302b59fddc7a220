"""``serve_embedded_broker`` as a real process: signals stop its Tansu child and remove broker.json;
a SIGKILLed parent takes its Tansu child with it (Linux parent-death signal)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from prmloop.store.kafka.broker_file import find_bootstrap_servers
from prmloop.store.ports import port_open
from prmloop.store.settings import KafkaSettings, StateSettings

SERVE = textwrap.dedent(
    """
    import json, sys
    from prmloop.flows.ops.broker import serve_embedded_broker
    from prmloop.store.settings import StateSettings

    def ready(broker):
        print(json.dumps({"pid": broker.pid, "servers": broker.bootstrap_servers}), flush=True)

    serve_embedded_broker(None, 1, StateSettings(), ready)
    print("stopped", flush=True)
    """
)


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting for its reaper counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _wait_gone(pid: int, timeout_s: float = 15) -> bool:
    deadline = time.monotonic() + timeout_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not _alive(pid)


def _start(home: Path) -> tuple[subprocess.Popen[str], int, str]:
    env = {**os.environ, "PRMLOOP_HOME": str(home)}
    env.pop("KAFKA_BOOTSTRAP_SERVERS", None)
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        raise AssertionError(f"the broker process did not start: {proc.stderr.read() if proc.stderr else ''}")
    info = json.loads(line)
    return proc, int(info["pid"]), str(info["servers"])


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signal_stops_tansu_and_removes_broker_json(tmp_path: Path, sig: signal.Signals) -> None:
    proc, tansu_pid, servers = _start(tmp_path)
    state = StateSettings(home=tmp_path)
    try:
        assert _alive(tansu_pid)
        assert json.loads(state.broker_file.read_text())["broker_pid"] == tansu_pid
        assert find_bootstrap_servers(KafkaSettings(bootstrap_servers=None), state) == servers
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "stopped" in out
    assert _wait_gone(tansu_pid), f"Tansu {tansu_pid} still runs after {sig.name} to its parent"
    assert not state.broker_file.exists()
    host, port = servers.rsplit(":", 1)
    assert not port_open(host, int(port))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only")
def test_a_sigkilled_parent_takes_tansu_with_it(tmp_path: Path) -> None:
    proc, tansu_pid, _ = _start(tmp_path)
    try:
        proc.kill()
        proc.wait(timeout=10)
        assert _wait_gone(tansu_pid), f"Tansu {tansu_pid} outlived its SIGKILLed parent"
    finally:
        if _alive(tansu_pid):
            os.kill(tansu_pid, signal.SIGKILL)
    # broker.json is stale now (nobody could remove it), but nothing trusts a closed port.
    state = StateSettings(home=tmp_path)
    assert state.broker_file.exists()
    assert find_bootstrap_servers(KafkaSettings(bootstrap_servers=None), state) is None
