"""Following the embedded broker across restarts.

The embedded broker keeps its topics in memory, and each start gets a new cluster id (and, when
``prmloop up`` or ``prmloop broker`` picks the port, a new port); ``$PRMLOOP_HOME/broker.json`` names
the current one. A client that found its broker there (``KAFKA_BOOTSTRAP_SERVERS`` unset) keeps a
:class:`BrokerWatch`: at most once a second it rereads the file and checks that the port answers, so
the consumer runtime and the event producer notice within seconds that their broker is gone or was
replaced, say so in their logs, and reconnect to the new one. A client given
``KAFKA_BOOTSTRAP_SERVERS`` follows nothing: a real cluster keeps its address and its data, and
kafka-python reconnects to it by itself.

Brokers of a cluster on durable storage (``prmloop up --cluster``) each advertise only
themselves, and kafka-python never goes back to its bootstrap list once it knows a broker: a client
given several addresses (``KAFKA_BOOTSTRAP_SERVERS=a:1,b:2``) keeps a watch with those ``peers``, and
when the broker it reads from stops answering it moves to one that answers (same cluster, same
topics, same committed offsets: nothing is reread or lost).

A following consumer runtime also keeps a :class:`BrokerLink` record under
``$PRMLOOP_HOME/run/links/`` (service, pid, the broker it reads from, whether that broker answers) so
that ``prmloop status`` can say which service is connected to which broker.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from prmloop.store.kafka.broker_file import BrokerInfo, found_in_broker_file, read_broker_file
from prmloop.store.procs import pid_running
from prmloop.store.settings import KafkaSettings, StateSettings

log = logging.getLogger(__name__)

__all__ = ["BrokerChange", "BrokerLink", "BrokerWatch", "read_links", "remove_links"]


@dataclass(frozen=True)
class BrokerChange:
    """``gone``: the followed broker stopped answering; ``back``: it answers again; ``moved``:
    ``broker.json`` names another live broker (``broker``), which replaces ``previous``."""

    kind: Literal["gone", "back", "moved"]
    broker: BrokerInfo
    previous: BrokerInfo

    #: The move is to another broker of the same cluster (a peer), not to a replacement in broker.json.
    peer: bool = False

    def message(self) -> str:
        """What a client logs about the change."""
        if self.kind == "gone":
            return f"the broker {self.broker.describe()} is gone; waiting for it, or for a new one in broker.json"
        if self.kind == "back":
            return f"the broker {self.broker.describe()} answers again"
        if self.peer:
            return f"the broker {self.previous.bootstrap_servers} is gone: moving to {self.broker.bootstrap_servers}"
        return f"the broker was replaced: {self.previous.describe()} -> {self.broker.describe()} (broker.json)"


class BrokerWatch:
    """Tells a client when the broker it uses is gone, back, or replaced by the one ``broker.json`` names.

    :meth:`check` is cheap enough to call on every poll: it does its work (read a small file, open
    one loopback connection) at most every ``interval_s``. It never changes which broker is followed
    by itself: the caller reconnects, then calls :meth:`follow`, so a failed reconnection is simply
    tried again at the next check.
    """

    def __init__(
        self, current: BrokerInfo, state: StateSettings, *, interval_s: float = 1.0, peers: tuple[str, ...] = ()
    ) -> None:
        self.current = current
        self.state = state
        self.interval_s = interval_s
        #: The addresses of a cluster's brokers (empty: follow broker.json instead).
        self.peers = peers
        self.reachable = True
        self._next_check = time.monotonic() + interval_s

    @classmethod
    def for_servers(
        cls,
        bootstrap_servers: str,
        kafka: KafkaSettings | None = None,
        state: StateSettings | None = None,
        *,
        interval_s: float = 1.0,
    ) -> BrokerWatch | None:
        """A watch when ``bootstrap_servers`` is an embedded broker found in ``broker.json`` (by this
        process, or named there now), else None (``KAFKA_BOOTSTRAP_SERVERS`` is set, or the address came
        from elsewhere: a test's own broker). Several addresses (a cluster): a watch over those peers,
        starting on the first that answers."""
        peers = tuple(a.strip() for a in bootstrap_servers.split(",") if a.strip())
        if len(peers) > 1:
            live = next((a for a in peers if _answers(a)), peers[0])
            return cls(BrokerInfo(live), state or StateSettings(), interval_s=interval_s, peers=peers)
        if (kafka or KafkaSettings()).bootstrap_servers:
            return None
        found = found_in_broker_file(bootstrap_servers)
        if found is not None and (state is None or state.broker_file == found[1].broker_file):
            return cls(found[0], found[1], interval_s=interval_s)
        state = state or StateSettings()
        named = read_broker_file(state)
        if named is None or named.bootstrap_servers != bootstrap_servers:
            return None
        return cls(named, state, interval_s=interval_s)

    def check(self, *, force: bool = False) -> BrokerChange | None:
        """What changed since the last check, if anything (see :class:`BrokerChange`)."""
        now = time.monotonic()
        if not force and now < self._next_check:
            return None
        self._next_check = now + self.interval_s
        if self.peers:
            return self._check_peers()
        named = read_broker_file(self.state)
        if named is not None and _identity(named) != _identity(self.current) and named.reachable:
            return BrokerChange("moved", named, self.current)
        reachable = self.current.reachable
        if reachable == self.reachable:
            return None
        self.reachable = reachable
        return BrokerChange("back" if reachable else "gone", self.current, self.current)

    def _check_peers(self) -> BrokerChange | None:
        reachable = self.current.reachable
        if not reachable:
            live = next((a for a in self.peers if a != self.current.bootstrap_servers and _answers(a)), None)
            if live is not None:
                return BrokerChange("moved", BrokerInfo(live, self.current.cluster_id), self.current, peer=True)
        if reachable == self.reachable:
            return None
        self.reachable = reachable
        return BrokerChange("back" if reachable else "gone", self.current, self.current)

    def resolve(self, client: str) -> str:
        """The address to connect to now: the followed broker's, or its replacement's if ``broker.json``
        names a new one already (the client looked its broker up before a restart, and starts after)."""
        change = self.check(force=True)
        if change is not None and change.kind == "moved":
            log.warning("%s: %s", client, change.message())
            self.follow(change.broker)
        return self.current.bootstrap_servers

    def follow(self, broker: BrokerInfo) -> None:
        """The caller is connected to ``broker`` now."""
        self.current = broker
        self.reachable = True


def _answers(address: str) -> bool:
    return BrokerInfo(address).reachable


def _identity(info: BrokerInfo) -> tuple[str, str | None]:
    return info.bootstrap_servers, info.cluster_id


class BrokerLink:
    """``$PRMLOOP_HOME/run/links/<service>-<pid>.json``: the broker a running service uses now."""

    def __init__(self, state: StateSettings, service: str) -> None:
        self.service = service
        self.path = state.links_dir / f"{service}-{os.getpid()}.json"

    def write(self, broker: BrokerInfo, *, reachable: bool) -> None:
        record = {
            "service": self.service,
            "pid": os.getpid(),
            "bootstrap_servers": broker.bootstrap_servers,
            "cluster_id": broker.cluster_id,
            "reachable": reachable,
            "since": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{self.path.name}")
            tmp.write_text(json.dumps(record))
            tmp.replace(self.path)
        except OSError:
            pass  # the record only informs `prmloop status`; the service goes on without it

    def remove(self) -> None:
        with contextlib.suppress(OSError):
            self.path.unlink(missing_ok=True)


def read_links(state: StateSettings | None = None) -> list[dict[str, Any]]:
    """Every link record (of running and of dead processes: the caller checks the pid)."""
    return [record for _, record in _links(state or StateSettings())]


def remove_links(state: StateSettings, *, pid: int | None = None) -> None:
    """Remove the link records of process ``pid``, or (``None``) of every process that is gone: a
    killed service cannot remove its own."""
    for path, record in _links(state):
        if record["pid"] == pid or (pid is None and not pid_running(record["pid"])):
            path.unlink(missing_ok=True)


def _links(state: StateSettings) -> list[tuple[Path, dict[str, Any]]]:
    folder: Path = state.links_dir
    links = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and isinstance(record.get("pid"), int):
            links.append((path, record))
    return links

    return True
