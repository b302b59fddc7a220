"""``prmloop up`` / ``prmloop down``: everything one machine needs, as background processes.

``up`` starts, in order, the embedded broker (unless ``KAFKA_BOOTSTRAP_SERVERS`` names one), the sink,
the scorer, selector, annotator, judge and consensus services, a Prefect server with its UI, and a process that
serves the loop's deployments (:mod:`prmloop.flows.deployments`); the Prefect server, slow to come up, is
launched before the rest and waited for in its turn. Each runs in its own session (it
outlives the ``up`` command), logs to ``$PRMLOOP_HOME/logs/<name>.log`` and is recorded in
``$PRMLOOP_HOME/run/<name>.json`` (pid, command line, start time, and for the Prefect server its URL).
A second ``up`` says what is already running and starts only what is not. ``down`` stops them in the
reverse order (SIGTERM, then SIGKILL after a grace period) and removes the records.

With ``--engine vllm`` it first starts the machine's vLLM engine (:mod:`prmloop.flows.ops.engine`); while
an engine runs, every model-using service ``up`` starts is pointed at it.

While the Prefect server is up, every ``prmloop`` command sends its flow runs to it (see
:func:`prefect_api_url`), so they show in the UI; otherwise flows use a throw-away local API.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from prmloop.flows.ops.prefect_home import prefect_auth_environment, prefect_cli, prefect_home
from prmloop.flows.ops.replicas import replica_ports, replicas_command
from prmloop.flows.ops.services import (
    KAFKA_SERVICES,
    SERVICES,
    STACK_SERVICES,
    ServiceState,
    prefect_api_url,
    read_state,
    record_path,
    running_services,
)
from prmloop.store.kafka.broker_file import BrokerInfo, find_bootstrap_servers, read_broker_file
from prmloop.store.kafka.follow import read_links, remove_links
from prmloop.store.ports import free_port
from prmloop.store.settings import KafkaSettings, StateSettings

__all__ = ["down", "up"]


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "prmloop.flows.cli", *args]


def _command(name: str, port: int | None) -> list[str]:
    if name == "engine":
        from prmloop.flows.ops.engine import converted_model, engine_command, vllm_python

        python = vllm_python()
        return engine_command(python, converted_model(python), port or free_port())
    if name == "broker":
        return _cli("broker")
    if name == "sink":
        return _cli("sink")
    if name == "scorer":
        return _cli("score")
    if name == "selector":
        return _cli("select", "--threads", "1")
    if name == "annotator":
        return _cli("annotate", "--threads", "1")
    if name == "judge":
        return _cli("judge", "--threads", "1")
    if name == "consensus":
        return _cli("consensus")
    if name == "prefect":
        return prefect_cli("server", "start", "--host", "127.0.0.1", "--port", str(port))
    if name == "deployments":
        return _cli("deployments", "serve")
    raise ValueError(f"unknown service {name!r}; choose from {', '.join(SERVICES)}")


def _engine_replicas(env: dict[str, str]) -> int:
    from prmloop.flows.ops.engine import engine_replicas  # the engine module loads vLLM's settings: late

    return engine_replicas(env)


def _wait(ready: Callable[[], bool], timeout_s: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.5)
    raise TimeoutError(f"{what} did not come up within {timeout_s:.0f} s; see {log}")


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _start(state: StateSettings, name: str, env: dict[str, str], say: Callable[[str], None]) -> ServiceState:
    record, process = _launch(state, name, env)
    return _await(state, record, process, say)


def _launch(state: StateSettings, name: str, env: dict[str, str]) -> tuple[ServiceState, subprocess.Popen[bytes]]:
    """Start ``name`` in a session of its own and record it; :func:`_await` waits until it serves."""
    port = free_port() if name in ("prefect", "engine") else None
    replicas = _engine_replicas(env) if name == "engine" else 1
    ports = replica_ports(port, replicas) if port else []
    # replicas: one process runs a server per port (flows/ops/replicas.py), recorded as one engine
    argv = _command(name, port) if replicas == 1 else replicas_command(ports)
    logs = state.home / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    state.run_dir.mkdir(parents=True, exist_ok=True)
    log = logs / f"{name}.log"
    if name == "prefect":
        # The UI's scripts call the API at PREFECT_UI_API_URL, which otherwise defaults to port 4200.
        env = {**env, "PREFECT_SERVER_API_PORT": str(port), "PREFECT_UI_API_URL": f"http://127.0.0.1:{port}/api"}
    if name == "engine":
        from prmloop.flows.ops.engine import engine_environment, engine_key_environment

        threads = env.get("PRMLOOP_ENGINE_THREADS")
        # replicas get one thread each unless told: they share the cores, and none waits on another
        each = int(threads) if threads else (None if replicas == 1 else 1)
        # the KV cache is split between replicas (each loop step holds a few per cent of the 2 GiB)
        kv = engine_environment(each, kv_cache_gib=max(1, 2 // replicas))
        env = {**env, **kv, **engine_key_environment(state.home)}
    with log.open("ab") as out:
        process = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
        )
    url = (f"http://127.0.0.1:{port}/v1" if name == "engine" else f"http://127.0.0.1:{port}/api") if port else None
    if name == "engine" and replicas > 1:
        url = ",".join(f"http://127.0.0.1:{p}/v1" for p in ports)
    record = ServiceState(name, process.pid, argv, time.time(), str(log), url)
    record_path(state, name).write_text(json.dumps(record.__dict__))
    return record, process


def _await(
    state: StateSettings, record: ServiceState, process: subprocess.Popen[bytes], say: Callable[[str], None]
) -> ServiceState:
    """Wait until the service :func:`_launch` started serves (or has not died, for a consumer)."""
    name, url, log = record.name, record.url, Path(record.log)
    if name == "broker":
        _wait(lambda: find_bootstrap_servers(KafkaSettings(), state) is not None, 60, "the embedded broker", log)
    elif name == "prefect" and url:
        _wait(lambda: _http_ok(url + "/health"), 180, "the Prefect server", log)
    elif name == "engine" and url:
        from prmloop.flows.ops.engine import wait_ready

        # Loading vLLM and the model takes 30-120 s on two busy cores.
        if not wait_ready(url, 600, lambda: process.poll() is None):
            _stop(state, name, record, grace_s=10.0, say=say)
            raise RuntimeError(f"the vLLM engine did not come up (exit code {process.poll()}); see {log}")
    else:
        time.sleep(0.5)
    if process.poll() is not None:
        raise RuntimeError(f"{name} exited at start (code {process.returncode}); see {log}")
    where = (f", serves {url}" if name == "engine" else f", UI {url.removesuffix('/api')}") if url else ""
    say(f"started {name} (pid {process.pid}, log {log}){where}")
    return record


def up(
    services: Sequence[str] = STACK_SERVICES,
    *,
    state: StateSettings | None = None,
    say: Callable[[str], None] = print,
    follow_timeout_s: float = 30.0,
) -> dict[str, Any]:
    """Start ``services`` (in :data:`SERVICES` order) that are not running yet; returns what runs.

    When it starts the broker while Kafka services run (the old broker died), it waits up to
    ``follow_timeout_s`` for each to move to the new broker, and restarts the ones that do not.
    One ``up`` at a time per home (:mod:`prmloop.flows.ops.home_lock`): a second waits for the first.
    """
    from prmloop.flows.ops.home_lock import home_lock

    state = state or StateSettings()
    with home_lock(state, say=say):
        return _up(services, state=state, say=say, follow_timeout_s=follow_timeout_s)


def _up(
    services: Sequence[str], *, state: StateSettings, say: Callable[[str], None], follow_timeout_s: float
) -> dict[str, Any]:
    unknown = [s for s in services if s not in SERVICES]
    if unknown:
        raise ValueError(f"unknown service {unknown[0]!r}; choose from {', '.join(SERVICES)}")
    state.home.mkdir(parents=True, exist_ok=True)
    already = running_services(state)
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL" or not already.get("prefect")}
    env["PRMLOOP_HOME"] = str(state.home)
    env.setdefault("PREFECT_HOME", str(prefect_home(state.home)))
    # The Prefect server asks for the credentials' auth string; the services that call it send it.
    for key, value in prefect_auth_environment(state.home).items():
        env.setdefault(key, value)
    wanted = [s for s in SERVICES if s in services]
    if "broker" in wanted and KafkaSettings().bootstrap_servers:
        say(f"broker: using KAFKA_BOOTSTRAP_SERVERS={KafkaSettings().bootstrap_servers}")
        wanted.remove("broker")
    started = []
    _use_engine(state, env)
    # The Prefect server needs nothing the others start and takes half a minute to come up, as the engine
    # does: launched first, it starts while the engine and the services load, and is waited for in its turn.
    early: dict[str, tuple[ServiceState, subprocess.Popen[bytes]]] = {}
    if "prefect" in wanted and "prefect" not in already:
        early["prefect"] = _launch(state, "prefect", env)
    new_broker: BrokerInfo | None = None
    for name in wanted:
        if name in already:
            record = already[name]
            if new_broker is None or name not in KAFKA_SERVICES:
                say(f"{name} is already running (pid {record.pid}, log {record.log})")
                continue
            # It used the broker this `up` replaced: it moves by itself within seconds
            # (prmloop.store.kafka.follow); one that does not is restarted.
            link = _link_after(state, record, new_broker, follow_timeout_s)
            if link is not None and link.get("cluster_id") == new_broker.cluster_id:
                say(f"{name} is already running (pid {record.pid}) and uses the new broker {new_broker.describe()}")
                continue
            if link is None and record.alive:  # still loading its model: it looks its broker up when done
                say(f"{name} is already running (pid {record.pid}), still starting: it will use the new broker")
                continue
            say(f"{name} (pid {record.pid}) did not move to the new broker within {follow_timeout_s:.0f} s: restarting")
            _stop(state, name, record, grace_s=20.0, say=say)
        if name == "deployments" and "prefect" not in running_services(state):
            say("deployments: not started (they need the Prefect server: add prefect)")
            continue
        url = prefect_api_url(state) if "prefect" not in early else None  # only once it serves
        if url and name != "prefect":
            env["PREFECT_API_URL"] = url
        if name in early:
            _await(state, *early.pop(name), say)
        else:
            _start(state, name, env, say)
        started.append(name)
        _use_engine(state, env)
        if name == "broker" and any(n in already for n in KAFKA_SERVICES):
            new_broker = read_broker_file(state)
    running = running_services(state)
    return {
        "home": str(state.home),
        "started": started,
        "running": {n: {"pid": r.pid, "log": r.log, **({"url": r.url} if r.url else {})} for n, r in running.items()},
    }


def _use_engine(state: StateSettings, env: dict[str, str]) -> None:
    """Point the services started from now on at the running engine (settings the user gave stay)."""
    record = read_state(state, "engine")
    if record is None or not record.url or not record.alive:
        return
    from prmloop.flows.ops.engine import service_environment

    for key, value in service_environment(record.url, state.home).items():
        if key not in os.environ:
            env[key] = value


def down(
    services: Sequence[str] = SERVICES,
    *,
    state: StateSettings | None = None,
    grace_s: float = 20.0,
    say: Callable[[str], None] = print,
) -> list[str]:
    """Stop ``services`` (default: every one ``up`` started), in reverse order: SIGTERM, SIGKILL after
    ``grace_s``."""
    state = state or StateSettings()
    stopped = []
    for name in reversed(SERVICES):
        record = read_state(state, name) if name in services else None
        if record is None:
            continue
        if _stop(state, name, record, grace_s=grace_s, say=say):
            stopped.append(name)
    if set(services) >= set(SERVICES):
        remove_links(state)
    return stopped


def _stop(state: StateSettings, name: str, record: ServiceState, *, grace_s: float, say: Callable[[str], None]) -> bool:
    """SIGTERM the service, SIGKILL after ``grace_s``, remove its record; False if it was not running."""
    was_running = record.alive
    if was_running:
        _signal_group(record.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while record.alive and time.monotonic() < deadline:
            time.sleep(0.2)
        if record.alive:
            say(f"{name} did not stop within {grace_s:.0f} s: killed")
            _signal_group(record.pid, signal.SIGKILL)
        say(f"stopped {name} (pid {record.pid})")
    record_path(state, name).unlink(missing_ok=True)
    remove_links(state, pid=record.pid)  # a killed service leaves its own
    return was_running


def _link_after(
    state: StateSettings, record: ServiceState, broker: BrokerInfo, timeout_s: float
) -> dict[str, Any] | None:
    """The service's link record once it names ``broker``, or as it is after ``timeout_s`` (None: the
    service has connected to no broker yet)."""
    deadline = time.monotonic() + timeout_s
    while True:
        link = next((link for link in read_links(state) if link["pid"] == record.pid), None)
        if link is not None and link.get("cluster_id") == broker.cluster_id:
            return link
        if time.monotonic() >= deadline or not record.alive:
            return link
        time.sleep(0.5)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    """Signal the service's whole process group (it was started in a session of its own)."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
