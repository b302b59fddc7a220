"""No other user's connection flood stalls the broker's gate (issue 54, point 1).

Reproduced as the issue found it, shorter: threads as another local user (``nobody``, via ``runuser``)
reconnect to the gate's port again and again for a few seconds, on loopback only, while this user
keeps asking the broker (ApiVersions over a raw socket, and a kafka-python producer). The old gate read
the whole of /proc/net/tcp on its event loop for each connection and logged every refusal: the owner's
requests took seconds or timed out, and 60 s wrote 6,192 lines into the owner's log. Now: every owner
request is answered, and the log holds a line a minute per user.
"""

from __future__ import annotations

import json
import os
import pwd
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kafka import KafkaProducer

from prmloop.flows.ops.broker import EmbeddedBroker
from prmloop.flows.ops.broker_gate import RefusalLog
from prmloop.flows.ops.peer import PeerLookup, loopback_peer_uid
from prmloop.store.kafka.producer import ensure_topics

#: The flood, with nothing but the standard library: THREADS threads reconnect for SECONDS seconds,
#: each reading until the gate closes it; prints how many connections it made and how many were closed.
FLOOD = """
import json, socket, sys, threading, time
host, port, threads, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
made = closed = 0
lock = threading.Lock()
def hammer():
    global made, closed
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            s = socket.create_connection((host, port), timeout=2)
        except OSError:
            time.sleep(0.05)
            continue
        with lock:
            made += 1
        try:
            s.sendall(b"\\0\\0\\0\\x10" + b"x" * 16)
            gone = s.recv(1) == b""
        except socket.timeout:
            gone = False
        except OSError:
            gone = True
        s.close()
        with lock:
            closed += gone
        time.sleep(0.02)
workers = [threading.Thread(target=hammer) for _ in range(threads)]
for w in workers: w.start()
for w in workers: w.join()
print(json.dumps({"made": made, "closed": closed}))
"""


def api_versions(host: str, port: int, correlation: int, timeout_s: float = 5.0) -> float:
    """One ApiVersions v0 request over a fresh connection; its seconds (raises on any failure)."""
    start = time.monotonic()
    client = b"owner"
    request = struct.pack(">hhih", 18, 0, correlation, len(client)) + client
    with socket.create_connection((host, port), timeout=timeout_s) as s:
        s.sendall(struct.pack(">i", len(request)) + request)
        size = b""
        while len(size) < 4:
            chunk = s.recv(4 - len(size))
            if not chunk:
                raise ConnectionError("the gate closed the owner's connection")
            size += chunk
        body = b""
        want = struct.unpack(">i", size)[0]
        while len(body) < want:
            chunk = s.recv(want - len(body))
            if not chunk:
                raise ConnectionError("the answer was cut short")
            body += chunk
    assert struct.unpack(">i", body[:4])[0] == correlation
    return time.monotonic() - start


@pytest.fixture
def logged_broker(tmp_path: Path) -> Iterator[tuple[EmbeddedBroker, Path]]:
    log = tmp_path / "broker.log"
    with EmbeddedBroker(log_path=log) as running:
        ensure_topics(running.bootstrap_servers)
        yield running, log


def test_a_flood_from_another_user_neither_stalls_the_owner_nor_fills_the_log(
    logged_broker: tuple[EmbeddedBroker, Path], as_nobody: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    broker, log = logged_broker
    before = log.read_bytes().count(b"refused")
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers, request_timeout_ms=10_000)
    result: dict[str, subprocess.CompletedProcess[str]] = {}

    def flood() -> None:
        result["flood"] = as_nobody(["python3", "-c", FLOOD, broker.host, str(broker.port), "60", "4"], timeout_s=60)

    attacker = threading.Thread(target=flood)
    attacker.start()
    answered: list[float] = []
    failures: list[str] = []
    sent = 0
    time.sleep(0.5)  # the flood under way
    try:
        while attacker.is_alive():
            try:
                answered.append(api_versions(broker.host, broker.port, len(answered) + 1))
            except OSError as exc:
                failures.append(repr(exc))
            producer.send("questions.registered", b"{}").get(timeout=10)
            sent += 1
            time.sleep(0.05)
    finally:
        attacker.join()
        producer.close()
    counts = json.loads(result["flood"].stdout)
    assert counts["made"] >= 100, result["flood"].stdout + result["flood"].stderr  # the flood ran
    assert counts["closed"] == counts["made"]  # every one of its connections refused
    assert not failures, failures  # and no request of the owner's failed meanwhile
    assert answered and sent >= 1
    refusal_lines = log.read_bytes().count(b"refused") - before
    assert refusal_lines <= 2, f"{refusal_lines} refusal lines for {counts['made']} refused connections"


def test_refusals_are_logged_once_per_user_per_interval_with_a_count(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    refusals = RefusalLog(60.0, clock=lambda: now[0])
    with caplog.at_level("WARNING", logger="prmloop.flows.ops.broker_gate"):
        for i in range(1000):
            now[0] = i * 0.01
            refusals.refused(65534, "only this user's clients reach the broker")
        refusals.refused(1000, "only this user's clients reach the broker")
        refusals.flush()  # 10 s in: nothing due yet
        now[0] = 61.0
        refusals.flush()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3, lines
    assert "user id 65534" in lines[0] and "user id 1000" in lines[1]
    assert "999 more connections from user id 65534" in lines[2]


def test_the_owner_of_a_connection_is_asked_of_netlink_for_that_socket(
    as_nobody: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    """sock_diag names the same owner as the whole table does, for another user's connection and this
    user's, without reading the table (issue 54: the table grew to 2,393 lines under the flood)."""
    peers = PeerLookup()
    if not peers.netlink:
        pytest.skip("no netlink socket diagnostics in this kernel or sandbox: the gate reads /proc/net/tcp")
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        hold = "import socket, sys, time; s = socket.create_connection(('127.0.0.1', int(sys.argv[1]))); time.sleep(3)"
        attacker = threading.Thread(target=as_nobody, args=(["python3", "-c", hold, str(port)],))
        attacker.start()
        theirs, _ = server.accept()
        mine_client = socket.create_connection(("127.0.0.1", port))
        mine, _ = server.accept()
        try:
            with open("/proc/net/tcp") as table:
                assert peers.uid(theirs) == loopback_peer_uid(theirs, table) == pwd.getpwnam("nobody").pw_uid
                assert peers.uid(mine) == loopback_peer_uid(mine, table) == os.geteuid()
            assert peers.netlink  # answered by netlink, not by falling back
        finally:
            for s in (theirs, mine, mine_client):
                s.close()
            attacker.join()
            peers.close()
