"""What the one-machine stack runs: each service's record under ``$PRMLOOP_HOME/run/``, whether its
process still lives, and the report ``prmloop status`` prints.

:mod:`prmloop.flows.ops.stack` starts and stops the services (``prmloop up`` / ``down``) and writes the
records; this module only reads them, so the commands that ask what runs (status, the loop's driver and
its report, the Prefect URL every command sends its flow runs to) need not import the start-up code.
A record is ``<name>.json``: pid, command line, start time, log, and for a server its URL. A record whose
process is gone, or whose pid now belongs to another program, is not running.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prmloop.store.kafka.broker_file import read_broker_file
from prmloop.store.kafka.follow import read_links
from prmloop.store.settings import KafkaSettings, StateSettings

__all__ = [
    "KAFKA_SERVICES",
    "SERVICES",
    "STACK_SERVICES",
    "ServiceState",
    "last_log_line",
    "prefect_api_url",
    "read_state",
    "record_path",
    "running_services",
    "service_report",
]

#: Every service ``up`` knows, in start order. The vLLM engine comes first (the services that use it
#: are pointed at it when they start) and so stops last; ``prmloop up`` starts it only when asked.
SERVICES: tuple[str, ...] = (
    "engine",
    "broker",
    "sink",
    "scorer",
    "selector",
    "annotator",
    "judge",
    "consensus",
    "prefect",
    "deployments",
)
#: What ``up`` starts when not told otherwise: everything but the engine (``--engine vllm`` adds it).
STACK_SERVICES: tuple[str, ...] = tuple(s for s in SERVICES if s != "engine")
#: The services that hold a Kafka connection for as long as they run (the others connect per flow run).
KAFKA_SERVICES: tuple[str, ...] = ("sink", "scorer", "selector", "annotator", "judge", "consensus")


@dataclass(frozen=True)
class ServiceState:
    name: str
    pid: int
    argv: list[str]
    started_at: float
    log: str
    url: str | None = None

    @property
    def alive(self) -> bool:
        return _alive(self.pid, self.argv)


def _alive(pid: int, argv: Sequence[str]) -> bool:
    """The process exists and is still the one we started (not a recycled pid)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return True
    if Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[-1].startswith("Z"):
        return False  # a zombie: exited, waiting to be reaped
    parts = [c.decode(errors="replace") for c in cmdline if c]
    # A script is run by its interpreter ([python, script, args...]): match the program's name and the args.
    tail = list(argv[1:])
    name = Path(argv[0]).name
    return parts[len(parts) - len(tail) :] == tail and any(
        Path(p).name == name for p in parts[: len(parts) - len(tail)]
    )


def record_path(state: StateSettings, name: str) -> Path:
    """Where ``up`` records the service ``name``."""
    return state.run_dir / f"{name}.json"


def read_state(state: StateSettings, name: str) -> ServiceState | None:
    try:
        return ServiceState(**json.loads(record_path(state, name).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def running_services(state: StateSettings | None = None) -> dict[str, ServiceState]:
    """The services ``up`` started that are still running (stale records are ignored)."""
    state = state or StateSettings()
    found = {}
    for name in SERVICES:
        record = read_state(state, name)
        if record is not None and record.alive:
            found[name] = record
    return found


def service_report(state: StateSettings | None = None) -> dict[str, dict[str, Any]]:
    """Every service recorded under ``$PRMLOOP_HOME/run/``, running or dead, for ``prmloop status``.

    A running Kafka service that follows the embedded broker says which broker it reads from (its
    link record, :mod:`prmloop.store.kafka.follow`) and whether that is the broker ``broker.json`` names now
    (``current``). A dead one (its process is gone, but ``down`` never removed its record) says so,
    with the last line of its log: ``up`` starts it again.
    """
    state = state or StateSettings()
    links = {link["pid"]: link for link in read_links(state)}
    named = read_broker_file(state)
    configured = KafkaSettings().bootstrap_servers
    report: dict[str, dict[str, Any]] = {}
    for name in SERVICES:
        record = read_state(state, name)
        if record is None:
            continue
        entry: dict[str, Any] = {"pid": record.pid, "log": record.log, **({"url": record.url} if record.url else {})}
        if not record.alive:
            entry["state"] = "dead"
            entry["last_log_line"] = last_log_line(Path(record.log))
            report[name] = entry
            continue
        entry["state"] = "running"
        if name == "broker" and named is not None and named.pid == record.pid:
            entry["serves"] = {"bootstrap_servers": named.bootstrap_servers, "cluster_id": named.cluster_id}
        elif name == "engine":
            from prmloop.flows.ops.engine import engine_load

            entry["load"] = engine_load(record.pid, record.url)
        elif name in KAFKA_SERVICES:
            link = links.get(record.pid)
            if link is not None:
                entry["broker"] = {
                    "bootstrap_servers": link["bootstrap_servers"],
                    "cluster_id": link.get("cluster_id"),
                    "reachable": link.get("reachable"),
                    "since": link.get("since"),
                    "current": named is not None
                    and (link["bootstrap_servers"], link.get("cluster_id"))
                    == (named.bootstrap_servers, named.cluster_id),
                }
            elif configured:
                entry["broker"] = {"bootstrap_servers": configured, "from": "KAFKA_BOOTSTRAP_SERVERS"}
            else:
                entry["broker"] = "unknown (no link record: still starting, or started by an older prmloop)"
        report[name] = entry
    return report


def last_log_line(log: Path, tail_bytes: int = 4096) -> str | None:
    """The log's last non-empty line (read from its end: logs grow)."""
    try:
        with log.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - tail_bytes))
            lines = [line.strip() for line in f.read().decode(errors="replace").splitlines() if line.strip()]
    except OSError:
        return None
    return lines[-1][:500] if lines else None


def prefect_api_url(state: StateSettings | None = None) -> str | None:
    """The API URL of the Prefect server ``up`` started, if it is running."""
    record = read_state(state or StateSettings(), "prefect")
    return record.url if record is not None and record.url and record.alive else None
