"""``prmloop up --cluster``: the compose file's topology as native processes on one machine.

Start order (each waits for the health of what it needs): PostgreSQL (databases ``prmloop_broker``,
``prefect``, ``prmloop_lake``), two Tansu brokers on PostgreSQL storage (``broker-1``, ``broker-2``),
the Prefect server on PostgreSQL, the work pools and ``prefect deploy --all`` of ``infra/prefect.yaml``
(schedules paused: a laptop runs deployments by hand), the ``topics`` job, then every service of
:data:`prmloop.flows.ops.topology.APP_SERVICES` with its replicas (``sink-1``, ``sink-2``, ...), each in
its consumer group, the store a DuckLake on that PostgreSQL. Every process is recorded under
``$PRMLOOP_HOME/run/cluster/`` and logs to ``$PRMLOOP_HOME/logs/<name>.log``; a second ``up --cluster``
starts only what is not running (a restart policy by hand) and schedules again the flow runs a dead
worker left pending or running (:mod:`prmloop.flows.ops.cluster_runs`); ``down --cluster`` stops all of it.
``prmloop status`` lists every process (:func:`cluster_report`) and reads the cluster's brokers and
store (:func:`cluster_connection`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prmloop.flows.ops.prefect_home import prefect_auth_environment, prefect_cli
from prmloop.flows.ops.services import ServiceState, last_log_line
from prmloop.flows.ops.topology import APP_SERVICES, SHARED_VARIABLES, Service, native_engine
from prmloop.store.auth.credentials import BROKER_ROLE, PREFECT_ROLE, READER_ROLE, SINK_ROLE, load_credentials
from prmloop.store.kafka.follow import read_links
from prmloop.store.ports import free_port, port_open
from prmloop.store.settings import StateSettings

__all__ = ["ROOT", "cluster_connection", "cluster_down", "cluster_report", "cluster_up", "process_names"]

#: The checkout (this file is flows/ops/cluster.py in it): ``infra/prefect.yaml`` is deployed from here.
ROOT = Path(__file__).resolve().parents[2]
BROKERS = ("broker-1", "broker-2")
DATABASES = ("prmloop_broker", "prefect", "prmloop_lake")


#: The processes this ``up`` started (their records' liveness checks the command line, which a child
#: has only once it has exec'ed: right after the fork it still shows this process's).
_PROCESSES: dict[int, subprocess.Popen[bytes]] = {}


def _dir(state: StateSettings) -> Path:
    return state.run_dir / "cluster"


def _read_ports(state: StateSettings) -> dict[str, int] | None:
    try:
        return {k: int(v) for k, v in json.loads((_dir(state) / "ports.json").read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return None


def _ports(state: StateSettings) -> dict[str, int]:
    """The cluster's ports, chosen once and kept (a restarted piece comes back where clients look)."""
    known = _read_ports(state)
    if known is not None:
        return known
    path = _dir(state) / "ports.json"
    ports = {"postgres": free_port(), "prefect": free_port(), **{b: free_port() for b in BROKERS}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(ports))
    return ports


def process_names() -> list[str]:
    """Every process of the cluster, in start order."""
    names = ["postgres", *BROKERS, "prefect-server"]
    for service in APP_SERVICES:
        if not service.job:
            names += (
                [service.name]
                if service.replicas == 1
                else [f"{service.name}-{i + 1}" for i in range(service.replicas)]
            )
    return names


def _record(state: StateSettings, name: str) -> ServiceState | None:
    try:
        return ServiceState(**json.loads((_dir(state) / f"{name}.json").read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _spawn(
    state: StateSettings, name: str, argv: list[str], env: dict[str, str], url: str | None = None
) -> ServiceState:
    log = state.home / "logs" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        process = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            cwd=ROOT,
        )
    record = ServiceState(name, process.pid, argv, time.time(), str(log), url)
    (_dir(state) / f"{name}.json").write_text(json.dumps(record.__dict__))
    _PROCESSES[record.pid] = process
    return record


def _wait(ready: Callable[[], bool], timeout_s: float, what: str, record: ServiceState) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ready():
            return
        process = _PROCESSES.get(record.pid)
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{what} exited at start (code {process.returncode}); see {record.log}")
        time.sleep(0.3)
    raise TimeoutError(f"{what} did not come up within {timeout_s:.0f} s; see {record.log}")


def _http_ok(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "prmloop.flows.cli", *args]


def cluster_env(state: StateSettings, ports: dict[str, int]) -> dict[str, str]:
    """What every prmloop process of the cluster reads (the compose file's ``x-prmloop`` environment)."""
    pg = ports["postgres"]
    credentials = load_credentials(state.home)
    # Each role's password in a passfile of its own: the conninfo names the file, never the password.
    lake = (
        f"ducklake:postgres:dbname=prmloop_lake host=127.0.0.1 port={pg} user={SINK_ROLE} "
        f"passfile={credentials.passfile(SINK_ROLE)}"
        f"#reader=user={READER_ROLE} passfile={credentials.passfile(READER_ROLE)}#data={state.home / 'lake'}"
    )
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": ",".join(f"127.0.0.1:{ports[b]}" for b in BROKERS),
        "PRMLOOP_HOME": str(state.home),
        "PRMLOOP_STORE": lake,
        "PREFECT_API_URL": f"http://127.0.0.1:{ports['prefect']}/api",
        "PREFECT_HOME": str(state.home / "prefect-cluster"),
        **prefect_auth_environment(state.home),
    }
    assert all(v in env for v in SHARED_VARIABLES)
    return env


def _deploy(env: dict[str, str], say: Callable[[str], None]) -> None:
    """Work pools, ``prefect deploy --all`` of infra/prefect.yaml against the server, schedules paused."""
    deploy_env = {**env, "PRMLOOP_CODE_DIR": str(ROOT)}
    for pool in ("cpu", "gpu"):
        _run(prefect_cli("work-pool", "create", pool, "--type", "process", "--overwrite"), deploy_env)
    _run(prefect_cli("--no-prompt", "deploy", "--all", "--prefect-file", "infra/prefect.yaml"), deploy_env, timeout=300)
    script = (
        "import asyncio\nfrom prefect.client.orchestration import get_client\n"
        "async def main():\n    async with get_client() as c:\n"
        "        for d in await c.read_deployments():\n            await c.pause_deployment(d.id)\n"
        "asyncio.run(main())\n"
    )
    _run([sys.executable, "-c", script], deploy_env)
    say("deployed infra/prefect.yaml to the Prefect server (schedules paused: run them by hand)")


def _run(argv: list[str], env: dict[str, str], timeout: float = 120) -> None:
    done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:4])} failed ({done.returncode}): {(done.stderr or done.stdout)[-800:]}")


def _argv(service: Service) -> list[str]:
    if service.entrypoint == "prefect":
        return prefect_cli(*service.command)
    return _cli(*service.command)


def cluster_up(
    *, state: StateSettings | None = None, engine: str = "simulator", say: Callable[[str], None] = print
) -> dict[str, Any]:
    """Start every process of the cluster that is not running (see the module's docstring); one at a
    time per home (:mod:`prmloop.flows.ops.home_lock`)."""
    from prmloop.flows.ops.home_lock import home_lock

    state = state or StateSettings()
    with home_lock(state, name="up-cluster", command="prmloop up --cluster", say=say):
        return _cluster_up(state=state, engine=engine, say=say)


def _cluster_up(*, state: StateSettings, engine: str, say: Callable[[str], None]) -> dict[str, Any]:
    _dir(state).mkdir(parents=True, exist_ok=True)
    ports = _ports(state)
    env = cluster_env(state, ports)
    started: list[str] = []

    def start(
        name: str, argv: list[str], extra: dict[str, str] | None = None, url: str | None = None
    ) -> ServiceState | None:
        record = _record(state, name)
        if record is not None and record.alive:
            return None
        record = _spawn(state, name, argv, {**env, **(extra or {})}, url)
        started.append(name)
        say(f"started {name} (pid {record.pid}, log {record.log})")
        return record

    pg = ports["postgres"]
    record = start(
        "postgres",
        _cli(
            "postgres",
            "--port",
            str(pg),
            "--dir",
            str(state.home / "postgres"),
            *[arg for d in DATABASES for arg in ("--database", d)],
        ),
    )
    if record is not None:
        from prmloop.flows.ops.postgres import prepare_server, wait_ready

        wait_ready("127.0.0.1", pg, timeout_s=90)
        # The server sets up its roles and databases itself once it answers; this does it too (idempotent)
        # so that nothing below starts before they exist. Each service connects as its own role.
        prepare_server("127.0.0.1", pg, DATABASES, credentials=load_credentials(state.home))
    passfile = load_credentials(state.home).passfile
    storage = f"postgresql://{BROKER_ROLE}@127.0.0.1:{pg}/prmloop_broker?passfile={passfile(BROKER_ROLE)}"
    for name in BROKERS:
        argv = _cli(
            "broker",
            "--storage",
            storage,
            "--no-announce",
            "--name",
            name,
            "--port",
            str(ports[name]),
            "--partitions",
            "8",
        )
        record = start(name, argv)
        if record is not None:
            _wait(functools.partial(port_open, "127.0.0.1", ports[name]), 120, name, record)
    url = f"http://127.0.0.1:{ports['prefect']}/api"
    server_env = {
        # asyncpg finds the role's password in PGPASSFILE: no password in the URL.
        "PREFECT_API_DATABASE_CONNECTION_URL": f"postgresql+asyncpg://{PREFECT_ROLE}@127.0.0.1:{pg}/prefect",
        "PGPASSFILE": str(passfile(PREFECT_ROLE)),
        "PREFECT_SERVER_API_PORT": str(ports["prefect"]),
        "PREFECT_UI_API_URL": url,
    }
    record = start(
        "prefect-server",
        prefect_cli("server", "start", "--host", "127.0.0.1", "--port", str(ports["prefect"])),
        server_env,
        url,
    )
    if record is not None:
        _wait(lambda: _http_ok(url + "/health"), 240, "the Prefect server", record)
        _deploy(env, say)
    for service in APP_SERVICES:
        if service.job:
            if started:
                _run(_argv(service), env, timeout=180)
                say(f"ran {service.name}: {' '.join(service.command)}")
            continue
        names = (
            [service.name] if service.replicas == 1 else [f"{service.name}-{i + 1}" for i in range(service.replicas)]
        )
        for name in names:
            start(name, _argv(service), native_engine(service, engine))
    retried = _retry_orphans(url, state, say)
    return {"home": str(state.home), "started": started, "retried_flow_runs": retried, "report": cluster_report(state)}


def _retry_orphans(url: str, state: StateSettings, say: Callable[[str], None]) -> list[dict[str, Any]]:
    """Schedule again the flow runs a dead worker left behind (their worker was just restarted, or its
    siblings in the pool are running: either picks them up)."""
    from prmloop.flows.ops.cluster_runs import retry_orphaned_runs

    if not _http_ok(url + "/health"):
        say("the Prefect server does not answer: flow runs of dead workers not checked (run up --cluster again)")
        return []
    retried = retry_orphaned_runs(url, auth=load_credentials(state.home).prefect_auth_string)
    for run in retried:
        say(
            f"flow run {run['name']} ({run['id']}) was {run['was'].lower()} in pid {run['pid']}, which is gone: "
            "marked crashed and scheduled again"
        )
    return retried


#: The services that hold a Kafka connection (and keep a link record naming the broker they use).
KAFKA_SERVICES = frozenset(s.name for s in APP_SERVICES if s.entrypoint == "prmloop" and not s.job)


def cluster_report(state: StateSettings | None = None) -> dict[str, dict[str, Any]]:
    """Every recorded process of the cluster: ``running`` or ``dead`` (with its pid and log; a dead one
    with its log's last line: ``up --cluster`` starts it again). A running broker says the address it
    serves, a running Kafka service the broker it reads from now (``broker-1``/``broker-2``, from its
    link record, :mod:`prmloop.store.kafka.follow`) and whether that broker answered it last."""
    state = state or StateSettings()
    ports = _read_ports(state) or {}
    brokers = {f"127.0.0.1:{ports[b]}": b for b in BROKERS if b in ports}
    links = {link["pid"]: link for link in read_links(state)}
    report: dict[str, dict[str, Any]] = {}
    for name in process_names():
        record = _record(state, name)
        if record is None:
            continue
        entry: dict[str, Any] = {"pid": record.pid, "state": "running" if record.alive else "dead", "log": record.log}
        if record.url:
            entry["url"] = record.url
        service = name.rsplit("-", 1)[0] if name[-1].isdigit() else name
        if entry["state"] == "dead":
            entry["last_log_line"] = last_log_line(Path(record.log))
        elif name in BROKERS and name in ports:
            entry["serves"] = f"127.0.0.1:{ports[name]}"
        elif service in KAFKA_SERVICES:
            link = links.get(record.pid)
            entry["broker"] = (
                {
                    "name": brokers.get(link["bootstrap_servers"], "not of this cluster"),
                    "bootstrap_servers": link["bootstrap_servers"],
                    "reachable": link.get("reachable"),
                    "since": link.get("since"),
                }
                if link is not None
                else "unknown (no link record yet: still starting)"
            )
        report[name] = entry
    return report


def cluster_connection(state: StateSettings | None = None) -> dict[str, str] | None:
    """Where the cluster ``up --cluster`` started under this home is reached (``bootstrap_servers``,
    ``store``, ``prefect_api_url``), or None when it never ran here (or ``down --cluster`` ended it)."""
    state = state or StateSettings()
    ports = _read_ports(state)
    if ports is None or not all(_record(state, name) is not None for name in ("postgres", *BROKERS)):
        return None
    env = cluster_env(state, ports)
    return {
        "bootstrap_servers": env["KAFKA_BOOTSTRAP_SERVERS"],
        "store": env["PRMLOOP_STORE"],
        "prefect_api_url": env["PREFECT_API_URL"],
    }


def cluster_down(
    *, state: StateSettings | None = None, grace_s: float = 20.0, say: Callable[[str], None] = print
) -> list[str]:
    """Stop every process of the cluster, in reverse start order (SIGTERM, SIGKILL after ``grace_s``)."""
    state = state or StateSettings()
    stopped = []
    for name in reversed(process_names()):
        record = _record(state, name)
        if record is None:
            continue
        if record.alive:
            with_group(record.pid, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while record.alive and time.monotonic() < deadline:
                time.sleep(0.2)
            if record.alive:
                with_group(record.pid, signal.SIGKILL)
            stopped.append(name)
            say(f"stopped {name} (pid {record.pid})")
        (_dir(state) / f"{name}.json").unlink(missing_ok=True)
    return stopped


def with_group(pid: int, sig: signal.Signals) -> None:
    """Signal the process's session (each was started in its own): its children (Tansu, the gateway, a
    flow run) get it too."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
