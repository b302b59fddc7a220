"""``$PRMLOOP_HOME/broker.json``: where the embedded broker of a home listens, written by the broker
itself and read by every client that is given no ``KAFKA_BOOTSTRAP_SERVERS``
(and by :mod:`prmloop.store.kafka.follow`, which follows a broker's replacements)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from prmloop.store.ports import port_open
from prmloop.store.procs import pid_running
from prmloop.store.settings import KafkaSettings, StateSettings

__all__ = [
    "BrokerError",
    "BrokerInfo",
    "find_bootstrap_servers",
    "found_in_broker_file",
    "read_broker_file",
    "remove_broker_file",
    "require_bootstrap_servers",
    "write_broker_file",
]


class BrokerError(RuntimeError):
    pass


@dataclass(frozen=True)
class BrokerInfo:
    """What ``broker.json`` says about the embedded broker: its address, its cluster id (new at every
    start, so a restarted broker is told apart from the one before even on the same port) and pids."""

    bootstrap_servers: str
    cluster_id: str | None = None
    pid: int | None = None
    broker_pid: int | None = None
    #: Tansu runs in a network namespace of its own (reachable through its gate by this user only);
    #: None: an older prmloop wrote the file.
    isolated: bool | None = None
    why_not_isolated: str | None = None

    @property
    def reachable(self) -> bool:
        """Its gate still runs and its port answers (a killed broker's port may have a new owner)."""
        if self.broker_pid is not None and not pid_running(self.broker_pid):
            return False
        host, port = self.bootstrap_servers.rsplit(":", 1)
        return port_open(host, int(port))

    def describe(self) -> str:
        return f"{self.bootstrap_servers} (cluster {self.cluster_id or 'unknown'})"


class RunningBroker(Protocol):
    """What ``broker.json`` records of a running embedded broker."""

    @property
    def bootstrap_servers(self) -> str: ...
    @property
    def cluster_id(self) -> str | None: ...
    @property
    def pid(self) -> int | None: ...
    @property
    def durable(self) -> bool: ...
    @property
    def isolated(self) -> bool: ...
    @property
    def why_not_isolated(self) -> str | None: ...


def write_broker_file(broker: RunningBroker, state: StateSettings) -> Path:
    state.home.mkdir(parents=True, exist_ok=True)
    info = {
        "bootstrap_servers": broker.bootstrap_servers,
        "cluster_id": broker.cluster_id,
        "pid": os.getpid(),
        "broker_pid": broker.pid,
        "storage": "postgres" if broker.durable else "memory",
        "isolated": broker.isolated,
        **({"why_not_isolated": broker.why_not_isolated} if broker.why_not_isolated else {}),
    }
    # Written whole and renamed: a service following the file never reads half of it.
    tmp = state.broker_file.with_name(f".{state.broker_file.name}.{os.getpid()}")
    tmp.write_text(json.dumps(info))
    tmp.replace(state.broker_file)
    return state.broker_file


def read_broker_file(state: StateSettings | None = None) -> BrokerInfo | None:
    """The broker ``broker.json`` names (alive or not), or None without a readable file."""
    state = state or StateSettings()
    try:
        info = json.loads(state.broker_file.read_text())
        servers = str(info["bootstrap_servers"])
        int(servers.rsplit(":", 1)[1])
    except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError):
        return None

    def number(key: str) -> int | None:
        value = info.get(key)
        return value if isinstance(value, int) else None

    cluster = info.get("cluster_id")
    isolated = info.get("isolated")
    why = info.get("why_not_isolated")
    return BrokerInfo(
        servers,
        str(cluster) if cluster else None,
        number("pid"),
        number("broker_pid"),
        isolated if isinstance(isolated, bool) else None,
        str(why) if why else None,
    )


#: The brokers this process found through ``broker.json``, by address, with where the file was: a
#: client given such an address follows that broker's replacements (:mod:`prmloop.store.kafka.follow`), also
#: when the file changed between the look-up and the client's start (a service loading its model).
_FOUND: dict[str, tuple[BrokerInfo, StateSettings]] = {}


def find_bootstrap_servers(kafka: KafkaSettings | None = None, state: StateSettings | None = None) -> str | None:
    """``KAFKA_BOOTSTRAP_SERVERS`` if set, else the live embedded broker started by ``prmloop broker``."""
    kafka = kafka or KafkaSettings()
    if kafka.bootstrap_servers:
        return kafka.bootstrap_servers
    state = state or StateSettings()
    info = read_broker_file(state)
    if info is None or not info.reachable:
        return None
    _FOUND[info.bootstrap_servers] = (info, state)
    return info.bootstrap_servers


def found_in_broker_file(bootstrap_servers: str) -> tuple[BrokerInfo, StateSettings] | None:
    """The broker :func:`find_bootstrap_servers` found at this address in ``broker.json``, if it did."""
    return _FOUND.get(bootstrap_servers)


def require_bootstrap_servers(kafka: KafkaSettings | None = None, state: StateSettings | None = None) -> str:
    servers = find_bootstrap_servers(kafka, state)
    if servers is None:
        raise BrokerError(
            "no Kafka broker found: start the embedded one with `prmloop broker` (in another terminal), "
            "or set KAFKA_BOOTSTRAP_SERVERS=host:port for a real cluster"
        )
    return servers


def remove_broker_file(state: StateSettings) -> None:
    """Remove ``broker.json`` unless another ``prmloop broker`` has replaced it since."""
    try:
        info = json.loads(state.broker_file.read_text())
    except (OSError, ValueError):
        info = {}
    if info.get("pid") in (None, os.getpid()):
        state.broker_file.unlink(missing_ok=True)
